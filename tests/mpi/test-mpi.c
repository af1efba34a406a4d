/* Tests of the MPI module, run by ctest under
 *   timeout T mpirun --oversubscribe -np N test-mpi NAME
 * Every rank checks its results against a reference computed on the host;
 * a failing rank prints why and calls MPI_Abort, so no rank waits forever. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mgpu.h"
#include "mgpu/mpi.h"
#include "util/fault.h"

static int rank, nranks;

#define FAIL(...)                                                 \
  do {                                                            \
    fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                 \
    fprintf(stderr, "\n");                                        \
    MPI_Abort(MPI_COMM_WORLD, 1);                                 \
  } while (0)

#define CHECK(call)                                                       \
  do {                                                                    \
    int rc_ = (call);                                                     \
    if (rc_ != 0)                                                         \
      FAIL("%s: %s (%s)", #call, mgpu_err_name(rc_), mgpu_error_detail()); \
  } while (0)

#define EXPECT_RC(call, want)                                               \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != (want))                                                      \
      FAIL("%s: %s, expected %s (%s)", #call, mgpu_err_name(rc_),           \
           mgpu_err_name(want), mgpu_error_detail());                       \
  } while (0)

/* ---- values: small integers, exact in every type ---- */

static const mgpu_dtype types[] = {MGPU_FLOAT32, MGPU_FLOAT64, MGPU_INT32,
                                   MGPU_INT64, MGPU_FLOAT16, MGPU_BFLOAT16};
static const mgpu_op ops[] = {MGPU_SUM, MGPU_PROD, MGPU_MIN, MGPU_MAX};

static uint16_t to_half(double v) {
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffff) == 0) return (uint16_t)(x >> 16);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x & 0x7fffff) >> 13));
}

static double from_half(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  double m = h & 0x3ff;
  double v = exp == 0 ? ldexp(m, -24) : ldexp(1024 + m, exp - 25);
  return (h & 0x8000) ? -v : v;
}

static void put(void *base, mgpu_dtype t, size_t i, double v) {
  switch (t) {
    case MGPU_FLOAT32: ((float *)base)[i] = (float)v; break;
    case MGPU_FLOAT64: ((double *)base)[i] = v; break;
    case MGPU_INT32: ((int32_t *)base)[i] = (int32_t)v; break;
    case MGPU_INT64: ((int64_t *)base)[i] = (int64_t)v; break;
    case MGPU_FLOAT16: ((uint16_t *)base)[i] = to_half(v); break;
    case MGPU_BFLOAT16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, sizeof x);
      ((uint16_t *)base)[i] = (uint16_t)(x >> 16);
      break;
    }
  }
}

static double get(const void *base, mgpu_dtype t, size_t i) {
  switch (t) {
    case MGPU_FLOAT32: return ((const float *)base)[i];
    case MGPU_FLOAT64: return ((const double *)base)[i];
    case MGPU_INT32: return ((const int32_t *)base)[i];
    case MGPU_INT64: return (double)((const int64_t *)base)[i];
    case MGPU_FLOAT16: return from_half(((const uint16_t *)base)[i]);
    case MGPU_BFLOAT16: {
      uint32_t x = (uint32_t)((const uint16_t *)base)[i] << 16;
      float f;
      memcpy(&f, &x, sizeof f);
      return f;
    }
  }
  return NAN;
}

/* Rank r's element i: 1..3, different on every rank and position. */
static double val(int r, size_t i) { return (double)(1 + (r * 7 + i) % 3); }

static double combine(mgpu_op op, double a, double b) {
  switch (op) {
    case MGPU_SUM: return a + b;
    case MGPU_PROD: return a * b;
    case MGPU_MIN: return b < a ? b : a;
    case MGPU_MAX: return b > a ? b : a;
  }
  return NAN;
}

static double reduced(mgpu_op op, size_t i) {
  double acc = val(0, i);
  for (int r = 1; r < nranks; r++) acc = combine(op, acc, val(r, i));
  return acc;
}

/* ---- buffers ---- */

static mgpu_buffer *make(int dev, size_t bytes) {
  mgpu_buffer *b;
  CHECK(mgpu_malloc(&b, dev, bytes));
  return b;
}

/* buf = host (bytes). */
static void upload(mgpu_buffer *b, const void *host, size_t bytes) {
  CHECK(mgpu_memcpy_htod(b, 0, host, bytes));
}

static void *download(const mgpu_buffer *b, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  if (h == NULL) FAIL("malloc");
  CHECK(mgpu_memcpy_dtoh(h, b, 0, bytes));
  return h;
}

/* A host array of n elements: element i = val(r, first + i) (r < 0: a
 * marker value 9 that no result takes). */
static void *values(mgpu_dtype t, size_t n, int r, size_t first) {
  size_t es = mgpu_dtype_size(t);
  void *h = malloc(n > 0 ? n * es : 1);
  if (h == NULL) FAIL("malloc");
  for (size_t i = 0; i < n; i++) put(h, t, i, r < 0 ? 9 : val(r, first + i));
  return h;
}

static void expect(const void *h, mgpu_dtype t, size_t i, double want,
                   const char *what, size_t count) {
  double got = get(h, t, i);
  if (got != want)
    FAIL("%s %s count %zu: element %zu is %g, expected %g", what,
         mgpu_dtype_name(t), count, i, got, want);
}

/* ---- the collectives ---- */

static void test_allreduce(int dev, mgpu_dtype t, mgpu_op op, size_t n,
                           int in_place) {
  size_t es = mgpu_dtype_size(t), bytes = n * es;
  void *h = values(t, n, rank, 0);
  mgpu_buffer *send = make(dev, bytes + es), *recv = in_place ? send : make(dev, bytes + es);
  upload(send, h, bytes);
  CHECK(mgpu_mpi_allreduce(send, 0, recv, 0, n, t, op, MPI_COMM_WORLD, NULL));
  void *out = download(recv, bytes);
  for (size_t i = 0; i < n; i++)
    expect(out, t, i, reduced(op, i), "allreduce", n);
  free(out);
  /* reduce to every root in turn, at an offset */
  for (int root = 0; root < nranks; root++) {
    mgpu_buffer *r = in_place ? send : recv;
    upload(send, h, bytes);
    if (!in_place) {
      void *mark = values(t, n + 1, -1, 0);
      upload(recv, mark, bytes + es);
      free(mark);
    }
    size_t off = in_place ? 0 : es;
    CHECK(mgpu_mpi_reduce(send, 0, rank == root ? r : NULL, off, n, t, op,
                          root, MPI_COMM_WORLD, NULL));
    if (rank == root) {
      void *o = download(r, bytes + es);
      for (size_t i = 0; i < n; i++)
        expect(o, t, i + off / es, reduced(op, i), "reduce", n);
      free(o);
    }
  }
  if (!in_place) CHECK(mgpu_free(recv));
  CHECK(mgpu_free(send));
  free(h);
}

static void test_reduce_scatter(int dev, mgpu_dtype t, mgpu_op op, size_t n,
                                int in_place) {
  size_t es = mgpu_dtype_size(t), total = n * (size_t)nranks;
  void *h = values(t, total, rank, 0);
  mgpu_buffer *send = make(dev, total * es);
  mgpu_buffer *recv = in_place ? send : make(dev, n * es);
  upload(send, h, total * es);
  CHECK(mgpu_mpi_reduce_scatter(send, 0, recv, 0, n, t, op, MPI_COMM_WORLD,
                                NULL));
  size_t at = in_place ? (size_t)rank * n : 0;
  void *out = download(recv, (at + n) * es);
  for (size_t i = 0; i < n; i++)
    expect(out, t, at + i, reduced(op, (size_t)rank * n + i),
           "reduce_scatter", n);
  free(out);
  if (!in_place) CHECK(mgpu_free(recv));
  CHECK(mgpu_free(send));
  free(h);
}

