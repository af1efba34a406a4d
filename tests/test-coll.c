/* Tests of the collectives: every collective against a host reference, for
 * every type, op, size class (0, 1, counts that do not divide by the number
 * of ranks, several pipeline chunks), in place and out of place, on
 * communicators of 1 to 4 devices (subsets of the open devices), with each
 * algorithm; one thread per device and groups; the errors, each caught
 * before any data moves; reduce_to_host; the metrics. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "task.h"
#include "util/half.h"

#define KINDS 5
enum { ALLREDUCE, REDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER };
static const char *kind_names[KINDS] = {"allreduce", "reduce", "broadcast",
                                        "allgather", "reduce_scatter"};
static const mgpu_dtype types[] = {MGPU_FLOAT32, MGPU_FLOAT64, MGPU_INT32,
                                   MGPU_INT64};
#define POISON 0xAB


typedef struct world {
  int n;
  int devs[4];
  mgpu_comm *comm;
  mgpu_stream *s[4];
  mgpu_buffer *a[4], *b[4]; /* send, recv */
  size_t cap;               /* bytes of each buffer */
  double *in[4];            /* what each rank's input holds */
  unsigned char *host;      /* scratch for read-backs */
} world;

static double rand_val(uint64_t *st, mgpu_dtype t, mgpu_op op) {
  uint64_t x = test_rand(st);
  int is_float = t == MGPU_FLOAT32 || t == MGPU_FLOAT64;
  double u = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
  if (op == MGPU_PROD) {
    static const double small[] = {-2, -1, 1, 2, 3};
    return is_float ? 0.5 + u : small[x % 5];
  }
  if (is_float) return 2 * u - 1;
  if (op == MGPU_SUM) return (double)(int)(x % 2001) - 1000;
  return (double)(int64_t)(x % 2000001) - 1000000;
}

static void put(void *p, mgpu_dtype t, size_t i, double v) {
  switch (t) {
    case MGPU_FLOAT32: ((float *)p)[i] = (float)v; break;
    case MGPU_FLOAT64: ((double *)p)[i] = v; break;
    case MGPU_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case MGPU_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: abort();
  }
}

static double get(const void *p, mgpu_dtype t, size_t i) {
  switch (t) {
    case MGPU_FLOAT32: return ((const float *)p)[i];
    case MGPU_FLOAT64: return ((const double *)p)[i];
    case MGPU_INT32: return ((const int32_t *)p)[i];
    case MGPU_INT64: return (double)((const int64_t *)p)[i];
    default: abort();
  }
}

/* The value as the device holds it (floats rounded to the type). */
static double stored(mgpu_dtype t, double v) {
  return t == MGPU_FLOAT32 ? (double)(float)v : v;
}

static double apply(mgpu_op op, double a, double b) {
  switch (op) {
    case MGPU_SUM: return a + b;
    case MGPU_PROD: return a * b;
    case MGPU_MIN: return b < a ? b : a;
    default: return b > a ? b : a;
  }
}

/* |expected - got| allowed: a sum of n terms in any order is off by at most
 * about n ulps of the sum of magnitudes; a product by n ulps of itself. */
static double tolerance(mgpu_dtype t, mgpu_op op, int n, double mag) {
  double eps = t == MGPU_FLOAT32 ? FLT_EPSILON : t == MGPU_FLOAT64 ? DBL_EPSILON : 0;
  if (op == MGPU_MIN || op == MGPU_MAX) return 0;
  return 2.0 * (n + 1) * eps * mag;
}

static void world_open(world *w, const int *devs, int n, size_t max_count,
                       const mgpu_comm_config *cfg) {
  memset(w, 0, sizeof *w);
  w->n = n;
  memcpy(w->devs, devs, (size_t)n * sizeof *devs);
  ASSERT_OK(mgpu_comm_create_config(devs, n, cfg, &w->comm));
  ASSERT_EQ(mgpu_comm_size(w->comm), n);
  w->cap = max_count * (size_t)n * 8 + 64;
  for (int r = 0; r < n; r++) {
    ASSERT_EQ(mgpu_comm_device(w->comm, r), devs[r]);
    ASSERT_OK(mgpu_stream_create(&w->s[r], devs[r]));
    ASSERT_OK(mgpu_malloc(&w->a[r], devs[r], w->cap));
    ASSERT_OK(mgpu_malloc(&w->b[r], devs[r], w->cap));
    w->in[r] = calloc(max_count * (size_t)n + 1, sizeof(double));
    ASSERT(w->in[r] != NULL);
  }
  w->host = malloc(w->cap);
  ASSERT(w->host != NULL);
}

static void world_close(world *w) {
  ASSERT_OK(mgpu_comm_destroy(w->comm));
  for (int r = 0; r < w->n; r++) {
    ASSERT_OK(mgpu_stream_destroy(w->s[r]));
    ASSERT_OK(mgpu_free(w->a[r]));
    ASSERT_OK(mgpu_free(w->b[r]));
    free(w->in[r]);
  }
  free(w->host);
}

/* Elements of rank r's input, and where they sit. */
static size_t in_count(int kind, size_t count, int n) {
  return kind == REDUCE_SCATTER ? count * (size_t)n : count;
}

static int issue(world *w, int kind, int r, mgpu_buffer *send,
                 mgpu_buffer *recv, size_t count, mgpu_dtype t, mgpu_op op,
                 int root) {
  switch (kind) {
    case ALLREDUCE: return mgpu_allreduce(w->comm, r, send, recv, count, t, op, w->s[r]);
    case REDUCE: return mgpu_reduce(w->comm, r, send, recv, count, t, op, root, w->s[r]);
    case BROADCAST: return mgpu_broadcast(w->comm, r, send, recv, count, t, root, w->s[r]);
    case ALLGATHER: return mgpu_allgather(w->comm, r, send, recv, count, t, w->s[r]);
    default: return mgpu_reduce_scatter(w->comm, r, send, recv, count, t, op, w->s[r]);
  }
}

