/* Streams, events, callbacks, kernel launches and the built-in kernels. */
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "task.h"

typedef struct order_log {
  pthread_mutex_t lock;
  int seq[256];
  int n;
} order_log;

typedef struct order_arg {
  order_log *log;
  int value;
} order_arg;

static void log_cb(void *arg) {
  order_arg *a = arg;
  pthread_mutex_lock(&a->log->lock);
  a->log->seq[a->log->n++] = a->value;
  pthread_mutex_unlock(&a->log->lock);
}

TEST_IMPL(stream_runs_in_order) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    order_log log = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
    order_arg args[100];
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, d));
    for (int i = 0; i < 100; i++) {
      args[i].log = &log;
      args[i].value = i;
      ASSERT_OK(mgpu_stream_add_callback(s, log_cb, &args[i]));
    }
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_EQ(log.n, 100);
    for (int i = 0; i < 100; i++) ASSERT_EQ(log.seq[i], i);
    ASSERT_EQ(mgpu_stream_query(s), 0);
    ASSERT_EQ(mgpu_stream_device(s), d);
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  return 0;
}

typedef struct rendezvous {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
} rendezvous;

static void meet_cb(void *arg) {
  rendezvous *r = arg;
  pthread_mutex_lock(&r->lock);
  r->arrived++;
  pthread_cond_broadcast(&r->cond);
  while (r->arrived < 2) pthread_cond_wait(&r->cond, &r->lock);
  pthread_mutex_unlock(&r->lock);
}

TEST_IMPL(streams_of_one_device_run_concurrently) {
  test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  /* Two callbacks that each wait for the other: only two streams running at
   * once can finish them. */
  rendezvous r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  mgpu_stream *a, *b;
  ASSERT_OK(mgpu_stream_create(&a, 0));
  ASSERT_OK(mgpu_stream_create(&b, 0));
  ASSERT_OK(mgpu_stream_add_callback(a, meet_cb, &r));
  ASSERT_OK(mgpu_stream_add_callback(b, meet_cb, &r));
  ASSERT_OK(mgpu_stream_synchronize(a));
  ASSERT_OK(mgpu_stream_synchronize(b));
  ASSERT_EQ(r.arrived, 2);
  ASSERT_OK(mgpu_stream_destroy(a));
  ASSERT_OK(mgpu_stream_destroy(b));
  return 0;
}

static void sleep_cb(void *arg) {
  (void)arg;
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

TEST_IMPL(events_record_query_sync_elapsed) {
  test_init();
  mgpu_stream *s;
  mgpu_event *start, *stop;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&start, 0));
  ASSERT_OK(mgpu_event_create(&stop, 0));
  ASSERT_EQ(mgpu_event_query(start), 0); /* never recorded: complete */
  float ms = -1;
  ASSERT(mgpu_event_elapsed_ms(start, stop, &ms) != 0);
  ASSERT_OK(mgpu_event_record(start, s));
  ASSERT_OK(mgpu_stream_add_callback(s, sleep_cb, NULL));
  ASSERT_OK(mgpu_event_record(stop, s));
  ASSERT_EQ(mgpu_event_query(stop), MGPU_EAGAIN);
  ASSERT_OK(mgpu_event_synchronize(stop));
  ASSERT_EQ(mgpu_event_query(stop), 0);
  ASSERT_OK(mgpu_event_elapsed_ms(start, stop, &ms));
  ASSERT(ms >= 15.0f); /* the 20 ms callback lies between them */
  ASSERT_OK(mgpu_event_destroy(start));
  ASSERT_ERR(MGPU_EFREED, mgpu_event_destroy(start));
  ASSERT_ERR(MGPU_EFREED, mgpu_event_record(start, s));
  ASSERT_OK(mgpu_event_destroy(stop));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_ERR(MGPU_EFREED, mgpu_stream_synchronize(s));
  ASSERT_ERR(MGPU_EFREED, mgpu_stream_destroy(s));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_stream_synchronize(NULL));
  return 0;
}

TEST_IMPL(event_of_other_device_on_stream_is_error) {
  int n = test_init();
  if (n < 2) return TEST_SKIP;
  mgpu_stream *s;
  mgpu_event *e;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&e, 1));
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_event_record(e, s));
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

