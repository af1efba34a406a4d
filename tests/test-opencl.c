/* Tests of the OpenCL backend: they run where libmgpu-opencl.so was built
 * and the ICD loader finds a device with shared virtual memory (PoCL on the
 * build machines), and skip (77) elsewhere. Each test names its devices in
 * the config; PoCL is asked for two CPU devices when POCL_DEVICES is unset.
 *
 * The rest of the suite also runs on OpenCL devices (MGPU_DEVICES=opencl,
 * the .ci/run step): these tests cover what is the backend's own, the
 * device list, the OpenCL C kernel variant and its build errors, the
 * built-in kernels' arithmetic, ordering across devices through events and
 * callbacks, lost devices and DLPack.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MGPU_TEST_OPENCL
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#endif

#include "alloc-sweep.h"
#include "json.h"
#include "task.h"
#include "util/fault.h"

/* Initializes mgpu with cfg; returns the device count, or 0 when the test
 * must skip (no plugin, no OpenCL device). */
static int ocl_init_cfg(const mgpu_config *cfg) {
  setenv("POCL_DEVICES", "pthread pthread", 0);
  int rc = mgpu_init(cfg);
  if (rc == MGPU_EPLUGIN || rc == MGPU_ENODEV) {
    printf("skipped: %s\n", mgpu_error_detail());
    return 0;
  }
  ASSERT_OK(rc);
  return mgpu_device_count();
}

/* Initializes mgpu on devices (an MGPU_DEVICES string), as ocl_init_cfg. */
static int ocl_init(const char *devices) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = devices;
  return ocl_init_cfg(&cfg);
}

#define OCL_INIT(n, devices)       \
  int n = ocl_init(devices);       \
  if (n == 0) return TEST_SKIP

/* ---- devices ---- */

/* The tokens are checked before the plugin is looked for: this runs (and
 * fails on a build that does not know them) everywhere. */
TEST_IMPL(opencl_tokens_parsed) {
  const char *bad[] = {"opencl:x", "opencl:1/0", "opencl:-1", "openclx",
                       "opencl:1/"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
    cfg.devices = bad[i];
    ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
    ASSERT_DETAIL_HAS("opencl:K/S");
  }
  /* A good token gets past the parser: it opens devices, or names the
   * missing plugin or device. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "opencl:0/2,host:1";
  int rc = mgpu_init(&cfg);
  ASSERT(rc == 0 || rc == MGPU_EPLUGIN || rc == MGPU_ENODEV);
  if (rc == MGPU_EPLUGIN) ASSERT_DETAIL_HAS("libmgpu-opencl.so");
  if (rc == 0) {
    ASSERT_EQ(mgpu_device_count(), 3);
    ASSERT_OK(mgpu_shutdown());
  }
  return 0;
}

TEST_IMPL(opencl_devices_mix_and_split) {
  OCL_INIT(n, "opencl,host:2");
  ASSERT(n >= 3);
  int nocl = n - 2;
  for (int d = 0; d < n; d++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(d, &p));
    if (d < nocl) {
      ASSERT_EQ(p.backend_kind, MGPU_BACKEND_OPENCL);
      ASSERT(strcmp(p.backend, "opencl") == 0);
      ASSERT_EQ(p.ordinal, d);
      ASSERT(p.total_mem > 0);
    } else {
      ASSERT_EQ(p.backend_kind, MGPU_BACKEND_HOST);
    }
  }
  /* Both kinds work side by side: a round trip through each. */
  unsigned char in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = (unsigned char)(i * 7);
  for (int d = 0; d < n; d += n - 1) {
    mgpu_buffer *a;
    ASSERT_OK(mgpu_malloc(&a, d, 64));
    memset(out, 0, sizeof out);
    ASSERT_OK(mgpu_memcpy_htod(a, 0, in, 64));
    ASSERT_OK(mgpu_memcpy_dtoh(out, a, 0, 64));
    ASSERT(memcmp(in, out, 64) == 0);
    ASSERT_OK(mgpu_free(a));
  }
  ASSERT_OK(mgpu_shutdown());

  /* opencl:0/2: two logical devices of OpenCL device 0. */
  OCL_INIT(m, "opencl:0/2");
  ASSERT_EQ(m, 2);
  for (int d = 0; d < 2; d++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(d, &p));
    ASSERT_EQ(p.ordinal, 0);
    ASSERT_EQ(p.split_index, d);
    ASSERT_EQ(p.split_count, 2);
    ASSERT(strstr(p.name, d == 0 ? "[0/2]" : "[1/2]") != NULL);
  }
  ASSERT_OK(mgpu_shutdown());

  /* A device that is not there is named. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "opencl:99";
  ASSERT_ERR(MGPU_ENODEV, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("OpenCL device 99 does not exist");
  return 0;
}

/* ---- the OpenCL C variant ---- */

typedef struct vadd_args {
  uint64_t a, b, c; /* device pointers, declared ulong in OpenCL C */
  uint32_t n;
  float scale;
} vadd_args;

static void vadd_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  const vadd_args *a = argp;
  const float *x = (const float *)(uintptr_t)a->a;
  const float *y = (const float *)(uintptr_t)a->b;
  float *z = (float *)(uintptr_t)a->c;
  for (uint32_t t = 0; t < ctx->block_dim.x; t++) {
    uint32_t i = ctx->block_idx.x * ctx->block_dim.x + t;
    if (i < a->n) z[i] = a->scale * x[i] + y[i];
  }
}

static const char vadd_src[] =
    "typedef struct { ulong a, b, c; uint n; float scale; } vadd_args;\n"
    "__kernel void vadd(vadd_args p) {\n"
    "  __global const float *x = (__global const float *)p.a;\n"
    "  __global const float *y = (__global const float *)p.b;\n"
    "  __global float *z = (__global float *)p.c;\n"
    "  size_t i = get_global_id(0);\n"
    "  if (i < p.n) z[i] = p.scale * x[i] + y[i];\n"
    "}\n";

static const mgpu_kernel vadd = {"vadd", vadd_host, NULL, vadd_src};

