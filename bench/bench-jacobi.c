/* mgpu bench jacobi: the multi-device Jacobi step of examples/jacobi.h next
 * to the same solver on MPI ranks.
 *
 *   mgpu bench jacobi [--json] [--quick] [--reps N] [SIZE ...]
 *
 * For 2 and 4 devices (as many as are open) and grids of 256^2, 1024^2
 * and 4096^2 (64^2 and 256^2 with --quick; up to three SIZEs given, those
 * sides), per iteration: the step
 * captured once as a graph and replayed, and the same step issued op by op,
 * next to bench/peers/mpi_jacobi: the same problem on as many MPI ranks
 * (Open MPI's under mpirun and, where mpicc.mpich was found at configure
 * time, MPICH's under mpiexec.mpich, each under a timeout), each rank
 * sweeping its slab and trading halo rows with MPI_Sendrecv. The ratio is
 * mgpu / MPI (below 1: mgpu is faster), a row for each MPI. All first run
 * 20 iterations from the initial grid and compare the sums of the squares
 * of the grid's cells, which must agree: they do the same arithmetic.
 *
 * The sides take turns batch by batch, in the same seconds: the peers are
 * started once a size with --gate, their ranks asleep in a read of a FIFO
 * between batches, and each round runs a batch by graph and one op by op
 * (in the order ABBA over the rounds), then one of each MPI (the two in
 * turn first). The speed of this kind of machine drifts by a third within
 * a minute; with half of mgpu's batches before the peers' runs and half
 * after, single runs of the ratio swung by 10-20 %. Each figure is the
 * median of reps batches after a warm-up round; a batch is about 2^26
 * cell updates (10 to 1000 iterations). */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/jacobi.h"
#include "bench.h"
#include "gate.h"
#include "peers/jacobi-batch.h"
#include "cmd.h"


enum { CHECK_ITERS = 20, MAX_SIZES = 3, NMPI = 2 };

/* Why each MPI's peer (Open MPI's, MPICH's) did not run: empty while it
 * does. A peer that failed is not run again for the next size: each try
 * could wait out its timeout. */
typedef char mpi_why[NMPI][PATH_MAX + 128];

/* The sum of the squares of the interior rows' cells after iters
 * iterations (by graph or op by op) from the initial grid. */
static int checksum(int ndev, int n, int iters, int graph, double *sum) {
  jacobi j;
  mgpu_graph *g = NULL;
  mgpu_graph_exec *x = NULL;
  float *grid = malloc((size_t)n * n * sizeof *grid);
  int rc = grid == NULL ? MGPU_ENOMEM : jacobi_init(&j, ndev, n, n);
  if (rc == 0 && graph) rc = jacobi_capture(&j, &g);
  if (rc == 0 && graph) rc = mgpu_graph_instantiate(g, &x);
  if (rc == 0) rc = jacobi_iterate(&j, x, iters);
  if (rc == 0) rc = jacobi_gather(&j, grid);
  if (rc == 0) {
    *sum = 0;
    for (size_t i = (size_t)n; i < (size_t)(n - 1) * n; i++)
      *sum += (double)grid[i] * grid[i];
  }
  if (x != NULL) mgpu_graph_exec_destroy(x);
  if (g != NULL) mgpu_graph_destroy(g);
  if (grid != NULL) jacobi_free(&j);
  free(grid);
  return rc;
}

/* A peer started with --gate (bench/peers/mpi_jacobi.c) and the grid's
 * checksum it printed when ready. */
typedef struct gate {
  bench_gate g;
  double sum;
} gate;

/* Starts MPI m's peer on ndev ranks for size n, gated, and waits until it
 * is ready: 0, or -1 with why filled in. */
static int gate_start(mgpu_cmd_mpi m, int ndev, int n, const bench_opts *o,
                      gate *g, char *why, size_t wlen) {
  char args[128], ready[64];
  snprintf(args, sizeof args, "--check %d --sizes %d%s", CHECK_ITERS, n,
           o->quick ? " --quick" : "");
  /* The peer lives for one size, seconds. */
  if (bench_gate_start(m, "mpi_jacobi", ndev, o->quick ? 120 : 300, args,
                       &g->g, ready, sizeof ready, why, wlen) != 0)
    return -1;
  if (sscanf(ready, "%lf", &g->sum) == 1) return 0;
  bench_gate_end(&g->g, 0, why, wlen);
  snprintf(why, wlen, "its ready line carried no checksum");
  return -1;
}