/* Runs one collective on every rank (issued by this thread in a group) and
 * checks every rank's output, and that nothing past it was written. */
static void check_one(world *w, int kind, mgpu_dtype t, mgpu_op op,
                      size_t count, int in_place, int root, uint64_t seed) {
  int n = w->n;
  size_t esz = mgpu_dtype_size(t);
  size_t nin = in_count(kind, count, n);
  /* Bytes that matter: inputs and outputs, and a margin to catch
   * overruns. */
  size_t used = (kind == ALLGATHER || kind == REDUCE_SCATTER ? (size_t)n : 1) *
                    count * esz + 64;
  if (used > w->cap) used = w->cap;
  for (int r = 0; r < n; r++) {
    uint64_t st = seed * 977 + (uint64_t)r + 1;
    memset(w->host, POISON, used);
    size_t base = in_place && kind == ALLGATHER ? (size_t)r * count : 0;
    for (size_t i = 0; i < nin; i++) {
      w->in[r][i] = stored(t, rand_val(&st, t, op));
      put(w->host, t, base + i, w->in[r][i]);
    }
    ASSERT_OK(mgpu_memcpy_htod(w->a[r], 0, w->host, used));
    memset(w->host, POISON, used);
    ASSERT_OK(mgpu_memcpy_htod(w->b[r], 0, w->host, used));
  }
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++) {
    mgpu_buffer *send = w->a[r], *recv = in_place ? w->a[r] : w->b[r];
    if (kind == REDUCE && r != root && (seed & 1)) recv = NULL;
    if (kind == BROADCAST && r != root && (seed & 1)) send = NULL;
    ASSERT_OK(issue(w, kind, r, send, recv, count, t, op, root));
  }
  ASSERT_OK(mgpu_group_end());
  for (int r = 0; r < n; r++) ASSERT_OK(mgpu_stream_synchronize(w->s[r]));

  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_memcpy_dtoh(w->host, in_place ? w->a[r] : w->b[r], 0,
                               used));
    size_t first = 0, nout = 0; /* element range that must hold results */
    switch (kind) {
      case ALLREDUCE: nout = count; break;
      case REDUCE: nout = r == root ? count : 0; break;
      case BROADCAST: nout = count; break;
      case ALLGATHER: nout = count * (size_t)n; break;
      default:
        first = in_place ? (size_t)r * count : 0;
        nout = count;
        break;
    }
    for (size_t i = 0; i < nout; i++) {
      double want = 0, mag = 0;
      switch (kind) {
        case ALLREDUCE:
        case REDUCE:
        case REDUCE_SCATTER: {
          size_t j = kind == REDUCE_SCATTER ? (size_t)r * count + i : i;
          want = w->in[0][j];
          mag = fabs(want);
          for (int q = 1; q < n; q++) {
            want = apply(op, want, w->in[q][j]);
            mag = op == MGPU_PROD ? fabs(want) : mag + fabs(w->in[q][j]);
          }
          break;
        }
        case BROADCAST: want = w->in[root][i]; break;
        default: want = w->in[i / count][i % count]; break;
      }
      double got = get(w->host, t, first + i);
      double tol = tolerance(t, op, n, mag);
      if (!(fabs(got - want) <= tol)) {
        fprintf(stderr,
                "%s %s %s n=%d count=%zu in_place=%d root=%d: rank %d "
                "element %zu: got %.17g, want %.17g (tolerance %g)\n",
                kind_names[kind], mgpu_dtype_name(t), mgpu_op_name(op), n,
                count, in_place, root, r, i, got, want, tol);
        abort();
      }
    }
    if (!in_place) {
      /* Nothing written past the results (nor at all on a reduce's
       * non-root ranks). */
      for (size_t byte = (first + nout) * esz; byte < used; byte++)
        if (w->host[byte] != POISON) {
          fprintf(stderr, "%s n=%d count=%zu: rank %d byte %zu overwritten\n",
                  kind_names[kind], n, count, r, byte);
          abort();
        }
    }
  }
}

/* Every kind, type, op, size class and placement on communicators of 1 to
 * 4 devices. */
static void matrix(const mgpu_comm_config *cfg, const size_t *sizes,
                   int nsizes, int all_ops) {
  int all[8];
  int ndev = test_same_backend(all, 8);
  size_t max = 0;
  for (int i = 0; i < nsizes; i++) max = sizes[i] > max ? sizes[i] : max;
  uint64_t seed = 1;
  for (int n = 1; n <= 4 && n <= ndev; n++) {
    /* A subset that is not simply the first n devices where possible. */
    int devs[4];
    for (int r = 0; r < n; r++) devs[r] = all[(ndev - n + r + (n == 2)) % ndev];
    world w;
    world_open(&w, devs, n, max, cfg);
    for (int kind = 0; kind < KINDS; kind++)
      for (int ti = 0; ti < 4; ti++)
        for (int op = 0; op < 4; op++) {
          if (op > 0 && (kind == BROADCAST || kind == ALLGATHER)) break;
          if (op > 0 && !all_ops && types[ti] != MGPU_INT32) break;
          for (int si = 0; si < nsizes; si++)
            for (int in_place = 0; in_place < 2; in_place++) {
              /* Large sizes: a sample of types and ops is enough. */
              if (sizes[si] > 2000 && (ti % 2 == 1 || op % 2 == 1)) continue;
              /* In place, sum and max stand for every op. */
              if (in_place && (op == MGPU_PROD || op == MGPU_MIN)) continue;
              int root = (int)(seed % (uint64_t)n);
              check_one(&w, kind, types[ti], (mgpu_op)op, sizes[si],
                        in_place, root, seed++);
            }
        }
    world_close(&w);
  }
}