static void test_movers(int dev, mgpu_dtype t, size_t n, int in_place) {
  size_t es = mgpu_dtype_size(t), total = n * (size_t)nranks;
  /* all-gather: rank r contributes val(r, i) at position r * n + i */
  void *all = malloc(total * es);
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) put(all, t, (size_t)r * n + i, val(r, i));
  void *mine = values(t, n, rank, 0);
  mgpu_buffer *recv = make(dev, total * es), *send = make(dev, n * es);
  if (in_place) {
    void *mark = values(t, total, -1, 0);
    memcpy((char *)mark + (size_t)rank * n * es, mine, n * es);
    upload(recv, mark, total * es);
    free(mark);
    CHECK(mgpu_mpi_allgather(recv, 0, recv, 0, n, t, MPI_COMM_WORLD, NULL));
  } else {
    upload(send, mine, n * es);
    CHECK(mgpu_mpi_allgather(send, 0, recv, 0, n, t, MPI_COMM_WORLD, NULL));
  }
  void *out = download(recv, total * es);
  for (size_t i = 0; i < total; i++)
    expect(out, t, i, get(all, t, i), "allgather", n);
  free(out);
  for (int root = 0; root < nranks; root++) {
    /* broadcast of root's values */
    void *rv = values(t, n, root, 0);
    void *mark = values(t, n, -1, 0);
    upload(send, rank == root ? rv : mark, n * es);
    CHECK(mgpu_mpi_bcast(send, 0, n, t, root, MPI_COMM_WORLD, NULL));
    out = download(send, n * es);
    for (size_t i = 0; i < n; i++) expect(out, t, i, val(root, i), "bcast", n);
    free(out);
    /* scatter of `all` from root: rank r gets val(r, i) */
    void *tmark = values(t, total, -1, 0);
    upload(recv, rank == root ? all : tmark, total * es);
    upload(send, mark, n * es);
    if (in_place && rank == root)
      CHECK(mgpu_mpi_scatter(recv, 0, recv, 0, n, t, root, MPI_COMM_WORLD,
                             NULL));
    else
      CHECK(mgpu_mpi_scatter(recv, 0, send, 0, n, t, root, MPI_COMM_WORLD,
                             NULL));
    if (in_place && rank == root) {
      out = download(recv, total * es);
      for (size_t i = 0; i < n; i++)
        expect(out, t, (size_t)root * n + i, val(root, i), "scatter", n);
    } else {
      out = download(send, n * es);
      for (size_t i = 0; i < n; i++) expect(out, t, i, val(rank, i), "scatter", n);
    }
    free(out);
    /* gather back to root */
    upload(send, mine, n * es);
    if (in_place && rank == root) {
      memcpy((char *)tmark + (size_t)root * n * es, mine, n * es);
      upload(recv, tmark, total * es);
      CHECK(mgpu_mpi_gather(recv, 0, recv, 0, n, t, root, MPI_COMM_WORLD,
                            NULL));
    } else {
      upload(recv, tmark, total * es);
      CHECK(mgpu_mpi_gather(send, 0, rank == root ? recv : NULL, 0, n, t,
                            root, MPI_COMM_WORLD, NULL));
    }
    if (rank == root) {
      out = download(recv, total * es);
      for (size_t i = 0; i < total; i++)
        expect(out, t, i, get(all, t, i), "gather", n);
      free(out);
    }
    free(tmark);
    free(rv);
    free(mark);
  }
  CHECK(mgpu_free(send));
  CHECK(mgpu_free(recv));
  free(mine);
  free(all);
}

/* Sums and products of 8- and 16-bit integers wrap as in C and NumPy
 * (Open MPI's own MPI_SUM saturated them on 16 elements or more: 200 + 201
 * gave 255 as a uint8). */
static void check_narrow_wrap(void) {
  static const mgpu_dtype narrow[] = {MGPU_MPI_INT8, MGPU_MPI_UINT8,
                                      MGPU_MPI_INT16, MGPU_MPI_UINT16};
  enum { N = 40 };
  for (size_t t = 0; t < 4; t++)
    for (int prod = 0; prod < 2; prod++) {
      size_t es = t < 2 ? 1 : 2;
      mgpu_buffer *b = make(0, N * es);
      unsigned char h[N * 2];
      /* every rank gives 200 + rank (8-bit) or 60000 + rank (16-bit) */
      unsigned mine = es == 1 ? 200u + (unsigned)rank : 60000u + (unsigned)rank;
      unsigned want = prod ? 1u : 0u;
      for (int r = 0; r < nranks; r++) {
        unsigned v = es == 1 ? 200u + (unsigned)r : 60000u + (unsigned)r;
        want = prod ? want * v : want + v;
        want &= es == 1 ? 0xffu : 0xffffu;
      }
      for (size_t i = 0; i < N; i++) memcpy(h + i * es, &mine, es); /* LE */
      upload(b, h, N * es);
      CHECK(mgpu_mpi_allreduce(b, 0, b, 0, N, narrow[t],
                               prod ? MGPU_PROD : MGPU_SUM, MPI_COMM_WORLD,
                               NULL));
      unsigned char *got = download(b, N * es);
      for (size_t i = 0; i < N; i++) {
        unsigned v = 0;
        memcpy(&v, got + i * es, es);
        if (v != want)
          FAIL("%s %s of %d ranks: element %zu is %u, want %u",
               t == 0 ? "int8" : t == 1 ? "uint8" : t == 2 ? "int16" : "uint16",
               prod ? "prod" : "sum", nranks, i, v, want);
      }
      free(got);
      CHECK(mgpu_free(b));
    }
}

static void run_coll(void) {
  check_narrow_wrap();
  /* odd counts; 3001 elements cross several 4 KiB bounce chunks */
  static const size_t counts[] = {1, 7, 3001};
  int ndev = mgpu_device_count();
  int step = 0;
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
    for (size_t ci = 0; ci < 3; ci++)
      for (int in_place = 0; in_place < 2; in_place++) {
        int dev = step++ % ndev; /* every device of the rank takes a turn */
        for (size_t oi = 0; oi < 4; oi++) {
          test_allreduce(dev, types[ti], ops[oi], counts[ci], in_place);
          test_reduce_scatter(dev, types[ti], ops[oi], counts[ci], in_place);
        }
        test_movers(dev, types[ti], counts[ci], in_place);
      }
  /* larger than one 1 MiB piece: reductions go to MPI in pieces */
  test_allreduce(ndev - 1, MGPU_FLOAT32, MGPU_SUM, 300001, 0);
  test_allreduce(0, MGPU_INT64, MGPU_MAX, 150001, 1);
  /* count 0 is a no-op that still agrees */
  mgpu_buffer *b = make(0, 8);
  CHECK(mgpu_mpi_allreduce(b, 0, b, 0, 0, MGPU_FLOAT32, MGPU_SUM,
                           MPI_COMM_WORLD, NULL));
  CHECK(mgpu_free(b));
  /* a stream of the buffer's device orders the call after its work */
  mgpu_stream *s;
  CHECK(mgpu_stream_create(&s, ndev - 1));
  b = make(ndev - 1, 1000 * sizeof(double));
  double one = 1.0;
  CHECK(mgpu_fill(s, b, 0, 1000, MGPU_FLOAT64, &one));
  CHECK(mgpu_mpi_allreduce(b, 0, b, 0, 1000, MGPU_FLOAT64, MGPU_SUM,
                           MPI_COMM_WORLD, s));
  double *o = download(b, 1000 * sizeof(double));
  for (int i = 0; i < 1000; i++)
    if (o[i] != nranks) FAIL("allreduce after fill: %g at %d", o[i], i);
  free(o);
  CHECK(mgpu_free(b));
  CHECK(mgpu_stream_destroy(s));
  mgpu_mpi_stats st = {sizeof st, 0, 0, 0, 0, 0, 0, 0};
  CHECK(mgpu_mpi_get_stats(&st));
  const char *stage = getenv("MGPU_MPI_STAGE");
  int staged = stage != NULL && strcmp(stage, "1") == 0;
  /* Memory of a device that is not the host's takes the direct path where
   * MPI is CUDA-aware (CUDA devices), else the staged one. */
  mgpu_device_props p0 = {.size = sizeof p0};
  CHECK(mgpu_device_get_props(0, &p0));
  mgpu_mpi_info in = {.size = sizeof in};
  CHECK(mgpu_mpi_get_info(&in));
  int direct = 0;
  if (!staged && p0.backend_kind != MGPU_BACKEND_HOST) {
    direct = in.cuda_aware && p0.backend_kind == MGPU_BACKEND_CUDA;
    staged = !direct;
  }
  /* the same per device in mgpu's metrics */
  mgpu_metrics m;
  memset(&m, 0, sizeof m);
  m.size = sizeof m;
  CHECK(mgpu_metrics_snapshot(&m));
  uint64_t host = 0, staged_m = 0, bytes = 0;
  for (int d = 0; d < m.ndevices; d++) {
    host += m.dev[d].mpi_host;
    staged_m += m.dev[d].mpi_staged;
    bytes += m.dev[d].bytes_mpi;
  }
  if (host != st.calls_host || staged_m != st.calls_staged ||
      bytes != st.bytes_host + st.bytes_staged)
    FAIL("metrics: host %llu staged %llu bytes %llu; stats %llu %llu",
         (unsigned long long)host, (unsigned long long)staged_m,
         (unsigned long long)bytes, (unsigned long long)st.calls_host,
         (unsigned long long)st.calls_staged);
  if (direct ? (st.calls_direct == 0 || st.calls_staged != 0)
      : staged ? (st.calls_staged == 0 || st.calls_host != 0 ||
                  (nranks > 1 && st.staged_chunks == 0))
               : (st.calls_host == 0 || st.calls_staged != 0))
    FAIL("paths (expected %s): host %llu staged %llu chunks %llu",
         direct ? "direct" : staged ? "staged" : "host",
         (unsigned long long)st.calls_host,
         (unsigned long long)st.calls_staged,
         (unsigned long long)st.staged_chunks);
}

