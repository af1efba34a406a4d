/* mgpu bench p2p: copies between every ordered pair of devices, the direct
 * and the host-staged path side by side.
 *
 *   mgpu bench p2p [--json] [--quick] [--reps N] [SIZE]
 *
 * For each ordered pair: bandwidth of a SIZE copy (default 64M, 8M with
 * --quick) along the direct path (where the pair can; "device" for logical
 * devices of one GPU) and the staged path (peer access turned off for the
 * pair), both ways at once for each unordered pair, and the latency of a
 * 1-byte copy. Each figure sits next to
 * a baseline timed in the same loop, rep for rep, so that a noisy machine
 * moves both alike:
 *   - host devices: single-thread memcpy of SIZE between two pre-touched
 *     host buffers (the bar: staged >= 70% of it);
 *   - GPUs: the slower of pinned D2H and H2D of the two devices for the
 *     staged path (the bar: >= 80%), and a device copy for the direct path;
 *   - latency: a 1-byte copy within the source device.
 * The peer access state of every pair is restored to on (where possible)
 * at the end. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cmd.h"

#define MAX_DEV 16

typedef struct p2p_ctx {
  int n, host_backend;
  size_t size;
  mgpu_buffer *src[MAX_DEV], *dst[MAX_DEV], *pinned[MAX_DEV];
  mgpu_stream *stream[MAX_DEV];
  char *host_a, *host_b; /* memcpy baseline buffers */
} p2p_ctx;

/* One timed operation. */
typedef struct op {
  p2p_ctx *c;
  int kind; /* OP_COPY, OP_BOTH, OP_MEMCPY, OP_DEVCOPY, OP_D2H, OP_H2D */
  int a, b;
  size_t bytes;
} op;

enum { OP_COPY, OP_BOTH, OP_MEMCPY, OP_DEVCOPY, OP_D2H, OP_H2D };

static int run_op(const op *o) {
  p2p_ctx *c = o->c;
  int rc = 0;
  switch (o->kind) {
    case OP_COPY:
      rc = mgpu_memcpy_async(c->dst[o->b], 0, c->src[o->a], 0, o->bytes,
                             c->stream[o->a]);
      return rc ? rc : mgpu_stream_synchronize(c->stream[o->a]);
    case OP_BOTH:
      rc = mgpu_memcpy_async(c->dst[o->b], 0, c->src[o->a], 0, o->bytes,
                             c->stream[o->a]);
      if (rc == 0)
        rc = mgpu_memcpy_async(c->dst[o->a], 0, c->src[o->b], 0, o->bytes,
                               c->stream[o->b]);
      if (rc == 0) rc = mgpu_stream_synchronize(c->stream[o->a]);
      return rc ? rc : mgpu_stream_synchronize(c->stream[o->b]);
    case OP_MEMCPY:
      memcpy(c->host_b, c->host_a, o->bytes);
      return 0;
    case OP_DEVCOPY:
      rc = mgpu_memcpy_async(c->dst[o->a], 0, c->src[o->a], 0, o->bytes,
                             c->stream[o->a]);
      return rc ? rc : mgpu_stream_synchronize(c->stream[o->a]);
    case OP_D2H:
      rc = mgpu_memcpy_dtoh_async(mgpu_buffer_ptr(c->pinned[o->a]),
                                  c->src[o->a], 0, o->bytes, c->stream[o->a]);
      return rc ? rc : mgpu_stream_synchronize(c->stream[o->a]);
    case OP_H2D:
      rc = mgpu_memcpy_htod_async(c->dst[o->a], 0,
                                  mgpu_buffer_ptr(c->pinned[o->a]), o->bytes,
                                  c->stream[o->a]);
      return rc ? rc : mgpu_stream_synchronize(c->stream[o->a]);
  }
  return 0;
}

/* Median seconds of the measured op and of the baseline, timed alternately
 * after one warm-up of each. */
