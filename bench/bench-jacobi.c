/* mgpu bench jacobi: the multi-device Jacobi step of examples/jacobi.h next
 * to the same solver on MPI ranks.
 *
 *   mgpu bench jacobi [--json] [--quick] [--reps N]
 *
 * For 2 and 4 devices (as many as are open) and grids of 256^2, 1024^2
 * and 4096^2 (64^2 and 256^2 with --quick), per iteration: the step
 * captured once as a graph and replayed, and the same step issued op by op,
 * timed alternately in the same process, half of the batches before and
 * half after bench/peers/mpi_jacobi's run of the same size: the same
 * problem on as many MPI ranks under mpirun (and a timeout), each rank
 * sweeping its slab and trading halo rows with MPI_Sendrecv. The ratio is
 * mgpu / MPI (below 1: mgpu is faster). Both first run 20 iterations from
 * the initial grid and compare the sums of the squares of the grid's cells,
 * which must agree: the two do the same arithmetic.
 *
 * Each figure is the median of reps batches after a warm-up; a batch is
 * about 2^26 cell updates (10 to 1000 iterations). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/jacobi.h"
#include "bench.h"
#include "peers/jacobi-batch.h"
#include "cmd.h"

#ifdef MGPU_PEER_MPI_JACOBI
#define PEER_BUILT 1
#else
#define PEER_BUILT 0
#endif

enum { CHECK_ITERS = 20, MAX_SIZES = 3 };

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
  for (int it = 0; it < iters && rc == 0; it += 2)
    rc = graph ? mgpu_graph_launch(x, j.s[0]) : jacobi_run(&j, 2);
  if (rc == 0) rc = jacobi_sync(&j);
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

/* Microseconds per iteration of reps batches by graph (graph_us) and op
 * by op (op_us), batches of the two alternating in the order ABBA. */
static int time_both(int ndev, int n, int iters, int reps, double *graph_us,
                     double *op_us) {
  jacobi j;
  mgpu_graph *g = NULL;
  mgpu_graph_exec *x = NULL;
  int rc = jacobi_init(&j, ndev, n, n);
  if (rc == 0) rc = jacobi_capture(&j, &g);
  if (rc == 0) rc = mgpu_graph_instantiate(g, &x);
  for (int r = -1; r < reps && rc == 0; r++) { /* -1: warm-up */
    for (int side = 0; side < 2 && rc == 0; side++) {
      int by_graph = side == (r & 1); /* ABBA: neither always goes first */
      double t0 = bench_now();
      if (by_graph)
        for (int it = 0; it < iters && rc == 0; it += 2)
          rc = mgpu_graph_launch(x, j.s[0]);
      else
        rc = jacobi_run(&j, iters);
      if (rc == 0) rc = jacobi_sync(&j);
      if (r >= 0)
        (by_graph ? graph_us : op_us)[r] = (bench_now() - t0) / iters * 1e6;
    }
  }
  if (x != NULL) mgpu_graph_exec_destroy(x);
  if (g != NULL) mgpu_graph_destroy(g);
  jacobi_free(&j);
  return rc;
}

/* bench/peers/mpi_jacobi on ndev ranks over the sizes: us[k] per sweep
 * and sum[k] after CHECK_ITERS sweeps (us[k] 0 where none came back).
 * Returns 0, or -1 with why filled in. */
