/* Graphs: built node by node and captured from streams, across devices,
 * replayed, updated, destroyed, and refused where they must be. */
#include <pthread.h>
#include <string.h>

#include "task.h"
#include "util/fault.h"

/* x[i] = x[i] * mul + add over n floats. */
typedef struct affine_args {
  float *x;
  size_t n;
  float mul, add;
} affine_args;

static void affine_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  const affine_args *a = argp;
  size_t per = (a->n + ctx->grid_dim.x - 1) / ctx->grid_dim.x;
  size_t lo = ctx->block_idx.x * per, hi = lo + per < a->n ? lo + per : a->n;
  for (size_t i = lo; i < hi; i++) a->x[i] = a->x[i] * a->mul + a->add;
}
static const mgpu_kernel affine = {"affine", affine_host, NULL};

static void fail_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  (void)argp;
  mgpu_kernel_fail(ctx, MGPU_EINVAL, "bad input in the graph");
}
static const mgpu_kernel failing = {"failing", fail_host, NULL};

static void count_cb(void *arg) {
  __atomic_fetch_add((int *)arg, 1, __ATOMIC_SEQ_CST);
}

static void read_floats(mgpu_buffer *b, float *out, size_t n) {
  ASSERT_OK(mgpu_memcpy_dtoh(out, b, 0, n * sizeof(float)));
}

static void write_floats(mgpu_buffer *b, float v, size_t n) {
  float tmp[64];
  for (size_t i = 0; i < n; i++) tmp[i] = v;
  ASSERT_OK(mgpu_memcpy_htod(b, 0, tmp, n * sizeof(float)));
}

enum { N = 64 };

/* fill x0 on device 0, x0 = 2*x0 + 1, copy to x1 on device 1, x1 += 10 on
 * device 1, a host function after it: every launch redoes the chain. */
TEST_IMPL(explicit_graph_across_devices) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_buffer *x0, *x1;
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&x1, d1, N * sizeof(float)));
  write_floats(x1, -1.0f, N);
  int calls = 0;
  mgpu_graph *g;
  ASSERT_OK(mgpu_graph_create(&g));
  mgpu_graph_node fill, k0, cp, k1, host;
  float three = 3.0f;
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, x0, 0, N, MGPU_FLOAT32, &three,
                                &fill));
  affine_args a0 = {mgpu_buffer_ptr(x0), N, 2.0f, 1.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, &fill, 1, &affine, MGPU_DIM3(4, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a0, sizeof a0, &k0));
  ASSERT_OK(mgpu_graph_add_copy(g, &k0, 1, x1, 0, x0, 0, N * sizeof(float),
                                &cp));
  affine_args a1 = {mgpu_buffer_ptr(x1), N, 1.0f, 10.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, d1, &cp, 1, &affine, MGPU_DIM3(2, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a1, sizeof a1, &k1));
  ASSERT_OK(mgpu_graph_add_host(g, d1, &k1, 1, count_cb, &calls, &host));
  ASSERT_EQ(mgpu_graph_node_count(g), 5);
  ASSERT_EQ(host, 4);
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  /* The executable graph keeps its own copy. */
  ASSERT_OK(mgpu_graph_destroy(g));
  /* Building runs nothing. */
  float out[N];
  read_floats(x1, out, N);
  ASSERT(out[0] == -1.0f);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  for (int i = 0; i < 3; i++) ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(calls, 3);
  read_floats(x1, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 17.0f);
  read_floats(x0, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 7.0f);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].graph_launches, 3);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(x0));
  ASSERT_OK(mgpu_free(x1));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A graph launched from a stream of another device than its nodes', and
 * from two streams one after the other: launches stay in order. */