/* ---- point to point ---- */

static void run_p2p(void) {
  int ndev = mgpu_device_count();
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  static const size_t counts[] = {1, 5, 4097, 100003};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
    for (size_t ci = 0; ci < 4; ci++) {
      mgpu_dtype t = types[ti];
      size_t n = counts[ci], es = mgpu_dtype_size(t);
      int dev = (int)(ti + ci) % ndev;
      mgpu_buffer *sb = make(dev, n * es + 16), *rb = make(ndev - 1 - dev, 2 * n * es + 16);
      void *h = values(t, n, rank, 3);
      CHECK(mgpu_memcpy_htod(sb, 16, h, n * es));
      /* non-blocking ring exchange; the receive waited on first */
      mgpu_mpi_request *sr, *rr;
      CHECK(mgpu_mpi_irecv(rb, 8, n, t, prev, 5, MPI_COMM_WORLD, NULL, &rr));
      CHECK(mgpu_mpi_isend(sb, 16, n, t, next, 5, MPI_COMM_WORLD, NULL, &sr));
      CHECK(mgpu_mpi_wait(rr));
      CHECK(mgpu_mpi_wait(sr));
      void *o = malloc(n * es);
      CHECK(mgpu_memcpy_dtoh(o, rb, 8, n * es));
      for (size_t i = 0; i < n; i++) expect(o, t, i, val(prev, 3 + i), "isend/irecv", n);
      /* blocking, in pairs: even ranks send first */
      if (nranks > 1 && !(nranks % 2 == 1 && rank == nranks - 1)) {
        int partner = rank ^ 1;
        if (rank % 2 == 0) {
          CHECK(mgpu_mpi_send(sb, 16, n, t, partner, 6, MPI_COMM_WORLD, NULL));
          CHECK(mgpu_mpi_recv(rb, 0, n, t, partner, 7, MPI_COMM_WORLD, NULL));
        } else {
          CHECK(mgpu_mpi_recv(rb, 0, n, t, partner, 6, MPI_COMM_WORLD, NULL));
          CHECK(mgpu_mpi_send(sb, 16, n, t, partner, 7, MPI_COMM_WORLD, NULL));
        }
        CHECK(mgpu_memcpy_dtoh(o, rb, 0, n * es));
        for (size_t i = 0; i < n; i++)
          expect(o, t, i, val(partner, 3 + i), "send/recv", n);
      }
      /* two sends on one tag arrive in order */
      mgpu_mpi_request *a, *b, *c, *d;
      CHECK(mgpu_mpi_isend(sb, 16, n, t, next, 8, MPI_COMM_WORLD, NULL, &a));
      CHECK(mgpu_mpi_isend(sb, 16 + es, n - 1, t, next, 8, MPI_COMM_WORLD, NULL, &b));
      CHECK(mgpu_mpi_irecv(rb, 0, n, t, prev, 8, MPI_COMM_WORLD, NULL, &c));
      CHECK(mgpu_mpi_wait(c));
      CHECK(mgpu_mpi_irecv(rb, n * es, n - 1, t, prev, 8, MPI_COMM_WORLD, NULL, &d));
      CHECK(mgpu_mpi_wait(d));
      CHECK(mgpu_mpi_wait(b));
      CHECK(mgpu_mpi_wait(a));
      void *o2 = malloc(2 * n * es);
      CHECK(mgpu_memcpy_dtoh(o2, rb, 0, (2 * n - 1) * es));
      for (size_t i = 0; i < n; i++) expect(o2, t, i, val(prev, 3 + i), "first of two", n);
      for (size_t i = 0; i + 1 < n; i++)
        expect(o2, t, n + i, val(prev, 4 + i), "second of two", n);
      free(o2);
      free(o);
      free(h);
      CHECK(mgpu_free(sb));
      CHECK(mgpu_free(rb));
    }
}

/* A 13 x 9 tile of floats from an image of pitch 64 floats on this rank to
 * the next rank's image of pitch 40 floats, at another place. */
static void run_p2p_2d(void) {
  int ndev = mgpu_device_count();
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  size_t tw = 13, th = 9, sp = 64, dp = 40;
  float *img = malloc(sp * 20 * sizeof *img), *out = malloc(dp * 20 * sizeof *out);
  for (size_t i = 0; i < sp * 20; i++) img[i] = (float)(rank * 10000 + (int)i);
  for (size_t i = 0; i < dp * 20; i++) out[i] = -1;
  mgpu_buffer *src = make(0, sp * 20 * sizeof(float));
  mgpu_buffer *dst = make(ndev - 1, dp * 20 * sizeof(float));
  upload(src, img, sp * 20 * sizeof(float));
  upload(dst, out, dp * 20 * sizeof(float));
  /* source tile at (3, 5), destination at (7, 2) */
  size_t soff = (5 * sp + 3) * sizeof(float), doff = (2 * dp + 7) * sizeof(float);
  if (nranks == 1) {
    CHECK(mgpu_memcpy_2d(dst, doff, dp * sizeof(float), src, soff,
                         sp * sizeof(float), tw * sizeof(float), th));
  } else if (rank % 2 == 0) {
    CHECK(mgpu_mpi_send_2d(src, soff, sp * sizeof(float), tw, th, MGPU_FLOAT32,
                           next, 9, MPI_COMM_WORLD, NULL));
    CHECK(mgpu_mpi_recv_2d(dst, doff, dp * sizeof(float), tw, th, MGPU_FLOAT32,
                           prev, 9, MPI_COMM_WORLD, NULL));
  } else {
    CHECK(mgpu_mpi_recv_2d(dst, doff, dp * sizeof(float), tw, th, MGPU_FLOAT32,
                           prev, 9, MPI_COMM_WORLD, NULL));
    CHECK(mgpu_mpi_send_2d(src, soff, sp * sizeof(float), tw, th, MGPU_FLOAT32,
                           next, 9, MPI_COMM_WORLD, NULL));
  }
  float *got = download(dst, dp * 20 * sizeof(float));
  int from = nranks == 1 ? rank : prev;
  for (size_t y = 0; y < 20; y++)
    for (size_t x = 0; x < dp; x++) {
      int in = x >= 7 && x < 7 + tw && y >= 2 && y < 2 + th;
      float want = in ? (float)(from * 10000 + (int)((y - 2 + 5) * sp + (x - 7 + 3))) : -1;
      if (got[y * dp + x] != want)
        FAIL("2-D from rank %d: (%zu, %zu) is %g, expected %g", from, x, y,
             got[y * dp + x], want);
    }
  EXPECT_RC(mgpu_mpi_send_2d(src, 0, 8, tw, th, MGPU_FLOAT32, next, 9,
                             MPI_COMM_WORLD, NULL), MGPU_EINVAL);
  EXPECT_RC(mgpu_mpi_send_2d(src, soff, sp * sizeof(float), tw, 40,
                             MGPU_FLOAT32, next, 9, MPI_COMM_WORLD, NULL),
            MGPU_ERANGE);
  free(got);
  free(img);
  free(out);
  CHECK(mgpu_free(src));
  CHECK(mgpu_free(dst));
}

/* ---- bad input: an error on every rank, before any data moves ---- */

