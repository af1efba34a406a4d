/* mgpu version [--json]: the version of the library the command is linked
 * with, and with --json also what this build was configured with. */
#include <string.h>

#include "cmd.h"

#ifdef MGPU_HAVE_CUDA
#define HAVE_CUDA "true"
#else
#define HAVE_CUDA "false"
#endif
#ifdef MGPU_HAVE_NCCL
#define HAVE_NCCL "true"
#else
#define HAVE_NCCL "false"
#endif
#ifdef MGPU_HAVE_MPI
#define HAVE_MPI "true"
#else
#define HAVE_MPI "false"
#endif
#ifdef MGPU_HAVE_HWLOC
#define HAVE_HWLOC "true"
#else
#define HAVE_HWLOC "false"
#endif

int mgpu_cmd_version(int argc, char **argv) {
  int json = argc == 2 && strcmp(argv[1], "--json") == 0;
  if (argc != 1 && !json) {
    fprintf(stderr, "usage: mgpu version [--json]\n");
    return 2;
  }
  if (!json) {
    printf("mgpu %s\n", mgpu_version_string());
    return 0;
  }
  unsigned v = mgpu_version();
  printf("{\"version\": \"%s\", \"major\": %u, \"minor\": %u, \"patch\": %u, "
         "\"built_with\": {\"cuda\": " HAVE_CUDA ", \"nccl\": " HAVE_NCCL
         ", \"mpi\": " HAVE_MPI ", \"hwloc\": " HAVE_HWLOC "}}\n",
         mgpu_version_string(), v >> 16, (v >> 8) & 0xff, v & 0xff);
  return 0;
}