static const size_t small_sizes[] = {0, 1, 2, 5, 13, 1003};

/* The direct algorithm's configuration over the devices of device 0's
 * backend; 0 where it is not offered (it needs host devices). */
static int direct_setup(int *devs, mgpu_comm_config *cfg) {
  test_init();
  int n = test_same_backend(devs, 4);
  mgpu_comm_config init = MGPU_COMM_CONFIG_INITIALIZER;
  *cfg = init;
  cfg->algo = MGPU_COLL_ALGO_DIRECT;
  mgpu_comm *c;
  if (mgpu_comm_create_config(devs, n, cfg, &c) == MGPU_ENOTSUP) return 0;
  ASSERT_OK(mgpu_comm_destroy(c));
  return n;
}

TEST_IMPL(direct) {
  int devs[4];
  mgpu_comm_config cfg;
  if (direct_setup(devs, &cfg) == 0) return TEST_SKIP; /* not host devices */
  static const size_t sizes[] = {0, 1, 5, 13, 1003, 30011};
  matrix(&cfg, sizes, 6, 1);
  return 0;
}

/* Large enough that results leave through non-temporal stores (several MiB
 * per rank), with an odd count so the slices start unaligned. */
TEST_IMPL(direct_large) {
  int devs[4];
  mgpu_comm_config cfg;
  int n = direct_setup(devs, &cfg);
  if (n == 0) return TEST_SKIP;
  size_t count = 600001; /* 2.4 MB written per rank */
  world w;
  world_open(&w, devs, n, count, &cfg);
  for (int in_place = 0; in_place < 2; in_place++) {
    check_one(&w, ALLREDUCE, MGPU_FLOAT32, MGPU_SUM, count, in_place, 0, 11);
    check_one(&w, BROADCAST, MGPU_INT32, MGPU_SUM, count, in_place, n - 1, 12);
  }
  world_close(&w);
  return 0;
}

/* Kernels for the stream-order test: fill a float buffer with a value after
 * a pause, and double one into another. */
typedef struct slow_fill_args {
  float *p;
  size_t n;
  float v;
  int pause_us;
} slow_fill_args;

static void slow_fill_kernel(const mgpu_kernel_ctx *ctx, const void *argp) {
  (void)ctx;
  const slow_fill_args *a = argp;
  if (a->pause_us > 0) usleep((useconds_t)a->pause_us);
  for (size_t i = 0; i < a->n; i++) a->p[i] = a->v;
}

static const mgpu_kernel slow_fill = {"test_slow_fill", slow_fill_kernel,
                                      NULL, NULL};

/* Small and medium collectives are run by the issuing thread (with the
 * devices' workers for medium ones) when every stream is idle, and queued as
 * stream work when one is busy: both keep stream order. A rank whose input
 * is still being written by a slow kernel must be waited for, and work
 * queued right after the collective must see its result, on every rank, for
 * every way of running it. */
TEST_IMPL(direct_stream_order) {
  int devs[4];
  mgpu_comm_config cfg;
  int n = direct_setup(devs, &cfg);
  if (n < 2) return TEST_SKIP;
  static const size_t counts[] = {1000, 100000}; /* 4 KB, 400 KB */
  world w;
  world_open(&w, devs, n, counts[1], &cfg);
  for (int k = 0; k < 4; k++) {
    size_t count = counts[k / 2];
    int busy = k % 2;
    for (int r = 0; r < n; r++) {
      float *p = mgpu_buffer_ptr(w.a[r]);
      ASSERT(p != NULL);
      slow_fill_args a = {p, count, (float)(r + 1), busy && r == n - 1 ? 20000 : 0};
      ASSERT_OK(mgpu_launch(w.s[r], &slow_fill, MGPU_DIM3(1, 1, 1),
                            MGPU_DIM3(1, 1, 1), &a, sizeof a));
      if (!busy) ASSERT_OK(mgpu_stream_synchronize(w.s[r]));
    }
    ASSERT_OK(mgpu_group_begin());
    for (int r = 0; r < n; r++)
      ASSERT_OK(mgpu_allreduce(w.comm, r, w.a[r], w.b[r], count, MGPU_FLOAT32,
                               MGPU_SUM, w.s[r]));
    ASSERT_OK(mgpu_group_end());
    /* Right behind it: overwrite the input, which the collective must have
     * read already. */
    for (int r = 0; r < n; r++) {
      float *p = mgpu_buffer_ptr(w.a[r]);
      slow_fill_args a = {p, count, -1.0f, 0};
      ASSERT_OK(mgpu_launch(w.s[r], &slow_fill, MGPU_DIM3(1, 1, 1),
                            MGPU_DIM3(1, 1, 1), &a, sizeof a));
      ASSERT_OK(mgpu_stream_synchronize(w.s[r]));
      ASSERT_OK(mgpu_stream_query(w.s[r]));
      const float *h = mgpu_buffer_ptr(w.b[r]); /* host devices */
      float want = (float)(n * (n + 1) / 2);
      for (size_t i = 0; i < count; i++) ASSERT_EQ(h[i], want);
    }
  }
  world_close(&w);
  return 0;
}

TEST_IMPL(ring) {
  test_init();
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  cfg.algo = MGPU_COLL_ALGO_RING;
  matrix(&cfg, small_sizes, 6, 1);
  return 0;
}

/* Chunks of 64 bytes: many pipelined rounds per segment, chunk edges that
 * do not meet segment edges. */
TEST_IMPL(ring_chunks) {
  test_init();
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  cfg.algo = MGPU_COLL_ALGO_RING;
  cfg.chunk_bytes = 64;
  static const size_t sizes[] = {7, 97, 3001};
  matrix(&cfg, sizes, 3, 0);
  return 0;
}

