/* mgpu bench copy: host-to-device, device-to-host and device-to-device copy
 * bandwidth of every device, from pageable and from pinned host memory.
 *
 *   mgpu bench copy [--json] [--quick] [--reps N] [SIZE]
 *
 * SIZE defaults to 64M (8M with --quick). Pageable memory is plain malloc
 * (touched before timing); pinned memory is a buffer of mgpu_malloc_host on
 * the same device. Every figure is timed alternately with single-thread
 * memcpy of the same size between two pre-touched host buffers, rep for rep,
 * so that both see the same machine; ratio = copy / memcpy. On OpenCL
 * devices each figure is also printed next to the same copy through bare
 * OpenCL calls on the same device (bench-opencl.h: clEnqueueWriteBuffer,
 * clEnqueueReadBuffer, clEnqueueCopyBuffer on plain cl_mem buffers, then
 * clFinish), timed in the same alternation. */
#include <stdlib.h>
#include <string.h>

#include "bench-opencl.h"
#include "bench.h"
#include "cmd.h"

typedef struct copy_ctx {
  size_t size;
  mgpu_buffer *dev_a, *dev_b, *pinned;
  mgpu_stream *stream;
  char *pageable, *host_a, *host_b;
} copy_ctx;

enum { C_H2D_PAGEABLE, C_H2D_PINNED, C_D2H_PAGEABLE, C_D2H_PINNED, C_D2D,
       C_MEMCPY };

static int run(copy_ctx *c, int kind) {
  int rc = 0;
  void *pinned = c->pinned ? mgpu_buffer_ptr(c->pinned) : NULL;
  switch (kind) {
    case C_H2D_PAGEABLE:
      rc = mgpu_memcpy_htod_async(c->dev_a, 0, c->pageable, c->size, c->stream);
      break;
    case C_H2D_PINNED:
      rc = mgpu_memcpy_htod_async(c->dev_a, 0, pinned, c->size, c->stream);
      break;
    case C_D2H_PAGEABLE:
      rc = mgpu_memcpy_dtoh_async(c->pageable, c->dev_a, 0, c->size, c->stream);
      break;
    case C_D2H_PINNED:
      rc = mgpu_memcpy_dtoh_async(pinned, c->dev_a, 0, c->size, c->stream);
      break;
    case C_D2D:
      rc = mgpu_memcpy_async(c->dev_b, 0, c->dev_a, 0, c->size, c->stream);
      break;
    case C_MEMCPY:
      memcpy(c->host_b, c->host_a, c->size);
      return 0;
  }
  return rc ? rc : mgpu_stream_synchronize(c->stream);
}

/* The bare OpenCL calls of each case (bench-opencl.h). */
static const struct {
  int kind;
  const char *name;
} bare_cases[] = {
    /* On a queue without profiling: mgpu's queues profile by default
     * (MGPU_OPENCL_BUSY), which PoCL's copies pay little for. */
    [C_H2D_PAGEABLE] = {BENCH_OCL_WRITE,
                        "bare clEnqueueWriteBuffer (plain queue)"},
    [C_H2D_PINNED] = {BENCH_OCL_WRITE,
                      "bare clEnqueueWriteBuffer (plain queue)"},
    [C_D2H_PAGEABLE] = {BENCH_OCL_READ,
                        "bare clEnqueueReadBuffer (plain queue)"},
    [C_D2H_PINNED] = {BENCH_OCL_READ, "bare clEnqueueReadBuffer (plain queue)"},
    [C_D2D] = {BENCH_OCL_COPY, "bare clEnqueueCopyBuffer (plain queue)"}};

/* The host side of kind. */
static void *host_of(copy_ctx *c, int kind) {
  return kind == C_H2D_PINNED || kind == C_D2H_PINNED
             ? mgpu_buffer_ptr(c->pinned)
             : c->pageable;
}

/* Median GB/s of kind, of memcpy, and (bare not NULL) of the bare OpenCL
 * copy, timed alternately, rep for rep, after a warm-up; *bare_gbps is 0
 * when a bare call failed. */
static int measure(copy_ctx *c, int kind, int reps, double *gbps,
                   double *memcpy_gbps, bench_ocl *bare, double *bare_gbps) {
  double *t = calloc((size_t)reps, sizeof *t), *b = calloc((size_t)reps, sizeof *b);
  double *o = calloc((size_t)reps, sizeof *o);
  int rc = t && b && o ? 0 : MGPU_ENOMEM;
  int bare_ok = bare != NULL;
  int bk = bare_cases[kind].kind;
  void *host = host_of(c, kind);
  if (rc == 0) rc = run(c, kind);
  if (rc == 0) rc = run(c, C_MEMCPY);
  if (bare_ok) bare_ok = bench_ocl_copy_once(bare, bk, host) == 0;
  for (int r = 0; r < reps && rc == 0; r++) {
    double t0 = bench_now();
    rc = run(c, kind);
    double t1 = bench_now();
    run(c, C_MEMCPY);
    double t2 = bench_now();
    if (bare_ok) bare_ok = bench_ocl_copy_once(bare, bk, host) == 0;
    t[r] = t1 - t0;
    b[r] = t2 - t1;
    o[r] = bench_now() - t2;
  }
  if (rc == 0) {
    *gbps = (double)c->size / bench_median(t, reps) / 1e9;
    *memcpy_gbps = (double)c->size / bench_median(b, reps) / 1e9;
    *bare_gbps = bare_ok ? (double)c->size / bench_median(o, reps) / 1e9 : 0;
  }
  free(t);
  free(b);
  free(o);
  return rc;
}

