/* mgpu version: the version of the library the command is linked with. */
#include "cmd.h"

int mgpu_cmd_version(int argc, char **argv) {
  (void)argv;
  if (argc != 1) {
    fprintf(stderr, "usage: mgpu version\n");
    return 2;
  }
  printf("mgpu %s\n", mgpu_version_string());
  return 0;
}