TEST_IMPL(wait_event_across_devices) {
  int n = test_init();
  if (n < 2) return TEST_SKIP;
  /* Device 0 writes a buffer after a gate opens; device 1 waits on an event
   * recorded after the write, then reads it. The read must see the data. */
  test_gate g = TEST_GATE_INITIALIZER;
  mgpu_stream *s0, *s1;
  mgpu_event *written;
  mgpu_buffer *src, *dst;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  ASSERT_OK(mgpu_event_create(&written, 0));
  ASSERT_OK(mgpu_malloc_host(&src, 0, 4096));
  ASSERT_OK(mgpu_malloc(&dst, 1, 4096));
  memset(mgpu_buffer_ptr(src), 0, 4096);
  unsigned char data[4096], out[4096];
  for (int i = 0; i < 4096; i++) data[i] = (unsigned char)(i * 13 + 1);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  int host = p.backend_kind == MGPU_BACKEND_HOST;
  if (host) ASSERT_OK(mgpu_stream_add_callback(s0, test_gate_wait, &g));
  ASSERT_OK(mgpu_memcpy_htod_async(src, 0, data, 4096, s0));
  ASSERT_OK(mgpu_event_record(written, s0));
  ASSERT_OK(mgpu_stream_wait_event(s1, written));
  ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, 4096, s1));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out, dst, 0, 4096, s1));
  if (host) {
    ASSERT_EQ(mgpu_stream_query(s1), MGPU_EAGAIN); /* held by the gate */
    test_gate_open(&g);
  }
  ASSERT_OK(mgpu_stream_synchronize(s1));
  ASSERT(memcmp(out, data, 4096) == 0);
  ASSERT_OK(mgpu_event_destroy(written));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  return 0;
}

TEST_IMPL(wait_on_unrecorded_event_does_not_block) {
  test_init();
  mgpu_stream *s;
  mgpu_event *e;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_stream_wait_event(s, e));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_event_synchronize(e));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* A host kernel: out[i] = in[i] * scale + block index, one block per 256
 * elements. */
typedef struct saxpy_args {
  float *out;
  const float *in;
  float scale;
  unsigned n;
} saxpy_args;

static void saxpy_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  const saxpy_args *a = argp;
  unsigned first = ctx->block_idx.x * ctx->block_dim.x;
  for (unsigned i = first; i < first + ctx->block_dim.x && i < a->n; i++)
    a->out[i] = a->in[i] * a->scale + (float)ctx->block_idx.x;
}

static const mgpu_kernel saxpy_kernel = {"saxpy_block", saxpy_host, NULL, NULL};

TEST_IMPL(launch_host_kernel) {
  int n = test_init();
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (p.backend_kind != MGPU_BACKEND_HOST) {
    /* No CUDA variant here: the launch is refused cleanly. */
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, 0));
    saxpy_args a = {0};
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_launch(s, &saxpy_kernel, MGPU_DIM3(1, 1, 1),
                                         MGPU_DIM3(1, 1, 1), &a, sizeof a));
    ASSERT_DETAIL_HAS("saxpy_block");
    ASSERT_OK(mgpu_stream_destroy(s));
    return 0;
  }
  const unsigned N = 1000;
  for (int d = 0; d < n; d++) {
    mgpu_buffer *in, *out;
    mgpu_stream *s;
    ASSERT_OK(mgpu_malloc(&in, d, N * sizeof(float)));
    ASSERT_OK(mgpu_malloc(&out, d, N * sizeof(float)));
    ASSERT_OK(mgpu_stream_create(&s, d));
    float host_in[1000], host_out[1000];
    for (unsigned i = 0; i < N; i++) host_in[i] = (float)i;
    ASSERT_OK(mgpu_memcpy_htod_async(in, 0, host_in, sizeof host_in, s));
    saxpy_args a = {mgpu_buffer_ptr(out), mgpu_buffer_ptr(in), 2.0f, N};
    ASSERT_OK(mgpu_launch(s, &saxpy_kernel, MGPU_DIM3((N + 255) / 256, 1, 1),
                          MGPU_DIM3(256, 1, 1), &a, sizeof a));
    a.scale = -100; /* the arguments were copied at launch */
    ASSERT_OK(mgpu_memcpy_dtoh_async(host_out, out, 0, sizeof host_out, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    for (unsigned i = 0; i < N; i++)
      ASSERT(host_out[i] == 2.0f * (float)i + (float)(i / 256));
    ASSERT_OK(mgpu_stream_destroy(s));
    ASSERT_OK(mgpu_free(in));
    ASSERT_OK(mgpu_free(out));
  }
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].kernels_launched, 1);
  ASSERT(m.dev[0].busy_ns > 0);
  return 0;
}

