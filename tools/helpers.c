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

/* The launcher of each MPI a peer may be built against: what it needs in
 * the environment, and the command that starts n ranks. */
static const char *const launcher_env[] = {
    [MGPU_CMD_OPEN_MPI] = "OMPI_ALLOW_RUN_AS_ROOT=1 "
                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    [MGPU_CMD_MPICH] = "",
};
static const char *const launchers[] = {
    [MGPU_CMD_OPEN_MPI] = "mpirun --oversubscribe --bind-to none -np",
    [MGPU_CMD_MPICH] = "mpiexec.mpich -n",
};
static const char *const launcher_names[] = {
    [MGPU_CMD_OPEN_MPI] = "mpirun",
    [MGPU_CMD_MPICH] = "mpiexec.mpich",
};
static const char *const mpi_names[] = {
    [MGPU_CMD_OPEN_MPI] = "Open MPI",
    [MGPU_CMD_MPICH] = "MPICH",
};

const char *mgpu_cmd_mpi_name(mgpu_cmd_mpi mpi) { return mpi_names[mpi]; }

int mgpu_cmd_mpi_peer(mgpu_cmd_mpi mpi, const char *name, int built,
                      int ranks, char *out, size_t len, char *why,
                      size_t wlen) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (mpi == MGPU_CMD_MPICH && cpus > 0 && ranks > cpus) {
    snprintf(why, wlen, "not run: MPICH's ranks poll without yielding, and "
             "%d ranks on %ld CPUs take milliseconds a step", ranks, cpus);
    return 0;
  }
  char probe[96];
  snprintf(probe, sizeof probe, "command -v %s >/dev/null 2>&1",
           launcher_names[mpi]);
  if (system(probe) != 0) {
    snprintf(why, wlen, "%s not found", launcher_names[mpi]);
    return 0;
  }
  char helper[128];
  snprintf(helper, sizeof helper, "%s%s", name,
           mpi == MGPU_CMD_MPICH ? "_mpich" : "");
  if (mgpu_cmd_helper_path(helper, out, len)) return 1;
  if (built)
    snprintf(why, wlen, "%s is missing (it is built and installed with this "
             "command)", out);
  else if (mpi == MGPU_CMD_MPICH)
    snprintf(why, wlen, "%s was not built: CMake found no mpicc.mpich beside "
             "another MPI when mgpu was configured", helper);
  else
    snprintf(why, wlen, "%s was not built: CMake found no MPI C library when "
             "mgpu was configured", name);
  return 0;
}

FILE *mgpu_cmd_mpirun(mgpu_cmd_mpi mpi, int ranks, int timeout_s,
                      const char *peer, const char *args) {
  char cmd[PATH_MAX + 1024];
  int n = snprintf(cmd, sizeof cmd, "%s timeout %d %s %d '%s' %s",
                   launcher_env[mpi], timeout_s, launchers[mpi], ranks, peer,
                   args);
  if (n < 0 || (size_t)n >= sizeof cmd) return NULL;
  return popen(cmd, "r");
}
