/* Runs one test of the file's list by name (as ctest does), or every test in
 * turn when given none. */
#include "task.h"

extern const test_entry mgpu_test_list[];

int main(int argc, char **argv) {
  int failed = 0, ran = 0;
  for (const test_entry *t = mgpu_test_list; t->name; t++) {
    if (argc > 1 && strcmp(argv[1], t->name) != 0) continue;
    ran++;
    int rc = t->fn();
    mgpu_shutdown();
    if (rc == TEST_SKIP) {
      printf("skip %s\n", t->name);
      if (argc > 1) return TEST_SKIP;
    } else if (rc != 0) {
      printf("FAIL %s (%d)\n", t->name, rc);
      failed++;
    } else {
      printf("ok %s\n", t->name);
    }
  }
  if (ran == 0) {
    fprintf(stderr, "no test named %s\n", argc > 1 ? argv[1] : "(any)");
    return 2;
  }
  return failed ? 1 : 0;
}
