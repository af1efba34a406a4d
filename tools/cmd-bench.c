/* mgpu bench NAME: runs one benchmark of bench/. Every one is built in but
 * `mgpu bench mpi`, the program mgpu-bench-mpi among the command's helpers:
 * it links MPI, which the command itself does not, so that the command
 * starts where MPI is absent. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

/* Each defined in bench/bench-<name>.c. */
int mgpu_bench_launch(int argc, char **argv);
int mgpu_bench_graph(int argc, char **argv);
int mgpu_bench_jacobi(int argc, char **argv);
int mgpu_bench_copy(int argc, char **argv);
int mgpu_bench_p2p(int argc, char **argv);
int mgpu_bench_sched(int argc, char **argv);
int mgpu_bench_allreduce(int argc, char **argv);
int mgpu_bench_barrier(int argc, char **argv);
int mgpu_bench_trace(int argc, char **argv);
int mgpu_bench_store(int argc, char **argv);

typedef struct bench_entry {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
  int own_process; /* runs a helper program: the command does not init */
} bench_entry;

/* mgpu bench mpi: replaces this process with mgpu-bench-mpi, so that under
 * mpirun the rank is the helper, with the same environment. */
static int bench_mpi(int argc, char **argv) {
  (void)argc;
#ifdef MGPU_HAVE_MPI
  char path[PATH_MAX];
  if (!mgpu_cmd_helper_path("mgpu-bench-mpi", path, sizeof path)) {
    fprintf(stderr, "mgpu bench mpi: %s is missing: it is built and "
            "installed with this command (make install puts it there)\n",
            path);
    return 1;
  }
  argv[0] = path;
  execv(path, argv);
  fprintf(stderr, "mgpu bench mpi: cannot run %s: %s\n", path,
          strerror(errno));
  return 1;
#else
  (void)argv;
  fprintf(stderr, "mgpu bench mpi: mgpu was built without MPI (CMake found "
          "no MPI C library, or MGPU_WITH_MPI=OFF)\n");
  return 1;
#endif
}

int mgpu_cmd_bench(int argc, char **argv) {
  const bench_entry benches[] = {
      {"launch", mgpu_bench_launch, "run_on_device and kernel launch cost", 0},
      {"graph", mgpu_bench_graph, "graph replay next to the same step op by op",
       0},
      {"jacobi", mgpu_bench_jacobi, "the Jacobi step, graph and op by op, "
       "next to MPI ranks", 0},
      {"copy", mgpu_bench_copy, "H2D, D2H, D2D per device, pageable and pinned",
       0},
      {"p2p", mgpu_bench_p2p, "every ordered pair, direct and staged", 0},
      {"sched", mgpu_bench_sched, "task pool overhead and skewed makespan", 0},
      {"allreduce", mgpu_bench_allreduce, "all-reduce algbw and busbw", 0},
      {"barrier", mgpu_bench_barrier, "host barrier next to pthread and "
       "MPI_Barrier", 0},
      {"mpi", bench_mpi, "all-reduce of device buffers across MPI ranks", 1},
      {"trace", mgpu_bench_trace, "cost of recording a trace, on next to off",
       0},
      {"store", mgpu_bench_store, "store round trips and a 256 MiB get", 0},
  };
  size_t n = sizeof benches / sizeof benches[0];
  if (argc >= 2) {
    for (size_t i = 0; i < n; i++) {
      if (strcmp(argv[1], benches[i].name) != 0) continue;
      int rc = benches[i].own_process ? 0 : mgpu_cmd_init();
      if (rc != 0) return rc;
      return benches[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "mgpu bench: unknown benchmark '%s'\n", argv[1]);
  }
  fprintf(stderr, "usage: mgpu bench NAME [--json] [--quick] [--reps N]\n\n");
  for (size_t i = 0; i < n; i++)
    fprintf(stderr, "  %-10s %s\n", benches[i].name, benches[i].help);
  return 2;
}
