/* Tests of the CUDA backend: they run when device 0 is a CUDA device
 * (MGPU_DEVICES=cuda, cuda:0/4, or unset on a machine with a GPU) and skip
 * (77) elsewhere. The kernels they launch live in libmgpu-cuda-testkern.so,
 * built beside the plugin and opened here with dlopen, so this file is plain
 * C and builds where there is no CUDA toolkit.
 *
 * The paths without a GPU (MGPU_DEVICES=cuda failing with the CUDA error
 * named, unset falling back to host) are tested by tests/cuda-fallback.sh.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "task.h"

static const void *tk_sym(const char *name) {
  const void *p = test_testkern_sym(name);
  if (p == NULL) abort();
  return p;
}

static const mgpu_kernel *tk_kernel(const char *name) {
  return (const mgpu_kernel *)tk_sym(name);
}

static int (*tk_int_fn(const char *name))(void) {
  int (*fn)(void);
  *(const void **)&fn = tk_sym(name);
  return fn;
}

/* Initializes mgpu; returns the number of CUDA devices at the front of the
 * device list (MGPU_DEVICES=cuda:0,host:2 gives 1), or 0 when the test must
 * skip (device 0 is not a CUDA device, or the kernel library is missing).
 * The tests use devices 0 .. n-1 only. */
static int cuda_init(void) {
  if (mgpu_init(NULL) != 0) return 0;
  int n = 0, total = mgpu_device_count();
  for (; n < total; n++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(n, &p));
    if (p.backend_kind != MGPU_BACKEND_CUDA) break;
  }
  if (n == 0) return 0;
  return test_testkern_sym("tk_empty_kernel") != NULL ? n : 0;
}

#define CUDA_INIT(n)                   \
  int n = cuda_init();                 \
  if (n == 0) return TEST_SKIP

TEST_IMPL(cuda_props) {
  CUDA_INIT(n);
  for (int i = 0; i < n; i++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(i, &p));
    ASSERT(strcmp(p.backend, "cuda") == 0);
    ASSERT(p.name[0] != '\0');
    ASSERT(p.total_mem > 0 && p.free_mem <= p.total_mem);
    ASSERT(p.cc_major >= 5);
    ASSERT(p.multiprocessors > 0);
    ASSERT(strlen(p.pci_bus_id) >= 7);
    ASSERT(strlen(p.uuid) == 36 && p.uuid[8] == '-');
    ASSERT(p.split_count >= 1 && p.split_index < p.split_count);
    if (p.split_count > 1) {
      char tag[32];
      snprintf(tag, sizeof tag, "[%d/%d]", p.split_index, p.split_count);
      ASSERT(strstr(p.name, tag) != NULL);
    }
    printf("device %d: %s, cc %d.%d, %d SMs, %s, NUMA %d, %s\n", i, p.name,
           p.cc_major, p.cc_minor, p.multiprocessors, p.pci_bus_id,
           p.numa_node, p.uuid);
  }
  return 0;
}

/* Every memory kind round-trips byte for byte, through sync and async
 * copies from pageable memory. */