TEST_IMPL(opencl_kernel_variant) {
  OCL_INIT(n, "opencl");
  enum { N = 1000 };
  float x[N], y[N], z[N];
  for (int i = 0; i < N; i++) {
    x[i] = (float)i;
    y[i] = (float)(2 * i + 1);
  }
  /* Every device, twice each: the second launch takes the cached build. */
  for (int d = 0; d < n; d++)
    for (int round = 0; round < 2; round++) {
      mgpu_stream *s;
      mgpu_buffer *bx, *by, *bz;
      ASSERT_OK(mgpu_stream_create(&s, d));
      ASSERT_OK(mgpu_malloc(&bx, d, sizeof x));
      ASSERT_OK(mgpu_malloc(&by, d, sizeof y));
      ASSERT_OK(mgpu_malloc(&bz, d, sizeof z));
      ASSERT_OK(mgpu_memcpy_htod(bx, 0, x, sizeof x));
      ASSERT_OK(mgpu_memcpy_htod(by, 0, y, sizeof y));
      ASSERT_OK(mgpu_memset_async(bz, 0, 0, sizeof z, s));
      vadd_args a = {(uintptr_t)mgpu_buffer_ptr(bx),
                     (uintptr_t)mgpu_buffer_ptr(by),
                     (uintptr_t)mgpu_buffer_ptr(bz), N, 0.5f + (float)round};
      ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3((N + 63) / 64, 1, 1),
                            MGPU_DIM3(64, 1, 1), &a, sizeof a));
      ASSERT_OK(mgpu_memcpy_dtoh_async(z, bz, 0, sizeof z, s));
      ASSERT_OK(mgpu_stream_synchronize(s));
      for (int i = 0; i < N; i++) ASSERT(z[i] == a.scale * x[i] + y[i]);
      ASSERT_OK(mgpu_free(bx));
      ASSERT_OK(mgpu_free(by));
      ASSERT_OK(mgpu_free(bz));
      ASSERT_OK(mgpu_stream_destroy(s));
    }
  /* A kernel without the variant is refused, naming the backend. */
  static const mgpu_kernel host_only = {"host_only", vadd_host, NULL, NULL};
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  vadd_args a = {0, 0, 0, 0, 0};
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_launch(s, &host_only, MGPU_DIM3(1, 1, 1),
                                       MGPU_DIM3(1, 1, 1), &a, sizeof a));
  ASSERT_DETAIL_HAS("no opencl variant");
  /* A kernel that takes no struct, launched with one, is refused. */
  static const mgpu_kernel no_params = {
      "no_params", NULL, NULL, "__kernel void no_params(void) {}\n"};
  ASSERT_ERR(MGPU_EINVAL, mgpu_launch(s, &no_params, MGPU_DIM3(1, 1, 1),
                                      MGPU_DIM3(1, 1, 1), &a, sizeof a));
  ASSERT_DETAIL_HAS("takes 0 parameters");
  ASSERT_OK(mgpu_launch(s, &no_params, MGPU_DIM3(2, 1, 1), MGPU_DIM3(4, 1, 1),
                        NULL, 0));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Threads launching one kernel at once, each on a stream of its own with
 * arguments of its own: a stream sets the arguments of its own cl_kernel,
 * so no launch runs with another thread's. */
typedef struct launcher {
  mgpu_stream *s;
  mgpu_buffer *bx, *by;
  float scale;
  int rc;
  test_gate *start;
} launcher;

enum { LAUNCHER_N = 64, LAUNCHER_LAUNCHES = 400 };

static void *launch_many(void *arg) {
  launcher *l = arg;
  test_gate_wait(l->start);
  vadd_args a = {(uintptr_t)mgpu_buffer_ptr(l->bx),
                 (uintptr_t)mgpu_buffer_ptr(l->by),
                 (uintptr_t)mgpu_buffer_ptr(l->by), LAUNCHER_N, l->scale};
  for (int i = 0; i < LAUNCHER_LAUNCHES && l->rc == 0; i++)
    l->rc = mgpu_launch(l->s, &vadd, MGPU_DIM3(1, 1, 1),
                        MGPU_DIM3(LAUNCHER_N, 1, 1), &a, sizeof a);
  if (l->rc == 0) l->rc = mgpu_stream_synchronize(l->s);
  return NULL;
}

TEST_IMPL(opencl_threads_launch_one_kernel) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  enum { T = 4 };
  float x[LAUNCHER_N], y[LAUNCHER_N];
  for (int i = 0; i < LAUNCHER_N; i++) x[i] = 1.0f;
  test_gate start = TEST_GATE_INITIALIZER;
  launcher l[T];
  pthread_t th[T];
  for (int t = 0; t < T; t++) {
    l[t] = (launcher){.scale = (float)(t + 1), .start = &start};
    ASSERT_OK(mgpu_stream_create(&l[t].s, 0));
    ASSERT_OK(mgpu_malloc(&l[t].bx, 0, sizeof x));
    ASSERT_OK(mgpu_malloc(&l[t].by, 0, sizeof y));
    ASSERT_OK(mgpu_memcpy_htod(l[t].bx, 0, x, sizeof x));
    ASSERT_OK(mgpu_memset_async(l[t].by, 0, 0, sizeof y, l[t].s));
    ASSERT_OK(mgpu_stream_synchronize(l[t].s));
    ASSERT_EQ(pthread_create(&th[t], NULL, launch_many, &l[t]), 0);
  }
  test_gate_open(&start);
  for (int t = 0; t < T; t++) ASSERT_EQ(pthread_join(th[t], NULL), 0);
  for (int t = 0; t < T; t++) {
    ASSERT_OK(l[t].rc);
    ASSERT_OK(mgpu_memcpy_dtoh(y, l[t].by, 0, sizeof y));
    for (int i = 0; i < LAUNCHER_N; i++)
      ASSERT(y[i] == l[t].scale * LAUNCHER_LAUNCHES);
    ASSERT_OK(mgpu_free(l[t].bx));
    ASSERT_OK(mgpu_free(l[t].by));
    ASSERT_OK(mgpu_stream_destroy(l[t].s));
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Busy time is counted per stretch of work: a stream left idle between two
 * launches, with nothing synchronizing it, does not count the idle time.
 * The first launch is known done through an event, not through the
 * stream, before the stream idles for IDLE_MS. */
TEST_IMPL(opencl_busy_time_leaves_out_idle_gaps) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  enum { N = 64, IDLE_MS = 200 };
  mgpu_stream *s;
  mgpu_buffer *bx;
  mgpu_event *e;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_malloc(&bx, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_memset_async(bx, 0, 0, N * sizeof(float), s));
  vadd_args a = {(uintptr_t)mgpu_buffer_ptr(bx), (uintptr_t)mgpu_buffer_ptr(bx),
                 (uintptr_t)mgpu_buffer_ptr(bx), N, 1.0f};
  /* Built (and the build's time spent) before anything is measured. */
  ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(1, 1, 1), MGPU_DIM3(N, 1, 1), &a,
                        sizeof a));
  ASSERT_OK(mgpu_stream_synchronize(s));
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(1, 1, 1), MGPU_DIM3(N, 1, 1), &a,
                        sizeof a));
  ASSERT_OK(mgpu_event_record(e, s));
  ASSERT_OK(mgpu_event_synchronize(e));
  usleep(IDLE_MS * 1000);
  ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(1, 1, 1), MGPU_DIM3(N, 1, 1), &a,
                        sizeof a));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  uint64_t busy = m1.dev[0].busy_ns - m0.dev[0].busy_ns;
  ASSERT(busy > 0);
  ASSERT(busy < (uint64_t)IDLE_MS * 1000000u);
  ASSERT_OK(mgpu_free(bx));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A long burst on two streams sharing one kernel, whose argument changes
 * on some launches and stays on others: each launch runs with its own
 * argument (each stream sets its own cl_kernel's argument only when it
 * changed), and every launch counts. */