TEST_IMPL(launch_errors) {
  test_init();
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  saxpy_args a = {0};
  ASSERT_ERR(MGPU_EINVAL, mgpu_launch(s, NULL, MGPU_DIM3(1, 1, 1),
                                      MGPU_DIM3(1, 1, 1), &a, sizeof a));
  ASSERT_ERR(MGPU_EINVAL, mgpu_launch(s, &saxpy_kernel, MGPU_DIM3(0, 1, 1),
                                      MGPU_DIM3(1, 1, 1), &a, sizeof a));
  ASSERT_DETAIL_HAS("saxpy_block");
  ASSERT_ERR(MGPU_EINVAL, mgpu_launch(s, &saxpy_kernel, MGPU_DIM3(1, 1, 1),
                                      MGPU_DIM3(1, 1, 1), NULL, 8));
  static const mgpu_kernel cuda_only = {"cuda_only", NULL, NULL, NULL};
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_launch(s, &cuda_only, MGPU_DIM3(1, 1, 1),
                                       MGPU_DIM3(1, 1, 1), NULL, 0));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_ERR(MGPU_EFREED, mgpu_launch(s, &saxpy_kernel, MGPU_DIM3(1, 1, 1),
                                      MGPU_DIM3(1, 1, 1), &a, sizeof a));
  return 0;
}

#define CHECK_TYPE(T, DT)                                                    \
  do {                                                                       \
    T va[37], vb[37], out[37];                                               \
    for (int i = 0; i < 37; i++) {                                           \
      va[i] = (T)(i % 11 - 5);                                               \
      vb[i] = (T)(7 - i % 5);                                                \
    }                                                                        \
    for (int op = MGPU_SUM; op <= MGPU_MAX; op++) {                          \
      ASSERT_OK(mgpu_memcpy_htod_async(a, 0, va, sizeof va, s));            \
      ASSERT_OK(mgpu_memcpy_htod_async(b, 0, vb, sizeof vb, s));            \
      ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 37, DT, op));          \
      ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, sizeof out, s));          \
      ASSERT_OK(mgpu_stream_synchronize(s));                                 \
      for (int i = 0; i < 37; i++) {                                         \
        T e = op == MGPU_SUM    ? (T)(va[i] + vb[i])                         \
              : op == MGPU_PROD ? (T)(va[i] * vb[i])                         \
              : op == MGPU_MIN  ? (va[i] < vb[i] ? va[i] : vb[i])            \
                                : (va[i] > vb[i] ? va[i] : vb[i]);           \
        ASSERT(out[i] == e);                                                 \
      }                                                                      \
    }                                                                        \
    T fillv = (T)3;                                                          \
    ASSERT_OK(mgpu_fill(s, c, sizeof(T), 35, DT, &fillv));                   \
    ASSERT_OK(mgpu_scale(s, c, sizeof(T), 35, DT, 2.0));                     \
    ASSERT_OK(mgpu_axpy(s, c, sizeof(T), a, sizeof(T), 35, DT, 2.0));        \
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, sizeof out, s));            \
    ASSERT_OK(mgpu_stream_synchronize(s));                                   \
    for (int i = 1; i < 36; i++) ASSERT(out[i] == (T)(6 + 2 * va[i]));       \
  } while (0)

TEST_IMPL(builtin_kernels_every_type) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    mgpu_buffer *a, *b, *c;
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, d));
    ASSERT_OK(mgpu_malloc(&a, d, 37 * 8));
    ASSERT_OK(mgpu_malloc(&b, d, 37 * 8));
    ASSERT_OK(mgpu_malloc(&c, d, 37 * 8));
    CHECK_TYPE(float, MGPU_FLOAT32);
    CHECK_TYPE(double, MGPU_FLOAT64);
    CHECK_TYPE(int32_t, MGPU_INT32);
    CHECK_TYPE(int64_t, MGPU_INT64);
    ASSERT_ERR(MGPU_ERANGE, mgpu_elementwise(s, c, 8, a, 0, b, 0, 37,
                                             MGPU_FLOAT64, MGPU_SUM));
    ASSERT_DETAIL_HAS("dst");
    ASSERT_ERR(MGPU_EINVAL, mgpu_elementwise(s, c, 0, a, 0, b, 0, 1,
                                             (mgpu_dtype)99, MGPU_SUM));
    ASSERT_ERR(MGPU_EINVAL, mgpu_elementwise(s, c, 0, a, 0, b, 0, 1,
                                             MGPU_FLOAT32, (mgpu_op)9));
    /* Offsets are in bytes but must fall on an element. */
    float fone = 1;
    ASSERT_ERR(MGPU_EINVAL, mgpu_fill(s, c, 2, 4, MGPU_FLOAT32, &fone));
    ASSERT_DETAIL_HAS("offset 2");
    ASSERT_ERR(MGPU_EINVAL, mgpu_axpy(s, c, 0, a, 4, 4, MGPU_FLOAT64, 1.0));
    ASSERT_DETAIL_HAS("mgpu_axpy x");
    ASSERT_ERR(MGPU_EINVAL, mgpu_elementwise(s, c, 0, a, 0, b, 1, 4,
                                             MGPU_INT32, MGPU_SUM));
    {
      /* 16-bit types on every backend: 1.0 is 0x3c00 in half, 0x3f80 in
       * bfloat16. */
      double one = 1;
      uint16_t bits[4];
      ASSERT_OK(mgpu_fill(s, c, 0, 4, MGPU_FLOAT16, &one));
      ASSERT_OK(mgpu_stream_synchronize(s));
      ASSERT_OK(mgpu_memcpy_dtoh(bits, c, 0, sizeof bits));
      for (int i = 0; i < 4; i++) ASSERT_EQ(bits[i], 0x3c00);
      ASSERT_OK(mgpu_fill(s, c, 0, 4, MGPU_BFLOAT16, &one));
      ASSERT_OK(mgpu_scale(s, c, 0, 4, MGPU_BFLOAT16, 3.0));
      ASSERT_OK(mgpu_stream_synchronize(s));
      ASSERT_OK(mgpu_memcpy_dtoh(bits, c, 0, sizeof bits));
      for (int i = 0; i < 4; i++) ASSERT_EQ(bits[i], 0x4040);
    }
    ASSERT_OK(mgpu_stream_destroy(s));
    ASSERT_OK(mgpu_free(a));
    ASSERT_OK(mgpu_free(b));
    ASSERT_OK(mgpu_free(c));
  }
  ASSERT_EQ(mgpu_dtype_size(MGPU_FLOAT64), 8);
  ASSERT_EQ(mgpu_dtype_size((mgpu_dtype)42), 0);
  ASSERT(strcmp(mgpu_op_name(MGPU_MAX), "max") == 0);
  return 0;
}