/* Devices that cannot read each other's memory: the ring stages through
 * copies between devices. */
TEST_IMPL(ring_staged) {
  mgpu_config conf = MGPU_CONFIG_INITIALIZER;
  conf.host_peer = 0;
  ASSERT_OK(mgpu_init(&conf));
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (p.backend_kind != MGPU_BACKEND_HOST || mgpu_device_count() < 2)
    return TEST_SKIP;
  /* Copies between devices may not be built in yet. */
  int devs[2] = {0, 1};
  mgpu_buffer *x, *y;
  ASSERT_OK(mgpu_malloc(&x, 0, 64));
  ASSERT_OK(mgpu_malloc(&y, 1, 64));
  int rc = mgpu_memcpy(y, 0, x, 0, 64);
  ASSERT_OK(mgpu_free(x));
  ASSERT_OK(mgpu_free(y));
  if (rc == MGPU_ENOTSUP) return TEST_SKIP;
  ASSERT_OK(rc);
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.algo = MGPU_COLL_ALGO_DIRECT;
  mgpu_comm *c;
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_comm_create_config(devs, 2, &cfg, &c));
  cfg.algo = MGPU_COLL_ALGO_AUTO;
  cfg.chunk_bytes = 256;
  static const size_t sizes[] = {1, 5, 2001};
  matrix(&cfg, sizes, 3, 0);
  return 0;
}

/* 16-bit floats, on every backend. Small integers are exact in both
 * formats, so sums, products, minima and maxima compare exactly whatever
 * the order of the reduction; on two ranks (one rounding per element) any
 * values compare exactly with the correctly rounded result. */
static float half_value(size_t i, int r, int op) {
  int m = op == MGPU_PROD ? 5 : 41; /* products of 4 stay small */
  return (float)((int)((i * 7 + (size_t)r * 13) % (size_t)m) - m / 2);
}

static uint16_t half_from(mgpu_dtype t, float v) {
  return t == MGPU_BFLOAT16 ? mgpu__float_to_bf16(v) : mgpu__float_to_half(v);
}

static float half_to(mgpu_dtype t, uint16_t h) {
  return t == MGPU_BFLOAT16 ? mgpu__bf16_to_float(h) : mgpu__half_to_float(h);
}

static void half_exact(world *w, mgpu_dtype t, int op, uint16_t *h,
                       size_t count) {
  int n = w->n;
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count * (size_t)n; i++)
      h[i] = half_from(t, half_value(i, r, op));
    ASSERT_OK(mgpu_memcpy_htod(w->a[r], 0, h, count * (size_t)n * 2));
  }
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_allreduce(w->comm, r, w->a[r], w->b[r], count, t,
                             (mgpu_op)op, w->s[r]));
    ASSERT_OK(mgpu_reduce_scatter(w->comm, r, w->a[r], w->a[r], count / 4, t,
                                  (mgpu_op)op, w->s[r]));
  }
  ASSERT_OK(mgpu_group_end());
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_stream_synchronize(w->s[r]));
    ASSERT_OK(mgpu_memcpy_dtoh(h, w->b[r], 0, count * 2));
    for (size_t i = 0; i < count; i++) {
      float want = half_value(i, 0, op);
      for (int q = 1; q < n; q++)
        want = (float)apply((mgpu_op)op, want, half_value(i, q, op));
      float got = half_to(t, h[i]);
      if (got != want) {
        fprintf(stderr, "%s %s rank %d element %zu: got %g want %g\n",
                mgpu_dtype_name(t), mgpu_op_name((mgpu_op)op), r, i, got,
                want);
        abort();
      }
    }
    /* The in-place reduce-scatter: rank r's block of its buffer. */
    size_t c4 = count / 4;
    ASSERT_OK(mgpu_memcpy_dtoh(h, w->a[r], (size_t)r * c4 * 2, c4 * 2));
    for (size_t i = 0; i < c4; i++) {
      size_t j = (size_t)r * c4 + i;
      float want = half_value(j, 0, op);
      for (int q = 1; q < n; q++)
        want = (float)apply((mgpu_op)op, want, half_value(j, q, op));
      ASSERT(half_to(t, h[i]) == want);
    }
  }
}

/* Two ranks, values that are not exact: each element of the result is the
 * float result of the two rounded once to the type. */
static void half_rounded(world *w, mgpu_dtype t, int op, uint16_t *h,
                         size_t count) {
  for (int r = 0; r < 2; r++) {
    for (size_t i = 0; i < count; i++)
      h[i] = half_from(t, (float)((i * 37 + (size_t)r * 11) % 1000) / 7.0f -
                              70.0f);
    ASSERT_OK(mgpu_memcpy_htod(w->a[r], 0, h, count * 2));
  }
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(mgpu_allreduce(w->comm, r, w->a[r], w->b[r], count, t,
                             (mgpu_op)op, w->s[r]));
  ASSERT_OK(mgpu_group_end());
  uint16_t *in0 = h + count, *in1 = h + 2 * count;
  ASSERT_OK(mgpu_memcpy_dtoh(in0, w->a[0], 0, count * 2));
  ASSERT_OK(mgpu_memcpy_dtoh(in1, w->a[1], 0, count * 2));
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_stream_synchronize(w->s[r]));
    ASSERT_OK(mgpu_memcpy_dtoh(h, w->b[r], 0, count * 2));
    for (size_t i = 0; i < count; i++) {
      /* The exact result (in double), rounded once to float, as the float
       * operation rounds it, then to the type. */
      uint16_t want = half_from(
          t, (float)apply((mgpu_op)op, half_to(t, in0[i]), half_to(t, in1[i])));
      if (h[i] != want) {
        fprintf(stderr, "%s %s rank %d element %zu: got 0x%04x want 0x%04x\n",
                mgpu_dtype_name(t), mgpu_op_name((mgpu_op)op), r, i, h[i],
                want);
        abort();
      }
    }
  }
}