/* One batch of g's peer: its seconds per sweep, in microseconds, into
 * *us; -1 when it is gone. */
static int gate_batch(gate *g, double *us) {
  char line[128];
  double t;
  if (bench_gate_batch(&g->g, line, sizeof line) != 0 ||
      sscanf(line, "%lf", &t) != 1 || t <= 0)
    return -1;
  *us = t * 1e6;
  return 0;
}

/* mgpu's batch: iters iterations as launches of x or, with x NULL, op by
 * op, in microseconds per iteration into *us. */
static int mgpu_batch(jacobi *j, mgpu_graph_exec *x, int iters, double *us) {
  double t0 = bench_now();
  int rc = jacobi_iterate(j, x, iters);
  *us = (bench_now() - t0) / iters * 1e6;
  return rc;
}

/* The timed rounds of one size, a warm-up first: in each, a batch by graph
 * and one op by op (in the order ABBA over the rounds), then one of each
 * live MPI peer (the two in turn first). v holds reps figures a side
 * (graph, op by op, then each MPI); live[m] drops to 0 for a peer that
 * stopped answering. */
static int rounds(int ndev, int n, int reps, int quick, gate *g, int *live,
                  double *v) {
  jacobi j;
  mgpu_graph *graph = NULL;
  mgpu_graph_exec *x = NULL;
  int iters = jacobi_batch(n, quick);
  int rc = jacobi_init(&j, ndev, n, n);
  if (rc == 0) rc = jacobi_capture(&j, &graph);
  if (rc == 0) rc = mgpu_graph_instantiate(graph, &x);
  for (int r = -1; r < reps && rc == 0; r++) {
    double us = 0;
    for (int side = 0; side < 2 && rc == 0; side++) {
      int by_graph = side == (r & 1);
      rc = mgpu_batch(&j, by_graph ? x : NULL, iters, &us);
      if (r >= 0) v[(by_graph ? 0 : 1) * reps + r] = us;
    }
    for (int k = 0; k < NMPI && rc == 0; k++) {
      int m = r & 1 ? NMPI - 1 - k : k;
      if (live[m] && gate_batch(&g[m], &us) != 0) live[m] = 0;
      if (live[m] && r >= 0) v[(2 + m) * reps + r] = us;
    }
  }
  if (x != NULL) mgpu_graph_exec_destroy(x);
  if (graph != NULL) mgpu_graph_destroy(graph);
  jacobi_free(&j);
  return rc;
}

/* The checks of one size: the graph's grid and op by op's agree. */
static int check_size(int ndev, int n, double *by_graph) {
  double by_op;
  int rc = checksum(ndev, n, CHECK_ITERS, 1, by_graph);
  if (rc == 0) rc = checksum(ndev, n, CHECK_ITERS, 0, &by_op);
  if (rc != 0) return mgpu_cmd_fail("bench jacobi", rc);
  if (*by_graph != by_op) {
    fprintf(stderr, "mgpu bench jacobi: %dx%d on %d devices: the graph's "
            "grid (sum of squares %.17g) differs from op by op's (%.17g)\n",
            n, n, ndev, *by_graph, by_op);
    return 1;
  }
  return 0;
}

/* One size on ndev devices: each MPI's peer started once, gated, then
 * rounds of mgpu's batches and the peers' in turn, so that a drift of the
 * machine over the seconds of a run weighs on every side alike; mine[0]
 * and mine[1] the medians by graph and op by op, mpi_us[m] each peer's (0
 * when it did not run: why[m] says why). 0; 1 when a peer's grid differs
 * from mgpu's (by_graph); else the command's failure. */