TEST_IMPL(device_synchronize_waits_for_every_stream) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    order_log log = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
    order_arg args[3] = {{&log, 0}, {&log, 1}, {&log, 2}};
    mgpu_stream *s[3];
    for (int i = 0; i < 3; i++) {
      ASSERT_OK(mgpu_stream_create(&s[i], d));
      ASSERT_OK(mgpu_stream_add_callback(s[i], sleep_cb, NULL));
      ASSERT_OK(mgpu_stream_add_callback(s[i], log_cb, &args[i]));
    }
    ASSERT_OK(mgpu_device_synchronize(d));
    ASSERT_EQ(log.n, 3);
    for (int i = 0; i < 3; i++) ASSERT_OK(mgpu_stream_destroy(s[i]));
  }
  ASSERT_ERR(MGPU_ENODEV, mgpu_device_synchronize(n));
  return 0;
}

TEST_IMPL(shutdown_releases_open_handles) {
  test_init();
  mgpu_stream *s;
  mgpu_event *e;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_malloc(&b, 0, 1 << 16));
  ASSERT_OK(mgpu_memset_async(b, 0, 1, 1 << 16, s));
  ASSERT_OK(mgpu_event_record(e, s));
  ASSERT_OK(mgpu_shutdown()); /* ASan would report anything left behind */
  test_init();
  ASSERT_ERR(MGPU_EFREED, mgpu_stream_destroy(s));
  ASSERT_ERR(MGPU_EFREED, mgpu_event_destroy(e));
  return 0;
}

typedef struct slow_arg {
  int ms;
  _Atomic int done;
} slow_arg;

static void slow_cb(void *arg) {
  slow_arg *a = arg;
  struct timespec ts = {0, (long)a->ms * 1000 * 1000};
  nanosleep(&ts, NULL);
  a->done = 1;
}

/* mgpu_free waits for the work queued on its device (as cudaFree), also
 * while another stream of the device captures a graph: a free that went
 * on at once left a kernel writing into memory given back. */
TEST_IMPL(free_waits_while_device_captures) {
  test_init();
  mgpu_stream *work, *cap;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&work, 0));
  ASSERT_OK(mgpu_stream_create(&cap, 0));
  ASSERT_OK(mgpu_malloc(&b, 0, 1 << 16));
  slow_arg held = {100, 0};
  ASSERT_OK(mgpu_memset_async(b, 0, 7, 1 << 16, work));
  ASSERT_OK(mgpu_stream_add_callback(work, slow_cb, &held));
  ASSERT_OK(mgpu_memset_async(b, 0, 9, 1 << 16, work));
  ASSERT_OK(mgpu_stream_begin_capture(cap));
  ASSERT_OK(mgpu_free(b));
  ASSERT_EQ(held.done, 1);
  ASSERT_OK(mgpu_stream_query(work)); /* done: nothing queued is left */
  /* The public synchronize of the device is still refused. */
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_device_synchronize(0));
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(cap, &g));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_stream_destroy(cap));
  ASSERT_OK(mgpu_stream_destroy(work));
  return 0;
}