TEST_IMPL(half_types) {
  test_init();
  int devs[4];
  int n = test_same_backend(devs, 4);
  const size_t count = 1001;
  uint16_t *h = malloc(count * 4 * sizeof *h);
  ASSERT(h != NULL);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(devs[0], &p));
  /* On host devices both algorithms: the direct one and the ring. */
  int algos = p.backend_kind == MGPU_BACKEND_HOST ? 2 : 1;
  for (int a = 0; a < algos; a++) {
    mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
    cfg.algo = a ? MGPU_COLL_ALGO_RING : MGPU_COLL_ALGO_AUTO;
    world w;
    world_open(&w, devs, n, count, &cfg);
    for (int ti = 0; ti < 2; ti++)
      for (int op = 0; op < 4; op++)
        half_exact(&w, ti ? MGPU_BFLOAT16 : MGPU_FLOAT16, op, h, count);
    world_close(&w);
    if (n < 2) continue;
    world_open(&w, devs, 2, count, &cfg);
    for (int ti = 0; ti < 2; ti++)
      for (int op = 0; op < 4; op++)
        half_rounded(&w, ti ? MGPU_BFLOAT16 : MGPU_FLOAT16, op, h, count);
    world_close(&w);
  }
  free(h);
  return 0;
}

/* One thread per device, no groups: each call waits for the others. */
typedef struct thread_arg {
  world *w;
  int rank;
} thread_arg;

static void *rank_thread(void *p) {
  thread_arg *a = p;
  world *w = a->w;
  int r = a->rank;
  for (int it = 0; it < 40; it++) {
    size_t count = (size_t)(it * 37 % 500) + 1;
    float *h = malloc(count * sizeof *h);
    for (size_t i = 0; i < count; i++) h[i] = (float)(r + 1) * (float)(i + it);
    ASSERT_OK(mgpu_memcpy_htod_async(w->a[r], 0, h, count * sizeof *h, w->s[r]));
    ASSERT_OK(mgpu_allreduce(w->comm, r, w->a[r], w->b[r], count, MGPU_FLOAT32,
                             MGPU_SUM, w->s[r]));
    ASSERT_OK(mgpu_memcpy_dtoh_async(h, w->b[r], 0, count * sizeof *h, w->s[r]));
    ASSERT_OK(mgpu_stream_synchronize(w->s[r]));
    float tri = (float)(w->n * (w->n + 1) / 2);
    for (size_t i = 0; i < count; i++) ASSERT(h[i] == tri * (float)(i + it));
    free(h);
  }
  return NULL;
}

