/* mgpu bench jacobi: the multi-device Jacobi step of examples/jacobi.h next
 * to the same solver on MPI ranks.
 *
 *   mgpu bench jacobi [--json] [--quick] [--reps N]
 *
 * For 2 and 4 devices (as many as are open) and grids of 256^2, 1024^2
 * and 4096^2 (64^2 and 256^2 with --quick), per iteration: the step
 * captured once as a graph and replayed, and the same step issued op by op,
 * timed alternately in the same process, half of the batches before and
 * half after bench/peers/mpi_jacobi's runs of the same size: the same
 * problem on as many MPI ranks (Open MPI's under mpirun and, where
 * mpicc.mpich was found at configure time, MPICH's under mpiexec.mpich,
 * each under a timeout), each rank sweeping its slab and trading halo rows
 * with MPI_Sendrecv. The ratio is mgpu / MPI (below 1: mgpu is faster),
 * a row for each MPI. All first run 20 iterations from
 * the initial grid and compare the sums of the squares of the grid's cells,
 * which must agree: they do the same arithmetic.
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

/* bench/peers/mpi_jacobi of MPI mpi on ndev ranks over the sizes: us[k]
 * per sweep and sum[k] after CHECK_ITERS sweeps (us[k] 0 where none came
 * back). Returns 0, or -1 with why filled in. */
static int run_mpi(mgpu_cmd_mpi mpi, int ndev, const int *sizes, int nsizes,
                   int reps, int quick, double *us, double *sum, char *why,
                   size_t wlen) {
  char peer[PATH_MAX];
  for (int k = 0; k < nsizes; k++) us[k] = sum[k] = 0;
  if (!mgpu_cmd_mpi_peer(mpi, "mpi_jacobi", ndev, peer, sizeof peer, why, wlen))
    return -1;
  char args[256];
  int len = snprintf(args, sizeof args, "--raw --reps %d --check %d%s --sizes ",
                     reps, CHECK_ITERS, quick ? " --quick" : "");
  for (int k = 0; k < nsizes && len < (int)sizeof args - 16; k++)
    len += snprintf(args + len, sizeof args - (size_t)len, "%s%d",
                    k ? "," : "", sizes[k]);
  FILE *f = mgpu_cmd_mpirun(mpi, ndev, quick ? 120 : 1200, peer, args);
  if (f == NULL) {
    snprintf(why, wlen, "cannot start its launcher");
    return -1;
  }
  int n, got = 1;
  double t, s;
  while (fscanf(f, "%d %lf %lf", &n, &t, &s) == 3)
    for (int k = 0; k < nsizes; k++)
      if (sizes[k] == n) {
        us[k] = t * 1e6;
        sum[k] = s;
      }
  for (int k = 0; k < nsizes; k++) got = got && us[k] > 0;
  if (mgpu_cmd_mpi_close(f, got, why, wlen) == 0) return 0;
  /* A peer that failed (timed out, say) gives no figure, not some. */
  for (int k = 0; k < nsizes; k++) us[k] = sum[k] = 0;
  return -1;
}

/* Each MPI's peer on ndev ranks for size n, where it has not failed
 * before: mpi_us[m] per sweep (0 where it did not run: why[m] says why),
 * its grid checked against mgpu's (by_graph). 0, or 1 when a grid
 * differs. */
static int run_mpis(int ndev, int n, const bench_opts *o, double by_graph,
                    double mpi_us[NMPI], mpi_why why) {
  for (int m = 0; m < NMPI; m++) {
    double sum = 0;
    mpi_us[m] = 0;
    if (why[m][0] != '\0' ||
        run_mpi((mgpu_cmd_mpi)m, ndev, &n, 1, o->reps, o->quick, &mpi_us[m],
                &sum, why[m], sizeof why[m]) != 0)
      continue;
    if (fabs(sum - by_graph) > 1e-9 * fabs(by_graph)) {
      fprintf(stderr, "mgpu bench jacobi: %dx%d: %s's grid after %d sweeps "
              "(sum of squares %.17g) differs from mgpu's (%.17g)\n", n, n,
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), CHECK_ITERS, sum,
              by_graph);
      return 1;
    }
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
 * peers' runs of the same size between them (ABA), so that a drift of the
 * machine over the seconds of a run weighs on both sides alike; mine[0]
 * and mine[1] the medians by graph and op by op, mpi_us[m] each peer's (0
 * when it did not run: why[m] says why). */
static int time_size(int ndev, int n, const bench_opts *o, double *mine,
                     double mpi_us[NMPI], double by_graph, mpi_why why) {
  int reps = o->reps, first = (reps + 1) / 2, iters = jacobi_batch(n, o->quick);
  double *v = malloc(2 * (size_t)reps * sizeof *v);
  if (v == NULL) return mgpu_cmd_fail("bench jacobi", MGPU_ENOMEM);
  int rc = time_both(ndev, n, iters, first, v, v + reps);
  int differs = rc == 0 && run_mpis(ndev, n, o, by_graph, mpi_us, why);
  if (rc == 0 && !differs && reps > first)
    rc = time_both(ndev, n, iters, reps - first, v + first, v + reps + first);
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