static void run_bad_input(void) {
  size_t n = 100;
  int ndev = mgpu_device_count();
  mgpu_buffer *small = make(0, 10 * sizeof(float));
  mgpu_buffer *buf = make(0, n * sizeof(float));
  mgpu_buffer *other = make(ndev - 1, n * sizeof(float));
  void *mark = values(MGPU_FLOAT32, n, -1, 0);
  upload(buf, mark, n * sizeof(float));
  int last = nranks - 1;
  /* buffer too small on the last rank */
  int rc = mgpu_mpi_allreduce(rank == last ? small : buf, 0,
                              rank == last ? small : buf, 0, n, MGPU_FLOAT32,
                              MGPU_SUM, MPI_COMM_WORLD, NULL);
  EXPECT_RC(rc, MGPU_ERANGE);
  if (rank == last ? !strstr(mgpu_error_detail(), "exceeds")
                   : !strstr(mgpu_error_detail(), "refused"))
    FAIL("detail: %s", mgpu_error_detail());
  /* an offset past the end */
  EXPECT_RC(mgpu_mpi_bcast(buf, rank == last ? n * sizeof(float) : 0, n,
                           MGPU_FLOAT32, 0, MPI_COMM_WORLD, NULL),
            MGPU_ERANGE);
  /* counts differ */
  if (nranks > 1) {
    EXPECT_RC(mgpu_mpi_allreduce(buf, 0, buf, 0, rank == last ? n - 1 : n,
                                 MGPU_FLOAT32, MGPU_SUM, MPI_COMM_WORLD, NULL),
              MGPU_EMISMATCH);
    if (!strstr(mgpu_error_detail(), "count"))
      FAIL("detail: %s", mgpu_error_detail());
    /* types differ (same bytes) */
    EXPECT_RC(mgpu_mpi_allreduce(buf, 0, buf, 0, n,
                                 rank == last ? MGPU_INT32 : MGPU_FLOAT32,
                                 MGPU_SUM, MPI_COMM_WORLD, NULL),
              MGPU_EMISMATCH);
    /* ops differ, roots differ, calls differ */
    EXPECT_RC(mgpu_mpi_allreduce(buf, 0, buf, 0, n, MGPU_FLOAT32,
                                 rank == last ? MGPU_MAX : MGPU_SUM,
                                 MPI_COMM_WORLD, NULL),
              MGPU_EMISMATCH);
    EXPECT_RC(mgpu_mpi_bcast(buf, 0, n, MGPU_FLOAT32, rank == last ? 1 : 0,
                             MPI_COMM_WORLD, NULL),
              MGPU_EMISMATCH);
    /* a broadcast has no op to name */
    if (!strstr(mgpu_error_detail(), "root") ||
        strstr(mgpu_error_detail(), "op "))
      FAIL("detail: %s", mgpu_error_detail());
    if (rank == last)
      rc = mgpu_mpi_bcast(buf, 0, n, MGPU_FLOAT32, 0, MPI_COMM_WORLD, NULL);
    else
      rc = mgpu_mpi_allgather(buf, 0, buf, 0, n / nranks, MGPU_FLOAT32,
                              MPI_COMM_WORLD, NULL);
    EXPECT_RC(rc, MGPU_EMISMATCH);
  }
  /* wrong device: the stream is not the buffer's (on the ranks with two
   * devices; the others are told) */
  int two_somewhere = ndev > 1;
  MPI_Allreduce(MPI_IN_PLACE, &two_somewhere, 1, MPI_INT, MPI_MAX,
                MPI_COMM_WORLD);
  if (two_somewhere) {
    mgpu_stream *s;
    CHECK(mgpu_stream_create(&s, ndev - 1));
    EXPECT_RC(mgpu_mpi_allreduce(buf, 0, buf, 0, n, MGPU_FLOAT32, MGPU_SUM,
                                 MPI_COMM_WORLD, ndev > 1 ? s : NULL),
              MGPU_EWRONGDEV);
    if (ndev > 1 && !strstr(mgpu_error_detail(), "but the stream on device"))
      FAIL("detail: %s", mgpu_error_detail());
    /* send and recv on different devices */
    EXPECT_RC(mgpu_mpi_allreduce(buf, 0, other, 0, n, MGPU_FLOAT32, MGPU_SUM,
                                 MPI_COMM_WORLD, NULL),
              ndev > 1 || nranks > 1 ? MGPU_EWRONGDEV : 0);
    CHECK(mgpu_stream_destroy(s));
  }
  /* a bad root, a bad op, a freed buffer */
  EXPECT_RC(mgpu_mpi_bcast(buf, 0, n, MGPU_FLOAT32, nranks, MPI_COMM_WORLD,
                           NULL), MGPU_EINVAL);
  EXPECT_RC(mgpu_mpi_allreduce(buf, 0, buf, 0, n, MGPU_FLOAT32, (mgpu_op)9,
                               MPI_COMM_WORLD, NULL), MGPU_EINVAL);
  mgpu_buffer *gone = make(0, 64);
  CHECK(mgpu_free(gone));
  EXPECT_RC(mgpu_mpi_allreduce(rank == 0 ? gone : buf, 0, rank == 0 ? gone : buf,
                               0, 4, MGPU_FLOAT32, MGPU_SUM, MPI_COMM_WORLD,
                               NULL), MGPU_EBADHANDLE);
  /* nothing moved: buf still holds the marker */
  float *o = download(buf, n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    if (o[i] != 9.0f) FAIL("data moved by a refused call: %g at %zu", o[i], i);
  free(o);
  /* point to point: count differs between sender and receiver */
  if (nranks > 1) {
    if (rank == 0) {
      EXPECT_RC(mgpu_mpi_send(buf, 0, n, MGPU_FLOAT32, 1, 3, MPI_COMM_WORLD,
                              NULL), MGPU_EMISMATCH);
      if (!strstr(mgpu_error_detail(), "rank 1"))
        FAIL("detail: %s", mgpu_error_detail());
    } else if (rank == 1) {
      EXPECT_RC(mgpu_mpi_recv(buf, 0, n - 1, MGPU_FLOAT32, 0, 3,
                              MPI_COMM_WORLD, NULL), MGPU_EMISMATCH);
    }
    o = download(buf, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (o[i] != 9.0f) FAIL("data moved by a refused recv: %g", o[i]);
    free(o);
  }
  EXPECT_RC(mgpu_mpi_send(small, 0, n, MGPU_FLOAT32, 0, 1, MPI_COMM_WORLD,
                          NULL), MGPU_ERANGE);
  EXPECT_RC(mgpu_mpi_send(buf, 0, n, MGPU_FLOAT32, nranks, 1, MPI_COMM_WORLD,
                          NULL), MGPU_EINVAL);
  EXPECT_RC(mgpu_mpi_send(buf, 0, n, MGPU_FLOAT32, 0, MGPU_MPI_TAG_RESERVED,
                          MPI_COMM_WORLD, NULL), MGPU_EINVAL);
  EXPECT_RC(mgpu_mpi_wait(NULL), MGPU_EBADHANDLE);
  free(mark);
  CHECK(mgpu_free(small));
  CHECK(mgpu_free(buf));
  CHECK(mgpu_free(other));
}

/* The last rank never calls: the others time out naming it. */
static void run_missing_rank(void) {
  mgpu_buffer *b = make(0, 64);
  int last = nranks - 1;
  MPI_Comm present; /* every rank but the last */
  MPI_Comm_split(MPI_COMM_WORLD, rank != last, rank, &present);
  char want[64];
  if (rank == 0) {
    /* a receive from a rank that never sends */
    EXPECT_RC(mgpu_mpi_recv(b, 0, 4, MGPU_FLOAT32, last, 2, MPI_COMM_WORLD,
                            NULL), MGPU_ETIMEDOUT);
    snprintf(want, sizeof want, "rank %d did not answer", last);
    if (!strstr(mgpu_error_detail(), want))
      FAIL("detail: %s", mgpu_error_detail());
  }
  if (rank != last) {
    MPI_Barrier(present);
    EXPECT_RC(mgpu_mpi_allreduce(b, 0, b, 0, 4, MGPU_FLOAT32, MGPU_SUM,
                                 MPI_COMM_WORLD, NULL), MGPU_ETIMEDOUT);
    snprintf(want, sizeof want, "rank(s) %d", last);
    if (!strstr(mgpu_error_detail(), want))
      FAIL("detail does not name rank %d: %s", last, mgpu_error_detail());
    /* Refused from then on: the missing rank, were it to come, would meet
     * this call with its first. */
    EXPECT_RC(mgpu_mpi_allreduce(b, 0, b, 0, 4, MGPU_FLOAT32, MGPU_SUM,
                                 MPI_COMM_WORLD, NULL), MGPU_ETIMEDOUT);
    if (!strstr(mgpu_error_detail(), "an earlier call timed out"))
      FAIL("detail: %s", mgpu_error_detail());
  }
  MPI_Comm_free(&present);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(mgpu_free(b));
}

/* A rank that comes after the others timed out: before, the others' next
 * call met its first, and every rank returned success with the other
 * call's data (sums of the wrong terms). Now the others refuse every later
 * call, and the late rank's call times out in its turn. */
static void run_late_rank(void) {
  int last = nranks - 1;
  mgpu_buffer *b = make(0, 64);
  float h[4];
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 4; i++) h[i] = (float)((k + 1) * (rank + 1));
    upload(b, h, sizeof h);
    if (rank == last && k == 0) usleep(1500 * 1000); /* past the timeout */
    int rc = mgpu_mpi_allreduce(b, 0, b, 0, 4, MGPU_FLOAT32, MGPU_SUM,
                                MPI_COMM_WORLD, NULL);
    if (rc == 0) {
      float *got = download(b, sizeof h);
      FAIL("call %d returned success (%g) after a rank timed out", k,
           (double)got[0]);
    }
    EXPECT_RC(rc, MGPU_ETIMEDOUT);
    if (rank == last) break; /* its own call 0 timed out */
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(mgpu_free(b));
}

/* ---- a rank that fails or leaves ---- */

/* What try_allreduce found in recv. */
enum { UNTOUCHED = 0, SUMMED = 1, OTHER = 2 };
static char last_detail[1024];

/* An all-reduce of n floats (rank r gives r + 1) on device 0 into a recv
 * marked 9, with the faults fault names (NULL: none) during the call: the
 * call's code (its detail in last_detail) and, in *found,
 * what recv holds after. */
static int try_allreduce(size_t n, int *found, const char *fault) {
  mgpu_buffer *send = make(0, n * sizeof(float));
  mgpu_buffer *recv = make(0, n * sizeof(float));
  float *h = malloc(n * sizeof(float));
  if (h == NULL) FAIL("malloc");
  for (size_t i = 0; i < n; i++) h[i] = (float)(rank + 1);
  upload(send, h, n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = 9.0f;
  upload(recv, h, n * sizeof(float));
  char why[256];
  if (fault != NULL && mgpu__fault_set(fault, why, sizeof why) != 0)
    FAIL("MGPU_FAULT %s: %s", fault, why);
  int rc = mgpu_mpi_allreduce(send, 0, recv, 0, n, MGPU_FLOAT32, MGPU_SUM,
                              MPI_COMM_WORLD, NULL);
  if (fault != NULL) mgpu__fault_set("", why, sizeof why);
  snprintf(last_detail, sizeof last_detail, "%s",
           rc != 0 ? mgpu_error_detail() : "");
  float *o = download(recv, n * sizeof(float));
  float want = (float)(nranks * (nranks + 1) / 2);
  int marks = 1, sums = 1;
  for (size_t i = 0; i < n; i++) {
    marks &= o[i] == 9.0f;
    sums &= o[i] == want;
  }
  *found = marks ? UNTOUCHED : sums ? SUMMED : OTHER;
  free(o);
  free(h);
  CHECK(mgpu_free(send));
  CHECK(mgpu_free(recv));
  return rc;
}

static void expect_detail(const char *part) {
  if (!strstr(last_detail, part))
    FAIL("detail does not say '%s': %s", part, last_detail);
}

/* Rank 1 was started with MGPU_MPI_CHUNK=4K, the others with the default:
 * every rank refuses, naming both values, and no byte moves (it was a write
 * past rank 1's 4 KiB bounce buffer). */
static void run_chunk_mismatch(void) {
  int found;
  EXPECT_RC(try_allreduce(300000, &found, NULL), MGPU_EMISMATCH);
  if (found != UNTOUCHED) FAIL("recv changed by a refused call (%d)", found);
  expect_detail("MGPU_MPI_CHUNK=");
  expect_detail("4096");
  expect_detail("1048576");
  expect_detail(rank == 1 ? "on rank 0" : "on rank 1");
}

/* Rank 1 fails what fault names in the next all-reduce
 * of n floats: rank 1 returns want, the others the same code naming rank 1,
 * and recv is as found says; then, with the fault cleared, the next call
 * works on every rank. */
static void fail_on_rank1(const char *fault, size_t n, int want, int found_want) {
  int found;
  int rc = try_allreduce(n, &found, rank == 1 ? fault : NULL);
  if (rc != want)
    FAIL("%s on rank 1: %s, expected %s (%s)", fault, mgpu_err_name(rc),
         mgpu_err_name(want), last_detail);
  if (rank != 1) expect_detail("rank 1 ");
  if (found_want >= 0 && found != found_want)
    FAIL("%s on rank 1: recv %d, expected %d", fault, found, found_want);
  EXPECT_RC(try_allreduce(n, &found, NULL), 0);
  if (found != SUMMED) FAIL("after %s: recv %d", fault, found);
}

/* The failing-allocation tests count the allocations of a staged
 * all-reduce between host devices, and MGPU_FAULT's device rule loses host
 * devices only: on other devices (a GPU run of the suite) those tests
 * check nothing. */
static int device0_is_host(void) {
  mgpu_device_props p = {.size = sizeof p};
  CHECK(mgpu_device_get_props(0, &p));
  if (p.backend_kind == MGPU_BACKEND_HOST) return 1;
  if (rank == 0) printf("device 0 is not a host device: not run\n");
  return 0;
}

static void run_rank_fails(void) {
  if (nranks < 2 || !device0_is_host()) return;
  /* Rank 1 cannot make its bounce pool: nothing moved anywhere. */
  fail_on_rank1("backend:event_create:1+", 3001, MGPU_EBACKEND, UNTOUCHED);
  mgpu_mpi_finalize();
  CHECK(mgpu_mpi_init(MPI_COMM_WORLD, NULL));
  fail_on_rank1("alloc:1+", 3001, MGPU_ENOMEM, UNTOUCHED);
  /* The pool is made: rank 1's copies fail while the data moves, every
   * rank hears of it at the end (what recv holds is undefined). */
  fail_on_rank1("alloc:1+", 3001, MGPU_ENOMEM, -1);
  fail_on_rank1("alloc:12+", 3001, MGPU_ENOMEM, -1);
}

/* A staged send whose first copy to its bounce buffer fails, after the
 * hand-shake: the receiver times out in the data phase naming the sender
 * (its bounce slots never used were cancelled too, as requests 0, and
 * MPI aborted the job); the sender returns its own failure. */
static void run_sender_fails_staged(void) {
  if (nranks != 2 || !device0_is_host()) return;
  mgpu_buffer *b = make(0, 4096);
  char why[256];
  if (rank == 0) {
    if (mgpu__fault_set("backend:memcpy_async:1", why, sizeof why) != 0)
      FAIL("MGPU_FAULT: %s", why);
    EXPECT_RC(mgpu_mpi_send(b, 0, 1000, MGPU_FLOAT32, 1, 3, MPI_COMM_WORLD,
                            NULL), MGPU_EBACKEND);
    mgpu__fault_set("", why, sizeof why);
  } else {
    EXPECT_RC(mgpu_mpi_recv(b, 0, 1000, MGPU_FLOAT32, 0, 3, MPI_COMM_WORLD,
                            NULL), MGPU_ETIMEDOUT);
    snprintf(last_detail, sizeof last_detail, "%s", mgpu_error_detail());
    expect_detail("rank 0 did not come for the data");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(mgpu_free(b));
}

/* A send's buffer freed between mgpu_mpi_isend and the wait, host path:
 * MPI read the freed memory (a crash in MPI_Isend); now the wait returns
 * MGPU_EFREED naming it, and the receiver times out. */
static void run_freed_before_wait(void) {
  if (nranks != 2 || !device0_is_host()) return;
  mgpu_buffer *b = make(0, 1 << 20);
  mgpu_mpi_request *rq;
  if (rank == 0) {
    CHECK(mgpu_mpi_isend(b, 0, 65536, MGPU_FLOAT32, 1, 7, MPI_COMM_WORLD,
                         NULL, &rq));
    CHECK(mgpu_free(b));
    EXPECT_RC(mgpu_mpi_wait(rq), MGPU_EFREED);
    snprintf(last_detail, sizeof last_detail, "%s", mgpu_error_detail());
    expect_detail("(262144 bytes at offset 0) was freed before its data "
                  "moved");
  } else {
    CHECK(mgpu_mpi_irecv(b, 0, 65536, MGPU_FLOAT32, 0, 7, MPI_COMM_WORLD,
                         NULL, &rq));
    EXPECT_RC(mgpu_mpi_wait(rq), MGPU_ETIMEDOUT);
    CHECK(mgpu_free(b));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* Requests never waited for: mgpu_mpi_finalize completes them before
 * its shutdown frees their buffers (it left them listed, and a later wait
 * ran on freed buffers); a wait after it is MGPU_EBADHANDLE. */
static void run_finalize_open_requests(void) {
  if (nranks != 2) return;
  mgpu_buffer *b = make(0, 4096);
  mgpu_mpi_request *rq;
  if (rank == 0)
    CHECK(mgpu_mpi_isend(b, 0, 1024, MGPU_FLOAT32, 1, 4, MPI_COMM_WORLD, NULL,
                         &rq));
  else
    CHECK(mgpu_mpi_irecv(b, 0, 1024, MGPU_FLOAT32, 0, 4, MPI_COMM_WORLD, NULL,
                         &rq));
  CHECK(mgpu_mpi_finalize());
  EXPECT_RC(mgpu_mpi_wait(rq), MGPU_EBADHANDLE);
  CHECK(mgpu_mpi_init(MPI_COMM_WORLD, NULL));
}

/* The module allocates through libmgpu's allocator, a fault site
 * (mgpu_module_calloc): rank 1's first allocation in an all-reduce of host
 * memory is the argument check's. Its failure fails the call on every
 * rank, naming rank 1, before a byte moves, and nobody waits for rank 1;
 * the next call works. */
static void run_module_alloc(void) {
  if (nranks < 2 || !device0_is_host()) return;
  int found;
  int rc = try_allreduce(3001, &found, rank == 1 ? "alloc:1" : NULL);
  if (rc != MGPU_ENOMEM)
    FAIL("alloc:1 on rank 1: %s, expected MGPU_ENOMEM (%s)",
         mgpu_err_name(rc), last_detail);
  expect_detail(rank == 1 ? "argument check" : "rank 1 ");
  if (found != UNTOUCHED) FAIL("recv changed by a refused call (%d)", found);
  EXPECT_RC(try_allreduce(3001, &found, NULL), 0);
  if (found != SUMMED) FAIL("after alloc:1: recv %d", found);
}

/* The last rank dies (SIGKILL) inside its second MPI_Iallreduce (see
 * MPI_Iallreduce below), as a rank killed mid-call does, under a launcher
 * that keeps the others running (mpirun --enable-recovery): they return
 * MGPU_ETIMEDOUT naming it, the next call is refused, and they report. */
static int die_at;
static void run_rank_dies(void) {
  int last = nranks - 1, found;
  if (rank == last) die_at = 2;
  EXPECT_RC(try_allreduce(64, &found, NULL), 0);
  EXPECT_RC(try_allreduce(64, &found, NULL), MGPU_ETIMEDOUT);
  char want[64];
  snprintf(want, sizeof want, "did not come: %d", last);
  expect_detail(want);
  EXPECT_RC(try_allreduce(64, &found, NULL), MGPU_ETIMEDOUT);
  expect_detail("an earlier call timed out");
  printf("rank %d: ok: %s\n", rank, want);
  fflush(stdout);
  _exit(0); /* MPI_Finalize would wait for the dead rank */
}

/* Rank 1 dies (SIGKILL) as it sends its first piece of data, after the
 * hand-shake: rank 0's receive returns MGPU_ETIMEDOUT naming it. */
static int die_in_data_send;
static void run_peer_dies(void) {
  mgpu_buffer *b = make(0, 4096 * sizeof(float));
  if (rank == 1) {
    die_in_data_send = 1;
    mgpu_mpi_send(b, 0, 4096, MGPU_FLOAT32, 0, 3, MPI_COMM_WORLD, NULL);
    FAIL("rank 1 did not die");
  }
  if (rank == 0) {
    EXPECT_RC(mgpu_mpi_recv(b, 0, 4096, MGPU_FLOAT32, 1, 3, MPI_COMM_WORLD,
                            NULL), MGPU_ETIMEDOUT);
    snprintf(last_detail, sizeof last_detail, "%s", mgpu_error_detail());
    expect_detail("recv from rank 1 tag 3: rank 1 did not come for the data");
    EXPECT_RC(mgpu_mpi_recv(b, 0, 4096, MGPU_FLOAT32, 1, 3, MPI_COMM_WORLD,
                            NULL), MGPU_ETIMEDOUT);
    snprintf(last_detail, sizeof last_detail, "%s", mgpu_error_detail());
    expect_detail("an earlier call timed out");
    printf("rank 0: ok\n");
    fflush(stdout);
  }
  _exit(0); /* MPI_Finalize would wait for the dead rank */
}

/* MPI's profiling interface: the module's data sends come here. */
int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest,
              int tag, MPI_Comm comm, MPI_Request *request) {
  if (die_in_data_send && datatype == MPI_BYTE) raise(SIGKILL);
  return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
}

/* MPI's profiling interface: the module's MPI_Iallreduce comes here. */
int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count,
                   MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                   MPI_Request *request) {
  static int calls;
  if (die_at > 0 && ++calls == die_at) raise(SIGKILL);
  return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm,
                         request);
}

/* One communicator over every device of every rank; *in tells where this
 * rank's devices sit in it. */
static mgpu_comm *comm_over_all(mgpu_mpi_info *in) {
  int ndev = mgpu_device_count();
  int devs[MGPU_MAX_DEVICES];
  for (int d = 0; d < ndev; d++) devs[d] = d;
  mgpu_comm *comm;
  CHECK(mgpu_mpi_comm_create(MPI_COMM_WORLD, ndev, devs, &comm));
  in->size = sizeof *in;
  CHECK(mgpu_mpi_get_info(in));
  return comm;
}

/* In a communicator over every device of every rank, rank 1 loses its
 * device 0 (MGPU_FAULT device:0@after:0): its calls fail with
 * MGPU_EDEVLOST, and every other rank's with MGPU_EDEVLOST naming rank 1
 * and the device, at once rather than after the timeout (the test's
 * MGPU_MPI_TIMEOUT_MS is far beyond ctest's limit). */
static void run_comm_lost(void) {
  int ndev = mgpu_device_count();
  mgpu_mpi_info in;
  mgpu_comm *comm = comm_over_all(&in);
  mgpu_buffer *b[MGPU_MAX_DEVICES];
  mgpu_stream *s[MGPU_MAX_DEVICES];
  for (int d = 0; d < ndev; d++) {
    b[d] = make(d, 64 * sizeof(float));
    CHECK(mgpu_stream_create(&s[d], d));
  }
  char why[256];
  if (rank == 1 && mgpu__fault_set("device:0@after:0", why, sizeof why) != 0)
    FAIL("MGPU_FAULT: %s", why);
  int rcs[MGPU_MAX_DEVICES];
  CHECK(mgpu_group_begin());
  for (int d = 0; d < ndev; d++)
    rcs[d] = mgpu_allreduce(comm, in.first_device + d, b[d], b[d], 64,
                            MGPU_FLOAT32, MGPU_SUM, s[d]);
  int end = mgpu_group_end();
  snprintf(last_detail, sizeof last_detail, "%s", mgpu_error_detail());
  for (int d = 0; d < ndev; d++)
    if (rcs[d] != 0 && rcs[d] != MGPU_EDEVLOST)
      FAIL("local rank %d: %s", d, mgpu_err_name(rcs[d]));
  if (end != MGPU_EDEVLOST)
    FAIL("group end: %s, expected MGPU_EDEVLOST (%s)", mgpu_err_name(end),
         last_detail);
  if (rank != 1) {
    expect_detail("rank 1 lost its device 0");
  } else {
    mgpu__fault_set("", why, sizeof why);
  }
  mgpu_comm_abort(comm);
  for (int d = 0; d < ndev; d++) {
    mgpu_stream_destroy(s[d]);
    mgpu_free(b[d]);
  }
}

/* ---- one mgpu_comm over the devices of every rank ---- */

static double reduced_n(mgpu_op op, size_t i, int n) {
  double acc = val(0, i);
  for (int r = 1; r < n; r++) acc = combine(op, acc, val(r, i));
  return acc;
}

/* Every local rank of the communicator issues, in one group. */
static void run_comm(void) {
  int ndev = mgpu_device_count();
  mgpu_mpi_info in;
  mgpu_comm *comm = comm_over_all(&in);
  int total = mgpu_comm_size(comm), first = in.first_device;
  if (total != in.total_devices) FAIL("comm of %d ranks, %d devices", total, in.total_devices);
  if (mgpu_comm_device(comm, first + ndev - 1) != ndev - 1) FAIL("comm device");
  if (mgpu_comm_device(comm, (first + ndev) % total) >= 0 && nranks > 1)
    FAIL("a rank of another process has a device here");
  mgpu_stream *s[MGPU_MAX_DEVICES];
  for (int d = 0; d < ndev; d++) CHECK(mgpu_stream_create(&s[d], d));
  static const size_t counts[] = {1, 7, 3001, 300000};
  static const mgpu_dtype ctypes[] = {MGPU_FLOAT32, MGPU_FLOAT64, MGPU_INT32,
                                      MGPU_INT64};
  for (size_t ti = 0; ti < 4; ti++)
    for (size_t ci = 0; ci < 4; ci++) {
      mgpu_dtype t = ctypes[ti];
      size_t n = counts[ci], es = mgpu_dtype_size(t), all = n * (size_t)total;
      if (n == 300000 && ti > 0) continue; /* the large case once */
      mgpu_buffer *sb[MGPU_MAX_DEVICES], *rb[MGPU_MAX_DEVICES];
      for (int d = 0; d < ndev; d++) {
        sb[d] = make(d, all * es);
        rb[d] = make(d, all * es);
      }
      for (size_t oi = 0; oi < 4; oi++) {
        mgpu_op op = ops[oi];
        /* all-reduce, in place on odd local ranks */
        for (int d = 0; d < ndev; d++) {
          void *h = values(t, n, first + d, 0);
          upload(d % 2 ? rb[d] : sb[d], h, n * es);
          free(h);
        }
        CHECK(mgpu_group_begin());
        for (int d = 0; d < ndev; d++)
          CHECK(mgpu_allreduce(comm, first + d, d % 2 ? rb[d] : sb[d], rb[d],
                               n, t, op, s[d]));
        CHECK(mgpu_group_end());
        for (int d = 0; d < ndev; d++) {
          void *o = download(rb[d], n * es);
          for (size_t i = 0; i < n; i++)
            expect(o, t, i, reduced_n(op, i, total), "comm allreduce", n);
          free(o);
        }
        /* reduce-scatter: rank g's block g of the sum of everyone's all */
        for (int d = 0; d < ndev; d++) {
          void *h = values(t, all, first + d, 0);
          upload(sb[d], h, all * es);
          free(h);
        }
        CHECK(mgpu_group_begin());
        for (int d = 0; d < ndev; d++)
          CHECK(mgpu_reduce_scatter(comm, first + d, sb[d], rb[d], n, t, op,
                                    s[d]));
        CHECK(mgpu_group_end());
        for (int d = 0; d < ndev; d++) {
          void *o = download(rb[d], n * es);
          for (size_t i = 0; i < n; i++)
            expect(o, t, i, reduced_n(op, (size_t)(first + d) * n + i, total),
                   "comm reduce_scatter", n);
          free(o);
        }
        /* reduce to the first and the last rank */
        for (int root = 0; root < total; root += total - 1 > 0 ? total - 1 : 1) {
          for (int d = 0; d < ndev; d++) {
            void *h = values(t, n, first + d, 0);
            upload(sb[d], h, n * es);
            free(h);
          }
          CHECK(mgpu_group_begin());
          for (int d = 0; d < ndev; d++)
            CHECK(mgpu_reduce(comm, first + d, sb[d], first + d == root ? rb[d] : NULL,
                              n, t, op, root, s[d]));
          CHECK(mgpu_group_end());
          if (root >= first && root < first + ndev) {
            void *o = download(rb[root - first], n * es);
            for (size_t i = 0; i < n; i++)
              expect(o, t, i, reduced_n(op, i, total), "comm reduce", n);
            free(o);
          }
          if (total == 1) break;
        }
      }
      /* broadcast from the last rank, all-gather (in place on odd ranks) */
      int root = total - 1;
      for (int d = 0; d < ndev; d++) {
        void *h = values(t, n, first + d == root ? root : -1, 0);
        upload(sb[d], h, n * es);
        free(h);
      }
      CHECK(mgpu_group_begin());
      for (int d = 0; d < ndev; d++)
        CHECK(mgpu_broadcast(comm, first + d, first + d == root ? sb[d] : NULL,
                             rb[d], n, t, root, s[d]));
      CHECK(mgpu_group_end());
      for (int d = 0; d < ndev; d++) {
        void *o = download(rb[d], n * es);
        for (size_t i = 0; i < n; i++) expect(o, t, i, val(root, i), "comm broadcast", n);
        free(o);
      }
      for (int d = 0; d < ndev; d++) {
        void *h = values(t, n, first + d, 0);
        if (d % 2) {
          CHECK(mgpu_memcpy_htod(rb[d], (size_t)(first + d) * n * es, h, n * es));
        } else {
          upload(sb[d], h, n * es);
        }
        free(h);
      }
      CHECK(mgpu_group_begin());
      for (int d = 0; d < ndev; d++)
        CHECK(mgpu_allgather(comm, first + d, d % 2 ? rb[d] : sb[d], rb[d], n,
                             t, s[d]));
      CHECK(mgpu_group_end());
      for (int d = 0; d < ndev; d++) {
        void *o = download(rb[d], all * es);
        for (int g = 0; g < total; g++)
          for (size_t i = 0; i < n; i++)
            expect(o, t, (size_t)g * n + i, val(g, i), "comm allgather", n);
        free(o);
      }
      for (int d = 0; d < ndev; d++) {
        CHECK(mgpu_free(sb[d]));
        CHECK(mgpu_free(rb[d]));
      }
    }
  /* a rank of another process is refused here */
  if (nranks > 1) {
    mgpu_buffer *b = make(0, 64);
    int other = (first + ndev) % total;
    int rc = mgpu_allreduce(comm, other, b, b, 4, MGPU_FLOAT32, MGPU_SUM, s[0]);
    if (rc != MGPU_EINVAL || !strstr(mgpu_error_detail(), "not in this process"))
      FAIL("rank of another process: %s (%s)", mgpu_err_name(rc), mgpu_error_detail());
    CHECK(mgpu_free(b));
  }
  for (int d = 0; d < ndev; d++) CHECK(mgpu_stream_destroy(s[d]));
  CHECK(mgpu_comm_destroy(comm));
}

/* ---- one scatter from rank 0 to every device of every rank ---- */

static void run_dist(void) {
  int ndev = mgpu_device_count();
  static const mgpu_dist_kind kinds[] = {MGPU_DIST_BLOCK, MGPU_DIST_CYCLIC,
                                         MGPU_DIST_BLOCK_CYCLIC};
  size_t n = 10007;
  for (int k = 0; k < 3; k++) {
    mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
    o.kind = kinds[k];
    o.block = 5;
    mgpu_dist *d;
    CHECK(mgpu_mpi_dist_create(MPI_COMM_WORLD, n, &o, &d));
    mgpu_mpi_info in = {.size = sizeof in};
    CHECK(mgpu_mpi_get_info(&in));
    if (mgpu_dist_nparts(d) != in.total_devices) FAIL("parts");
    double *host = malloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++) host[i] = (double)i * 0.5 + 1;
    int root = nranks - 1;
    mgpu_buffer *arr = NULL;
    if (rank == root) {
      arr = make(ndev - 1, n * sizeof(double) + 16);
      CHECK(mgpu_memcpy_htod(arr, 16, host, n * sizeof(double)));
    }
    mgpu_buffer *bufs[MGPU_MAX_DEVICES];
    for (int i = 0; i < ndev; i++) {
      size_t c = mgpu_dist_count(d, in.first_device + i);
      bufs[i] = make(i, (c ? c : 1) * sizeof(double));
    }
    CHECK(mgpu_mpi_dist_scatter(d, arr, 16, sizeof(double), root, bufs,
                                MPI_COMM_WORLD));
    for (int i = 0; i < ndev; i++) {
      int p = in.first_device + i;
      size_t c = mgpu_dist_count(d, p);
      if (c == 0) continue;
      double *loc = download(bufs[i], c * sizeof(double)), two = 2.0;
      size_t at = 0;
      for (size_t r = 0; r < mgpu_dist_nranges(d, p); r++) {
        mgpu_range rg = mgpu_dist_range(d, p, r);
        for (size_t g = rg.begin; g < rg.end; g++, at++)
          if (loc[at] != host[g]) FAIL("dist scatter part %d: %g at %zu", p, loc[at], g);
      }
      free(loc);
      /* double each part on its device, then gather back */
      mgpu_stream *s;
      CHECK(mgpu_stream_create(&s, i));
      CHECK(mgpu_scale(s, bufs[i], 0, c, MGPU_FLOAT64, two));
      CHECK(mgpu_stream_destroy(s));
    }
    mgpu_buffer *back = rank == root ? make(0, n * sizeof(double)) : NULL;
    CHECK(mgpu_mpi_dist_gather(d, back, 0, sizeof(double), root, bufs,
                               MPI_COMM_WORLD));
    if (rank == root) {
      double *o = download(back, n * sizeof(double));
      for (size_t i = 0; i < n; i++)
        if (o[i] != 2 * host[i]) FAIL("dist gather: %g at %zu", o[i], i);
      free(o);
      CHECK(mgpu_free(back));
      CHECK(mgpu_free(arr));
    }
    for (int i = 0; i < ndev; i++) CHECK(mgpu_free(bufs[i]));
    free(host);
    mgpu_dist_destroy(d);
  }
  mgpu_dist_opts bad = MGPU_DIST_OPTS_INITIALIZER;
  bad.ndevices = 2;
  mgpu_dist *d;
  EXPECT_RC(mgpu_mpi_dist_create(MPI_COMM_WORLD, 10, &bad, &d), MGPU_EINVAL);
}

/* ---- which devices each rank opened ---- */

/* The share tests count devices of MGPU_DEVICES=host:4 (the tests' own);
 * under another spec (a GPU run of the suite) they check nothing else. */
static int host4(void) {
  const char *d = getenv("MGPU_DEVICES");
  if (d != NULL && strcmp(d, "host:4") == 0) return 1;
  if (rank == 0) printf("share: MGPU_DEVICES is not host:4, not counted\n");
  return 0;
}

static void check_share(int expect_nodes) {
  mgpu_mpi_info in;
  memset(&in, 0, sizeof in);
  in.size = sizeof in;
  CHECK(mgpu_mpi_get_info(&in));
  if (in.rank != rank || in.nranks != nranks) FAIL("rank %d/%d", in.rank, in.nranks);
  if (in.nnodes != expect_nodes) FAIL("%d nodes, expected %d", in.nnodes, expect_nodes);
  int per_node = (nranks + expect_nodes - 1) / expect_nodes;
  if (in.local_rank != rank % per_node || in.node != rank / per_node)
    FAIL("node %d local rank %d", in.node, in.local_rank);
  /* host:4 (the tests' MGPU_DEVICES) over the node's ranks */
  int lr = in.local_rank, ls = in.local_size;
  int want = ls <= 4 ? (lr + 1) * 4 / ls - lr * 4 / ls : 1;
  if (in.ndevices != want || mgpu_device_count() != want)
    FAIL("%d devices (mgpu says %d), expected %d", in.ndevices,
         mgpu_device_count(), want);
  int first = 0, total = 0;
  MPI_Exscan(&in.ndevices, &first, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) first = 0;
  MPI_Allreduce(&in.ndevices, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (in.first_device != first || in.total_devices != total)
    FAIL("first device %d of %d, expected %d of %d", in.first_device,
         in.total_devices, first, total);
  if (in.shared != (ls > 4)) FAIL("shared %d", in.shared);
  if (in.cuda_aware != 0) FAIL("cuda_aware %d on host devices", in.cuda_aware);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const char *name = argc > 1 ? argv[1] : "";
  if (strcmp(name, "bad_env") == 0) {
    int rc = mgpu_mpi_init(MPI_COMM_WORLD, NULL);
    if (rc != MGPU_EINVAL || !strstr(mgpu_error_detail(), "MGPU_MPI_CUDA_AWARE") ||
        !strstr(mgpu_error_detail(), "maybe"))
      FAIL("bad MGPU_MPI_CUDA_AWARE: %s (%s)", mgpu_err_name(rc), mgpu_error_detail());
    EXPECT_RC(mgpu_mpi_allreduce(NULL, 0, NULL, 0, 1, MGPU_FLOAT32, MGPU_SUM,
                                 MPI_COMM_WORLD, NULL), MGPU_ENOINIT);
    /* A timeout of 0 would fail every call that waits for another rank. */
    setenv("MGPU_MPI_CUDA_AWARE", "auto", 1);
    setenv("MGPU_MPI_TIMEOUT_MS", "0", 1);
    rc = mgpu_mpi_init(MPI_COMM_WORLD, NULL);
    if (rc != MGPU_EINVAL || !strstr(mgpu_error_detail(), "MGPU_MPI_TIMEOUT_MS"))
      FAIL("MGPU_MPI_TIMEOUT_MS=0: %s (%s)", mgpu_err_name(rc), mgpu_error_detail());
    MPI_Finalize();
    return 0;
  }
  /* The tests' devices unless the test names others. */
  if (getenv("MGPU_DEVICES") == NULL) setenv("MGPU_DEVICES", "host:4", 1);
  if (strcmp(name, "chunk_mismatch") == 0 && rank == 1)
    setenv("MGPU_MPI_CHUNK", "4K", 1);
  CHECK(mgpu_mpi_init(MPI_COMM_WORLD, NULL));
  EXPECT_RC(mgpu_mpi_init(MPI_COMM_WORLD, NULL), MGPU_EALREADY);
  if (strcmp(name, "coll") == 0) {
    run_coll();
  } else if (strcmp(name, "p2p") == 0) {
    run_p2p();
    run_p2p_2d();
  } else if (strcmp(name, "comm") == 0) {
    run_comm();
  } else if (strcmp(name, "dist") == 0) {
    run_dist();
  } else if (strcmp(name, "bad_input") == 0) {
    run_bad_input();
  } else if (strcmp(name, "missing_rank") == 0) {
    run_missing_rank();
  } else if (strcmp(name, "late_rank") == 0) {
    run_late_rank();
  } else if (strcmp(name, "chunk_mismatch") == 0) {
    run_chunk_mismatch();
  } else if (strcmp(name, "rank_fails") == 0) {
    run_rank_fails();
  } else if (strcmp(name, "sender_fails_staged") == 0) {
    run_sender_fails_staged();
  } else if (strcmp(name, "freed_before_wait") == 0) {
    run_freed_before_wait();
  } else if (strcmp(name, "finalize_open_requests") == 0) {
    run_finalize_open_requests();
  } else if (strcmp(name, "module_alloc") == 0) {
    run_module_alloc();
  } else if (strcmp(name, "comm_lost") == 0) {
    /* MGPU_FAULT's device rule loses host devices only (docs/faults.md). */
    if (nranks > 1 && device0_is_host()) run_comm_lost();
  } else if (strcmp(name, "peer_dies") == 0) {
    run_peer_dies();
  } else if (strcmp(name, "rank_dies") == 0) {
    run_rank_dies();
  } else if (strcmp(name, "share") == 0) {
    if (host4()) check_share(1);
  } else if (strcmp(name, "two_nodes") == 0) {
    if (host4()) check_share((nranks + 1) / 2);
    run_coll();
  } else if (strcmp(name, "shared") == 0) {
    mgpu_mpi_info in = {.size = sizeof in};
    CHECK(mgpu_mpi_get_info(&in));
    if (in.ndevices != 1 || in.shared != (nranks > 2))
      FAIL("host:2 over %d ranks: %d devices, shared %d", nranks, in.ndevices,
           in.shared);
    run_p2p();
  } else {
    FAIL("unknown test '%s'", name);
  }
  CHECK(mgpu_mpi_finalize());
  MPI_Finalize();
  return 0;
}