static void threads_with(const mgpu_comm_config *cfg) {
  int devs[4];
  int n = test_same_backend(devs, 4);
  world w;
  world_open(&w, devs, n, 512, cfg);
  pthread_t th[4];
  thread_arg args[4];
  for (int r = 0; r < n; r++) {
    args[r] = (thread_arg){&w, r};
    ASSERT(pthread_create(&th[r], NULL, rank_thread, &args[r]) == 0);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  world_close(&w);
}

TEST_IMPL(threads) {
  test_init();
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  threads_with(&cfg);
  cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  cfg.algo = MGPU_COLL_ALGO_RING;
  cfg.chunk_bytes = 256;
  threads_with(&cfg);
  return 0;
}

/* Two threads, each issuing a group for half of the ranks, several
 * collectives per group. */
static void *half_group(void *p) {
  thread_arg *a = p;
  world *w = a->w;
  int lo = a->rank, hi = a->rank + w->n / 2;
  for (int it = 0; it < 20; it++) {
    ASSERT_OK(mgpu_group_begin());
    for (int r = lo; r < hi; r++) {
      ASSERT_OK(mgpu_allreduce(w->comm, r, w->a[r], w->b[r], 100, MGPU_INT32,
                               MGPU_SUM, w->s[r]));
      ASSERT_OK(mgpu_broadcast(w->comm, r, w->b[r], w->b[r], 100, MGPU_INT32,
                               1, w->s[r]));
    }
    ASSERT_OK(mgpu_group_end());
  }
  return NULL;
}

TEST_IMPL(split_groups) {
  test_init();
  int devs[4];
  if (test_same_backend(devs, 4) < 4) return TEST_SKIP;
  world w;
  world_open(&w, devs, 4, 100, NULL);
  int32_t h[100];
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < 100; i++) h[i] = r + i;
    ASSERT_OK(mgpu_memcpy_htod(w.a[r], 0, h, sizeof h));
  }
  pthread_t th[2];
  thread_arg args[2] = {{&w, 0}, {&w, 2}};
  for (int i = 0; i < 2; i++)
    ASSERT(pthread_create(&th[i], NULL, half_group, &args[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int r = 0; r < 4; r++) {
    ASSERT_OK(mgpu_stream_synchronize(w.s[r]));
    ASSERT_OK(mgpu_memcpy_dtoh(h, w.b[r], 0, sizeof h));
    for (int i = 0; i < 100; i++) ASSERT_EQ(h[i], 6 + 4 * i);
  }
  world_close(&w);
  return 0;
}

/* Errors: each is reported with its code and a detail, and no data moves. */
static void expect_untouched(world *w) {
  for (int r = 0; r < w->n; r++) {
    ASSERT_OK(mgpu_stream_synchronize(w->s[r]));
    ASSERT_OK(mgpu_memcpy_dtoh(w->host, w->b[r], 0, w->cap));
    for (size_t i = 0; i < w->cap; i++) ASSERT(w->host[i] == POISON);
  }
}

TEST_IMPL(errors) {
  int ndev = test_init();
  int devs[2];
  if (test_same_backend(devs, 2) < 2) return TEST_SKIP;
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.timeout_ms = 200;
  world w;
  world_open(&w, devs, 2, 64, &cfg);
  memset(w.host, POISON, w.cap);
  for (int r = 0; r < 2; r++) ASSERT_OK(mgpu_memcpy_htod(w.b[r], 0, w.host, w.cap));

  /* Mismatched counts, types, ops, roots: caught when both ranks called. */
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_OK(mgpu_allreduce(w.comm, 1, w.a[1], w.b[1], 11, MGPU_FLOAT32, MGPU_SUM, w.s[1]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("has count 10, rank 1");
  ASSERT_DETAIL_HAS("has count 11");
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_OK(mgpu_allreduce(w.comm, 1, w.a[1], w.b[1], 10, MGPU_INT32, MGPU_SUM, w.s[1]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("has dtype float32, rank 1");
  ASSERT_DETAIL_HAS("has dtype int32");
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_OK(mgpu_allreduce(w.comm, 1, w.a[1], w.b[1], 10, MGPU_FLOAT32, MGPU_MAX, w.s[1]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("has op sum, rank 1");
  ASSERT_DETAIL_HAS("has op max");
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_broadcast(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, 0, w.s[0]));
  ASSERT_OK(mgpu_broadcast(w.comm, 1, w.a[1], w.b[1], 10, MGPU_FLOAT32, 1, w.s[1]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("has root 0, rank 1 (device");
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_broadcast(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, 0, w.s[0]));
  ASSERT_OK(mgpu_allgather(w.comm, 1, w.a[1], w.b[1], 5, MGPU_FLOAT32, w.s[1]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("allgather");
  expect_untouched(&w);

  /* Checked on the call itself: the whole group is dropped. */
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 10, MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_allreduce(w.comm, 1, w.a[0], w.b[1], 10,
                                            MGPU_FLOAT32, MGPU_SUM, w.s[1]));
  ASSERT_DETAIL_HAS("send buffer is on device 0");
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_group_end());
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_allreduce(w.comm, 1, w.a[1], w.b[1], 10,
                                            MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_DETAIL_HAS("stream");
  ASSERT_ERR(MGPU_ERANGE, mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], w.cap,
                                         MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_DETAIL_HAS("bytes");
  ASSERT_ERR(MGPU_ERANGE, mgpu_allgather(w.comm, 0, w.a[0], w.b[0],
                                         w.cap / 4 / 2 + 1, MGPU_FLOAT32, w.s[0]));
  /* count * size * ranks past size_t: refused before any buffer is sized. */
  ASSERT_ERR(MGPU_ERANGE, mgpu_allgather(w.comm, 1, w.a[1], w.b[1],
                                         (size_t)-1 / 4, MGPU_FLOAT32, w.s[1]));
  ASSERT_DETAIL_HAS("rank 1: count");
  ASSERT_ERR(MGPU_EINVAL, mgpu_allreduce(w.comm, 2, w.a[0], w.b[0], 1,
                                         MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  ASSERT_ERR(MGPU_EINVAL, mgpu_reduce(w.comm, 0, w.a[0], w.b[0], 1,
                                      MGPU_FLOAT32, MGPU_SUM, 5, w.s[0]));
  ASSERT_ERR(MGPU_EINVAL, mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 1,
                                         (mgpu_dtype)42, MGPU_SUM, w.s[0]));
  ASSERT_ERR(MGPU_EINVAL, mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 1,
                                         MGPU_FLOAT32, (mgpu_op)9, w.s[0]));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_allreduce(w.comm, 0, NULL, w.b[0], 1,
                                             MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  expect_untouched(&w);

  /* A rank that never comes: the call times out and names its device. */
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_allreduce(w.comm, 0, w.a[0], w.b[0], 4,
                                            MGPU_FLOAT32, MGPU_SUM, w.s[0]));
  char want[64];
  snprintf(want, sizeof want, "device(s) %d never", devs[1]);
  ASSERT_DETAIL_HAS(want);
  /* The communicator is aborted from then on. */
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_allreduce(w.comm, 1, w.a[1], w.b[1], 4,
                                            MGPU_FLOAT32, MGPU_SUM, w.s[1]));
  expect_untouched(&w);

  /* Use after destroy. */
  mgpu_comm *dead = w.comm;
  world_close(&w);
  ASSERT_ERR(MGPU_EFREED, mgpu_comm_size(dead));
  ASSERT_ERR(MGPU_EFREED, mgpu_comm_destroy(dead));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_comm_size(NULL));

  /* Bad communicators. */
  mgpu_comm *c;
  int twice[2] = {0, 0}, bad[1] = {ndev};
  ASSERT_ERR(MGPU_EINVAL, mgpu_comm_create(twice, 2, &c));
  ASSERT_ERR(MGPU_ENODEV, mgpu_comm_create(bad, 1, &c));
  ASSERT_ERR(MGPU_EINVAL, mgpu_comm_create(devs, 0, &c));
  ASSERT_ERR(MGPU_EINVAL, mgpu_group_end());
  /* Devices of two backends: refused when the communicator is made. */
  mgpu_device_props p0 = {.size = sizeof p0}, pd = {.size = sizeof pd};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  for (int d = 1; d < ndev; d++) {
    ASSERT_OK(mgpu_device_get_props(d, &pd));
    if (pd.backend_kind == p0.backend_kind) continue;
    int mixed[2] = {0, d};
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_comm_create(mixed, 2, &c));
    ASSERT_DETAIL_HAS("different backends");
    break;
  }
  return 0;
}

TEST_IMPL(provider_and_metrics) {
  test_init();
  int devs[4];
  int n = test_same_backend(devs, 4);
  world w;
  world_open(&w, devs, n, 16, NULL);
  int prov = mgpu_comm_provider(w.comm);
  ASSERT(prov == MGPU_COLL_PROVIDER_MGPU || prov == MGPU_COLL_PROVIDER_NCCL);
  ASSERT(strcmp(mgpu_coll_provider_name(prov), "unknown") != 0);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (p.backend_kind == MGPU_BACKEND_HOST) ASSERT_EQ(prov, MGPU_COLL_PROVIDER_MGPU);
  ASSERT_OK(mgpu_metrics_reset());
  for (int it = 0; it < 3; it++) check_one(&w, ALLREDUCE, MGPU_FLOAT32, MGPU_SUM, 16, 0, 0, (uint64_t)it + 5);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  for (int r = 0; r < n; r++) {
    ASSERT_EQ(m.dev[devs[r]].coll_ops, 3);
    if (prov == MGPU_COLL_PROVIDER_MGPU) {
      ASSERT_EQ(m.dev[devs[r]].coll_ring, 3);
      ASSERT_EQ(m.dev[devs[r]].coll_nccl, 0);
    } else {
      ASSERT_EQ(m.dev[devs[r]].coll_nccl, 3);
    }
  }
  world_close(&w);
  return 0;
}

TEST_IMPL(reduce_to_host) {
  test_init();
  int devs[4];
  int n = test_same_backend(devs, 4);
  mgpu_comm *c;
  ASSERT_OK(mgpu_comm_create(devs, n, &c));
  mgpu_buffer *bufs[4];
  size_t counts[4];
  for (int r = 0; r < n; r++) {
    counts[r] = r == 1 ? 0 : (size_t)(1000 * r + 777 + r);
    ASSERT_OK(mgpu_malloc(&bufs[r], devs[r], 8 * 5000));
  }
  unsigned char *h = malloc(8 * 5000);
  for (int ti = 0; ti < 4; ti++)
    for (int op = 0; op < 4; op++) {
      mgpu_dtype t = types[ti];
      double want = 0, mag = 0;
      int have = 0;
      for (int r = 0; r < n; r++) {
        uint64_t st = (uint64_t)(r * 31 + ti * 7 + op + 1);
        for (size_t i = 0; i < counts[r]; i++) {
          double v = stored(t, rand_val(&st, t, (mgpu_op)op));
          if (op == MGPU_PROD) v = (i % 97 == 0) ? (v < 0 ? -1.0 : 1.0) : 1.0;
          put(h, t, i, v);
          want = have ? apply((mgpu_op)op, want, v) : v;
          mag += fabs(v);
          have = 1;
        }
        if (counts[r]) ASSERT_OK(mgpu_memcpy_htod(bufs[r], 0, h, counts[r] * mgpu_dtype_size(t)));
      }
      union { float f; double d; int32_t i; int64_t l; } res;
      ASSERT_OK(mgpu_reduce_to_host(c, bufs, counts, t, (mgpu_op)op, &res));
      double got = get(&res, t, 0);
      double tol = op == MGPU_SUM ? 2.0 * log2(5000.0) * (t == MGPU_FLOAT32 ? FLT_EPSILON : DBL_EPSILON) * mag : 0;
      if (t == MGPU_INT32 || t == MGPU_INT64) tol = 0;
      if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "reduce_to_host %s %s: got %.17g want %.17g\n",
                mgpu_dtype_name(t), mgpu_op_name((mgpu_op)op), got, want);
        abort();
      }
    }
  size_t zero[4] = {0, 0, 0, 0};
  float f;
  ASSERT_ERR(MGPU_EINVAL, mgpu_reduce_to_host(c, bufs, zero, MGPU_FLOAT32, MGPU_SUM, &f));
  if (n > 1) {
    mgpu_buffer *swapped[4] = {bufs[1], bufs[0], bufs[2], bufs[3]};
    size_t ones[4] = {1, 1, 1, 1};
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_reduce_to_host(c, swapped, ones, MGPU_FLOAT32, MGPU_SUM, &f));
  }
  size_t huge[4] = {1u << 20, 1u << 20, 1u << 20, 1u << 20};
  ASSERT_ERR(MGPU_ERANGE, mgpu_reduce_to_host(c, bufs, huge, MGPU_FLOAT32, MGPU_SUM, &f));
  for (int r = 0; r < n; r++) ASSERT_OK(mgpu_free(bufs[r]));
  free(h);
  ASSERT_OK(mgpu_comm_destroy(c));
  return 0;
}

/* In place is each rank's own choice (send == recv on that rank): ranks of
 * one collective may differ. Rank 0 in place and the others not, then the
 * reverse; every result must be right and every out-of-place send buffer
 * left as it was. Repeated, because a rank that writes its input while a
 * peer still reads it gives wrong sums only when the streams interleave. */
static int32_t mixed_val(int r, size_t i) { return (int32_t)(r * 100003 + (int)i); }

static void mixed_one(mgpu_comm *comm, int n, const int *devs,
                      mgpu_stream **s, int kind, size_t count, int first_in_place) {
  size_t total = count * (size_t)n, bytes = total * sizeof(int32_t);
  mgpu_buffer *send[4], *recv[4];
  int32_t *h = malloc(bytes);
  ASSERT(h != NULL);
  for (int r = 0; r < n; r++) {
    int in_place = (r == 0) == first_in_place;
    ASSERT_OK(mgpu_malloc(&send[r], devs[r], bytes));
    recv[r] = send[r];
    if (!in_place) ASSERT_OK(mgpu_malloc(&recv[r], devs[r], bytes));
    for (size_t i = 0; i < total; i++) h[i] = mixed_val(r, i);
    ASSERT_OK(mgpu_memcpy_htod(send[r], 0, h, bytes));
  }
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++) {
    if (kind == ALLREDUCE)
      ASSERT_OK(mgpu_allreduce(comm, r, send[r], recv[r], count, MGPU_INT32,
                               MGPU_SUM, s[r]));
    else
      ASSERT_OK(mgpu_reduce_scatter(comm, r, send[r], recv[r], count,
                                    MGPU_INT32, MGPU_SUM, s[r]));
  }
  ASSERT_OK(mgpu_group_end());
  for (int r = 0; r < n; r++) ASSERT_OK(mgpu_stream_synchronize(s[r]));
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_memcpy_dtoh(h, recv[r], 0, bytes));
    size_t base = kind == REDUCE_SCATTER ? (size_t)r * count : 0;
    size_t at = kind == REDUCE_SCATTER && recv[r] == send[r] ? base : 0;
    for (size_t i = 0; i < count; i++) {
      int32_t want = 0;
      for (int q = 0; q < n; q++)
        want = (int32_t)((uint32_t)want + (uint32_t)mixed_val(q, base + i));
      if (h[at + i] != want)
        fprintf(stderr, "%s, rank 0 %s: rank %d element %zu is %d, not %d\n",
                kind_names[kind], first_in_place ? "in place" : "not in place",
                r, i, h[at + i], want);
      ASSERT_EQ(h[at + i], want);
    }
    if (recv[r] != send[r]) {
      ASSERT_OK(mgpu_memcpy_dtoh(h, send[r], 0, bytes));
      for (size_t i = 0; i < total; i++) ASSERT_EQ(h[i], mixed_val(r, i));
      ASSERT_OK(mgpu_free(recv[r]));
    }
    ASSERT_OK(mgpu_free(send[r]));
  }
  free(h);
}

