/* mgpu bench NAME: runs one benchmark of bench/ (every one is built in). */
#include <string.h>

#include "cmd.h"

/* Each defined in bench/bench-<name>.c. */
int mgpu_bench_launch(int argc, char **argv);
int mgpu_bench_graph(int argc, char **argv);
int mgpu_bench_copy(int argc, char **argv);
int mgpu_bench_p2p(int argc, char **argv);
int mgpu_bench_sched(int argc, char **argv);
int mgpu_bench_allreduce(int argc, char **argv);
#ifdef MGPU_HAVE_MPI
int mgpu_bench_mpi(int argc, char **argv); /* built when MPI is found */
#endif
int mgpu_bench_trace(int argc, char **argv);
int mgpu_bench_store(int argc, char **argv);

typedef struct bench_entry {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
} bench_entry;

int mgpu_cmd_bench(int argc, char **argv) {
  const bench_entry benches[] = {
      {"launch", mgpu_bench_launch, "run_on_device and kernel launch cost"},
      {"graph", mgpu_bench_graph, "graph replay next to the same step op by op"},
      {"copy", mgpu_bench_copy, "H2D, D2H, D2D per device, pageable and pinned"},
      {"p2p", mgpu_bench_p2p, "every ordered pair, direct and staged"},
      {"sched", mgpu_bench_sched, "task pool overhead and skewed makespan"},
      {"allreduce", mgpu_bench_allreduce, "all-reduce algbw and busbw"},
#ifdef MGPU_HAVE_MPI
      {"mpi", mgpu_bench_mpi, "all-reduce of device buffers across MPI ranks"},
#endif
      {"trace", mgpu_bench_trace, "cost of recording a trace, on next to off"},
      {"store", mgpu_bench_store, "store round trips and a 256 MiB get"},
  };
  size_t n = sizeof benches / sizeof benches[0];
  if (argc >= 2) {
    for (size_t i = 0; i < n; i++) {
      if (strcmp(argv[1], benches[i].name) != 0) continue;
      int rc = mgpu_cmd_init();
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
