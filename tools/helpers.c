/* Where the mgpu command finds its helper programs (the benchmarks'
 * baselines, mgpu-bench-mpi): at MGPU_BIN_TO_HELPERS from the command's own
 * folder, ../libexec/mgpu by default. The build tree keeps them at the same
 * place relative to bin/, so a built and an installed command look alike. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd.h"

/* Whether the MPI CMake found (the one the peers named name are built
 * against) is MPICH: then they run under mpiexec.mpich. */
#ifdef MGPU_MAIN_MPI_IS_MPICH
#define MAIN_IS_MPICH 1
#else
#define MAIN_IS_MPICH 0
#endif

#ifndef MGPU_BUILT_HELPERS
#define MGPU_BUILT_HELPERS ","
#endif

int mgpu_cmd_helper_built(const char *name) {
  char item[160];
  int n = snprintf(item, sizeof item, ",%s,", name);
  return n > 0 && (size_t)n < sizeof item &&
         strstr(MGPU_BUILT_HELPERS, item) != NULL;
}

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

int mgpu_cmd_mpi_peer(mgpu_cmd_mpi mpi, const char *name, int ranks,
                      char *out, size_t len, char *why, size_t wlen) {
  /* The CPUs this process may run on (a cpuset or taskset counts), which
   * the peer's ranks inherit. */
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                         : 0;
  if (mpi == MGPU_CMD_MPICH && cpus > 0 && ranks > cpus) {
    snprintf(why, wlen, "not run: MPICH's ranks poll without yielding, and "
             "%d ranks on %d CPUs take milliseconds a step", ranks, cpus);
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
           mpi == MGPU_CMD_MPICH && !MAIN_IS_MPICH ? "_mpich" : "");
  if (mpi == MGPU_CMD_OPEN_MPI && MAIN_IS_MPICH)
    snprintf(why, wlen, "%s was not built against it: the MPI CMake found "
             "when mgpu was configured is MPICH", name);
  else if (mgpu_cmd_helper_path(helper, out, len))
    return 1;
  else if (mgpu_cmd_helper_built(helper))
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
  /* Standard input from /dev/null: timeout puts the launcher in a process
   * group of its own, where MPICH's, which forwards its input, would be
   * stopped reading a terminal. A launcher that outlives the timeout's
   * SIGTERM by 10 s is killed, so that the caller's read of its output
   * ends. */
  int n = snprintf(cmd, sizeof cmd,
                   "%s timeout -k 10 %d %s %d '%s' %s </dev/null",
                   launcher_env[mpi], timeout_s, launchers[mpi], ranks, peer,
                   args);
  if (n < 0 || (size_t)n >= sizeof cmd) return NULL;
  return popen(cmd, "r");
}

int mgpu_cmd_mpi_close(FILE *f, int figures, char *why, size_t wlen) {
  int st = pclose(f);
  if (st == -1)
    snprintf(why, wlen, "its launcher could not be waited for");
  else if (WIFEXITED(st) && WEXITSTATUS(st) == 124)
    snprintf(why, wlen, "its launcher ran out of time");
  else if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
    snprintf(why, wlen, "its launcher exited with status %d",
             WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(why, wlen, "its launcher was ended by signal %d", WTERMSIG(st));
  else if (!figures)
    snprintf(why, wlen, "the peer printed no figure");
  else
    return 0;
  return -1;
}