static void sleep_50ms_cb(void *arg) {
  (void)arg;
  usleep(50000);
}

/* mgpu_comm_destroy waits for the collectives queued on the ranks' streams
 * before it frees what they use, also while another stream of a rank's
 * device captures a graph (it used to fail with MGPU_ENOTSUP after it had
 * already retired the handle and freed the rest). */
TEST_IMPL(destroy_while_a_device_captures) {
  test_init();
  int devs[2];
  int n = test_same_backend(devs, 2);
  if (n < 2) return TEST_SKIP;
  world w;
  world_open(&w, devs, n, 1024, NULL);
  for (int r = 0; r < n; r++) {
    float *h = (float *)w.host;
    for (int i = 0; i < 1024; i++) h[i] = (float)(r + 1);
    ASSERT_OK(mgpu_memcpy_htod(w.a[r], 0, h, 1024 * sizeof(float)));
    ASSERT_OK(mgpu_stream_add_callback(w.s[r], sleep_50ms_cb, NULL));
  }
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++)
    ASSERT_OK(mgpu_allreduce(w.comm, r, w.a[r], w.b[r], 1024, MGPU_FLOAT32,
                             MGPU_SUM, w.s[r]));
  ASSERT_OK(mgpu_group_end());
  mgpu_stream *cap;
  ASSERT_OK(mgpu_stream_create(&cap, devs[0]));
  ASSERT_OK(mgpu_stream_begin_capture(cap));
  ASSERT_OK(mgpu_comm_destroy(w.comm));
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_stream_query(w.s[r])); /* done before the destroy ended */
    float *h = (float *)w.host;
    ASSERT_OK(mgpu_memcpy_dtoh(h, w.b[r], 0, 1024 * sizeof(float)));
    for (int i = 0; i < 1024; i++) ASSERT_EQ(h[i], 3.0f);
  }
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(cap, &g));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_stream_destroy(cap));
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_stream_destroy(w.s[r]));
    ASSERT_OK(mgpu_free(w.a[r]));
    ASSERT_OK(mgpu_free(w.b[r]));
    free(w.in[r]);
  }
  free(w.host);
  return 0;
}

