/* mgpu bench graph: what replaying a captured step saves over issuing it.
 *
 *  - the multi-device Jacobi step of examples/jacobi.h (a kernel per
 *    device, halo rows pushed with mgpu_memcpy_async, a stream barrier) on
 *    2 devices (or what is open), per iteration: a captured graph of two
 *    iterations launched again and again, next to the same iterations
 *    issued op by op (the loop a program would otherwise write), in the
 *    same run. (A chain of 8 launches as one graph next to the 8 launches
 *    is a row of `mgpu bench launch`.)
 *
 * Each figure is the median of --reps runs after a warm-up, the graph's
 * runs and op by op's taking turns on the same grid; the ratio is graph /
 * op by op (below 1: the graph is faster).
 */
#include <stdio.h>
#include <stdlib.h>

#include "../examples/jacobi.h"
#include "bench.h"

/* Microseconds per iteration of iters iterations, op by op or (graph) as
 * launches of x. */
static int jacobi_time(jacobi *j, mgpu_graph_exec *x, int iters, double *us) {
  double t0 = bench_now();
  int rc = jacobi_iterate(j, x, iters);
  *us = (bench_now() - t0) / iters * 1e6;
  return rc;
}

/* Median microseconds per iteration over reps runs of iters iterations,
 * op by op (*by_op) and as a graph (*by_graph) on the same grid and
 * streams, the two taking turns (which goes first alternates), so that a
 * machine whose load drifts from second to second weighs on both alike. */
static int jacobi_us(int ndev, int n, int iters, int reps, double *by_op,
                     double *by_graph) {
  jacobi j = {0};
  mgpu_graph *g = NULL;
  mgpu_graph_exec *x = NULL;
  double *v = malloc(2 * (size_t)reps * sizeof *v);
  int rc = v == NULL ? MGPU_ENOMEM : jacobi_init(&j, ndev, n, n);
  if (rc == 0) rc = jacobi_capture(&j, &g);
  if (rc == 0) rc = mgpu_graph_instantiate(g, &x);
  for (int r = -1; r < reps && rc == 0; r++) { /* -1: warm-up */
    double us[2] = {0, 0}; /* op by op, graph */
    for (int k = 0; k < 2 && rc == 0; k++) {
      int graph = (k + r) % 2 != 0;
      rc = jacobi_time(&j, graph ? x : NULL, iters, &us[graph]);
    }
    if (r >= 0) {
      v[r] = us[0];
      v[reps + r] = us[1];
    }
  }
  if (rc == 0) {
    *by_op = bench_median(v, reps);
    *by_graph = bench_median(v + reps, reps);
  }
  if (x != NULL) mgpu_graph_exec_destroy(x);
  if (g != NULL) mgpu_graph_destroy(g);
  jacobi_free(&j);
  free(v);
  return rc;
}

static int failed(bench_report *r, int json, int rc) {
  fprintf(stderr, "mgpu bench graph: %s: %s\n", mgpu_err_name(rc),
          mgpu_error_detail());
  bench_report_finish(r, json);
  return 1;
}

int mgpu_bench_graph(int argc, char **argv) {
  static const char usage[] = "mgpu bench graph [--json] [--quick] "
                              "[--reps N] [DEVICES]";
  bench_opts o;
  char *rest[1];
  int nrest = 0;
  int rc = bench_parse(argc, argv, usage, &o, rest, BENCH_CAP(rest), &nrest);
  if (rc != 0) return rc;
  int ndev = nrest > 0 ? atoi(rest[0]) : 2;
  if (ndev < 1) {
    fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  if (ndev > mgpu_device_count()) ndev = mgpu_device_count();
  bench_report *r = bench_report_new("graph");
  static const int sizes[] = {256, 1024};
  for (int k = 0; k < (o.quick ? 1 : 2); k++) {
    int n = o.quick ? 64 : sizes[k];
    int iters = o.quick ? 20 : n <= 256 ? 400 : 100;
    double by_op = 0, by_graph = 0;
    rc = jacobi_us(ndev, n, iters, o.reps, &by_op, &by_graph);
    if (rc != 0) return failed(r, o.json, rc);
    char name[96];
    snprintf(name, sizeof name, "jacobi %dx%d, %d device%s", n, n, ndev,
             ndev > 1 ? "s" : "");
    bench_report_add(r, name, "per_iter", by_graph, "us", "op by op", by_op);
  }
  bench_report_finish(r, o.json);
  return 0;
}