static int time_vs(const op *m, const op *base, int reps, double *m_s,
                   double *base_s) {
  double *tm = calloc((size_t)reps, sizeof *tm);
  double *tb = calloc((size_t)reps, sizeof *tb);
  int rc = tm && tb ? 0 : MGPU_ENOMEM;
  if (rc == 0) rc = run_op(m);
  if (rc == 0) rc = run_op(base);
  for (int r = 0; r < reps && rc == 0; r++) {
    double t0 = bench_now();
    rc = run_op(m);
    double t1 = bench_now();
    if (rc == 0) rc = run_op(base);
    tm[r] = t1 - t0;
    tb[r] = bench_now() - t1;
  }
  if (rc == 0) {
    *m_s = bench_median(tm, reps);
    *base_s = bench_median(tb, reps);
  }
  free(tm);
  free(tb);
  return rc;
}

/* The slower of pinned D2H and H2D of device d, as an op. */
static int slower_half(p2p_ctx *c, int d, int reps, op *out) {
  op d2h = {c, OP_D2H, d, d, c->size}, h2d = {c, OP_H2D, d, d, c->size};
  double t1, t2;
  int rc = time_vs(&d2h, &h2d, reps, &t1, &t2);
  *out = t1 > t2 ? d2h : h2d;
  return rc;
}

static void size_name(size_t size, char *buf, size_t n) {
  if (size >= ((size_t)1 << 20) && size % ((size_t)1 << 20) == 0)
    snprintf(buf, n, "%zuMiB", size >> 20);
  else if (size >= 1024 && size % 1024 == 0)
    snprintf(buf, n, "%zuKiB", size >> 10);
  else
    snprintf(buf, n, "%zuB", size);
}

/* Bandwidth of a->b (one way, or both ways at once) on the path the pair
 * has now. */
static int bandwidth(p2p_ctx *c, bench_report *r, int reps, int a, int b,
                     const char *path, int both) {
  op m = {c, both ? OP_BOTH : OP_COPY, a, b, c->size};
  op base = {c, OP_MEMCPY, a, b, c->size};
  const char *base_name = "memcpy 1 thread";
  int rc = 0;
  if (!c->host_backend && strcmp(path, "staged") == 0) {
    op sa, sb;
    double ta, tb;
    rc = slower_half(c, a, reps, &sa);
    if (rc == 0) rc = slower_half(c, b, reps, &sb);
    if (rc == 0) rc = time_vs(&sa, &sb, reps, &ta, &tb);
    if (rc != 0) return rc;
    base = ta > tb ? sa : sb;
    base_name = "slower of pinned D2H/H2D";
  } else if (!c->host_backend) {
    base = (op){c, OP_DEVCOPY, a, a, c->size};
    base_name = "device copy";
  }
  double tm, tb;
  rc = time_vs(&m, &base, reps, &tm, &tb);
  if (rc != 0) return rc;
  char sz[32], name[96];
  size_name(c->size, sz, sizeof sz);
  snprintf(name, sizeof name, "%s %d%s%d %s", path, a, both ? "<->" : "->", b, sz);
  double bytes = (double)c->size * (both ? 2 : 1);
  bench_report_add(r, name, "bandwidth", bytes / tm / 1e9, "GB/s", base_name,
                   (double)c->size / tb / 1e9);
  return 0;
}

static int latency(p2p_ctx *c, bench_report *r, int reps, int a, int b,
                   const char *path) {
  op m = {c, OP_COPY, a, b, 1}, base = {c, OP_DEVCOPY, a, a, 1};
  double tm, tb;
  int rc = time_vs(&m, &base, reps, &tm, &tb);
  if (rc != 0) return rc;
  char name[96];
  snprintf(name, sizeof name, "%s %d->%d 1B", path, a, b);
  bench_report_add(r, name, "latency", tm * 1e6, "us", "device copy 1B",
                   tb * 1e6);
  return 0;
}

/* Every figure of one pair on one path. */
static int pair_figures(p2p_ctx *c, bench_report *r, int reps, int a, int b,
                        const char *path) {
  int rc = bandwidth(c, r, reps, a, b, path, 0);
  if (rc == 0 && a < b) rc = bandwidth(c, r, reps, a, b, path, 1);
  if (rc == 0) rc = latency(c, r, reps * 5, a, b, path);
  return rc;
}