TEST_IMPL(mixed_in_place) {
  test_init();
  int devs[4];
  int n = test_same_backend(devs, 4);
  if (n < 2) return TEST_SKIP;
  static const int algos[] = {MGPU_COLL_ALGO_RING, MGPU_COLL_ALGO_AUTO};
  for (int al = 0; al < 2; al++) {
    mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
    cfg.algo = algos[al];
    mgpu_comm *comm;
    ASSERT_OK(mgpu_comm_create_config(devs, n, &cfg, &comm));
    mgpu_stream *s[4];
    for (int r = 0; r < n; r++) ASSERT_OK(mgpu_stream_create(&s[r], devs[r]));
    static const size_t counts[] = {13, 30011, 100003};
    for (int first = 0; first < 2; first++)
      for (size_t c = 0; c < 3; c++)
        for (int rep = 0; rep < 10; rep++) {
          mixed_one(comm, n, devs, s, ALLREDUCE, counts[c], first);
          mixed_one(comm, n, devs, s, REDUCE_SCATTER, counts[c], first);
        }
    for (int r = 0; r < n; r++) ASSERT_OK(mgpu_stream_destroy(s[r]));
    ASSERT_OK(mgpu_comm_destroy(comm));
  }
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(direct)
TEST_ENTRY(direct_large)
TEST_ENTRY(direct_stream_order)
TEST_ENTRY(ring)
TEST_ENTRY(ring_chunks)
TEST_ENTRY(ring_staged)
TEST_ENTRY(half_types)
TEST_ENTRY(threads)
TEST_ENTRY(split_groups)
TEST_ENTRY(errors)
TEST_ENTRY(provider_and_metrics)
TEST_ENTRY(reduce_to_host)
TEST_ENTRY(mixed_in_place)
TEST_ENTRY(destroy_while_a_device_captures)
TEST_LIST_END