static void sleep_300ms_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  (void)ctx;
  (void)argp;
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
}
static const mgpu_kernel sleep_300ms = {"sleep_300ms", sleep_300ms_host, NULL,
                                        NULL};

/* A wait takes the record it captured, not a later one: an event recorded
 * on a slow stream, waited for, then recorded again on an idle stream.
 * The second record completes first; the wait passed then (it compared
 * with the highest number completed) and read the slow stream's output
 * before it was written, as CUDA's cudaStreamWaitEvent does not. */
TEST_IMPL(wait_takes_its_own_record) {
  test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  mgpu_stream *slow, *idle, *reader;
  mgpu_event *e;
  mgpu_buffer *x, *y;
  ASSERT_OK(mgpu_stream_create(&slow, 0));
  ASSERT_OK(mgpu_stream_create(&idle, 0));
  ASSERT_OK(mgpu_stream_create(&reader, 0));
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_malloc(&x, 0, 4));
  ASSERT_OK(mgpu_malloc(&y, 0, 4));
  float zero = 0, one = 1, out = -1;
  ASSERT_OK(mgpu_fill(slow, x, 0, 1, MGPU_FLOAT32, &zero));
  ASSERT_OK(mgpu_fill(slow, y, 0, 1, MGPU_FLOAT32, &zero));
  ASSERT_OK(mgpu_stream_synchronize(slow));
  ASSERT_OK(mgpu_launch(slow, &sleep_300ms, MGPU_DIM3(1, 1, 1),
                        MGPU_DIM3(1, 1, 1), NULL, 0));
  ASSERT_OK(mgpu_fill(slow, x, 0, 1, MGPU_FLOAT32, &one));
  ASSERT_OK(mgpu_event_record(e, slow));
  ASSERT_OK(mgpu_stream_wait_event(reader, e));
  ASSERT_OK(mgpu_memcpy_async(y, 0, x, 0, 4, reader));
  ASSERT_OK(mgpu_event_record(e, idle)); /* done long before the first */
  ASSERT_OK(mgpu_stream_synchronize(reader));
  ASSERT_OK(mgpu_memcpy_dtoh(&out, y, 0, 4));
  ASSERT(out == 1.0f);
  ASSERT_OK(mgpu_event_query(e));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_OK(mgpu_stream_destroy(slow));
  ASSERT_OK(mgpu_stream_destroy(idle));
  ASSERT_OK(mgpu_stream_destroy(reader));
  ASSERT_OK(mgpu_free(x));
  ASSERT_OK(mgpu_free(y));
  return 0;
}

/* mgpu_free waits for the work queued on every device's streams: a copy
 * into a buffer of device 1 queued on a stream of device 0 (behind a slow
 * kernel) wrote into memory already given back when the free waited for
 * device 1 only; so did a fill of device 1's unified memory from device
 * 0's stream. */
TEST_IMPL(free_waits_for_other_devices_streams) {
  int n = test_init();
  if (n < 2) return TEST_SKIP;
  if (!test_device_is_host(0)) return TEST_SKIP;
  mgpu_stream *s0;
  mgpu_buffer *src, *dst, *u;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_malloc(&src, 0, 4096));
  ASSERT_OK(mgpu_malloc(&dst, 1, 4096));
  ASSERT_OK(mgpu_malloc_unified(&u, 1, 4096));
  ASSERT_OK(mgpu_launch(s0, &sleep_300ms, MGPU_DIM3(1, 1, 1),
                        MGPU_DIM3(1, 1, 1), NULL, 0));
  ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, 4096, s0));
  float one = 1;
  ASSERT_OK(mgpu_fill(s0, u, 0, 1024, MGPU_FLOAT32, &one));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_query(s0)); /* the free waited for it all */
  ASSERT_OK(mgpu_free(u));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_free(src));
  return 0;
}

typedef struct rec_wait {
  mgpu_stream *s;
  mgpu_event *e;
} rec_wait;

static void *record_many(void *arg) {
  rec_wait *r = arg;
  for (int i = 0; i < 20000; i++) ASSERT_OK(mgpu_event_record(r->e, r->s));
  return NULL;
}

static void *wait_many(void *arg) {
  rec_wait *r = arg;
  for (int i = 0; i < 20000; i++) ASSERT_OK(mgpu_stream_wait_event(r->s, r->e));
  return NULL;
}

/* Records and waits of one event on one stream from two threads: a wait
 * that took the number of a record whose operation was not queued yet
 * was queued ahead of it, and the stream waited for ever (3 runs of 3,
 * 20000 of each). */
