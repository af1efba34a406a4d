/* mgpu bench allreduce: float sums over every open device, 4 KiB to
 * 256 MiB per device (--quick: a few small sizes).
 *
 * Figures per size, as nccl-tests defines them: algbw = size / time and
 * busbw = algbw * 2 (n - 1) / n. On host devices memory is the limit, so
 * each size also gets the traffic an all-reduce cannot avoid (every device's
 * input read once and output written once: 2 n size bytes) per second, next
 * to memcpy's bandwidth counted the same way (bytes read + bytes written),
 * measured in the same run: their ratio says how close to the memory the
 * collective runs. At 64 MiB the ring is also timed, next to the algorithm
 * chosen by default.
 *
 * Each timed repetition issues a batch of back-to-back all-reduces (one
 * thread, a group per call) and synchronizes once; the figure is the median
 * over repetitions after a warm-up. Buffers are allocated and touched once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAXDEV 8

typedef struct setup {
  int n;
  mgpu_comm *comm;
  mgpu_stream *s[MAXDEV];
  mgpu_buffer *send[MAXDEV], *recv[MAXDEV];
} setup;

static int fail(const char *what, int rc) {
  fprintf(stderr, "bench allreduce: %s: %s (%s)\n", what, mgpu_err_name(rc),
          mgpu_error_detail());
  return 1;
}

static int open_comm(setup *st, int algo) {
  int devs[MAXDEV];
  for (int i = 0; i < st->n; i++) devs[i] = i;
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.algo = algo;
  if (algo != MGPU_COLL_ALGO_AUTO) cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  return mgpu_comm_create_config(devs, st->n, &cfg, &st->comm);
}

/* Seconds per all-reduce of count floats: median of reps batches. */
static int time_allreduce(setup *st, size_t count, int reps, int max_iters,
                          double *secs) {
  size_t bytes = count * sizeof(float);
  int iters = (int)((size_t)(64u << 20) / bytes);
  if (iters < 1) iters = 1;
  if (iters > max_iters) iters = max_iters;
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) return MGPU_ENOMEM;
  int rc = 0;
  for (int rep = -1; rep < reps && rc == 0; rep++) { /* rep -1: warm-up */
    double t0 = bench_now();
    for (int it = 0; it < iters && rc == 0; it++) {
      rc = mgpu_group_begin();
      for (int r = 0; r < st->n && rc == 0; r++)
        rc = mgpu_allreduce(st->comm, r, st->send[r], st->recv[r], count,
                            MGPU_FLOAT32, MGPU_SUM, st->s[r]);
      int erc = mgpu_group_end();
      if (rc == 0) rc = erc;
    }
    for (int r = 0; r < st->n && rc == 0; r++)
      rc = mgpu_stream_synchronize(st->s[r]);
    if (rep >= 0) t[rep] = (bench_now() - t0) / iters;
  }
  if (rc == 0) *secs = bench_median(t, reps);
  free(t);
  return rc;
}

static void size_name(size_t bytes, char *out, size_t len) {
  if (bytes >= (1u << 20))
    snprintf(out, len, "%zuMiB", bytes >> 20);
  else
    snprintf(out, len, "%zuKiB", bytes >> 10);
}

int mgpu_bench_allreduce(int argc, char **argv) {
  bench_opts o;
  char *rest[8];
  int nrest;
  if (bench_parse(argc, argv,
                  "mgpu bench allreduce [--json] [--quick] [--reps N]", &o,
                  rest, &nrest) != 0)
    return 2;
  setup st;
  memset(&st, 0, sizeof st);
  st.n = mgpu_device_count();
  if (st.n > MAXDEV) st.n = MAXDEV;
  static const size_t full[] = {4u << 10, 16u << 10, 64u << 10, 256u << 10,
                                1u << 20, 4u << 20, 16u << 20, 64u << 20,
                                256u << 20};
  static const size_t quick[] = {4u << 10, 64u << 10, 1u << 20};
  const size_t *sizes = o.quick ? quick : full;
  int nsizes = o.quick ? 3 : 9;
  size_t max = sizes[nsizes - 1];
  int max_iters = o.quick ? 10 : 200; /* all-reduces per timed batch */

  int rc = open_comm(&st, MGPU_COLL_ALGO_AUTO);
  if (rc != 0) return fail("comm", rc);
  for (int r = 0; r < st.n && rc == 0; r++) {
    rc = mgpu_stream_create(&st.s[r], r);
    if (rc == 0) rc = mgpu_malloc(&st.send[r], r, max);
    if (rc == 0) rc = mgpu_malloc(&st.recv[r], r, max);
    /* Touch every page once, outside the timing. */
    if (rc == 0) rc = mgpu_memset_async(st.send[r], 0, 0, max, st.s[r]);
    if (rc == 0) rc = mgpu_memset_async(st.recv[r], 0, 0, max, st.s[r]);
  }
  for (int r = 0; r < st.n && rc == 0; r++)
    rc = mgpu_stream_synchronize(st.s[r]);
  if (rc != 0) return fail("buffers of the largest size", rc);

  bench_report *rep = bench_report_new("allreduce");
  double n = st.n, factor = st.n > 1 ? 2.0 * (n - 1) / n : 1.0;
  for (int i = 0; i < nsizes && rc == 0; i++) {
    size_t bytes = sizes[i];
    double t;
    rc = time_allreduce(&st, bytes / sizeof(float), o.reps, max_iters, &t);
    if (rc != 0) break;
    char name[96], sz[32];
    size_name(bytes, sz, sizeof sz);
    double algbw = (double)bytes / t / 1e9;
    double memcpy_rw = 2.0 * bench_memcpy_gbps(bytes, o.reps);
    snprintf(name, sizeof name, "allreduce %s", sz);
    bench_report_add(rep, name, "busbw", algbw * factor, "GB/s", NULL, 0);
    bench_report_add(rep, name, "algbw", algbw, "GB/s", NULL, 0);
    bench_report_add(rep, name, "time", t * 1e6, "us", NULL, 0);
    snprintf(name, sizeof name, "allreduce %s traffic", sz);
    bench_report_add(rep, name, "bandwidth", 2.0 * n * (double)bytes / t / 1e9,
                     "GB/s", "memcpy read+write", memcpy_rw);
    if (bytes == (64u << 20) && st.n > 1) {
      /* The ring on the same buffers, next to the default. */
      setup ring = st;
      if (open_comm(&ring, MGPU_COLL_ALGO_RING) == 0) {
        double tr;
        rc = time_allreduce(&ring, bytes / sizeof(float), o.reps, max_iters,
                            &tr);
        mgpu_comm_destroy(ring.comm);
        if (rc != 0) break;
        snprintf(name, sizeof name, "allreduce %s ring", sz);
        bench_report_add(rep, name, "busbw", (double)bytes / tr / 1e9 * factor,
                         "GB/s", "default algorithm", algbw * factor);
      }
    }
  }
  if (rc != 0) {
    bench_report_finish(rep, o.json);
    return fail("allreduce", rc);
  }
  bench_report_finish(rep, o.json);
  for (int r = 0; r < st.n; r++) {
    mgpu_free(st.send[r]);
    mgpu_free(st.recv[r]);
    mgpu_stream_destroy(st.s[r]);
  }
  mgpu_comm_destroy(st.comm);
  return 0;
}
