/* Where the mgpu command finds its helper programs (the benchmarks'
 * baselines, mgpu-bench-mpi): at MGPU_BIN_TO_HELPERS from the command's own
 * folder, ../libexec/mgpu by default. The build tree keeps them at the same
 * place relative to bin/, so a built and an installed command look alike. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

int mgpu_cmd_helper_path(const char *name, char *out, size_t len) {
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  char *slash = k > 0 ? (self[k] = '\0', strrchr(self, '/')) : NULL;
  if (slash == NULL) {
    snprintf(out, len, "%s/%s", MGPU_BIN_TO_HELPERS, name);
    return 0;
  }
  *slash = '\0';
  int n = snprintf(out, len, "%s/%s/%s", self, MGPU_BIN_TO_HELPERS, name);
  if (n < 0 || (size_t)n >= len) return 0;
  return access(out, X_OK) == 0;
}

int mgpu_cmd_mpi_peer(const char *name, int built, char *out, size_t len,
                      char *why, size_t wlen) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    snprintf(why, wlen, "mpirun not found");
    return 0;
  }
  if (mgpu_cmd_helper_path(name, out, len)) return 1;
  if (built)
    snprintf(why, wlen, "%s is missing (it is built and installed with this "
             "command)", out);
  else
    snprintf(why, wlen, "%s was not built: CMake found no MPI C library when "
             "mgpu was configured", name);
  return 0;
}

FILE *mgpu_cmd_mpirun(int ranks, int timeout_s, const char *peer,
                      const char *args) {
  char cmd[PATH_MAX + 1024];
  int n = snprintf(cmd, sizeof cmd,
                   "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                   "timeout %d mpirun --oversubscribe --bind-to none -np %d "
                   "'%s' %s", timeout_s, ranks, peer, args);
  if (n < 0 || (size_t)n >= sizeof cmd) return NULL;
  return popen(cmd, "r");
}