static int time_size(int ndev, int n, const bench_opts *o, double *mine,
                     double mpi_us[NMPI], double by_graph, mpi_why why) {
  int reps = o->reps, live[NMPI], started[NMPI], differs = 0;
  gate g[NMPI];
  double *v = malloc((size_t)(2 + NMPI) * (size_t)reps * sizeof *v);
  if (v == NULL) return mgpu_cmd_fail("bench jacobi", MGPU_ENOMEM);
  void (*pipe_was)(int) = signal(SIGPIPE, SIG_IGN); /* a rank that died */
  for (int m = 0; m < NMPI; m++) {
    mpi_us[m] = 0;
    started[m] = live[m] =
        why[m][0] == '\0' && gate_start((mgpu_cmd_mpi)m, ndev, n, o, &g[m],
                                        why[m], sizeof why[m]) == 0;
  }
  int rc = rounds(ndev, n, reps, o->quick, g, live, v);
  for (int m = 0; m < NMPI; m++) {
    /* A peer that failed gives no figure, not some. */
    if (!started[m] ||
        bench_gate_end(&g[m].g, live[m], why[m], sizeof why[m]) != 0)
      continue;
    if (fabs(g[m].sum - by_graph) > 1e-9 * fabs(by_graph)) {
      fprintf(stderr, "mgpu bench jacobi: %dx%d: %s's grid after %d sweeps "
              "(sum of squares %.17g) differs from mgpu's (%.17g)\n", n, n,
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), CHECK_ITERS, g[m].sum,
              by_graph);
      differs = 1;
    }
    mpi_us[m] = bench_median(v + (2 + m) * reps, reps);
  }
  signal(SIGPIPE, pipe_was);
  if (rc == 0 && !differs) {
    mine[0] = bench_median(v, reps);
    mine[1] = bench_median(v + reps, reps);
  }
  free(v);
  if (rc != 0) return mgpu_cmd_fail("bench jacobi", rc);
  return differs;
}

/* One device count: mgpu's figures, the MPI peers', the checks. */
static int one_count(int ndev, const int *sizes, int nsizes,
                     const bench_opts *o, bench_report *r) {
  mpi_why why = {"", ""};
  for (int k = 0; k < nsizes; k++) {
    double by_graph = 0, mine[2] = {0, 0}, mpi_us[NMPI] = {0, 0};
    int rc = check_size(ndev, sizes[k], &by_graph);
    if (rc == 0)
      rc = time_size(ndev, sizes[k], o, mine, mpi_us, by_graph, why);
    if (rc != 0) return rc;
    for (int how = 0; how < 2; how++) {
      char name[96], base[64];
      snprintf(name, sizeof name, "jacobi %dx%d, %d devices, %s", sizes[k],
               sizes[k], ndev, how == 0 ? "graph" : "op by op");
      for (int m = 0; m < NMPI; m++) {
        if (mpi_us[m] <= 0) continue;
        snprintf(base, sizeof base, "%s ranks, MPI_Sendrecv halos",
                 mgpu_cmd_mpi_name((mgpu_cmd_mpi)m));
        bench_report_add(r, name, "per_iter", mine[how], "us", base,
                         mpi_us[m]);
      }
      /* No MPI ran: the row's baseline says why Open MPI's did not. */
      if (mpi_us[0] <= 0 && mpi_us[1] <= 0)
        bench_report_add(r, name, "per_iter", mine[how], "us", why[0], 0);
    }
  }
  for (int m = 0; m < NMPI; m++)
    if (why[m][0] != '\0')
      fprintf(stderr, "mgpu bench jacobi: no %s baseline on %d ranks: %s\n",
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), ndev, why[m]);
  return 0;
}

int mgpu_bench_jacobi(int argc, char **argv) {
  static const char usage[] =
      "mgpu bench jacobi [--json] [--quick] [--reps N] [SIZE ...]";
  bench_opts o;
  char *rest[MAX_SIZES];
  int nrest = 0;
  int rc = bench_parse(argc, argv, usage, &o, rest, BENCH_CAP(rest), &nrest);
  if (rc != 0) return rc;
  static const int full[MAX_SIZES] = {256, 1024, 4096}, quick[] = {64, 256};
  int given[MAX_SIZES];
  for (int k = 0; k < nrest; k++) { /* SIZE: the grid's side, 8..16384 */
    char *end;
    long v = strtol(rest[k], &end, 10);
    if (end == rest[k] || *end != '\0' || v < 8 || v > 16384) {
      fprintf(stderr, "mgpu bench jacobi: a grid's side is 8 to 16384, not "
              "'%s'\nusage: %s\n", rest[k], usage);
      return 2;
    }
    given[k] = (int)v;
  }
  const int *sizes = nrest > 0 ? given : o.quick ? quick : full;
  int nsizes = nrest > 0 ? nrest : o.quick ? 2 : MAX_SIZES;
  int open = mgpu_device_count();
  bench_report *r = bench_report_new("jacobi");
  for (int ndev = 2; ndev <= 4 && ndev <= open && rc == 0; ndev += 2)
    rc = one_count(ndev, sizes, nsizes, &o, r);
  bench_report_finish(r, o.json);
  return rc;
}
