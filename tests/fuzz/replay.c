/* Runs a fuzz target over files and folders of inputs (its corpus), once
 * each, without libFuzzer: every build replays the corpora as ordinary tests,
 * so an input that once found a bug stays a regression test. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return 1;
  }
  static uint8_t data[1 << 16];
  size_t size = fread(data, 1, sizeof data, f);
  fclose(f);
  /* A copy of exactly the input's size, so ASan sees a read past its end. */
  uint8_t *copy = malloc(size ? size : 1);
  if (copy == NULL) return 1;
  memcpy(copy, data, size);
  LLVMFuzzerTestOneInput(copy, size);
  free(copy);
  return 0;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int inputs = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad += replay_file(argv[i]);
      inputs++;
      continue;
    }
    DIR *dir = opendir(argv[i]);
    if (dir == NULL) {
      perror(argv[i]);
      return 1;
    }
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      bad += replay_file(path);
      inputs++;
    }
    closedir(dir);
  }
  printf("replayed %d inputs\n", inputs);
  return bad != 0 || inputs == 0;
}