TEST_IMPL(opencl_burst_with_changing_arguments) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  enum { N = 256, LAUNCHES = 1500 };
  float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = 1.0f;
  mgpu_stream *s[2];
  mgpu_buffer *bx, *by[2];
  ASSERT_OK(mgpu_malloc(&bx, 0, sizeof x));
  ASSERT_OK(mgpu_memcpy_htod(bx, 0, x, sizeof x));
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(mgpu_stream_create(&s[k], 0));
    ASSERT_OK(mgpu_malloc(&by[k], 0, sizeof y));
    ASSERT_OK(mgpu_memset_async(by[k], 0, 0, sizeof y, s[k]));
    ASSERT_OK(mgpu_stream_synchronize(s[k]));
  }
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  float want[2] = {0, 0};
  for (int i = 0; i < LAUNCHES; i++) {
    int k = i % 5 == 4; /* stream 1 now and then, the same kernel */
    float scale = i % 3 == 0 ? 2.0f : 1.0f;
    /* y += scale * x, in place on the stream's own buffer */
    vadd_args a = {(uintptr_t)mgpu_buffer_ptr(bx),
                   (uintptr_t)mgpu_buffer_ptr(by[k]),
                   (uintptr_t)mgpu_buffer_ptr(by[k]), N, scale};
    ASSERT_OK(mgpu_launch(s[k], &vadd, MGPU_DIM3(N / 64, 1, 1),
                          MGPU_DIM3(64, 1, 1), &a, sizeof a));
    want[k] += scale;
  }
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(mgpu_memcpy_dtoh_async(y, by[k], 0, sizeof y, s[k]));
    ASSERT_OK(mgpu_stream_synchronize(s[k]));
    for (int i = 0; i < N; i++) ASSERT(y[i] == want[k]);
  }
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  ASSERT_EQ((int)(m1.dev[0].kernels_launched - m0.dev[0].kernels_launched),
            LAUNCHES);
  ASSERT(m1.dev[0].busy_ns > m0.dev[0].busy_ns);
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(mgpu_free(by[k]));
    ASSERT_OK(mgpu_stream_destroy(s[k]));
  }
  ASSERT_OK(mgpu_free(bx));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

static const char broken_src[] =
    "__kernel void broken(ulong p) {\n"
    "  undeclared_thing_here = 3;\n"
    "}\n";

static const mgpu_kernel broken = {"broken", NULL, NULL, broken_src};

TEST_IMPL(opencl_build_error_has_log) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  uint64_t arg = 0;
  for (int round = 0; round < 2; round++) { /* the failure is kept */
    ASSERT_ERR(MGPU_EINVAL, mgpu_launch(s, &broken, MGPU_DIM3(1, 1, 1),
                                        MGPU_DIM3(1, 1, 1), &arg, sizeof arg));
    ASSERT_DETAIL_HAS("kernel 'broken' did not build");
    ASSERT_DETAIL_HAS("undeclared_thing_here");
  }
  /* The stream is unharmed. */
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- built-in kernels and reductions ---- */

/* A stream and three 64-byte buffers of device 0, and their end (which also
 * shuts mgpu down). */
typedef struct three_bufs {
  mgpu_stream *s;
  mgpu_buffer *a, *b, *c;
} three_bufs;

static void three_open(three_bufs *t) {
  ASSERT_OK(mgpu_stream_create(&t->s, 0));
  ASSERT_OK(mgpu_malloc(&t->a, 0, 64));
  ASSERT_OK(mgpu_malloc(&t->b, 0, 64));
  ASSERT_OK(mgpu_malloc(&t->c, 0, 64));
}

static void three_close(three_bufs *t) {
  ASSERT_OK(mgpu_free(t->a));
  ASSERT_OK(mgpu_free(t->b));
  ASSERT_OK(mgpu_free(t->c));
  ASSERT_OK(mgpu_stream_destroy(t->s));
  ASSERT_OK(mgpu_shutdown());
}