TEST_IMPL(record_and_wait_from_two_threads_end) {
  test_init();
  rec_wait r;
  ASSERT_OK(mgpu_stream_create(&r.s, 0));
  ASSERT_OK(mgpu_event_create(&r.e, 0));
  alarm(120); /* a hang fails here, not at ctest's limit */
  pthread_t t[2];
  ASSERT(pthread_create(&t[0], NULL, record_many, &r) == 0);
  ASSERT(pthread_create(&t[1], NULL, wait_many, &r) == 0);
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  ASSERT_OK(mgpu_stream_synchronize(r.s));
  ASSERT_OK(mgpu_event_destroy(r.e));
  ASSERT_OK(mgpu_stream_destroy(r.s));
  alarm(0);
  return 0;
}

static void failing_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  (void)argp;
  mgpu_kernel_fail(ctx, MGPU_EINVAL, "bad input");
}
static const mgpu_kernel failing = {"failing", failing_host, NULL, NULL};

/* A failure of work on a stream is reported by that stream's next
 * synchronize (or query, destroy, device synchronize), once, even when
 * mgpu_free of another buffer of the device waited for the work first:
 * the free used to take the error and drop it, and the stream then said
 * all went well. */
TEST_IMPL(free_keeps_stream_error_for_its_stream) {
  test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  mgpu_stream *s;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  /* Reported by the stream's synchronize, then by its query. */
  for (int round = 0; round < 3; round++) {
    ASSERT_OK(mgpu_malloc(&b, 0, 64));
    ASSERT_OK(mgpu_launch(s, &failing, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                          NULL, 0));
    ASSERT_OK(mgpu_free(b));
    int rc = round == 0   ? mgpu_stream_synchronize(s)
             : round == 1 ? mgpu_stream_query(s)
                          : mgpu_device_synchronize(0);
    ASSERT_EQ(rc, MGPU_EINVAL);
    ASSERT_DETAIL_HAS("kernel 'failing' failed");
    ASSERT_DETAIL_HAS("bad input");
    ASSERT_OK(mgpu_stream_synchronize(s)); /* once */
  }
  /* An error kept, then a later one: the first is reported first, and
   * the later by the next report. */
  ASSERT_OK(mgpu_malloc(&b, 0, 64));
  ASSERT_OK(mgpu_launch(s, &failing, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                        NULL, 0));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_launch(s, &failing, MGPU_DIM3(2, 1, 1), MGPU_DIM3(1, 1, 1),
                        NULL, 0));
  ASSERT_EQ(mgpu_stream_synchronize(s), MGPU_EINVAL);
  ASSERT_DETAIL_HAS("block (0, 0, 0)");
  ASSERT_EQ(mgpu_stream_synchronize(s), MGPU_EINVAL);
  ASSERT_OK(mgpu_stream_synchronize(s));
  /* Kept, and reported by the stream's destroy. */
  ASSERT_OK(mgpu_malloc(&b, 0, 64));
  ASSERT_OK(mgpu_launch(s, &failing, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                        NULL, 0));
  ASSERT_OK(mgpu_free(b));
  ASSERT_EQ(mgpu_stream_destroy(s), MGPU_EINVAL);
  ASSERT_DETAIL_HAS("bad input");
  return 0;
}

/* An event may be destroyed while operations that use it are still queued
 * (as in CUDA): a record queued before a later one that already completed,
 * and a wait queued on another stream. Destroying it must not free it under
 * them; on host devices destroy waits until they have run. */
TEST_IMPL(event_destroy_with_queued_record_and_wait) {
  int n = test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  mgpu_stream *s1, *s2, *s3;
  mgpu_event *e;
  ASSERT_OK(mgpu_stream_create(&s1, 0));
  ASSERT_OK(mgpu_stream_create(&s2, n > 1 ? 1 : 0));
  ASSERT_OK(mgpu_stream_create(&s3, 0));

  /* Recorded on s1 (held back), then again on s3 (completes at once). */
  slow_arg held = {30, 0};
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_stream_add_callback(s1, slow_cb, &held));
  ASSERT_OK(mgpu_event_record(e, s1));
  ASSERT_OK(mgpu_event_record(e, s3));
  ASSERT_OK(mgpu_stream_synchronize(s3));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_EQ(held.done, 1); /* the record behind the callback has run */
  ASSERT_OK(mgpu_stream_synchronize(s1));

  /* A wait queued on s2 behind a longer callback than the record's. */
  slow_arg rec = {20, 0}, waiter = {60, 0};
  ASSERT_OK(mgpu_event_create(&e, 0));
  ASSERT_OK(mgpu_stream_add_callback(s1, slow_cb, &rec));
  ASSERT_OK(mgpu_event_record(e, s1));
  ASSERT_OK(mgpu_stream_add_callback(s2, slow_cb, &waiter));
  ASSERT_OK(mgpu_stream_wait_event(s2, e));
  ASSERT_OK(mgpu_event_destroy(e));
  ASSERT_EQ(waiter.done, 1); /* s2 has gone past its wait */
  ASSERT_OK(mgpu_stream_synchronize(s2));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_stream_destroy(s2));
  ASSERT_OK(mgpu_stream_destroy(s3));
  return 0;
}