TEST_IMPL(launches_from_other_streams_run_in_order) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_buffer *x;
  ASSERT_OK(mgpu_malloc(&x, 0, N * sizeof(float)));
  write_floats(x, 1.0f, N);
  mgpu_graph *g;
  ASSERT_OK(mgpu_graph_create(&g));
  affine_args a = {mgpu_buffer_ptr(x), N, 2.0f, 0.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &affine, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a, sizeof a, NULL));
  mgpu_graph_exec *ex;
  ASSERT_OK(mgpu_graph_instantiate(g, &ex));
  mgpu_stream *s0, *s1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  for (int i = 0; i < 5; i++) ASSERT_OK(mgpu_graph_launch(ex, i % 2 ? s1 : s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  float out[N];
  read_floats(x, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 32.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(ex));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* The Jacobi swap: one graph, its kernel's arguments and its copy's
 * buffers updated between launches. */
TEST_IMPL(exec_update_kernel_and_copy) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_buffer *a, *b, *dst;
  ASSERT_OK(mgpu_malloc(&a, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&b, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&dst, d1, N * sizeof(float)));
  write_floats(a, 1.0f, N);
  write_floats(b, 100.0f, N);
  mgpu_graph *g;
  ASSERT_OK(mgpu_graph_create(&g));
  affine_args args = {mgpu_buffer_ptr(a), N, 1.0f, 1.0f};
  mgpu_graph_node k, c;
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &affine, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &args, sizeof args, &k));
  ASSERT_OK(mgpu_graph_add_copy(g, &k, 1, dst, 0, a, 0, N * sizeof(float),
                                &c));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_graph_launch(x, s));
  /* The launch queued above keeps its arguments. */
  args.x = mgpu_buffer_ptr(b);
  args.add = 5.0f;
  ASSERT_OK(mgpu_graph_exec_update_kernel(x, k, &args, sizeof args));
  ASSERT_OK(mgpu_graph_exec_update_copy(x, c, dst, 0, b, 0,
                                        N * sizeof(float)));
  ASSERT_OK(mgpu_stream_synchronize(s));
  float out[N];
  read_floats(a, out, N);
  ASSERT(out[0] == 2.0f);
  read_floats(dst, out, N);
  ASSERT(out[5] == 2.0f);
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  read_floats(b, out, N);
  ASSERT(out[0] == 105.0f);
  read_floats(dst, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 105.0f);
  read_floats(a, out, N);
  ASSERT(out[0] == 2.0f);
  /* Wrong kinds, ranges and devices. */
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_exec_update_kernel(x, c, &args,
                                                        sizeof args));
  ASSERT_DETAIL_HAS("node 1 is a copy node");
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_exec_update_copy(x, k, dst, 0, b, 0, 4));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_exec_update_kernel(x, 7, &args,
                                                        sizeof args));
  ASSERT_ERR(MGPU_ERANGE, mgpu_graph_exec_update_copy(x, c, dst, 4, b, 0,
                                                      N * sizeof(float)));
  if (d1 != 0) {
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_graph_exec_update_copy(x, c, b, 0, dst, 0,
                                                           16));
    ASSERT_DETAIL_HAS("new source is on device 1");
  }
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(graph_errors) {
  test_init();
  mgpu_graph *g;
  mgpu_graph_exec *x;
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_graph_node_count(NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_create(NULL));
  ASSERT_OK(mgpu_graph_create(&g));
  mgpu_buffer *b, *ro;
  ASSERT_OK(mgpu_malloc(&b, 0, 256));
  static char wrapped[64];
  ASSERT_OK(mgpu_buffer_wrap(&ro, 0, MGPU_MEM_DEVICE, wrapped, sizeof wrapped,
                             MGPU_BUFFER_READONLY, NULL, NULL));
  mgpu_graph_node a, c;
  ASSERT_OK(mgpu_graph_add_memset(g, NULL, 0, b, 0, 0, 256, &a));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_memset(g, (int[]){3}, 1, b, 0, 0, 8,
                                                NULL));
  ASSERT_DETAIL_HAS("dependency 0 is node 3");
  ASSERT_ERR(MGPU_ERANGE, mgpu_graph_add_memset(g, NULL, 0, b, 200, 0, 100,
                                                NULL));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_graph_add_copy(g, NULL, 0, ro, 0, b, 0, 8,
                                                 NULL));
  ASSERT_ERR(MGPU_EOVERLAP, mgpu_graph_add_copy(g, NULL, 0, b, 0, b, 4, 8,
                                                NULL));
  ASSERT_ERR(MGPU_ENODEV, mgpu_graph_add_host(g, 99, NULL, 0, count_cb, NULL,
                                              NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_kernel(g, 0, NULL, 0, &affine,
                                                MGPU_DIM3(0, 1, 1),
                                                MGPU_DIM3(1, 1, 1), NULL, 0,
                                                NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_fill(g, NULL, 0, b, 0, 4,
                                              MGPU_FLOAT32, NULL, NULL));
  ASSERT_EQ(mgpu_graph_node_count(g), 1); /* failed adds left nothing */
  ASSERT_OK(mgpu_graph_add_memset(g, &a, 1, b, 0, 1, 16, &c));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_dependency(g, c, c));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_dependency(g, c, 9));
  /* a -> c -> a: a cycle, found when instantiated. */
  ASSERT_OK(mgpu_graph_add_dependency(g, c, a));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_instantiate(g, &x));
  ASSERT_DETAIL_HAS("cycle through node");
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_destroy(g));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_add_empty(g, 0, NULL, 0, NULL));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_graph_launch(NULL, NULL));

  /* A buffer freed after the graph was built: the launch names the node
   * and queues nothing. */
  mgpu_buffer *gone;
  ASSERT_OK(mgpu_malloc(&gone, 0, 64));
  int calls = 0;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, count_cb, &calls, &a));
  ASSERT_OK(mgpu_graph_add_memset(g, &a, 1, gone, 0, 7, 64, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_free(gone));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_launch(x, s));
  ASSERT_DETAIL_HAS("node 1 (memset on device 0)");
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(calls, 0);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_launch(x, s));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_free(ro));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A kernel failing inside a replay: on the launching stream's device the
 * failure surfaces at its synchronize; on another device at the next
 * launch. */