TEST_IMPL(opencl_builtins_match_host) {
  OCL_INIT(n, "opencl");
  three_bufs t3;
  three_open(&t3);
  mgpu_stream *s = t3.s;
  mgpu_buffer *a = t3.a, *b = t3.b, *c = t3.c;

  /* int32: scale saturates, NaN gives 0, sums wrap, min and max. */
  int32_t i32[4] = {INT32_MAX, -5, 7, INT32_MIN}, j32[4] = {1, 3, -9, -1};
  int32_t out32[4];
  ASSERT_OK(mgpu_memcpy_htod(a, 0, i32, sizeof i32));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, j32, sizeof j32));
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 4, MGPU_INT32, MGPU_SUM));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out32, c, 0, sizeof out32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(out32[0], INT32_MIN); /* wrapped */
  ASSERT_EQ(out32[1], -2);
  ASSERT_EQ(out32[3], INT32_MAX);
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 4, MGPU_INT32, MGPU_MIN));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out32, c, 0, sizeof out32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(out32[0], 1);
  ASSERT_EQ(out32[2], -9);
  ASSERT_OK(mgpu_scale(s, a, 0, 4, MGPU_INT32, 1e10));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out32, a, 0, sizeof out32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(out32[0], INT32_MAX);
  ASSERT_EQ(out32[1], INT32_MIN);
  ASSERT_OK(mgpu_scale(s, a, 0, 4, MGPU_INT32, NAN));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out32, a, 0, sizeof out32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  for (int i = 0; i < 4; i++) ASSERT_EQ(out32[i], 0);

  /* int64 fill and axpy in double, float and double fill/axpy/max. */
  int64_t v64 = 40, o64[3];
  ASSERT_OK(mgpu_fill(s, a, 0, 3, MGPU_INT64, &v64));
  ASSERT_OK(mgpu_axpy(s, a, 0, a, 0, 3, MGPU_INT64, 0.5)); /* 40 + 20 */
  ASSERT_OK(mgpu_memcpy_dtoh_async(o64, a, 0, sizeof o64, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  for (int i = 0; i < 3; i++) ASSERT_EQ(o64[i], 60);
  float vf = 1.5f, of[5];
  ASSERT_OK(mgpu_fill(s, a, 0, 5, MGPU_FLOAT32, &vf));
  ASSERT_OK(mgpu_scale(s, a, 4, 3, MGPU_FLOAT32, -2.0)); /* elements 1..3 */
  ASSERT_OK(mgpu_memcpy_dtoh_async(of, a, 0, sizeof of, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(of[0] == 1.5f && of[1] == -3.0f && of[3] == -3.0f && of[4] == 1.5f);
  double vd = 2.25, od[4], wd[4] = {1, 5, -1, 3};
  ASSERT_OK(mgpu_fill(s, a, 0, 4, MGPU_FLOAT64, &vd));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, wd, sizeof wd));
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 4, MGPU_FLOAT64, MGPU_MAX));
  ASSERT_OK(mgpu_memcpy_dtoh_async(od, c, 0, sizeof od, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(od[0] == 2.25 && od[1] == 5 && od[2] == 2.25 && od[3] == 3);
  three_close(&t3);
  return 0;
}

/* The bits of a small integer (|v| < 2048) as float16 and as bfloat16,
 * both exact. */
static uint16_t half_of(int v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = (unsigned)(v < 0 ? -v : v);
  int e = 0;
  while ((a >> (e + 1)) != 0) e++;
  return (uint16_t)(sign | (unsigned)(e + 15) << 10 | ((a << (10 - e)) & 0x3ff));
}

static uint16_t bf16_of(int v) {
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}

/* float16 and bfloat16 compute in float as on CUDA devices. */
TEST_IMPL(opencl_builtins_16_bit) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  three_bufs t3;
  three_open(&t3);
  mgpu_stream *s = t3.s;
  mgpu_buffer *a = t3.a, *b = t3.b, *c = t3.c;
  for (int bf = 0; bf < 2; bf++) {
    mgpu_dtype t = bf ? MGPU_BFLOAT16 : MGPU_FLOAT16;
    uint16_t (*of)(int) = bf ? bf16_of : half_of;
    uint16_t x[4] = {of(3), of(-5), of(7), of(100)};
    uint16_t y[4] = {of(4), of(2), of(-9), of(1)}, out[4];
    ASSERT_OK(mgpu_memcpy_htod(a, 0, x, sizeof x));
    ASSERT_OK(mgpu_memcpy_htod(b, 0, y, sizeof y));
    ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 4, t, MGPU_SUM));
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, sizeof out, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_EQ(out[0], of(7));
    ASSERT_EQ(out[1], of(-3));
    ASSERT_EQ(out[2], of(-2));
    ASSERT_EQ(out[3], of(101));
    ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 4, t, MGPU_MAX));
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, sizeof out, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT(out[0] == of(4) && out[1] == of(2) && out[2] == of(7));
    ASSERT_OK(mgpu_scale(s, a, 0, 4, t, -2.0));
    ASSERT_OK(mgpu_axpy(s, a, 0, b, 0, 4, t, 3.0)); /* -2x + 3y */
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, a, 0, sizeof out, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_EQ(out[0], of(6));
    ASSERT_EQ(out[1], of(16));
    ASSERT_EQ(out[2], of(-41));
    ASSERT_EQ(out[3], of(-197));
    double one = 1.0; /* a double: the core converts it */
    ASSERT_OK(mgpu_fill(s, c, 2, 2, t, &one));
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, sizeof out, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT(out[1] == of(1) && out[2] == of(1));
  }
  three_close(&t3);
  return 0;
}