static int run_mpi(int ndev, const int *sizes, int nsizes, int reps,
                   int quick, double *us, double *sum, char *why, size_t wlen) {
  char peer[PATH_MAX];
  for (int k = 0; k < nsizes; k++) us[k] = sum[k] = 0;
  if (!mgpu_cmd_mpi_peer("mpi_jacobi", PEER_BUILT, peer, sizeof peer, why, wlen))
    return -1;
  char args[256];
  int len = snprintf(args, sizeof args, "--raw --reps %d --check %d%s --sizes ",
                     reps, CHECK_ITERS, quick ? " --quick" : "");
  for (int k = 0; k < nsizes && len < (int)sizeof args - 16; k++)
    len += snprintf(args + len, sizeof args - (size_t)len, "%s%d",
                    k ? "," : "", sizes[k]);
  FILE *f = mgpu_cmd_mpirun(ndev, quick ? 120 : 1200, peer, args);
  if (f == NULL) {
    snprintf(why, wlen, "cannot start mpirun");
    return -1;
  }
  int n;
  double t, s;
  while (fscanf(f, "%d %lf %lf", &n, &t, &s) == 3)
    for (int k = 0; k < nsizes; k++)
      if (sizes[k] == n) {
        us[k] = t * 1e6;
        sum[k] = s;
      }
  int st = pclose(f);
  if (st != 0) {
    snprintf(why, wlen, "mpirun exited with status %d", st);
    return -1;
  }
  return 0;
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

/* One size on ndev devices: mgpu's batches in two halves with the MPI
 * peer's run of the same size between them (ABA), so that a drift of the
 * machine over the seconds of a run weighs on both sides alike; mine[0]
 * and mine[1] the medians by graph and op by op, *mpi_us the peer's (0
 * when it did not run: why says why). */
static int time_size(int ndev, int n, const bench_opts *o, double *mine,
                     double *mpi_us, double by_graph, char *why,
                     size_t wlen) {
  int reps = o->reps, first = (reps + 1) / 2, iters = jacobi_batch(n, o->quick);
  double *v = malloc(2 * (size_t)reps * sizeof *v), mpi_sum = 0;
  if (v == NULL) return mgpu_cmd_fail("bench jacobi", MGPU_ENOMEM);
  int rc = time_both(ndev, n, iters, first, v, v + reps);
  /* A peer that failed (why is set) is not run again for the next size:
   * each try could wait out its timeout. */
  int have_mpi = rc == 0 && why[0] == '\0' &&
                 run_mpi(ndev, &n, 1, reps, o->quick, mpi_us, &mpi_sum, why,
                         wlen) == 0;
  if (have_mpi && *mpi_us <= 0) {
    snprintf(why, wlen, "the MPI peer printed no figure for %dx%d", n, n);
    have_mpi = 0;
  }
  if (rc == 0 && reps > first)
    rc = time_both(ndev, n, iters, reps - first, v + first, v + reps + first);
  if (rc == 0) {
    mine[0] = bench_median(v, reps);
    mine[1] = bench_median(v + reps, reps);
  }
  free(v);
  if (rc != 0) return mgpu_cmd_fail("bench jacobi", rc);
  if (!have_mpi) *mpi_us = 0;
  if (have_mpi && fabs(mpi_sum - by_graph) > 1e-9 * fabs(by_graph)) {
    fprintf(stderr, "mgpu bench jacobi: %dx%d: MPI's grid after %d sweeps "
            "(sum of squares %.17g) differs from mgpu's (%.17g)\n",
            n, n, CHECK_ITERS, mpi_sum, by_graph);
    return 1;
  }
  return 0;
}

/* One device count: mgpu's figures, the MPI peer's, the checks. */
static int one_count(int ndev, const int *sizes, int nsizes,
                     const bench_opts *o, bench_report *r) {
  char why[PATH_MAX + 128] = ""; /* why the MPI peer did not run */
  for (int k = 0; k < nsizes; k++) {
    double by_graph = 0, mine[2] = {0, 0}, mpi_us = 0;
    char name[96];
    int rc = check_size(ndev, sizes[k], &by_graph);
    if (rc == 0)
      rc = time_size(ndev, sizes[k], o, mine, &mpi_us, by_graph, why,
                     sizeof why);
    if (rc != 0) return rc;
    const char *base = mpi_us > 0 ? "MPI ranks, MPI_Sendrecv halos" : why;
    snprintf(name, sizeof name, "jacobi %dx%d, %d devices, graph", sizes[k],
             sizes[k], ndev);
    bench_report_add(r, name, "per_iter", mine[0], "us", base, mpi_us);
    snprintf(name, sizeof name, "jacobi %dx%d, %d devices, op by op",
             sizes[k], sizes[k], ndev);
    bench_report_add(r, name, "per_iter", mine[1], "us", base, mpi_us);
  }
  return 0;
}

int mgpu_bench_jacobi(int argc, char **argv) {
  static const char usage[] = "mgpu bench jacobi [--json] [--quick] [--reps N]";
  bench_opts o;
  char *rest[2];
  int nrest = 0;
  int rc = bench_parse(argc, argv, usage, &o, rest, &nrest);
  if (rc != 0) return rc;
  if (nrest != 0) {
    fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  static const int full[MAX_SIZES] = {256, 1024, 4096}, quick[] = {64, 256};
  const int *sizes = o.quick ? quick : full;
  int nsizes = o.quick ? 2 : MAX_SIZES, open = mgpu_device_count();
  bench_report *r = bench_report_new("jacobi");
  for (int ndev = 2; ndev <= 4 && ndev <= open && rc == 0; ndev += 2)
    rc = one_count(ndev, sizes, nsizes, &o, r);
  bench_report_finish(r, o.json);
  return rc;
}