TEST_IMPL(fault_inside_replay) {
  int n = test_init();
  mgpu_graph *g;
  mgpu_graph_exec *x;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  int calls = 0;
  ASSERT_OK(mgpu_graph_create(&g));
  mgpu_graph_node k;
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &failing, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), NULL, 0, &k));
  ASSERT_OK(mgpu_graph_add_host(g, 0, &k, 1, count_cb, &calls, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("bad input in the graph");
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  if (n > 1) {
    ASSERT_OK(mgpu_graph_create(&g));
    ASSERT_OK(mgpu_graph_add_kernel(g, 1, NULL, 0, &failing,
                                    MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                                    NULL, 0, NULL));
    ASSERT_OK(mgpu_graph_instantiate(g, &x));
    ASSERT_OK(mgpu_graph_launch(x, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_ERR(MGPU_EINVAL, mgpu_graph_launch(x, s));
    ASSERT_DETAIL_HAS("earlier launch failed on device 1");
    ASSERT_OK(mgpu_graph_launch(x, s)); /* the failure was reported once */
    ASSERT_ERR(MGPU_EINVAL, mgpu_graph_exec_destroy(x));
    ASSERT_OK(mgpu_graph_destroy(g));
  }
  /* A backend failure while a launch queues its nodes is the launch's. */
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &failing, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), NULL, 0, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu__fault_set("backend:launch:1", NULL, 0));
  ASSERT_ERR(MGPU_EBACKEND, mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Destroying an executable graph with launches queued waits for them. */
TEST_IMPL(destroy_while_launched) {
  test_init();
  int calls = 0;
  mgpu_graph *g;
  ASSERT_OK(mgpu_graph_create(&g));
  mgpu_graph_node prev = -1;
  for (int i = 0; i < 8; i++)
    ASSERT_OK(mgpu_graph_add_host(g, i % mgpu_device_count(),
                                  prev >= 0 ? &prev : NULL, prev >= 0,
                                  count_cb, &calls, &prev));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_destroy(g));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  for (int i = 0; i < 20; i++) ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_EQ(__atomic_load_n(&calls, __ATOMIC_SEQ_CST) >= 20 * 7, 1);
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(calls, 160);
  /* An executable graph left open is freed by shutdown. */
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, count_cb, &calls, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_EQ(calls, 161);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(explicit_graph_across_devices)
TEST_ENTRY(launches_from_other_streams_run_in_order)
TEST_ENTRY(exec_update_kernel_and_copy)
TEST_ENTRY(graph_errors)
TEST_ENTRY(fault_inside_replay)
TEST_ENTRY(destroy_while_launched)
TEST_LIST_END