TEST_IMPL(opencl_allreduce_every_type) {
  OCL_INIT(n, "opencl");
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_comm *comm;
  int devs[MGPU_MAX_DEVICES];
  for (int d = 0; d < n; d++) devs[d] = d;
  ASSERT_OK(mgpu_comm_create(devs, n, &comm));
  const mgpu_dtype types[] = {MGPU_FLOAT32, MGPU_FLOAT64, MGPU_INT32,
                              MGPU_INT64};
  enum { COUNT = 257 };
  mgpu_buffer *buf[MGPU_MAX_DEVICES];
  mgpu_stream *s[MGPU_MAX_DEVICES];
  for (int d = 0; d < n; d++) {
    ASSERT_OK(mgpu_malloc(&buf[d], d, COUNT * 8));
    ASSERT_OK(mgpu_stream_create(&s[d], d));
  }
  for (int t = 0; t < 4; t++) {
    size_t es = mgpu_dtype_size(types[t]);
    for (int d = 0; d < n; d++) {
      unsigned char host[COUNT * 8];
      for (int i = 0; i < COUNT; i++) {
        double v = (double)(d + 1) * i;
        if (types[t] == MGPU_FLOAT32) ((float *)host)[i] = (float)v;
        if (types[t] == MGPU_FLOAT64) ((double *)host)[i] = v;
        if (types[t] == MGPU_INT32) ((int32_t *)host)[i] = (int32_t)v;
        if (types[t] == MGPU_INT64) ((int64_t *)host)[i] = (int64_t)v;
      }
      ASSERT_OK(mgpu_memcpy_htod(buf[d], 0, host, COUNT * es));
    }
    ASSERT_OK(mgpu_group_begin());
    for (int d = 0; d < n; d++)
      ASSERT_OK(mgpu_allreduce(comm, d, buf[d], buf[d], COUNT, types[t],
                               MGPU_SUM, s[d]));
    ASSERT_OK(mgpu_group_end());
    double factor = n * (n + 1) / 2.0;
    for (int d = 0; d < n; d++) {
      unsigned char host[COUNT * 8];
      ASSERT_OK(mgpu_memcpy_dtoh_async(host, buf[d], 0, COUNT * es, s[d]));
      ASSERT_OK(mgpu_stream_synchronize(s[d]));
      for (int i = 0; i < COUNT; i++) {
        double want = factor * i, got = 0;
        if (types[t] == MGPU_FLOAT32) got = ((float *)host)[i];
        if (types[t] == MGPU_FLOAT64) got = ((double *)host)[i];
        if (types[t] == MGPU_INT32) got = ((int32_t *)host)[i];
        if (types[t] == MGPU_INT64) got = (double)((int64_t *)host)[i];
        ASSERT(got == want);
      }
    }
  }
  for (int d = 0; d < n; d++) {
    ASSERT_OK(mgpu_free(buf[d]));
    ASSERT_OK(mgpu_stream_destroy(s[d]));
  }
  ASSERT_OK(mgpu_comm_destroy(comm));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- order across devices ---- */

static atomic_int released, first_done, second_saw;

/* Blocks (10 s at most) until the main thread has queued everything. */
static void first_cb(void *arg) {
  (void)arg;
  for (int i = 0; i < 10000 && !atomic_load(&released); i++) usleep(1000);
  atomic_store(&first_done, 1);
}

static void second_cb(void *arg) {
  (void)arg;
  atomic_store(&second_saw, atomic_load(&first_done) ? 1 : 2);
}

TEST_IMPL(opencl_wait_across_devices) {
  OCL_INIT(n, "opencl");
  int other = n > 1 ? 1 : 0;
  mgpu_stream *a, *b;
  mgpu_event *e;
  ASSERT_OK(mgpu_stream_create(&a, 0));
  ASSERT_OK(mgpu_stream_create(&b, other));
  ASSERT_OK(mgpu_event_create(&e, 0));
  mgpu_buffer *src, *dst;
  ASSERT_OK(mgpu_malloc(&src, 0, 4096));
  ASSERT_OK(mgpu_malloc(&dst, other, 4096));
  ASSERT_OK(mgpu_memset_async(dst, 0, 0, 4096, b));
  ASSERT_OK(mgpu_stream_synchronize(b));
  /* a: a callback that holds the stream, then a fill; b waits for a's
   * event, then copies the filled bytes and checks its callback ran after
   * a's. */
  ASSERT_OK(mgpu_stream_add_callback(a, first_cb, NULL));
  ASSERT_OK(mgpu_memset_async(src, 0, 0x5A, 4096, a));
  ASSERT_OK(mgpu_event_record(e, a));
  ASSERT_OK(mgpu_stream_wait_event(b, e));
  ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, 4096, b));
  ASSERT_OK(mgpu_stream_add_callback(b, second_cb, NULL));
  ASSERT_EQ(mgpu_event_query(e), MGPU_EAGAIN); /* a is held */
  atomic_store(&released, 1);
  ASSERT_OK(mgpu_stream_synchronize(b));
  ASSERT_EQ(atomic_load(&second_saw), 1);
  ASSERT_OK(mgpu_event_query(e));
  unsigned char host[4096];
  ASSERT_OK(mgpu_memcpy_dtoh(host, dst, 0, sizeof host));
  for (int i = 0; i < 4096; i++) ASSERT_EQ(host[i], 0x5A);
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(a));
  ASSERT_OK(mgpu_stream_destroy(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* 1 when devices a and b share one OpenCL context (PoCL's devices of one
 * platform do; NVIDIA's GPU and a PoCL device do not): copies between them
 * are direct, others are staged through the host. */
static int same_context(int a, int b) {
#ifdef MGPU_TEST_OPENCL
  cl_context ctx[2];
  int devs[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, devs[i]));
    ASSERT_EQ(clGetCommandQueueInfo(mgpu_stream_native(s), CL_QUEUE_CONTEXT,
                                    sizeof ctx[i], &ctx[i], NULL),
              CL_SUCCESS);
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  return ctx[0] == ctx[1];
#else
  /* Without the OpenCL headers: the devices' own word, exact for two. */
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(a, &p));
  return a == b || p.peer_capable;
#endif
}

/* Each copy's bytes and time reach the metrics of its path once the stream
 * is synchronized. */
TEST_IMPL(opencl_copy_metrics_per_path) {
  OCL_INIT(n, "opencl");
  mgpu_buffer *a, *b;
  ASSERT_OK(mgpu_malloc(&a, 0, 1 << 20));
  ASSERT_OK(mgpu_malloc(&b, n - 1, 1 << 20));
  char *host = calloc(1, 1 << 20);
  ASSERT(host != NULL);
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  ASSERT_OK(mgpu_memcpy_htod(a, 0, host, 1 << 20));
  ASSERT_OK(mgpu_memcpy_dtoh(host, a, 0, 1000));
  if (n > 1) ASSERT_OK(mgpu_memcpy(b, 0, a, 0, 4096));
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  const mgpu_device_metrics *d0 = &m0.dev[0], *d1 = &m1.dev[0];
  ASSERT_EQ(d1->copy_bytes[MGPU_METRIC_PATH_H2D] -
                d0->copy_bytes[MGPU_METRIC_PATH_H2D], (uint64_t)1 << 20);
  ASSERT_EQ(d1->copy_bytes[MGPU_METRIC_PATH_D2H] -
                d0->copy_bytes[MGPU_METRIC_PATH_D2H], 1000);
  ASSERT(d1->copy_ns[MGPU_METRIC_PATH_H2D] > d0->copy_ns[MGPU_METRIC_PATH_H2D]);
  if (n > 1) {
    uint64_t direct = 0;
    for (int d = 0; d < n; d++)
      direct += m1.dev[d].copy_bytes[MGPU_METRIC_PATH_PEER_DIRECT] -
                m0.dev[d].copy_bytes[MGPU_METRIC_PATH_PEER_DIRECT];
    ASSERT_EQ(direct, same_context(0, n - 1) ? 4096 : 0);
  }
  free(host);
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- split devices ---- */

#ifdef MGPU_TEST_OPENCL
/* The OpenCL device the queue of a stream of dev runs on. */
static cl_device_id queue_device(int dev) {
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, dev));
  cl_device_id id = NULL;
  ASSERT_EQ(clGetCommandQueueInfo(mgpu_stream_native(s), CL_QUEUE_DEVICE,
                                  sizeof id, &id, NULL), CL_SUCCESS);
  ASSERT_OK(mgpu_stream_destroy(s));
  return id;
}

