/* mgpu bench trace: what recording a trace costs.
 *
 * Every figure is measured with tracing off and on in the same run,
 * alternating in the order ABBA (off, on, on, off ...) so that drift of the
 * machine hits both alike and neither always runs right after the other;
 * each is the median of the repetitions after a warm-up, and the time to
 * write the file at mgpu_trace_stop is outside the timing.
 *
 * 1. One span recorded by mgpu_trace_span from one thread (the recorder's
 *    own cost: a name copy, a few stores, a release), next to the same call
 *    with tracing off (one branch).
 * 2. The task pool: N empty tasks over every device (the pool's overhead
 *    figure of `mgpu bench sched`), ns per task with tracing on next to off;
 *    and from it the cost per recorded event in a real layer: the extra time
 *    divided by the events the recording kept.
 * 3. A 64 MiB float all-reduce over every device, time with tracing on next
 *    to off.
 * Targets (docs/PERF.md): at most 5% slowdown, at most 100 ns per recorded
 * event on host devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

enum { SPANS = 100000, TASKS = 20000, MAXDEV = 8 };
#define ALLREDUCE_BYTES ((size_t)64 << 20)

static char trace_path[256];

static int fail(const char *what, int rc) {
  fprintf(stderr, "mgpu bench trace: %s: %s (%s)\n", what, mgpu_err_name(rc),
          mgpu_error_detail());
  return 1;
}

/* Starts (on) or not; returns 0 or the code. */
static int trace_begin(int on) { return on ? mgpu_trace_start(trace_path) : 0; }

/* Stops (when on) and adds the events kept to *events. */
static int trace_end(int on, double *events) {
  if (!on) return 0;
  int rc = mgpu_trace_stop();
  mgpu_trace_stats st = {.size = sizeof st};
  if (rc == 0) rc = mgpu_trace_stats_get(&st);
  if (events != NULL) *events += (double)st.events;
  remove(trace_path);
  return rc;
}

static double spans_ns(void) {
  uint64_t t = mgpu_trace_now_ns();
  double t0 = bench_now();
  for (int i = 0; i < SPANS; i++) mgpu_trace_span("kernel bench", t + i, t + i + 5);
  return (bench_now() - t0) * 1e9 / SPANS;
}

static int empty_task(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  (void)arg;
  return 0;
}

static int tasks_ns(mgpu_pool *pool, double *ns) {
  double t0 = bench_now();
  for (int i = 0; i < TASKS; i++) {
    int rc = mgpu_pool_submit_fn(pool, empty_task, NULL, NULL);
    if (rc != 0) return rc;
  }
  int rc = mgpu_pool_wait_all(pool);
  *ns = (bench_now() - t0) * 1e9 / TASKS;
  return rc;
}

typedef struct reduce_setup {
  int n;
  mgpu_comm *comm;
  mgpu_stream *s[MAXDEV];
  mgpu_buffer *send[MAXDEV], *recv[MAXDEV];
} reduce_setup;

static int allreduce_ms(reduce_setup *st, double *ms) {
  size_t count = ALLREDUCE_BYTES / sizeof(float);
  double t0 = bench_now();
  int rc = mgpu_group_begin();
  for (int r = 0; r < st->n && rc == 0; r++)
    rc = mgpu_allreduce(st->comm, r, st->send[r], st->recv[r], count,
                        MGPU_FLOAT32, MGPU_SUM, st->s[r]);
  int erc = mgpu_group_end();
  if (rc == 0) rc = erc;
  for (int r = 0; r < st->n && rc == 0; r++) rc = mgpu_stream_synchronize(st->s[r]);
  *ms = (bench_now() - t0) * 1e3;
  return rc;
}

static int reduce_open(reduce_setup *st) {
  int devs[MAXDEV];
  st->n = mgpu_device_count() < MAXDEV ? mgpu_device_count() : MAXDEV;
  for (int i = 0; i < st->n; i++) devs[i] = i;
  int rc = mgpu_comm_create(devs, st->n, &st->comm);
  for (int r = 0; r < st->n && rc == 0; r++) {
    rc = mgpu_stream_create(&st->s[r], r);
    if (rc == 0) rc = mgpu_malloc(&st->send[r], r, ALLREDUCE_BYTES);
    if (rc == 0) rc = mgpu_malloc(&st->recv[r], r, ALLREDUCE_BYTES);
    if (rc == 0) rc = mgpu_memset_async(st->send[r], 0, 0, ALLREDUCE_BYTES, st->s[r]);
    if (rc == 0) rc = mgpu_memset_async(st->recv[r], 0, 0, ALLREDUCE_BYTES, st->s[r]);
  }
  for (int r = 0; r < st->n && rc == 0; r++) rc = mgpu_stream_synchronize(st->s[r]);
  return rc;
}

static void reduce_close(reduce_setup *st) {
  for (int r = 0; r < st->n; r++) {
    if (st->s[r]) mgpu_stream_destroy(st->s[r]);
    if (st->send[r]) mgpu_free(st->send[r]);
    if (st->recv[r]) mgpu_free(st->recv[r]);
  }
  if (st->comm) mgpu_comm_destroy(st->comm);
}