TEST_IMPL(cuda_memory_kinds) {
  CUDA_INIT(n);
  const size_t size = (4 << 20) + 13;
  unsigned char *src = malloc(size), *back = malloc(size);
  ASSERT(src && back);
  uint64_t st = 42;
  for (size_t i = 0; i < size; i++) src[i] = (unsigned char)test_rand(&st);
  int (*malloc_fn[3])(mgpu_buffer **, int, size_t) = {
      mgpu_malloc, mgpu_malloc_host, mgpu_malloc_unified};
  int dev = n - 1;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, dev));
  for (int k = 0; k < 3; k++) {
    mgpu_buffer *b;
    ASSERT_OK(malloc_fn[k](&b, dev, size));
    ASSERT_EQ(mgpu_buffer_kind(b), k);
    memset(back, 0, size);
    ASSERT_OK(mgpu_memcpy_htod(b, 0, src, size));
    ASSERT_OK(mgpu_memcpy_dtoh(back, b, 0, size));
    ASSERT(memcmp(src, back, size) == 0);
    /* Async from pageable memory, at an odd offset. */
    memset(back, 0, size);
    ASSERT_OK(mgpu_memset_async(b, 0, 0, size, s));
    ASSERT_OK(mgpu_memcpy_htod_async(b, 7, src, size - 7, s));
    ASSERT_OK(mgpu_memcpy_dtoh_async(back, b, 7, size - 7, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT(memcmp(src, back, size - 7) == 0);
    if (k != 0) {
      /* Pinned and unified memory are readable from the host directly. */
      ASSERT(memcmp((unsigned char *)mgpu_buffer_ptr(b) + 7, src, size - 7) == 0);
    }
    ASSERT_OK(mgpu_free(b));
  }
  ASSERT_OK(mgpu_stream_destroy(s));
  free(src);
  free(back);
  return 0;
}

/* Managed memory beyond what the GPU has free is refused, not attempted. */
TEST_IMPL(cuda_unified_too_big) {
  CUDA_INIT(n);
  (void)n;
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  mgpu_buffer *b = NULL;
  ASSERT_ERR(MGPU_ENOMEM, mgpu_malloc_unified(&b, 0, p.total_mem + (1ull << 30)));
  ASSERT(b == NULL);
  /* Earlier state intact: a small one still works. */
  ASSERT_OK(mgpu_malloc_unified(&b, 0, 4096));
  ASSERT_OK(mgpu_free(b));
  return 0;
}

/* Built-in kernels of every type against values computed here. */
static void check_builtin(int dev, mgpu_stream *s, mgpu_dtype t) {
  const size_t count = 100003;
  size_t es = mgpu_dtype_size(t);
  mgpu_buffer *x, *y, *z;
  ASSERT_OK(mgpu_malloc(&x, dev, count * es));
  ASSERT_OK(mgpu_malloc(&y, dev, count * es));
  ASSERT_OK(mgpu_malloc(&z, dev, count * es));
  /* Values small enough to be exact in every type (half included). */
  double xv = 3.0, yv = 5.0;
  union { float f; double d; int32_t i; int64_t l; } vx, vy;
  const void *px = &xv, *py = &yv;
  if (t == MGPU_FLOAT32) { vx.f = 3; vy.f = 5; px = &vx; py = &vy; }
  if (t == MGPU_INT32) { vx.i = 3; vy.i = 5; px = &vx; py = &vy; }
  if (t == MGPU_INT64) { vx.l = 3; vy.l = 5; px = &vx; py = &vy; }
  ASSERT_OK(mgpu_fill(s, x, 0, count, t, px));
  ASSERT_OK(mgpu_fill(s, y, 0, count, t, py));
  /* y = 2*y + 0.5*x... kept integral: y = 2*y = 10; y += 2*x = 16. */
  ASSERT_OK(mgpu_scale(s, y, 0, count, t, 2.0));
  ASSERT_OK(mgpu_axpy(s, y, 0, x, 0, count, t, 2.0));
  const mgpu_op ops[4] = {MGPU_SUM, MGPU_PROD, MGPU_MIN, MGPU_MAX};
  const double want[4] = {19.0, 48.0, 3.0, 16.0};
  unsigned char *host = malloc(count * es);
  ASSERT(host != NULL);
  for (int o = 0; o < 4; o++) {
    ASSERT_OK(mgpu_elementwise(s, z, 0, x, 0, y, 0, count, t, ops[o]));
    ASSERT_OK(mgpu_memcpy_dtoh_async(host, z, 0, count * es, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    for (size_t i = 0; i < count; i += 997) {
      double got = 0;
      const unsigned char *e = host + i * es;
      switch (t) {
        case MGPU_FLOAT32: got = *(const float *)e; break;
        case MGPU_FLOAT64: got = *(const double *)e; break;
        case MGPU_INT32: got = *(const int32_t *)e; break;
        case MGPU_INT64: got = (double)*(const int64_t *)e; break;
        case MGPU_FLOAT16: {
          /* 19, 48, 3 and 16 as IEEE half bit patterns. */
          uint16_t bits = *(const uint16_t *)e;
          const uint16_t h[4] = {0x4CC0, 0x5200, 0x4200, 0x4C00};
          got = bits == h[o] ? want[o] : -1;
          break;
        }
        case MGPU_BFLOAT16: {
          uint16_t bits = *(const uint16_t *)e;
          const uint16_t h[4] = {0x4198, 0x4240, 0x4040, 0x4180};
          got = bits == h[o] ? want[o] : -1;
          break;
        }
      }
      if (got != want[o]) {
        fprintf(stderr, "%s %s at %zu: got %g, want %g\n", mgpu_dtype_name(t),
                mgpu_op_name(ops[o]), i, got, want[o]);
        abort();
      }
    }
  }
  free(host);
  ASSERT_OK(mgpu_free(x));
  ASSERT_OK(mgpu_free(y));
  ASSERT_OK(mgpu_free(z));
}

TEST_IMPL(cuda_builtins) {
  CUDA_INIT(n);
  for (int dev = 0; dev < n; dev += (n > 1 ? n - 1 : 1)) {
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, dev));
    for (int t = MGPU_FLOAT32; t <= MGPU_BFLOAT16; t++)
      check_builtin(dev, s, (mgpu_dtype)t);
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  return 0;
}

struct tk_axpy_args {
  float *y;
  const float *x;
  float k;
  unsigned n;
};

/* A user kernel through mgpu_launch, args passed by value. */
TEST_IMPL(cuda_launch) {
  CUDA_INIT(n);
  const unsigned count = 10000;
  float *host = malloc(count * sizeof(float));
  ASSERT(host != NULL);
  for (int dev = 0; dev < n; dev++) {
    mgpu_stream *s;
    mgpu_buffer *x, *y;
    ASSERT_OK(mgpu_stream_create(&s, dev));
    ASSERT_OK(mgpu_malloc(&x, dev, count * sizeof(float)));
    ASSERT_OK(mgpu_malloc(&y, dev, count * sizeof(float)));
    for (unsigned i = 0; i < count; i++) host[i] = (float)i;
    ASSERT_OK(mgpu_memcpy_htod_async(x, 0, host, count * sizeof(float), s));
    float one = 1.0f;
    ASSERT_OK(mgpu_fill(s, y, 0, count, MGPU_FLOAT32, &one));
    struct tk_axpy_args a = {mgpu_buffer_ptr(y), mgpu_buffer_ptr(x), 3.0f,
                             count};
    ASSERT_OK(mgpu_launch(s, tk_kernel("tk_axpy_kernel"),
                          MGPU_DIM3((count + 255) / 256, 1, 1),
                          MGPU_DIM3(256, 1, 1), &a, sizeof a));
    a.k = 1000.0f; /* the launch copied the arguments */
    ASSERT_OK(mgpu_memcpy_dtoh_async(host, y, 0, count * sizeof(float), s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    for (unsigned i = 0; i < count; i++) ASSERT(host[i] == 1.0f + 3.0f * i);
    ASSERT_OK(mgpu_free(x));
    ASSERT_OK(mgpu_free(y));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  free(host);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT(m.dev[0].kernels_launched >= 1);
  ASSERT(m.dev[0].busy_ns > 0);
  return 0;
}

/* A kernel without a CUDA variant is refused on a CUDA device. */
static void host_only(const mgpu_kernel_ctx *ctx, const void *args) {
  (void)ctx;
  (void)args;
}

TEST_IMPL(cuda_launch_no_variant) {
  CUDA_INIT(n);
  (void)n;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  mgpu_kernel k = {"host_only", host_only, NULL, NULL};
  int arg = 0;
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_launch(s, &k, MGPU_DIM3(1, 1, 1),
                                       MGPU_DIM3(1, 1, 1), &arg, sizeof arg));
  ASSERT_DETAIL_HAS("host_only");
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* The user's own CUDA code inside mgpu_run_on_device targets that device. */
static int run_user_code(int dev, void *arg) {
  (void)arg;
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(dev, &p));
  ASSERT_EQ(tk_int_fn("tk_current_device")(), p.ordinal);
  ASSERT_EQ(tk_int_fn("tk_user_code")(), p.ordinal);
  return 7;
}

TEST_IMPL(cuda_run_on_device) {
  CUDA_INIT(n);
  for (int dev = 0; dev < n; dev++)
    ASSERT_EQ(mgpu_run_on_device(dev, run_user_code, NULL), 7);
  /* mgpu_set_device makes the GPU current on the calling thread too. */
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(n - 1, &p));
  ASSERT_OK(mgpu_set_device(n - 1));
  ASSERT_EQ(tk_int_fn("tk_current_device")(), p.ordinal);
  return 0;
}

struct tk_slow_write_args {
  volatile int *flag;
  long long cycles;
  int value;
};
struct tk_read_args {
  int *dst;
  const volatile int *src;
};

/* A stream of the last device waits for an event of device 0: a slow
 * kernel there writes a flag into pinned memory; the waiting stream reads
 * it after the wait. Without the wait it would read the old value. */
TEST_IMPL(cuda_event_wait_across_devices) {
  CUDA_INIT(n);
  int da = 0, db = n - 1;
  mgpu_stream *sa, *sb;
  mgpu_event *e;
  mgpu_buffer *flag, *out;
  ASSERT_OK(mgpu_stream_create(&sa, da));
  ASSERT_OK(mgpu_stream_create(&sb, db));
  ASSERT_OK(mgpu_event_create(&e, da));
  ASSERT_OK(mgpu_malloc_host(&flag, da, sizeof(int)));
  ASSERT_OK(mgpu_malloc_host(&out, db, sizeof(int)));
  volatile int *f = mgpu_buffer_ptr(flag);
  int *o = mgpu_buffer_ptr(out);
  *f = 0;
  *o = -1;
  int (*clock_khz)(int);
  *(const void **)&clock_khz = tk_sym("tk_clock_khz");
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(da, &p));
  /* About 50 ms. */
  struct tk_slow_write_args w = {f, (long long)clock_khz(p.ordinal) * 50, 1234};
  ASSERT_OK(mgpu_launch(sa, tk_kernel("tk_slow_write_kernel"),
                        MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), &w, sizeof w));
  ASSERT_OK(mgpu_event_record(e, sa));
  ASSERT_OK(mgpu_stream_wait_event(sb, e));
  struct tk_read_args r = {o, f};
  ASSERT_OK(mgpu_launch(sb, tk_kernel("tk_read_kernel"), MGPU_DIM3(1, 1, 1),
                        MGPU_DIM3(1, 1, 1), &r, sizeof r));
  ASSERT_OK(mgpu_stream_synchronize(sb));
  ASSERT_EQ(*o, 1234);
  ASSERT_OK(mgpu_event_synchronize(e));
  ASSERT_OK(mgpu_event_query(e));
  ASSERT_OK(mgpu_free(flag));
  ASSERT_OK(mgpu_free(out));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

/* Timing events and host callbacks in stream order. */
static void set_flag(void *arg) { *(volatile int *)arg = 1; }

TEST_IMPL(cuda_events_and_callbacks) {
  CUDA_INIT(n);
  (void)n;
  mgpu_stream *s;
  mgpu_event *a, *b;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&a, 0));
  ASSERT_OK(mgpu_event_create(&b, 0));
  mgpu_buffer *buf;
  ASSERT_OK(mgpu_malloc(&buf, 0, 64 << 20));
  ASSERT_OK(mgpu_event_record(a, s));
  ASSERT_OK(mgpu_memset_async(buf, 0, 1, 64 << 20, s));
  volatile int flag = 0;
  ASSERT_OK(mgpu_stream_add_callback(s, set_flag, (void *)&flag));
  ASSERT_OK(mgpu_event_record(b, s));
  ASSERT_OK(mgpu_event_synchronize(b));
  ASSERT_EQ(flag, 1);
  float ms = -1;
  ASSERT_OK(mgpu_event_elapsed_ms(a, b, &ms));
  ASSERT(ms >= 0);
  ASSERT_OK(mgpu_stream_query(s));
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_event_destroy(a));
  ASSERT_OK(mgpu_event_destroy(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* The stream-ordered pool hands out working memory and reuses it. */
TEST_IMPL(cuda_pool) {
  CUDA_INIT(n);
  int dev = n - 1;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, dev));
  int32_t host[1024];
  for (int round = 0; round < 20; round++) {
    mgpu_buffer *b;
    ASSERT_OK(mgpu_malloc_async(&b, sizeof host, s));
    int32_t v = round;
    ASSERT_OK(mgpu_fill(s, b, 0, 1024, MGPU_INT32, &v));
    ASSERT_OK(mgpu_memcpy_dtoh_async(host, b, 0, sizeof host, s));
    ASSERT_OK(mgpu_free_async(b, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    for (int i = 0; i < 1024; i++) ASSERT_EQ(host[i], round);
  }
  ASSERT_OK(mgpu_mempool_trim(dev));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* Copies between devices: on one GPU split in logical devices they are
 * device-to-device copies. */
TEST_IMPL(cuda_copy_between_devices) {
  CUDA_INIT(n);
  if (n < 2) return TEST_SKIP;
  const size_t size = 1 << 20;
  unsigned char *src = malloc(size), *back = malloc(size);
  ASSERT(src && back);
  for (size_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 7 + 3);
  mgpu_buffer *a, *b;
  ASSERT_OK(mgpu_malloc(&a, 0, size));
  ASSERT_OK(mgpu_malloc(&b, n - 1, size));
  ASSERT_OK(mgpu_memcpy_htod(a, 0, src, size));
  int rc = mgpu_memcpy(b, 0, a, 0, size);
  if (rc == MGPU_ENOTSUP) {
    printf("copies between these devices are not supported yet: %s\n",
           mgpu_error_detail());
  } else {
    ASSERT_OK(rc);
    ASSERT_OK(mgpu_memcpy_dtoh(back, b, 0, size));
    ASSERT(memcmp(src, back, size) == 0);
  }
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  free(src);
  free(back);
  return 0;
}

/* Split devices: each has its own streams and a share of the memory, and
 * work on all of them at once lands where it should. */
TEST_IMPL(cuda_split_devices) {
  CUDA_INIT(n);
  mgpu_device_props p0 = {.size = sizeof p0};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  if (p0.split_count < 2) return TEST_SKIP;
  mgpu_stream *s[MGPU_MAX_DEVICES];
  mgpu_buffer *b[MGPU_MAX_DEVICES];
  const size_t count = 1 << 20;
  for (int d = 0; d < n; d++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(d, &p));
    ASSERT(p.total_mem <= p0.total_mem);
    ASSERT_OK(mgpu_stream_create(&s[d], d));
    ASSERT_OK(mgpu_malloc(&b[d], d, count * sizeof(int32_t)));
    int32_t v = 100 + d;
    ASSERT_OK(mgpu_fill(s[d], b[d], 0, count, MGPU_INT32, &v));
    ASSERT_OK(mgpu_scale(s[d], b[d], 0, count, MGPU_INT32, 3.0));
  }
  int32_t *host = malloc(count * sizeof(int32_t));
  ASSERT(host != NULL);
  for (int d = 0; d < n; d++) {
    ASSERT_OK(mgpu_memcpy_dtoh_async(host, b[d], 0, count * sizeof(int32_t),
                                     s[d]));
    ASSERT_OK(mgpu_stream_synchronize(s[d]));
    for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(host[i], 3 * (100 + d));
    ASSERT_OK(mgpu_free(b[d]));
    ASSERT_OK(mgpu_stream_destroy(s[d]));
  }
  free(host);
  return 0;
}

struct tk_smid_args {
  int *used;
  long long cycles;
};

/* A device's kernels run on at most its multiprocessors: on a split GPU
 * with green contexts, on its SM partition only. */
TEST_IMPL(cuda_sm_partition) {
  CUDA_INIT(n);
  int (*clock_khz)(int);
  *(const void **)&clock_khz = tk_sym("tk_clock_khz");
  for (int dev = 0; dev < n; dev++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(dev, &p));
    mgpu_stream *s;
    mgpu_buffer *used;
    ASSERT_OK(mgpu_stream_create(&s, dev));
    ASSERT_OK(mgpu_malloc_host(&used, dev, 1024 * sizeof(int)));
    memset(mgpu_buffer_ptr(used), 0, 1024 * sizeof(int));
    /* Many more blocks than SMs, each busy for about 0.1 ms. */
    struct tk_smid_args a = {mgpu_buffer_ptr(used),
                             (long long)clock_khz(p.ordinal) / 10};
    ASSERT_OK(mgpu_launch(s, tk_kernel("tk_smid_kernel"),
                          MGPU_DIM3(8 * 132, 1, 1), MGPU_DIM3(64, 1, 1), &a,
                          sizeof a));
    ASSERT_OK(mgpu_stream_synchronize(s));
    int distinct = 0;
    const int *u = mgpu_buffer_ptr(used);
    for (int i = 0; i < 1024; i++) distinct += u[i] != 0;
    printf("device %d: kernel ran on %d SMs, the device has %d\n", dev,
           distinct, p.multiprocessors);
    ASSERT(distinct > 0 && distinct <= p.multiprocessors);
    ASSERT_OK(mgpu_free(used));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  return 0;
}

/* The NCCL slots of the backend table, driven directly (the collective
 * layer drives them the same way): an all-reduce and a broadcast over every
 * whole GPU, one rank each. On split GPUs the slots must be empty, since
 * NCCL refuses two ranks on one GPU. */
TEST_IMPL(cuda_nccl_provider) {
  CUDA_INIT(n);
  mgpu__device *d0 = mgpu__device_get(0);
  const mgpu__backend_coll_ops *ops = d0->ops->coll;
  if (d0->spec.split_count > 1) {
    ASSERT(ops == NULL);
    return 0;
  }
  if (ops == NULL) {
    printf("NCCL is not available: collectives use mgpu's ring\n");
    return TEST_SKIP;
  }
  mgpu__bdevice *devs[MGPU_MAX_DEVICES];
  for (int i = 0; i < n; i++) devs[i] = mgpu__device_get(i)->bdev;
  void *comm = NULL;
  ASSERT_OK(ops->comm_create(devs, n, &comm));
  const size_t count = 1 << 16;
  mgpu_stream *s[MGPU_MAX_DEVICES];
  mgpu_buffer *send[MGPU_MAX_DEVICES], *recv[MGPU_MAX_DEVICES];
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_stream_create(&s[r], r));
    ASSERT_OK(mgpu_malloc(&send[r], r, count * sizeof(float)));
    ASSERT_OK(mgpu_malloc(&recv[r], r, count * sizeof(float)));
    float v = (float)(r + 1);
    ASSERT_OK(mgpu_fill(s[r], send[r], 0, count, MGPU_FLOAT32, &v));
  }
  for (int kind = 0; kind < 2; kind++) {
    ASSERT_OK(ops->group_start());
    for (int r = 0; r < n; r++) {
      mgpu__stream *is;
      ASSERT_OK(mgpu__stream_get(s[r], &is));
      mgpu__coll_args a = {
          .kind = kind == 0 ? MGPU__COLL_ALLREDUCE : MGPU__COLL_BROADCAST,
          .send = mgpu_buffer_ptr(send[r]), .recv = mgpu_buffer_ptr(recv[r]),
          .count = count, .dtype = MGPU_FLOAT32, .op = MGPU_SUM,
          .root = n - 1};
      ASSERT_OK(ops->run(comm, r, &a, is->bstream));
    }
    ASSERT_OK(ops->group_end());
    float want = kind == 0 ? (float)(n * (n + 1) / 2) : (float)n;
    float *host = malloc(count * sizeof(float));
    ASSERT(host != NULL);
    for (int r = 0; r < n; r++) {
      ASSERT_OK(mgpu_memcpy_dtoh_async(host, recv[r], 0, count * sizeof(float),
                                       s[r]));
      ASSERT_OK(mgpu_stream_synchronize(s[r]));
      for (size_t i = 0; i < count; i += 101) ASSERT(host[i] == want);
    }
    free(host);
  }
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_free(send[r]));
    ASSERT_OK(mgpu_free(recv[r]));
    ASSERT_OK(mgpu_stream_destroy(s[r]));
  }
  ops->comm_destroy(comm);
  return 0;
}