typedef struct feeder {
  mgpu_stream *s;
  _Atomic int ran, stop, capped;
} feeder;

static void feed_cb(void *arg) {
  feeder *f = arg;
  struct timespec ts = {0, 2 * 1000 * 1000};
  nanosleep(&ts, NULL);
  f->ran++;
}

/* Keeps four callbacks queued on f->s until told to stop (or 5 s pass). */
static void *feed_main(void *arg) {
  feeder *f = arg;
  int queued = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!f->stop) {
    if (queued - f->ran < 4) {
      ASSERT_OK(mgpu_stream_add_callback(f->s, feed_cb, f));
      queued++;
    } else {
      sched_yield();
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec >= 5) {
      f->capped = 1;
      break;
    }
  }
  return NULL;
}

/* Synchronize waits for the work queued before it, not for the stream to run
 * dry: another thread that keeps the stream busy must not hold it up. */
TEST_IMPL(synchronize_does_not_wait_for_later_work) {
  test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  feeder f = {NULL, 0, 0, 0};
  ASSERT_OK(mgpu_stream_create(&f.s, 0));
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, feed_main, &f) == 0);
  while (f.ran < 4) sched_yield();
  ASSERT_OK(mgpu_stream_synchronize(f.s));
  ASSERT_OK(mgpu_device_synchronize(0));
  f.stop = 1;
  pthread_join(t, NULL);
  ASSERT_EQ(f.capped, 0); /* both returned while the feeder still ran */
  ASSERT_OK(mgpu_stream_destroy(f.s));
  return 0;
}

/* Integer sums and products that overflow wrap, as they do on a GPU (on the
 * host they were signed overflow: undefined, and fatal under UBSan). */
TEST_IMPL(integer_sum_and_product_wrap) {
  test_init();
  mgpu_stream *s;
  mgpu_buffer *a, *b, *c;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&a, 0, 16));
  ASSERT_OK(mgpu_malloc(&b, 0, 16));
  ASSERT_OK(mgpu_malloc(&c, 0, 16));
  int32_t a32[2] = {INT32_MAX, 65536}, b32[2] = {1, 65536}, c32[2];
  ASSERT_OK(mgpu_memcpy_htod(a, 0, a32, sizeof a32));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, b32, sizeof b32));
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 2, MGPU_INT32, MGPU_SUM));
  ASSERT_OK(mgpu_memcpy_dtoh_async(c32, c, 0, sizeof c32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(c32[0], INT32_MIN);
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 2, MGPU_INT32, MGPU_PROD));
  ASSERT_OK(mgpu_memcpy_dtoh_async(c32, c, 0, sizeof c32, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(c32[0], INT32_MAX);
  ASSERT_EQ(c32[1], 0); /* 2^32 wraps to 0 */
  int64_t a64[2] = {INT64_MAX, INT64_MIN}, b64[2] = {1, -1}, c64[2];
  ASSERT_OK(mgpu_memcpy_htod(a, 0, a64, sizeof a64));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, b64, sizeof b64));
  ASSERT_OK(mgpu_elementwise(s, c, 0, a, 0, b, 0, 2, MGPU_INT64, MGPU_SUM));
  ASSERT_OK(mgpu_memcpy_dtoh_async(c64, c, 0, sizeof c64, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(c64[0] == INT64_MIN && c64[1] == INT64_MAX);
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_free(c));
  return 0;
}

/* Integer scale and axpy whose result does not fit saturate (and NaN gives
 * 0) instead of converting out of range, which is undefined behaviour
 * (clang's -fsanitize=float-cast-overflow reports it; on x86 it gave the
 * type's minimum for either sign). */