int mgpu_bench_trace(int argc, char **argv) {
  bench_opts o;
  int nrest;
  if (bench_parse(argc, argv, "mgpu bench trace [--json] [--quick] [--reps N]",
                  &o, NULL, 0, &nrest) != 0)
    return 2;
  if (mgpu_trace_active()) {
    fprintf(stderr, "mgpu bench trace: a trace is already being recorded "
                    "(MGPU_TRACE): unset it, this benchmark records its own\n");
    return 1;
  }
  const char *dir = getenv("TMPDIR");
  snprintf(trace_path, sizeof trace_path, "%s/mgpu-bench-trace-%d.json",
           dir ? dir : "/tmp", (int)getpid());
  int reps = o.reps, rc = 0;
  double *v[2];
  v[0] = calloc((size_t)reps * 2, sizeof(double));
  if (v[0] == NULL) return fail("memory", MGPU_ENOMEM);
  v[1] = v[0] + reps;
  bench_report *rep = bench_report_new("trace");

  /* 1. The recorder alone. */
  for (int r = -1; r < reps && rc == 0; r++)
    for (int k = 0, on; k <= 1 && rc == 0; k++) {
      on = k ^ (r & 1); /* ABBA: neither side always goes first */
      if ((rc = trace_begin(on)) != 0) break;
      double ns = spans_ns();
      rc = trace_end(on, NULL);
      if (r >= 0) v[on][r] = ns;
    }
  if (rc != 0) goto out;
  bench_report_add(rep, "mgpu_trace_span, one thread", "cost",
                   bench_median(v[1], reps), "ns/op", "tracing off",
                   bench_median(v[0], reps));

  /* 2. The task pool. */
  mgpu_pool_opts po = MGPU_POOL_OPTS_INITIALIZER;
  mgpu_pool *pool;
  if ((rc = mgpu_pool_create(&pool, &po)) != 0) goto out;
  double events = 0;
  for (int r = -1; r < reps && rc == 0; r++)
    for (int k = 0, on; k <= 1 && rc == 0; k++) {
      on = k ^ (r & 1); /* ABBA: neither side always goes first */
      double ns = 0, ev = 0;
      if ((rc = trace_begin(on)) != 0) break;
      int trc = tasks_ns(pool, &ns);
      rc = trace_end(on, &ev);
      if (rc == 0) rc = trc;
      if (r < 0) continue;
      v[on][r] = ns;
      events += ev;
    }
  mgpu_pool_destroy(pool);
  if (rc != 0) goto out;
  char name[96];
  snprintf(name, sizeof name, "sched: %d empty tasks, %d devices", TASKS,
           mgpu_device_count());
  double on_ns = bench_median(v[1], reps), off_ns = bench_median(v[0], reps);
  bench_report_add(rep, name, "time", on_ns, "ns/task", "tracing off", off_ns);
  /* The extra time per task over the events each task recorded. Its noise
   * is the spread of the tracing-off repetitions (half their range), per
   * event: a difference within it, or below 0, is no measurement and is
   * printed as such, not as a cost. */
  double per_task = events / reps / TASKS;
  double per_event = per_task > 0 ? (on_ns - off_ns) / per_task : 0;
  double lo = v[0][0], hi = v[0][0];
  for (int r = 1; r < reps; r++) {
    if (v[0][r] < lo) lo = v[0][r];
    if (v[0][r] > hi) hi = v[0][r];
  }
  double noise = per_task > 0 ? (hi - lo) / 2 / per_task : 0;
  if (noise < 0.01) noise = 0.01; /* below the printed precision */
  bench_report_add(rep, "sched: cost per recorded event", "cost", per_event,
                   "ns/event", NULL, 0);
  bench_report_noise(rep, noise);
  bench_report_add(rep, "sched: events per task", "count", per_task,
                   "events", NULL, 0);

  /* 3. The all-reduce. */
  reduce_setup st;
  memset(&st, 0, sizeof st);
  if ((rc = reduce_open(&st)) == 0) {
    for (int r = -1; r < reps && rc == 0; r++)
      for (int k = 0, on; k <= 1 && rc == 0; k++) {
        on = k ^ (r & 1); /* ABBA: neither side always goes first */
        double ms = 0;
        if ((rc = trace_begin(on)) != 0) break;
        int arc = allreduce_ms(&st, &ms);
        rc = trace_end(on, NULL);
        if (rc == 0) rc = arc;
        if (r >= 0) v[on][r] = ms;
      }
  }
  reduce_close(&st);
  if (rc != 0) goto out;
  snprintf(name, sizeof name, "allreduce 64MiB float, %d devices", st.n);
  bench_report_add(rep, name, "time", bench_median(v[1], reps), "ms",
                   "tracing off", bench_median(v[0], reps));
out:
  free(v[0]);
  if (rc != 0) {
    bench_report_finish(rep, 0);
    return fail("measuring", rc);
  }
  bench_report_finish(rep, o.json);
  return 0;
}
