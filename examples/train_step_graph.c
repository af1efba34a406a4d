/* A data-parallel training step, captured once as a graph and replayed.
 *
 * Every device holds a copy of the weights w and computes a gradient
 * g = c_d * w (c_d = 0.01 (d + 1), a stand-in for its own batch); an
 * all-reduce sums the gradients over the devices, and every device applies
 * w -= (lr / n) * g. Captured from the devices' streams (the other streams
 * join the first through an event and rejoin it at the end), the step is
 * one graph launch: copy, scale, the all-reduce (recorded as a group, one
 * call per rank), axpy. The weights after STEPS launches are checked
 * against the closed form on the host, w0 (1 - lr C / n)^STEPS with C the
 * sum of the c_d; the same steps issued op by op are timed beside it
 * (after one untimed run of each). Usage: train_step_graph [STEPS]. */
#include <math.h>
#include <mgpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "check.h"

#define LEN 4096
#define STEPS 200 /* unless the first argument says how many */
#define LR 0.5

typedef struct step {
  int n;
  mgpu_comm *comm;
  mgpu_stream **s;
  mgpu_buffer **w, **g;
  mgpu_event *start, **done;
} step;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One step's work on the streams: captured, or run as it is queued. */
static void queue_step(const step *st) {
  CHECK(mgpu_event_record(st->start, st->s[0]));
  for (int d = 1; d < st->n; d++)
    CHECK(mgpu_stream_wait_event(st->s[d], st->start)); /* joins */
  for (int d = 0; d < st->n; d++) {
    CHECK(mgpu_memcpy_async(st->g[d], 0, st->w[d], 0, LEN * sizeof(float),
                            st->s[d]));
    CHECK(mgpu_scale(st->s[d], st->g[d], 0, LEN, MGPU_FLOAT32,
                     0.01 * (d + 1)));
  }
  CHECK(mgpu_group_begin());
  for (int d = 0; d < st->n; d++)
    CHECK(mgpu_allreduce(st->comm, d, st->g[d], st->g[d], LEN, MGPU_FLOAT32,
                         MGPU_SUM, st->s[d]));
  CHECK(mgpu_group_end());
  for (int d = 0; d < st->n; d++) {
    CHECK(mgpu_axpy(st->s[d], st->w[d], 0, st->g[d], 0, LEN, MGPU_FLOAT32,
                    -LR / st->n));
    CHECK(mgpu_event_record(st->done[d], st->s[d]));
  }
  for (int d = 1; d < st->n; d++) /* rejoins the first stream */
    CHECK(mgpu_stream_wait_event(st->s[0], st->done[d]));
}

/* Sets every device's weights to 1; 1 when each is want within 1e-4
 * relative after the steps (reset 0: just compares). */
static int weights(const step *st, int reset, double want) {
  float *h = malloc(LEN * sizeof *h);
  if (h == NULL) {
    fprintf(stderr, "train_step_graph: out of host memory for %d weights\n",
            LEN);
    exit(1);
  }
  int ok = 1;
  for (int d = 0; d < st->n; d++) {
    if (reset) {
      for (int i = 0; i < LEN; i++) h[i] = 1.0f;
      CHECK(mgpu_memcpy_htod(st->w[d], 0, h, LEN * sizeof *h));
      continue;
    }
    CHECK(mgpu_memcpy_dtoh(h, st->w[d], 0, LEN * sizeof *h));
    for (int i = 0; i < LEN; i++) ok &= fabs(h[i] - want) <= 1e-4 * want;
  }
  free(h);
  return ok;
}

static void setup(step *st) {
  int count = mgpu_device_count(), devs[64];
  mgpu_device_props p0 = {.size = sizeof p0}, p = {.size = sizeof p};
  CHECK(mgpu_device_get_props(0, &p0));
  st->n = 0;
  for (int d = 0; d < count && st->n < 64; d++) {
    CHECK(mgpu_device_get_props(d, &p)); /* one backend per communicator */
    if (p.backend_kind == p0.backend_kind) devs[st->n++] = d;
  }
  CHECK(mgpu_comm_create(devs, st->n, &st->comm));
  st->s = calloc((size_t)st->n, sizeof *st->s);
  st->w = calloc((size_t)st->n, sizeof *st->w);
  st->g = calloc((size_t)st->n, sizeof *st->g);
  st->done = calloc((size_t)st->n, sizeof *st->done);
  CHECK(mgpu_event_create(&st->start, devs[0]));
  for (int d = 0; d < st->n; d++) {
    CHECK(mgpu_stream_create(&st->s[d], devs[d]));
    CHECK(mgpu_malloc(&st->w[d], devs[d], LEN * sizeof(float)));
    CHECK(mgpu_malloc(&st->g[d], devs[d], LEN * sizeof(float)));
    CHECK(mgpu_event_create(&st->done[d], devs[d]));
  }
}

static void teardown(step *st) {
  for (int d = 0; d < st->n; d++) {
    CHECK(mgpu_event_destroy(st->done[d]));
    CHECK(mgpu_free(st->w[d]));
    CHECK(mgpu_free(st->g[d]));
    CHECK(mgpu_stream_destroy(st->s[d]));
  }
  CHECK(mgpu_event_destroy(st->start));
  CHECK(mgpu_comm_destroy(st->comm));
  free(st->s);
  free(st->w);
  free(st->g);
  free(st->done);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : STEPS;
  if (steps < 1) {
    fprintf(stderr, "usage: train_step_graph [STEPS >= 1]\n");
    return 2;
  }
  CHECK(mgpu_init(NULL));
  step st;
  setup(&st);
  double c = 0;
  for (int d = 0; d < st.n; d++) c += 0.01 * (d + 1);
  double want = pow(1.0 - LR * c / st.n, steps);

  mgpu_graph *graph;
  mgpu_graph_exec *exec;
  CHECK(mgpu_stream_begin_capture(st.s[0]));
  queue_step(&st);
  CHECK(mgpu_stream_end_capture(st.s[0], &graph));
  CHECK(mgpu_graph_instantiate(graph, &exec));
  /* One of each first, untimed: first uses set things up. */
  CHECK(mgpu_graph_launch(exec, st.s[0]));
  queue_step(&st);
  CHECK(mgpu_stream_synchronize(st.s[0]));
  weights(&st, 1, 0);
  double t0 = now_s();
  for (int k = 0; k < steps; k++) CHECK(mgpu_graph_launch(exec, st.s[0]));
  CHECK(mgpu_stream_synchronize(st.s[0]));
  double t_graph = (now_s() - t0) / steps;
  int ok_graph = weights(&st, 0, want);

  weights(&st, 1, 0);
  t0 = now_s();
  for (int k = 0; k < steps; k++) queue_step(&st);
  CHECK(mgpu_stream_synchronize(st.s[0]));
  double t_ops = (now_s() - t0) / steps;
  int ok_ops = weights(&st, 0, want);

  printf("train_step_graph: %d devices, %d steps of %d weights: graph of "
         "%d nodes %s, op by op %s (w = %.6f); %.1f us a step as a graph, "
         "%.1f us op by op\n", st.n, steps, LEN,
         mgpu_graph_node_count(graph), ok_graph ? "ok" : "WRONG",
         ok_ops ? "ok" : "WRONG", want, t_graph * 1e6, t_ops * 1e6);
  CHECK(mgpu_graph_exec_destroy(exec));
  CHECK(mgpu_graph_destroy(graph));
  teardown(&st);
  CHECK(mgpu_shutdown());
  return ok_graph && ok_ops ? 0 : 1;
}