static cl_device_id parent_of(cl_device_id id) {
  cl_device_id parent = NULL;
  ASSERT_EQ(clGetDeviceInfo(id, CL_DEVICE_PARENT_DEVICE, sizeof parent,
                            &parent, NULL), CL_SUCCESS);
  return parent;
}
#endif

/* opencl:0/K runs each part on a sub-device of its own where the device
 * partitions into K (PoCL's pthread device: one per compute unit, two
 * asked for here), else on the whole device. */
TEST_IMPL(opencl_split_on_sub_devices) {
#ifndef MGPU_TEST_OPENCL
  return TEST_SKIP;
#else
  setenv("POCL_CPU_MAX_CU_COUNT", "2", 1);
  OCL_INIT(n, "opencl:0/2");
  ASSERT_EQ(n, 2);
  cl_device_id a = queue_device(0), b = queue_device(1);
  ASSERT(a != b);
  ASSERT(parent_of(a) != NULL);
  ASSERT(parent_of(a) == parent_of(b));
  cl_uint cu = 0;
  ASSERT_EQ(clGetDeviceInfo(a, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu,
                            NULL), CL_SUCCESS);
  ASSERT_EQ(cu, 1);
  /* Both parts compute, and see each other's memory (one context). */
  enum { N = 256 };
  float x[N], z[N];
  for (int i = 0; i < N; i++) x[i] = (float)i;
  mgpu_buffer *bx, *bz;
  ASSERT_OK(mgpu_malloc(&bx, 0, sizeof x));
  ASSERT_OK(mgpu_malloc(&bz, 1, sizeof z));
  ASSERT_OK(mgpu_memcpy_htod(bx, 0, x, sizeof x));
  ASSERT_OK(mgpu_memcpy_htod(bz, 0, x, sizeof x));
  for (int d = 0; d < 2; d++) {
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, d));
    vadd_args args = {(uintptr_t)mgpu_buffer_ptr(bx),
                      (uintptr_t)mgpu_buffer_ptr(bz),
                      (uintptr_t)mgpu_buffer_ptr(bz), N, 1.0f};
    ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(N / 64, 1, 1),
                          MGPU_DIM3(64, 1, 1), &args, sizeof args));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  ASSERT_OK(mgpu_memcpy_dtoh(z, bz, 0, sizeof z));
  for (int i = 0; i < N; i++) ASSERT(z[i] == 3.0f * x[i]);
  ASSERT_OK(mgpu_free(bx));
  ASSERT_OK(mgpu_free(bz));
  ASSERT_OK(mgpu_shutdown());

  /* Three parts of two compute units: the whole device for each. */
  OCL_INIT(m, "opencl:0/3");
  ASSERT_EQ(m, 3);
  for (int d = 0; d < 3; d++)
    ASSERT(parent_of(queue_device(d)) == NULL);
  ASSERT_OK(mgpu_shutdown());
  return 0;
#endif
}

/* ---- busy time and traces ---- */

/* Kernel spans named "kernel vadd" in the trace file at path, each on
 * device 0's track with a start and a length. */
static int vadd_spans(const char *path) {
  char err[256];
  json *j = json_parse_file(path, err, sizeof err);
  ASSERT(j != NULL);
  const json *ev = json_get(j, "traceEvents");
  ASSERT(ev != NULL && ev->type == JSON_ARRAY);
  int spans = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *ph = json_get_string(e, "ph"), *name = json_get_string(e, "name");
    if (ph == NULL || name == NULL || strcmp(ph, "X") != 0 ||
        strcmp(name, "kernel vadd") != 0)
      continue;
    ASSERT_EQ((int)json_get_number(e, "pid", -1), 0);
    ASSERT(json_get_number(e, "dur", 0) > 0);
    ASSERT(json_get_number(e, "ts", -1) >= 0);
    spans++;
  }
  json_free(j);
  return spans;
}

/* A kernel's profiling times become a span of the trace, on the device's
 * track, and the device's busy time. */
TEST_IMPL(opencl_kernel_span_and_busy_time) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  enum { N = 1 << 20 };
  mgpu_stream *s;
  mgpu_buffer *bx, *bz;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&bx, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&bz, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_memset_async(bx, 0, 0, N * sizeof(float), s));
  vadd_args a = {(uintptr_t)mgpu_buffer_ptr(bx), (uintptr_t)mgpu_buffer_ptr(bx),
                 (uintptr_t)mgpu_buffer_ptr(bz), N, 2.0f};
  /* Built (and the build's time spent) before anything is measured. */
  ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(N / 64, 1, 1), MGPU_DIM3(64, 1, 1),
                        &a, sizeof a));
  ASSERT_OK(mgpu_stream_synchronize(s));
  char path[256];
  snprintf(path, sizeof path, "%s/mgpu-test-opencl-%d-trace.json",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  ASSERT_OK(mgpu_trace_start(path));
  ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(N / 64, 1, 1), MGPU_DIM3(64, 1, 1),
                        &a, sizeof a));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_trace_stop());
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  ASSERT(m1.dev[0].busy_ns > m0.dev[0].busy_ns);

  ASSERT_EQ(vadd_spans(path), 1);
  unlink(path);
  ASSERT_OK(mgpu_free(bx));
  ASSERT_OK(mgpu_free(bz));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* 1 when the queue behind s has profiling on, 0 when not, -1 where the
 * test cannot ask (built without the OpenCL headers). */
static int queue_profiles(mgpu_stream *s) {
#ifdef MGPU_TEST_OPENCL
  cl_command_queue_properties props = 0;
  ASSERT_EQ(clGetCommandQueueInfo(mgpu_stream_native(s), CL_QUEUE_PROPERTIES,
                                  sizeof props, &props, NULL), CL_SUCCESS);
  return (props & CL_QUEUE_PROFILING_ENABLE) != 0;
#else
  (void)s;
  return -1;
#endif
}