struct tk_fault_args {
  int *bad;
};

/* A kernel that faults is reported by the next synchronize, with the CUDA
 * error named, and never aborts the process. An illegal address is sticky
 * in CUDA (the GPU's context is unusable until the process ends), so the
 * device is lost: MGPU_EDEVLOST, mgpu_device_status says so, new work is
 * refused naming the device, and every mgpu device on the same GPU (the
 * splits of cuda:0/4) is lost with it. */
TEST_IMPL(cuda_async_error) {
  CUDA_INIT(n);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  struct tk_fault_args a = {(int *)(uintptr_t)0x10};
  ASSERT_OK(mgpu_launch(s, tk_kernel("tk_fault_kernel"), MGPU_DIM3(1, 1, 1),
                        MGPU_DIM3(32, 1, 1), &a, sizeof a));
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("cudaError");
  ASSERT_DETAIL_HAS("device 0");
  printf("reported: %s\n", mgpu_error_detail());
  mgpu_device_state st = MGPU_DEVICE_OK;
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(MGPU_DEVICE_LOST, st);
  mgpu_device_props p0 = {.size = sizeof p0};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  for (int d = 1; d < n; d++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(d, &p));
    if (strcmp(p.uuid, p0.uuid) != 0) continue;
    st = MGPU_DEVICE_OK;
    ASSERT_OK(mgpu_device_status(d, &st));
    ASSERT_EQ(MGPU_DEVICE_LOST, st);
  }
  mgpu_buffer *b = NULL;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_malloc(&b, 0, 256));
  ASSERT_DETAIL_HAS("device 0");
  /* Freeing still works on a lost device; shutdown must still return. */
  ASSERT_OK(mgpu_stream_destroy(s));
  mgpu_shutdown();
  return 0;
}