static int setup(p2p_ctx *c) {
  c->host_a = malloc(c->size);
  c->host_b = malloc(c->size);
  if (c->host_a == NULL || c->host_b == NULL) return MGPU_ENOMEM;
  memset(c->host_a, 1, c->size);
  memset(c->host_b, 2, c->size);
  for (int d = 0; d < c->n; d++) {
    int rc = mgpu_malloc(&c->src[d], d, c->size);
    if (rc == 0) rc = mgpu_malloc(&c->dst[d], d, c->size);
    if (rc == 0 && !c->host_backend)
      rc = mgpu_malloc_host(&c->pinned[d], d, c->size);
    if (rc == 0) rc = mgpu_stream_create(&c->stream[d], d);
    /* Touch every page once before timing anything. */
    if (rc == 0) rc = mgpu_memset_async(c->src[d], 0, 3, c->size, c->stream[d]);
    if (rc == 0) rc = mgpu_memset_async(c->dst[d], 0, 4, c->size, c->stream[d]);
    if (rc == 0) rc = mgpu_stream_synchronize(c->stream[d]);
    if (rc != 0) return rc;
  }
  return 0;
}

static void teardown(p2p_ctx *c) {
  for (int d = 0; d < c->n; d++) {
    if (c->stream[d]) mgpu_stream_destroy(c->stream[d]);
    if (c->src[d]) mgpu_free(c->src[d]);
    if (c->dst[d]) mgpu_free(c->dst[d]);
    if (c->pinned[d]) mgpu_free(c->pinned[d]);
  }
  free(c->host_a);
  free(c->host_b);
}


int mgpu_bench_p2p(int argc, char **argv) {
  static const char usage[] = "mgpu bench p2p [--json] [--quick] [--reps N] [SIZE]";
  bench_opts o;
  char *rest[1];
  int nrest = 0;
  if (bench_parse(argc, argv, usage, &o, rest, BENCH_CAP(rest), &nrest) != 0)
    return 2;
  p2p_ctx *c = calloc(1, sizeof *c);
  if (c == NULL) return 1;
  c->n = mgpu_device_count();
  if (c->n > MAX_DEV) c->n = MAX_DEV;
  c->size = (size_t)(o.quick ? 8 : 64) << 20;
  if (nrest == 1 && (c->size = bench_parse_size(rest[0])) == 0) {
    fprintf(stderr, "mgpu bench p2p: bad size '%s'\nusage: %s\n", rest[0], usage);
    free(c);
    return 2;
  }
  mgpu_device_props p = {.size = sizeof p};
  int rc = mgpu_device_get_props(0, &p);
  c->host_backend = rc == 0 && p.backend_kind == MGPU_BACKEND_HOST;
  if (rc == 0) rc = setup(c);
  bench_report *r = bench_report_new("p2p");
  for (int a = 0; a < c->n && rc == 0 && r != NULL; a++)
    for (int b = 0; b < c->n && rc == 0; b++) {
      if (a == b) continue;
      int yes = 0;
      mgpu_copy_path path = MGPU_PATH_STAGED;
      rc = mgpu_peer_can_access(a, b, &yes);
      if (rc == 0) rc = mgpu_copy_path_get(a, b, &path);
      /* Logical devices of one GPU copy within it ("device"); turned off,
       * they go staged like any other pair. */
      const char *on = path == MGPU_PATH_DEVICE ? "device" : "direct";
      if (rc == 0 && yes && (rc = mgpu_peer_enable(a, b)) == 0)
        rc = pair_figures(c, r, o.reps, a, b, on);
      if (rc == 0) rc = mgpu_peer_disable(a, b);
      if (rc == 0) rc = pair_figures(c, r, o.reps, a, b, "staged");
      if (rc == 0 && yes) rc = mgpu_peer_enable(a, b);
    }
  teardown(c);
  free(c);
  if (r == NULL) return mgpu_cmd_fail("bench p2p", MGPU_ENOMEM);
  bench_report_finish(r, o.json); /* what was measured, even on a failure */
  return rc != 0 ? mgpu_cmd_fail("bench p2p", rc) : 0;
}