/* On device 0: vadd over N floats (z = 2x + y) between two events on a new
 * stream, plus a device-to-device copy of z, all read back and checked;
 * *busy: the device's busy_ns gained meanwhile, *copy_ns: its copy time
 * per path gained (all paths); *profiles: queue_profiles of the stream.
 * The events are left recorded in e[0] and e[1] (the caller's). */
static int busy_run(mgpu_event *e[2], uint64_t *busy, uint64_t *copy_ns,
                    int *profiles) {
  enum { N = 4096 };
  static float x[N], y[N], z[N];
  for (int i = 0; i < N; i++) {
    x[i] = (float)i;
    y[i] = (float)(3 * i + 1);
  }
  mgpu_stream *s;
  mgpu_buffer *bx, *by, *bz, *bw;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  *profiles = queue_profiles(s);
  ASSERT_OK(mgpu_malloc(&bx, 0, sizeof x));
  ASSERT_OK(mgpu_malloc(&by, 0, sizeof y));
  ASSERT_OK(mgpu_malloc(&bz, 0, sizeof z));
  ASSERT_OK(mgpu_malloc(&bw, 0, sizeof z));
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  ASSERT_OK(mgpu_memcpy_htod_async(bx, 0, x, sizeof x, s));
  ASSERT_OK(mgpu_memcpy_htod_async(by, 0, y, sizeof y, s));
  ASSERT_OK(mgpu_memset_async(bz, 0, 0xff, sizeof z, s));
  vadd_args a = {(uintptr_t)mgpu_buffer_ptr(bx), (uintptr_t)mgpu_buffer_ptr(by),
                 (uintptr_t)mgpu_buffer_ptr(bz), N, 2.0f};
  ASSERT_OK(mgpu_event_record(e[0], s));
  for (int k = 0; k < 8; k++)
    ASSERT_OK(mgpu_launch(s, &vadd, MGPU_DIM3(N / 64, 1, 1),
                          MGPU_DIM3(64, 1, 1), &a, sizeof a));
  ASSERT_OK(mgpu_event_record(e[1], s));
  ASSERT_OK(mgpu_memcpy_async(bw, 0, bz, 0, sizeof z, s));
  memset(z, 0, sizeof z);
  ASSERT_OK(mgpu_memcpy_dtoh_async(z, bw, 0, sizeof z, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  for (int i = 0; i < N; i++) ASSERT(z[i] == 2.0f * x[i] + y[i]);
  *busy = m1.dev[0].busy_ns - m0.dev[0].busy_ns;
  *copy_ns = 0;
  for (int p = 0; p < MGPU_METRIC_PATHS; p++)
    *copy_ns += m1.dev[0].copy_ns[p] - m0.dev[0].copy_ns[p];
  ASSERT_OK(mgpu_free(bx));
  ASSERT_OK(mgpu_free(by));
  ASSERT_OK(mgpu_free(bz));
  ASSERT_OK(mgpu_free(bw));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* MGPU_OPENCL_BUSY=0: plain queues; launches, fills and copies give the
 * same results, no busy time or copy time is counted, and the elapsed time
 * between two events is MGPU_ENOTSUP naming the device and the variable.
 * With the default (the variable unset), the same run has profiling
 * queues, counts busy time and gives elapsed times. */
TEST_IMPL(opencl_busy_off_makes_plain_queues) {
  setenv("MGPU_OPENCL_BUSY", "0", 1);
  OCL_INIT(n, "opencl:0");
  (void)n;
  mgpu_event *e[2];
  for (int round = 0; round < 2; round++) {
    for (int k = 0; k < 2; k++) ASSERT_OK(mgpu_event_create(&e[k], 0));
    uint64_t busy = 0, copy_ns = 0;
    int profiles = -1;
    ASSERT_OK(busy_run(e, &busy, &copy_ns, &profiles));
    float ms = -1.0f;
    if (round == 0) { /* MGPU_OPENCL_BUSY=0 */
      ASSERT(profiles != 1);
      ASSERT_EQ(busy, 0);
      ASSERT_EQ(copy_ns, 0);
      ASSERT_ERR(MGPU_ENOTSUP, mgpu_event_elapsed_ms(e[0], e[1], &ms));
      ASSERT_DETAIL_HAS("opencl device 0");
      ASSERT_DETAIL_HAS("MGPU_OPENCL_BUSY=0");
      ASSERT(ms == -1.0f); /* nothing written */
    } else { /* the default */
      ASSERT(profiles != 0);
      ASSERT(busy > 0);
      ASSERT(copy_ns > 0);
      ASSERT_OK(mgpu_event_elapsed_ms(e[0], e[1], &ms));
      ASSERT(ms >= 0.0f);
    }
    for (int k = 0; k < 2; k++) ASSERT_OK(mgpu_event_destroy(e[k]));
    ASSERT_OK(mgpu_shutdown());
    if (round == 0) {
      unsetenv("MGPU_OPENCL_BUSY");
      ASSERT_EQ(ocl_init("opencl:0"), n);
    }
  }
  return 0;
}

/* opencl_busy = 0 in the config with a trace recorded from mgpu_init: the
 * queues keep profiling, so the trace has the kernels' spans and event
 * times work, but no busy time is counted. */
TEST_IMPL(opencl_busy_off_with_trace_keeps_spans) {
  char path[256];
  snprintf(path, sizeof path, "%s/mgpu-test-opencl-%d-busy-off.json",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "opencl:0";
  cfg.opencl_busy = 0;
  cfg.trace = path;
  if (ocl_init_cfg(&cfg) == 0) return TEST_SKIP;
  mgpu_event *e[2];
  for (int k = 0; k < 2; k++) ASSERT_OK(mgpu_event_create(&e[k], 0));
  uint64_t busy = 1, copy_ns = 0;
  int profiles = -1;
  ASSERT_OK(busy_run(e, &busy, &copy_ns, &profiles));
  ASSERT(profiles != 0);
  ASSERT_EQ(busy, 0);
  ASSERT(copy_ns > 0); /* copies are timed where the queue profiles */
  float ms = -1.0f;
  ASSERT_OK(mgpu_event_elapsed_ms(e[0], e[1], &ms));
  ASSERT(ms >= 0.0f);
  for (int k = 0; k < 2; k++) ASSERT_OK(mgpu_event_destroy(e[k]));
  ASSERT_OK(mgpu_shutdown()); /* writes the trace */
  ASSERT_EQ(vadd_spans(path), 8);
  unlink(path);
  return 0;
}

/* ---- lost devices, DLPack ---- */

TEST_IMPL(opencl_lost_device_by_injection) {
  OCL_INIT(n, "opencl:0/2");
  ASSERT_EQ(n, 2);
  mgpu_stream *s[2];
  mgpu_buffer *b[2];
  for (int d = 0; d < 2; d++) {
    ASSERT_OK(mgpu_stream_create(&s[d], d));
    ASSERT_OK(mgpu_malloc(&b[d], d, 64));
  }
  ASSERT_OK(mgpu__fault_set("backend:memset_async:2=devlost", NULL, 0));
  ASSERT_OK(mgpu_memset_async(b[0], 0, 3, 64, s[0]));
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_memset_async(b[1], 0, 3, 64, s[1]));
  ASSERT_DETAIL_HAS("opencl device 1 was lost in memset_async");
  mgpu_device_state st;
  ASSERT_OK(mgpu_device_status(1, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s[1]));
  ASSERT_OK(mgpu_stream_synchronize(s[0]));
  unsigned char host[64];
  ASSERT_OK(mgpu_memcpy_dtoh(host, b[0], 0, sizeof host));
  for (int i = 0; i < 64; i++) ASSERT_EQ(host[i], 3);
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  for (int d = 0; d < 2; d++) {
    mgpu_free(b[d]);
    mgpu_stream_destroy(s[d]);
  }
  mgpu_shutdown();
  return 0;
}

/* A stream of device 0 into *arg, which stays NULL when it fails. */
static int stream_of_device_0(void *arg) {
  mgpu_stream **s = arg;
  *s = NULL;
  int rc = mgpu_stream_create(s, 0);
  if (rc != 0) ASSERT(*s == NULL);
  return rc;
}

static void stream_destroy(void *arg) {
  ASSERT_OK(mgpu_stream_destroy(*(mgpu_stream **)arg));
}

/* The plugin allocates through the core's allocation seam (the backend
 * environment): failing each allocation of an mgpu_stream_create in turn
 * reaches the plugin's own (its detail names the command queue), and every
 * failure leaves no stream behind. */
TEST_IMPL(opencl_allocations_are_fault_sites) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  mgpu_stream *s = NULL;
  ASSERT(test_alloc_sweep(stream_of_device_0, stream_destroy, &s,
                          "memory for an OpenCL command queue") == 1);
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(opencl_dlpack_device_memory_is_not_host) {
  OCL_INIT(n, "opencl:0");
  (void)n;
  mgpu_buffer *dev, *pinned;
  ASSERT_OK(mgpu_malloc(&dev, 0, 256));
  ASSERT_OK(mgpu_malloc_host(&pinned, 0, 256));
  DLDevice dl;
  ASSERT_OK(mgpu_buffer_dldevice(dev, &dl));
  ASSERT_EQ(dl.device_type, kDLOpenCL);
  ASSERT_EQ(dl.device_id, 0);
  ASSERT_OK(mgpu_buffer_dldevice(pinned, &dl));
  ASSERT_EQ(dl.device_type, kDLCPU);
  /* The device memory comes back as the same buffer memory; host memory
   * never goes on an OpenCL device. */
  int64_t shape = 256;
  DLManagedTensorVersioned *t = NULL;
  ASSERT_OK(mgpu_buffer_dlpack(dev, 0, (DLDataType){kDLUInt, 8, 1}, 1, &shape,
                               NULL, &t));
  ASSERT_EQ(t->dl_tensor.device.device_type, kDLOpenCL);
  mgpu_buffer *back;
  ASSERT_OK(mgpu_buffer_from_dlpack(&back, -1, t));
  ASSERT(mgpu_buffer_ptr(back) == mgpu_buffer_ptr(dev));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_memset_async(back, 0, 0x31, 256, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(back)); /* calls t's deleter */
  unsigned char host[256];
  ASSERT_OK(mgpu_memcpy_dtoh(host, dev, 0, sizeof host));
  for (int i = 0; i < 256; i++) ASSERT_EQ(host[i], 0x31);
  ASSERT_OK(mgpu_buffer_dlpack(pinned, 0, (DLDataType){kDLUInt, 8, 1}, 1,
                               &shape, NULL, &t));
  ASSERT_EQ(t->dl_tensor.device.device_type, kDLCPU);
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_buffer_from_dlpack(&back, 0, t));
  ASSERT_DETAIL_HAS("cannot go on device 0 (opencl device 0)");
  ASSERT_ERR(MGPU_ENODEV, mgpu_buffer_from_dlpack(&back, -1, t));
  t->deleter(t);
  /* Pinned memory is the host's: written directly, copied in. */
  memset(mgpu_buffer_ptr(pinned), 0x77, 256);
  ASSERT_OK(mgpu_memcpy(dev, 0, pinned, 0, 256));
  ASSERT_OK(mgpu_memcpy_dtoh(host, dev, 0, sizeof host));
  for (int i = 0; i < 256; i++) ASSERT_EQ(host[i], 0x77);
  ASSERT_OK(mgpu_free(dev));
  ASSERT_OK(mgpu_free(pinned));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(opencl_tokens_parsed)
TEST_ENTRY(opencl_devices_mix_and_split)
TEST_ENTRY(opencl_split_on_sub_devices)
TEST_ENTRY(opencl_kernel_variant)
TEST_ENTRY(opencl_burst_with_changing_arguments)
TEST_ENTRY(opencl_threads_launch_one_kernel)
TEST_ENTRY(opencl_busy_time_leaves_out_idle_gaps)
TEST_ENTRY(opencl_build_error_has_log)
TEST_ENTRY(opencl_builtins_match_host)
TEST_ENTRY(opencl_builtins_16_bit)
TEST_ENTRY(opencl_allreduce_every_type)
TEST_ENTRY(opencl_wait_across_devices)
TEST_ENTRY(opencl_copy_metrics_per_path)
TEST_ENTRY(opencl_kernel_span_and_busy_time)
TEST_ENTRY(opencl_busy_off_makes_plain_queues)
TEST_ENTRY(opencl_busy_off_with_trace_keeps_spans)
TEST_ENTRY(opencl_lost_device_by_injection)
TEST_ENTRY(opencl_dlpack_device_memory_is_not_host)
TEST_ENTRY(opencl_allocations_are_fault_sites)
TEST_LIST_END