static void graph_count(void *arg) {
  __atomic_fetch_add((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* y = 1, y += k * x (a CUDA kernel), z = 0, z = y, acc += z, a host
 * function: captured on device 0's stream. */
static void capture_chain(mgpu_stream *s, mgpu_buffer *x, mgpu_buffer *y,
                          mgpu_buffer *z, mgpu_buffer *acc, unsigned count,
                          float k, int *calls) {
  float one = 1.0f;
  ASSERT_OK(mgpu_fill(s, y, 0, count, MGPU_FLOAT32, &one));
  struct tk_axpy_args a = {mgpu_buffer_ptr(y), mgpu_buffer_ptr(x), k, count};
  ASSERT_OK(mgpu_launch(s, tk_kernel("tk_axpy_kernel"),
                        MGPU_DIM3((count + 255) / 256, 1, 1),
                        MGPU_DIM3(256, 1, 1), &a, sizeof a));
  ASSERT_OK(mgpu_memset_async(z, 0, 0, count * sizeof(float), s));
  ASSERT_OK(mgpu_memcpy_async(z, 0, y, 0, count * sizeof(float), s));
  ASSERT_OK(mgpu_axpy(s, acc, 0, z, 0, count, MGPU_FLOAT32, 1.0));
  ASSERT_OK(mgpu_stream_add_callback(s, graph_count, calls));
}

/* A graph on one CUDA device (a split one under cuda:0/4) becomes one
 * CUDA graph: launched several times, updated, launched again, every
 * launch redoes the chain; its copy runs inside the CUDA graph, so the
 * copy metrics do not see it (a node-by-node replay would count it). */
TEST_IMPL(cuda_graph_chain) {
  CUDA_INIT(n);
  (void)n;
  const unsigned count = 10000;
  const size_t bytes = count * sizeof(float);
  float *host = malloc(bytes);
  ASSERT(host != NULL);
  mgpu_stream *s;
  mgpu_buffer *x, *y, *z, *acc;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&x, 0, bytes));
  ASSERT_OK(mgpu_malloc(&y, 0, bytes));
  ASSERT_OK(mgpu_malloc(&z, 0, bytes));
  ASSERT_OK(mgpu_malloc(&acc, 0, bytes));
  for (unsigned i = 0; i < count; i++) host[i] = (float)i;
  ASSERT_OK(mgpu_memcpy_htod(x, 0, host, bytes));
  ASSERT_OK(mgpu_memset_async(acc, 0, 0, bytes, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  int calls = 0;
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_begin_capture(s));
  capture_chain(s, x, y, z, acc, count, 3.0f, &calls);
  ASSERT_OK(mgpu_stream_end_capture(s, &g));
  mgpu_graph_exec *e;
  ASSERT_OK(mgpu_graph_instantiate(g, &e));
  ASSERT_EQ(calls, 0); /* capturing ran nothing */
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  const int launches = 5;
  for (int i = 0; i < launches; i++) ASSERT_OK(mgpu_graph_launch(e, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  ASSERT_EQ(calls, launches);
  ASSERT_EQ(m1.dev[0].graph_launches - m0.dev[0].graph_launches, launches);
  if (m1.dev[0].bytes_d2d != m0.dev[0].bytes_d2d)
    printf("the graph was replayed node by node, not as a CUDA graph "
           "(MGPU_LOG=debug says why)\n");
  ASSERT_EQ(m1.dev[0].bytes_d2d, m0.dev[0].bytes_d2d);
  ASSERT_OK(mgpu_memcpy_dtoh(host, acc, 0, bytes));
  for (unsigned i = 0; i < count; i++)
    ASSERT(host[i] == (float)launches * (1.0f + 3.0f * i));
  ASSERT_OK(mgpu_memcpy_dtoh(host, z, 0, bytes));
  for (unsigned i = 0; i < count; i++) ASSERT(host[i] == 1.0f + 3.0f * i);
  /* The kernel node's new arguments make the part again. */
  struct tk_axpy_args a = {mgpu_buffer_ptr(y), mgpu_buffer_ptr(x), 5.0f,
                           count};
  ASSERT_OK(mgpu_graph_exec_update_kernel(e, 1, &a, sizeof a));
  ASSERT_OK(mgpu_graph_launch(e, s));
  ASSERT_OK(mgpu_graph_exec_synchronize(e));
  ASSERT_OK(mgpu_memcpy_dtoh(host, acc, 0, bytes));
  for (unsigned i = 0; i < count; i++)
    ASSERT(host[i] == (float)launches * (1.0f + 3.0f * i) + 1.0f + 5.0f * i);
  ASSERT_EQ(calls, launches + 1);
  ASSERT_OK(mgpu_graph_exec_destroy(e));
  ASSERT_OK(mgpu_graph_destroy(g));
  /* Copies from and to pageable memory cannot be in a CUDA graph: such a
   * graph is replayed node by node, and is right all the same. */
  float *back = malloc(bytes);
  ASSERT(back != NULL);
  for (unsigned i = 0; i < count; i++) host[i] = (float)(2 * i);
  ASSERT_OK(mgpu_stream_begin_capture(s));
  ASSERT_OK(mgpu_memcpy_htod_async(y, 0, host, bytes, s));
  ASSERT_OK(mgpu_scale(s, y, 0, count, MGPU_FLOAT32, 0.5));
  ASSERT_OK(mgpu_memcpy_dtoh_async(back, y, 0, bytes, s));
  ASSERT_OK(mgpu_stream_end_capture(s, &g));
  ASSERT_OK(mgpu_graph_instantiate(g, &e));
  for (int r = 0; r < 2; r++) {
    memset(back, 0, bytes);
    ASSERT_OK(mgpu_graph_launch(e, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    for (unsigned i = 0; i < count; i++) ASSERT(back[i] == (float)i);
  }
  ASSERT_OK(mgpu_graph_exec_destroy(e));
  ASSERT_OK(mgpu_graph_destroy(g));
  free(back);
  ASSERT_OK(mgpu_free(x));
  ASSERT_OK(mgpu_free(y));
  ASSERT_OK(mgpu_free(z));
  ASSERT_OK(mgpu_free(acc));
  ASSERT_OK(mgpu_stream_destroy(s));
  free(host);
  return 0;
}

/* acc += 1 * a on a's device: a kernel node after dep. */
static void add_acc(mgpu_graph *g, int dev, const mgpu_graph_node *dep,
                    mgpu_buffer *acc, mgpu_buffer *a, unsigned count) {
  struct tk_axpy_args k = {mgpu_buffer_ptr(acc), mgpu_buffer_ptr(a), 1.0f,
                           count};
  ASSERT_OK(mgpu_graph_add_kernel(g, dev, dep, 1, tk_kernel("tk_axpy_kernel"),
                                  MGPU_DIM3((count + 255) / 256, 1, 1),
                                  MGPU_DIM3(256, 1, 1), &k, sizeof k, NULL));
}

static void check_all(mgpu_buffer *b, float *host, unsigned count, float v) {
  ASSERT_OK(mgpu_memcpy_dtoh(host, b, 0, count * sizeof(float)));
  for (unsigned i = 0; i < count; i++) ASSERT(host[i] == v);
}

/* Graphs over two CUDA devices (two GPUs, or cuda:0/2 and finer splits):
 * one whose devices do not wait for each other (a CUDA graph per device,
 * joined to the launching stream by events), and one with an edge between
 * the devices (replayed node by node), each launched from both devices'
 * streams. */
TEST_IMPL(cuda_graph_two_devices) {
  CUDA_INIT(n);
  if (n < 2) return TEST_SKIP;
  const unsigned count = 4096;
  const size_t bytes = count * sizeof(float);
  int d1 = n - 1;
  mgpu_stream *s0, *s1;
  mgpu_buffer *a0, *a1, *acc0, *acc1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_malloc(&a0, 0, bytes));
  ASSERT_OK(mgpu_malloc(&acc0, 0, bytes));
  ASSERT_OK(mgpu_malloc(&a1, d1, bytes));
  ASSERT_OK(mgpu_malloc(&acc1, d1, bytes));
  ASSERT_OK(mgpu_memset_async(acc0, 0, 0, bytes, s0));
  ASSERT_OK(mgpu_memset_async(acc1, 0, 0, bytes, s1));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  float two = 2.0f, five = 5.0f;
  /* Apart: a0 = 2, acc0 += a0 on device 0; a1 = 5, acc1 += a1 on d1. */
  mgpu_graph *g;
  mgpu_graph_node f0, f1, cp;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, a0, 0, count, MGPU_FLOAT32, &two,
                                &f0));
  add_acc(g, 0, &f0, acc0, a0, count);
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, a1, 0, count, MGPU_FLOAT32, &five,
                                &f1));
  add_acc(g, d1, &f1, acc1, a1, count);
  mgpu_graph_exec *e;
  ASSERT_OK(mgpu_graph_instantiate(g, &e));
  for (int i = 0; i < 3; i++) ASSERT_OK(mgpu_graph_launch(e, s0));
  for (int i = 0; i < 2; i++) ASSERT_OK(mgpu_graph_launch(e, s1));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  float *host = malloc(bytes);
  ASSERT(host != NULL);
  check_all(acc0, host, count, 10.0f);
  check_all(acc1, host, count, 25.0f);
  ASSERT_OK(mgpu_graph_exec_synchronize(e));
  ASSERT_OK(mgpu_graph_exec_destroy(e));
  ASSERT_OK(mgpu_graph_destroy(g));
  /* An edge between the devices: a0 = 2, a1 = a0 (copied on device 0),
   * acc1 += a1 on d1 after the copy. */
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, a0, 0, count, MGPU_FLOAT32, &two,
                                &f0));
  ASSERT_OK(mgpu_graph_add_copy(g, &f0, 1, a1, 0, a0, 0, bytes, &cp));
  add_acc(g, d1, &cp, acc1, a1, count);
  ASSERT_OK(mgpu_graph_instantiate(g, &e));
  ASSERT_OK(mgpu_memset_async(acc1, 0, 0, bytes, s1));
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(mgpu_graph_launch(e, s1));
    ASSERT_OK(mgpu_graph_launch(e, s0));
  }
  ASSERT_OK(mgpu_stream_synchronize(s0));
  check_all(acc1, host, count, 8.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(e));
  ASSERT_OK(mgpu_graph_destroy(g));
  free(host);
  ASSERT_OK(mgpu_free(a0));
  ASSERT_OK(mgpu_free(a1));
  ASSERT_OK(mgpu_free(acc0));
  ASSERT_OK(mgpu_free(acc1));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(cuda_props)
TEST_ENTRY(cuda_memory_kinds)
TEST_ENTRY(cuda_unified_too_big)
TEST_ENTRY(cuda_builtins)
TEST_ENTRY(cuda_launch)
TEST_ENTRY(cuda_launch_no_variant)
TEST_ENTRY(cuda_run_on_device)
TEST_ENTRY(cuda_event_wait_across_devices)
TEST_ENTRY(cuda_events_and_callbacks)
TEST_ENTRY(cuda_pool)
TEST_ENTRY(cuda_copy_between_devices)
TEST_ENTRY(cuda_split_devices)
TEST_ENTRY(cuda_sm_partition)
TEST_ENTRY(cuda_nccl_provider)
TEST_ENTRY(cuda_async_error)
TEST_ENTRY(cuda_graph_chain)
TEST_ENTRY(cuda_graph_two_devices)
TEST_LIST_END