TEST_IMPL(builtin_integer_saturates) {
  test_init();
  mgpu_stream *s;
  mgpu_buffer *x32, *y32, *x64, *y64;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&x32, 0, 4 * sizeof(int32_t)));
  ASSERT_OK(mgpu_malloc(&y32, 0, 4 * sizeof(int32_t)));
  ASSERT_OK(mgpu_malloc(&x64, 0, 4 * sizeof(int64_t)));
  ASSERT_OK(mgpu_malloc(&y64, 0, 4 * sizeof(int64_t)));
  int32_t h32[4] = {7, -7, 100, 3};
  int64_t h64[4] = {7, -7, 100, 3};
  ASSERT_OK(mgpu_memcpy_htod_async(x32, 0, h32, sizeof h32, s));
  ASSERT_OK(mgpu_memcpy_htod_async(x64, 0, h64, sizeof h64, s));
  /* 7e30 and -7e30: far outside both types. */
  ASSERT_OK(mgpu_scale(s, x32, 0, 2, MGPU_INT32, 1e30));
  ASSERT_OK(mgpu_scale(s, x64, 0, 2, MGPU_INT64, 1e30));
  /* NaN gives 0; an in-range result is exact. */
  ASSERT_OK(mgpu_scale(s, x32, 2 * sizeof(int32_t), 1, MGPU_INT32, 0.0 / 0.0));
  ASSERT_OK(mgpu_scale(s, x64, 2 * sizeof(int64_t), 1, MGPU_INT64, 0.0 / 0.0));
  ASSERT_OK(mgpu_scale(s, x32, 3 * sizeof(int32_t), 1, MGPU_INT32, -2.0));
  ASSERT_OK(mgpu_scale(s, x64, 3 * sizeof(int64_t), 1, MGPU_INT64, -2.0));
  ASSERT_OK(mgpu_memcpy_dtoh_async(h32, x32, 0, sizeof h32, s));
  ASSERT_OK(mgpu_memcpy_dtoh_async(h64, x64, 0, sizeof h64, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(h32[0], INT32_MAX);
  ASSERT_EQ(h32[1], INT32_MIN);
  ASSERT_EQ(h32[2], 0);
  ASSERT_EQ(h32[3], -6);
  ASSERT_EQ(h64[0], INT64_MAX);
  ASSERT_EQ(h64[1], INT64_MIN);
  ASSERT_EQ(h64[2], 0);
  ASSERT_EQ(h64[3], -6);
  /* axpy: y = {1, 1, 1, 1} + alpha * {1, -1, 1, 0}. */
  int32_t y32h[4] = {1, 1, 1, 1}, xv32[4] = {1, -1, 1, 0};
  int64_t y64h[4] = {1, 1, 1, 1}, xv64[4] = {1, -1, 1, 0};
  ASSERT_OK(mgpu_memcpy_htod_async(x32, 0, xv32, sizeof xv32, s));
  ASSERT_OK(mgpu_memcpy_htod_async(y32, 0, y32h, sizeof y32h, s));
  ASSERT_OK(mgpu_memcpy_htod_async(x64, 0, xv64, sizeof xv64, s));
  ASSERT_OK(mgpu_memcpy_htod_async(y64, 0, y64h, sizeof y64h, s));
  ASSERT_OK(mgpu_axpy(s, y32, 0, x32, 0, 4, MGPU_INT32, 3e9));
  ASSERT_OK(mgpu_axpy(s, y64, 0, x64, 0, 4, MGPU_INT64, 1e19));
  ASSERT_OK(mgpu_memcpy_dtoh_async(y32h, y32, 0, sizeof y32h, s));
  ASSERT_OK(mgpu_memcpy_dtoh_async(y64h, y64, 0, sizeof y64h, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(y32h[0], INT32_MAX);
  ASSERT_EQ(y32h[1], INT32_MIN);
  ASSERT_EQ(y32h[3], 1);
  ASSERT_EQ(y64h[0], INT64_MAX);
  ASSERT_EQ(y64h[1], INT64_MIN);
  ASSERT_EQ(y64h[3], 1);
  ASSERT_OK(mgpu_free(x32));
  ASSERT_OK(mgpu_free(y32));
  ASSERT_OK(mgpu_free(x64));
  ASSERT_OK(mgpu_free(y64));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(stream_runs_in_order)
TEST_ENTRY(streams_of_one_device_run_concurrently)
TEST_ENTRY(events_record_query_sync_elapsed)
TEST_ENTRY(event_of_other_device_on_stream_is_error)
TEST_ENTRY(wait_event_across_devices)
TEST_ENTRY(wait_on_unrecorded_event_does_not_block)
TEST_ENTRY(event_destroy_with_queued_record_and_wait)
TEST_ENTRY(launch_host_kernel)
TEST_ENTRY(launch_errors)
TEST_ENTRY(builtin_kernels_every_type)
TEST_ENTRY(builtin_integer_saturates)
TEST_ENTRY(integer_sum_and_product_wrap)
TEST_ENTRY(device_synchronize_waits_for_every_stream)
TEST_ENTRY(free_waits_while_device_captures)
TEST_ENTRY(free_keeps_stream_error_for_its_stream)
TEST_ENTRY(wait_takes_its_own_record)
TEST_ENTRY(free_waits_for_other_devices_streams)
TEST_ENTRY(record_and_wait_from_two_threads_end)
TEST_ENTRY(synchronize_does_not_wait_for_later_work)
TEST_ENTRY(shutdown_releases_open_handles)
TEST_LIST_END