/* The bare baselines on the device of c's stream: NULL when it is not an
 * OpenCL device, or with a line on stderr when they cannot be had. */
static bench_ocl *bare_open(copy_ctx *c, int dev) {
  mgpu_device_props p = {.size = sizeof p};
  if (mgpu_device_get_props(dev, &p) != 0 ||
      p.backend_kind != MGPU_BACKEND_OPENCL)
    return NULL;
  char why[160] = "";
  bench_ocl *o = bench_ocl_open(mgpu_stream_native(c->stream), why, sizeof why);
  if (o != NULL && bench_ocl_copy_prepare(o, c->pageable, c->size) != 0) {
    snprintf(why, sizeof why, "its buffers could not be made");
    bench_ocl_close(o);
    o = NULL;
  }
  if (o == NULL)
    fprintf(stderr, "mgpu bench copy: no bare OpenCL baseline: %s\n", why);
  return o;
}

static int device_figures(copy_ctx *c, int dev, bench_report *r, int reps) {
  static const struct { int kind; const char *name; } cases[] = {
      {C_H2D_PAGEABLE, "H2D pageable"}, {C_H2D_PINNED, "H2D pinned"},
      {C_D2H_PAGEABLE, "D2H pageable"}, {C_D2H_PINNED, "D2H pinned"},
      {C_D2D, "D2D"}};
  bench_ocl *bare = NULL;
  int rc = mgpu_malloc(&c->dev_a, dev, c->size);
  if (rc == 0) rc = mgpu_malloc(&c->dev_b, dev, c->size);
  if (rc == 0) rc = mgpu_malloc_host(&c->pinned, dev, c->size);
  if (rc == 0) rc = mgpu_stream_create(&c->stream, dev);
  /* Touch every page before timing. */
  if (rc == 0) rc = mgpu_memset_async(c->dev_a, 0, 1, c->size, c->stream);
  if (rc == 0) rc = mgpu_memset_async(c->dev_b, 0, 2, c->size, c->stream);
  if (rc == 0) memset(mgpu_buffer_ptr(c->pinned), 3, c->size);
  if (rc == 0) rc = mgpu_stream_synchronize(c->stream);
  if (rc == 0) bare = bare_open(c, dev);
  for (size_t i = 0; rc == 0 && i < sizeof cases / sizeof cases[0]; i++) {
    double v, base, b = 0;
    rc = measure(c, cases[i].kind, reps, &v, &base, bare, &b);
    if (rc != 0) break;
    char name[96];
    if (c->size % ((size_t)1 << 20) == 0)
      snprintf(name, sizeof name, "dev %d %s %zuMiB", dev, cases[i].name,
               c->size >> 20);
    else
      snprintf(name, sizeof name, "dev %d %s %zuB", dev, cases[i].name, c->size);
    bench_report_add(r, name, "bandwidth", v, "GB/s", "memcpy 1 thread", base);
    if (b > 0)
      bench_report_add(r, name, "bandwidth", v, "GB/s",
                       bare_cases[cases[i].kind].name, b);
  }
  bench_ocl_close(bare);
  if (c->stream) mgpu_stream_destroy(c->stream);
  if (c->dev_a) mgpu_free(c->dev_a);
  if (c->dev_b) mgpu_free(c->dev_b);
  if (c->pinned) mgpu_free(c->pinned);
  c->stream = NULL;
  c->dev_a = c->dev_b = c->pinned = NULL;
  return rc;
}


int mgpu_bench_copy(int argc, char **argv) {
  static const char usage[] = "mgpu bench copy [--json] [--quick] [--reps N] [SIZE]";
  bench_opts o;
  char *rest[1];
  int nrest = 0;
  if (bench_parse(argc, argv, usage, &o, rest, BENCH_CAP(rest), &nrest) != 0)
    return 2;
  copy_ctx c = {.size = (size_t)(o.quick ? 8 : 64) << 20};
  if (nrest == 1 && (c.size = bench_parse_size(rest[0])) == 0) {
    fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  c.pageable = malloc(c.size);
  c.host_a = malloc(c.size);
  c.host_b = malloc(c.size);
  bench_report *r = bench_report_new("copy");
  int rc = c.pageable && c.host_a && c.host_b && r ? 0 : MGPU_ENOMEM;
  if (rc == 0) {
    memset(c.pageable, 4, c.size);
    memset(c.host_a, 5, c.size);
    memset(c.host_b, 6, c.size);
  }
  int n = mgpu_device_count();
  for (int d = 0; d < n && rc == 0; d++) rc = device_figures(&c, d, r, o.reps);
  free(c.pageable);
  free(c.host_a);
  free(c.host_b);
  if (r == NULL) return mgpu_cmd_fail("bench copy", MGPU_ENOMEM);
  bench_report_finish(r, o.json);
  return rc != 0 ? mgpu_cmd_fail("bench copy", rc) : 0;
}
