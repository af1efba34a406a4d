/* Graphs: built node by node and captured from streams, across devices,
 * replayed, updated, destroyed, and refused where they must be. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/graph.h"
#include "backend/host/host-internal.h"
#include "core/core-internal.h"
#include "graph/graph-internal.h"
#include "json.h"
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
/* The same in OpenCL C (the struct's pointer as a ulong): the graph tests
 * run on OpenCL devices too. */
static const char affine_src[] =
    "typedef struct { ulong x; ulong n; float mul, add; } affine_args;\n"
    "__kernel void affine(affine_args a) {\n"
    "  __global float *x = (__global float *)a.x;\n"
    "  size_t g = get_global_size(0);\n"
    "  size_t per = (a.n + g - 1) / g, lo = get_global_id(0) * per;\n"
    "  size_t hi = lo + per < a.n ? lo + per : a.n;\n"
    "  for (size_t i = lo; i < hi; i++) x[i] = x[i] * a.mul + a.add;\n"
    "}\n";
static const mgpu_kernel affine = {"affine", affine_host, NULL, affine_src};

static void fail_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  (void)argp;
  mgpu_kernel_fail(ctx, MGPU_EINVAL, "bad input in the graph");
}
static const mgpu_kernel failing = {"failing", fail_host, NULL, NULL};

/* 1 when every device from 0 to last runs kernel k; 0, saying which does
 * not, when one is a CUDA device and k has no CUDA variant (the kernels of
 * these tests have host and OpenCL variants only). */
static int kernel_runs_on(const mgpu_kernel *k, int last) {
  for (int d = 0; d <= last; d++) {
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(d, &p));
    if (p.backend_kind == MGPU_BACKEND_CUDA && k->cuda_fn == NULL) {
      printf("skipped: device %d (%s) has no variant of kernel %s\n", d,
             p.name, k->name);
      return 0;
    }
  }
  return 1;
}

/* Skips the test (mgpu shut down) when kernel_runs_on says no. */
#define SKIP_UNLESS_KERNEL_RUNS(k, last)   \
  do {                                      \
    if (!kernel_runs_on((k), (last))) {     \
      ASSERT_OK(mgpu_shutdown());           \
      return TEST_SKIP;                     \
    }                                       \
  } while (0)

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

/* Operations queued on s since its creation, where s is a host device's
 * stream; -1 elsewhere. */
static long host_ops_queued(mgpu_stream *s) {
  mgpu__stream *is;
  mgpu_device_props p = {.size = sizeof p};
  if (mgpu__stream_get(s, &is) != 0) return -1;
  long n = -1;
  if (mgpu_device_get_props(is->dev, &p) == 0 &&
      p.backend_kind == MGPU_BACKEND_HOST) {
    mgpu__bstream *b = is->bstream;
    mgpu__mutex_lock(&b->dev->lock);
    n = (long)b->nqueued;
    mgpu__mutex_unlock(&b->dev->lock);
  }
  mgpu__stream_put(is);
  return n;
}

enum { N = 64 };

/* 1 when graphs replay as mode says (MGPU_GRAPH_REPLAY, "devices" when
 * unset): some tests look at how a replay is issued. */
static int replay_is(const char *mode) {
  const char *v = getenv("MGPU_GRAPH_REPLAY");
  return strcmp(v != NULL && *v != '\0' ? v : "devices", mode) == 0;
}

/* fill x0 on device 0, x0 = 2*x0 + 1, copy to x1 on device 1, x1 += 10 on
 * device 1, a host function after it: every launch redoes the chain. */
static int explicit_graph(const mgpu_config *config) {
  ASSERT_OK(mgpu_init(config));
  int n = mgpu_device_count();
  int d1 = n > 1 ? 1 : 0;
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
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

TEST_IMPL(explicit_graph_across_devices) { return explicit_graph(NULL); }

/* Without peer access the copy between devices is staged, which a device's
 * part cannot run in place: the graph is issued node by node, with the
 * same results. */
TEST_IMPL(explicit_graph_node_by_node) {
  mgpu_config c = MGPU_CONFIG_INITIALIZER;
  c.host_peer = 0;
  return explicit_graph(&c);
}

/* A graph launched from a stream of another device than its nodes', and
 * from two streams one after the other: launches stay in order. */
TEST_IMPL(launches_from_other_streams_run_in_order) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
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
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
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

/* A gate the host node of each launch passes once opened reaches its
 * run's number (at most 10 s), then counts the run done. */
typedef struct gate {
  int runs, opened, done;
} gate;

static void gate_pass(void *arg) {
  gate *t = arg;
  int k = __atomic_add_fetch(&t->runs, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 100000 && __atomic_load_n(&t->opened,
                                                 __ATOMIC_SEQ_CST) < k; i++)
    usleep(100);
}

static void gate_done(void *arg) {
  __atomic_add_fetch(&((gate *)arg)->done, 1, __ATOMIC_SEQ_CST);
}

/* An update retires the parts the queued launches still run; each set is
 * freed once the launches that used it are done, not only once every
 * launch is: a loop of updates and launches running ahead of its device
 * keeps only the sets in use. */
TEST_IMPL(updates_free_parts_of_done_launches) {
  test_init();
  SKIP_UNLESS_KERNEL_RUNS(&affine, 0);
  mgpu_buffer *a;
  ASSERT_OK(mgpu_malloc(&a, 0, N * sizeof(float)));
  write_floats(a, 0.0f, N);
  gate t = {0, 0, 0};
  mgpu_graph *g;
  ASSERT_OK(mgpu_graph_create(&g));
  affine_args args = {mgpu_buffer_ptr(a), N, 1.0f, 1.0f};
  mgpu_graph_node h, k;
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, gate_pass, &t, &h));
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, &h, 1, &affine, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &args, sizeof args, &k));
  ASSERT_OK(mgpu_graph_add_host(g, 0, &k, 1, gate_done, &t, NULL));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  for (int i = 0; i < 10; i++) {
    ASSERT_OK(mgpu_graph_exec_update_kernel(x, k, &args, sizeof args));
    ASSERT_OK(mgpu_graph_launch(x, s));
  }
  ASSERT(mgpu__graph_exec_retired(x) >= 9); /* launches 1 to 9 held */
  __atomic_store_n(&t.opened, 9, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 100000 && __atomic_load_n(&t.done, __ATOMIC_SEQ_CST) < 9;
       i++)
    usleep(100);
  ASSERT_EQ(__atomic_load_n(&t.done, __ATOMIC_SEQ_CST), 9);
  /* Launch 10 still waits at its gate: the next update keeps its set,
   * and at most launch 9's (whose end event may trail its last node on
   * some backends, OpenCL's), not the ten sets it kept before. */
  ASSERT_OK(mgpu_graph_exec_update_kernel(x, k, &args, sizeof args));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT(mgpu__graph_exec_retired(x) <= 2);
  __atomic_store_n(&t.opened, 11, __ATOMIC_SEQ_CST);
  ASSERT_OK(mgpu_graph_exec_synchronize(x));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(t.done, 11);
  float out[N];
  read_floats(a, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 11.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A captured graph's nodes are numbered in the order their calls were
 * recorded, over the capture's streams; records and waits inside it are
 * edges, not nodes (graph.h, mgpu_stream_end_capture). */
TEST_IMPL(captured_nodes_numbered_in_record_order) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
  mgpu_buffer *a, *b;
  ASSERT_OK(mgpu_malloc(&a, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&b, d1, N * sizeof(float)));
  mgpu_stream *s0, *s1;
  mgpu_event *e0, *e1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_event_create(&e0, 0));
  ASSERT_OK(mgpu_event_create(&e1, d1));
  int calls = 0;
  affine_args args = {mgpu_buffer_ptr(b), N, 2.0f, 1.0f};
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_OK(mgpu_memset_async(a, 0, 0, N * sizeof(float), s0)); /* node 0 */
  ASSERT_OK(mgpu_event_record(e0, s0));
  ASSERT_OK(mgpu_stream_wait_event(s1, e0));
  ASSERT_OK(mgpu_launch(s1, &affine, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                        &args, sizeof args)); /* node 1 */
  ASSERT_OK(mgpu_event_record(e1, s1));
  ASSERT_OK(mgpu_stream_wait_event(s0, e1));
  ASSERT_OK(mgpu_stream_add_callback(s0, count_cb, &calls)); /* node 2 */
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(s0, &g));
  ASSERT_EQ(mgpu_graph_node_count(g), 3);
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_exec_update_kernel(x, 0, &args,
                                                        sizeof args));
  ASSERT_DETAIL_HAS("node 0 is a memset node");
  args.add = 3.0f;
  ASSERT_OK(mgpu_graph_exec_update_kernel(x, 1, &args, sizeof args));
  write_floats(b, 1.0f, N);
  ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  float out[N];
  read_floats(b, out, N);
  ASSERT(out[0] == 5.0f); /* 1 * 2 + 3: the updated arguments */
  ASSERT_EQ(calls, 1);
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
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_empty(g, 0, (int[]){0}, 1, NULL));
  ASSERT_DETAIL_HAS("dependency 0 is node 0, and the graph has no nodes");
  ASSERT_OK(mgpu_graph_add_memset(g, NULL, 0, b, 0, 0, 256, &a));
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_add_memset(g, (int[]){3}, 1, b, 0, 0, 8,
                                                NULL));
  ASSERT_DETAIL_HAS("dependency 0 is node 3, and the graph has nodes 0 to 0");
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

/* A kernel failing inside a replay surfaces at the launching stream's
 * synchronize, on its device or on another. */
TEST_IMPL(fault_inside_replay) {
  int n = test_init();
  SKIP_UNLESS_KERNEL_RUNS(&failing, n > 1 ? 1 : 0);
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
    ASSERT_ERR(MGPU_EINVAL, mgpu_stream_synchronize(s));
    ASSERT_DETAIL_HAS("host device 1");
    ASSERT_DETAIL_HAS("bad input in the graph");
    ASSERT_OK(mgpu_graph_exec_synchronize(x)); /* reported once */
    ASSERT_OK(mgpu_graph_launch(x, s));
    ASSERT_OK(mgpu_graph_exec_destroy(x));
    ASSERT_ERR(MGPU_EINVAL, mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_graph_destroy(g));
  }
  /* A backend failure while a launch queues its work is the launch's: on
   * host devices a graph is one operation per device (graph_launch); with
   * an event node it is issued node by node (launch). */
  mgpu_event *ev;
  ASSERT_OK(mgpu_event_create(&ev, 0));
  for (int by_node = 0; by_node < 2; by_node++) {
    ASSERT_OK(mgpu_graph_create(&g));
    ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &affine,
                                    MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                                    &(affine_args){NULL, 0, 1, 1},
                                    sizeof(affine_args), &k));
    if (by_node) ASSERT_OK(mgpu_graph_add_event_record(g, &k, 1, ev, NULL));
    ASSERT_OK(mgpu_graph_instantiate(g, &x));
    /* Replayed in segments, a graph of one kernel is that kernel. */
    int parts = !by_node && replay_is("devices");
    ASSERT_OK(mgpu__fault_set(parts ? "backend:graph_launch:1"
                                    : "backend:launch:1", NULL, 0));
    ASSERT_ERR(MGPU_EBACKEND, mgpu_graph_launch(x, s));
    ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
    ASSERT_OK(mgpu_graph_launch(x, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_graph_exec_destroy(x));
    ASSERT_OK(mgpu_graph_destroy(g));
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A node failing on another device than the launching stream's: the
 * launching stream's next synchronize reports it, once, naming the device,
 * as a wait for an event of a lost device's stream fails the waiter;
 * whether the graph runs as parts or node by node (an event record node),
 * and from a stream of a device the graph does not use. Today's graph
 * streams kept it for mgpu_graph_exec_synchronize alone. */
TEST_IMPL(failure_on_other_device_reaches_launching_stream) {
  int n = test_init();
  /* 'failing' is a host kernel: device 1 must be a host device. */
  if (n < 3 || !test_device_is_host(1)) return TEST_SKIP;
  mgpu_event *ev;
  ASSERT_OK(mgpu_event_create(&ev, 1));
  for (int variant = 0; variant < 3; variant++) {
    int by_node = variant == 1, sdev = variant == 2 ? 2 : 0;
    mgpu_stream *s;
    ASSERT_OK(mgpu_stream_create(&s, sdev));
    int calls = 0;
    mgpu_graph *g;
    mgpu_graph_node k, h;
    ASSERT_OK(mgpu_graph_create(&g));
    ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, count_cb, &calls, &h));
    ASSERT_OK(mgpu_graph_add_kernel(g, 1, &h, 1, &failing, MGPU_DIM3(1, 1, 1),
                                    MGPU_DIM3(1, 1, 1), NULL, 0, &k));
    if (by_node) ASSERT_OK(mgpu_graph_add_event_record(g, &k, 1, ev, NULL));
    ASSERT_OK(mgpu_graph_add_host(g, 0, &k, 1, count_cb, &calls, NULL));
    mgpu_graph_exec *x;
    ASSERT_OK(mgpu_graph_instantiate(g, &x));
    ASSERT_OK(mgpu_graph_launch(x, s));
    ASSERT_ERR(MGPU_EINVAL, mgpu_stream_synchronize(s));
    ASSERT_DETAIL_HAS("graph launch: host device 1: kernel 'failing'");
    ASSERT_DETAIL_HAS("bad input in the graph");
    ASSERT_EQ(calls, 2);
    ASSERT_OK(mgpu_stream_synchronize(s)); /* reported once */
    ASSERT_OK(mgpu_graph_exec_synchronize(x));
    ASSERT_OK(mgpu_graph_exec_destroy(x));
    ASSERT_OK(mgpu_graph_destroy(g));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  ASSERT_OK(mgpu_event_destroy(ev));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* An event recorded in a capture that ended is a point of the graph, not
 * queued work: a wait for it (also from a capturing stream), its
 * synchronize and its query are refused naming the event, until it is
 * recorded again outside a capture. Today's wait passed at once. */
TEST_IMPL(wait_on_event_of_ended_capture_refused) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_stream *s0, *s1;
  mgpu_event *ev;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_event_create(&ev, 0));
  ASSERT_OK(mgpu_malloc(&b, 0, 256));
  ASSERT_OK(mgpu_event_record(ev, s0)); /* a real record before */
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_OK(mgpu_memset_async(b, 0, 7, 256, s0));
  ASSERT_OK(mgpu_event_record(ev, s0));
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(s0, &g));
  char want[96];
  snprintf(want, sizeof want, "event %#lx of device 0",
           (unsigned long)(uintptr_t)ev);
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_wait_event(s1, ev));
  ASSERT_DETAIL_HAS("mgpu_stream_wait_event");
  ASSERT_DETAIL_HAS(want);
  ASSERT_DETAIL_HAS("graph capture that has ended");
  ASSERT_ERR(MGPU_EINVAL, mgpu_event_synchronize(ev));
  ASSERT_DETAIL_HAS("mgpu_event_synchronize");
  ASSERT_ERR(MGPU_EINVAL, mgpu_event_query(ev));
  ASSERT_DETAIL_HAS("mgpu_event_query");
  ASSERT_OK(mgpu_stream_begin_capture(s1));
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_wait_event(s1, ev));
  ASSERT_DETAIL_HAS(want);
  mgpu_graph *empty;
  ASSERT_OK(mgpu_stream_end_capture(s1, &empty));
  ASSERT_OK(mgpu_graph_destroy(empty));
  /* Recorded again outside a capture, it is an event like any. */
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_event_record(ev, s0));
  ASSERT_OK(mgpu_stream_wait_event(s1, ev));
  ASSERT_OK(mgpu_event_synchronize(ev));
  unsigned char bytes[256];
  ASSERT_OK(mgpu_memcpy_dtoh(bytes, b, 0, 256));
  ASSERT_EQ(bytes[255], 7);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Device 1 is lost after a launch was queued and before its part ran: the
 * node of device 0 that waits for device 1's node does not wait for ever,
 * and the launching stream reports the loss naming device 1. A loss that
 * mgpu__device_lose injects stops host devices' workers; a GPU's work runs
 * on regardless (a real GPU is lost by a sticky error: cuda_async_error),
 * so the test needs host devices. */
TEST_IMPL(device_lost_during_replay) {
  int n = test_init();
  if (n < 2 || !test_device_is_host(0) || !test_device_is_host(1))
    return TEST_SKIP;
  int calls = 0;
  mgpu_graph *g;
  mgpu_graph_node a;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 1, NULL, 0, count_cb, &calls, &a));
  ASSERT_OK(mgpu_graph_add_host(g, 0, &a, 1, count_cb, &calls, NULL));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  test_gate held = TEST_GATE_INITIALIZER;
  ASSERT_OK(mgpu_stream_add_callback(s, test_gate_wait, &held));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu__device_lose(1, "lost by the test"));
  test_gate_open(&held);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("device 1");
  /* Host functions still run on a lost device (they free what the work
   * used), as queued callbacks do. */
  ASSERT_EQ(calls, 2);
  /* Refused before anything is queued on s. */
  long queued = host_ops_queued(s);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_graph_launch(x, s));
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_EQ(host_ops_queued(s), queued);
  mgpu_graph_exec_destroy(x);
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A host function that says it started, then waits for its gate. */
typedef struct started_gate {
  _Atomic int started;
  test_gate gate;
} started_gate;

static void start_then_wait(void *arg) {
  started_gate *sg = arg;
  atomic_store(&sg->started, 1);
  test_gate_wait(&sg->gate);
}

/* The launching device lost while its part runs, between two nodes: the
 * rest of the part does not run but its host functions, and the launching
 * stream fails with MGPU_EDEVLOST naming the device, though nothing else
 * was queued on it. */
TEST_IMPL(device_lost_inside_part) {
  test_init();
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (p.backend_kind != MGPU_BACKEND_HOST) { /* others replay node by node */
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  int calls = 0;
  started_gate sg = {0, TEST_GATE_INITIALIZER};
  mgpu_buffer *buf;
  ASSERT_OK(mgpu_malloc(&buf, 0, 64));
  mgpu_graph *g;
  mgpu_graph_node a, b;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, start_then_wait, &sg, &a));
  ASSERT_OK(mgpu_graph_add_memset(g, &a, 1, buf, 0, 0x5a, 64, &b));
  ASSERT_OK(mgpu_graph_add_host(g, 0, &b, 1, count_cb, &calls, NULL));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_graph_launch(x, s));
  while (!atomic_load(&sg.started)) sched_yield();
  ASSERT_OK(mgpu__device_lose(0, "lost by the test"));
  test_gate_open(&sg.gate);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("device 0");
  ASSERT_EQ(calls, 1); /* host functions still run */
  mgpu_graph_exec_destroy(x);
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A trace shows each device's part of a launch as one span named "graph
 * launch" on its stream's track, with a span per node inside it, and the
 * launch call as a span of the calling thread. */
TEST_IMPL(trace_shows_launch_with_nodes_inside) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
  char path[256];
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/mgpu-test-graph-%d.json", dir ? dir : "/tmp",
           (int)getpid());
  mgpu_buffer *x0, *x1;
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&x1, d1, N * sizeof(float)));
  mgpu_graph *g;
  mgpu_graph_node k0;
  ASSERT_OK(mgpu_graph_create(&g));
  affine_args a0 = {mgpu_buffer_ptr(x0), N, 1.0f, 1.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, NULL, 0, &affine, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a0, sizeof a0, &k0));
  mgpu_graph_node cp;
  ASSERT_OK(mgpu_graph_add_copy(g, &k0, 1, x1, 0, x0, 0, N * sizeof(float),
                                &cp));
  affine_args a1 = {mgpu_buffer_ptr(x1), N, 1.0f, 1.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, d1, &cp, 1, &affine, MGPU_DIM3(1, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a1, sizeof a1, NULL));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_trace_start(path));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_trace_stop());
  char err[256];
  json *j = json_parse_file(path, err, sizeof err);
  ASSERT(j != NULL);
  const json *ev = json_get(j, "traceEvents");
  ASSERT(ev != NULL && ev->type == JSON_ARRAY);
  int parts = 0, inside = 0, calls = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *name = json_get_string(e, "name");
    if (name == NULL || strcmp(name, "graph launch") != 0) continue;
    if (json_get(json_get(e, "args"), "nodes") != NULL) {
      calls++; /* the launch call, on the calling thread */
      continue;
    }
    parts++;
    double t0 = json_get_number(e, "ts", -1);
    double t1 = t0 + json_get_number(e, "dur", -1);
    for (size_t k = 0; k < ev->n; k++) {
      const json *f = &ev->items[k];
      const char *fn = json_get_string(f, "name");
      double ts = json_get_number(f, "ts", -1);
      if (fn != NULL && strncmp(fn, "graph ", 6) == 0 &&
          strcmp(fn, "graph launch") != 0 &&
          json_get_number(f, "pid", -2) == json_get_number(e, "pid", -3) &&
          json_get_number(f, "tid", -2) == json_get_number(e, "tid", -3) &&
          ts >= t0 && ts + json_get_number(f, "dur", 0) <= t1)
        inside++;
    }
  }
  /* A part per device: kernel and copy on device 0, kernel on d1. In
   * segments, device 1's one kernel is issued alone; node by node, no
   * part runs. */
  int want_parts = d1 != 0 ? 2 : 1, want_inside = 3;
  if (replay_is("segments") && d1 != 0) want_parts = 1, want_inside = 2;
  if (replay_is("nodes")) want_parts = 0, want_inside = 0;
  ASSERT_EQ(calls, 1);
  ASSERT_EQ(parts, want_parts);
  ASSERT_EQ(inside, want_inside);
  json_free(j);
  unlink(path);
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
  /* The last node runs on another device's stream of the graph's own, and
   * waits for all the others: the destroy waits for every launch. */
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_EQ(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 160);
  ASSERT_OK(mgpu_stream_synchronize(s));
  /* An executable graph left open is freed by shutdown. */
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, count_cb, &calls, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_EQ(calls, 161);
  return 0;
}

/* On host devices a launch from a stream of one of the graph's devices is
 * one operation on that stream (its device's part, which also joins the
 * other devices' parts) and the event of the launch's end: a graph of 8
 * kernels on device 0, and a graph over two devices, each launched 10
 * times from a stream of device 0, queue 20 operations there, and still
 * compute what they must. */
TEST_IMPL(launch_is_one_operation_per_device) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  if (host_ops_queued(s) < 0 || !replay_is("devices")) {
    ASSERT_OK(mgpu_stream_destroy(s));
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_buffer *x0, *x1;
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&x1, d1, N * sizeof(float)));
  write_floats(x0, 0.0f, N);
  write_floats(x1, 0.0f, N);
  mgpu_graph *g[2];
  mgpu_graph_node prev = -1;
  affine_args a0 = {mgpu_buffer_ptr(x0), N, 1.0f, 1.0f};
  ASSERT_OK(mgpu_graph_create(&g[0]));
  for (int i = 0; i < 8; i++)
    ASSERT_OK(mgpu_graph_add_kernel(g[0], 0, prev >= 0 ? &prev : NULL,
                                    prev >= 0, &affine, MGPU_DIM3(1, 1, 1),
                                    MGPU_DIM3(1, 1, 1), &a0, sizeof a0,
                                    &prev));
  /* Two devices: x0 += 1 on device 0, x1 = 2 * x1 on d1 after it, x0 += 1
   * after that. */
  affine_args a1 = {mgpu_buffer_ptr(x1), N, 2.0f, 0.0f};
  mgpu_graph_node k0, k1;
  ASSERT_OK(mgpu_graph_create(&g[1]));
  ASSERT_OK(mgpu_graph_add_kernel(g[1], 0, NULL, 0, &affine,
                                  MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), &a0,
                                  sizeof a0, &k0));
  ASSERT_OK(mgpu_graph_add_kernel(g[1], d1, &k0, 1, &affine,
                                  MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), &a1,
                                  sizeof a1, &k1));
  ASSERT_OK(mgpu_graph_add_kernel(g[1], 0, &k1, 1, &affine,
                                  MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), &a0,
                                  sizeof a0, NULL));
  write_floats(x1, 1.0f, N);
  for (int k = 0; k < 2; k++) {
    mgpu_graph_exec *x;
    ASSERT_OK(mgpu_graph_instantiate(g[k], &x));
    long before = host_ops_queued(s);
    for (int i = 0; i < 10; i++) ASSERT_OK(mgpu_graph_launch(x, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_EQ(host_ops_queued(s) - before, 20);
    ASSERT_OK(mgpu_graph_exec_destroy(x));
  }
  float out[N];
  read_floats(x0, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 100.0f); /* 80 + 20 */
  read_floats(x1, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 1024.0f);
  ASSERT_OK(mgpu_graph_destroy(g[0]));
  ASSERT_OK(mgpu_graph_destroy(g[1]));
  ASSERT_OK(mgpu_free(x0));
  ASSERT_OK(mgpu_free(x1));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* What the launches' host node on device 1 saw in x0[0], launch by launch
 * (next_launch_waits_for_work_between). */
typedef struct seen_values {
  const float *src;
  float seen[4];
  int n;
} seen_values;

static void see_value(void *arg) {
  seen_values *v = arg;
  if (v->n < 4) v->seen[v->n++] = v->src[0];
}

static void sleep_20ms(void *arg) {
  (void)arg;
  usleep(20000);
}

static void slow_write_seven(void *arg) {
  usleep(50000);
  *(float *)arg = 7.0f;
}

/* Two launches from a stream of device 0 with a host function between
 * them on that stream, which writes x0[0] after 50 ms: device 1's part of
 * the second launch (a host node that reads x0[0], waiting for nothing in
 * the graph) must not begin before it, although the first launch's end is
 * followed, on its stream, by the second launch's part (the start of a
 * launch is posted early only where nothing but event records is between,
 * src/backend/host/graph.c). Device 0's part sleeps 20 ms, so that all of
 * it is queued before the first launch ends. */
TEST_IMPL(next_launch_waits_for_work_between) {
  int n = test_init();
  if (n < 2 || !test_device_is_host(0) || !test_device_is_host(1)) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_stream *s;
  mgpu_buffer *x0;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  write_floats(x0, 0.0f, N);
  float *px0 = mgpu_buffer_ptr(x0);
  seen_values v = {px0, {0}, 0};
  mgpu_graph *g;
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_host(g, 0, NULL, 0, sleep_20ms, NULL, NULL));
  ASSERT_OK(mgpu_graph_add_host(g, 1, NULL, 0, see_value, &v, NULL));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_add_callback(s, slow_write_seven, px0));
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(v.n, 2);
  ASSERT(v.seen[0] == 0.0f);
  ASSERT(v.seen[1] == 7.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_free(x0));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Capture across devices: s0 (device 0) fills x0 and records e0; s1
 * (device 1) waits for e0 and so joins the capture, copies x0 into x1,
 * scales it, runs a host callback and records e1, which s0 waits for
 * (rejoining); s0 then copies x1 back and adds it to x0 (axpy). Nothing runs while
 * capturing; each launch runs it all. */
TEST_IMPL(capture_across_devices) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  SKIP_UNLESS_KERNEL_RUNS(&affine, d1);
  mgpu_buffer *x0, *x1, *t0;
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&x1, d1, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&t0, 0, N * sizeof(float)));
  write_floats(x0, -5.0f, N);
  write_floats(x1, -5.0f, N);
  mgpu_stream *s0, *s1;
  mgpu_event *e0, *e1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_event_create(&e0, 0));
  ASSERT_OK(mgpu_event_create(&e1, d1));
  int calls = 0;
  float two = 2.0f;
  ASSERT_EQ(mgpu_stream_is_capturing(s0), 0);
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_EQ(mgpu_stream_is_capturing(s0), 1);
  ASSERT_OK(mgpu_fill(s0, x0, 0, N, MGPU_FLOAT32, &two));
  ASSERT_OK(mgpu_event_record(e0, s0));
  ASSERT_EQ(mgpu_stream_is_capturing(s1), 0);
  ASSERT_OK(mgpu_stream_wait_event(s1, e0));
  ASSERT_EQ(mgpu_stream_is_capturing(s1), 1);
  ASSERT_OK(mgpu_memcpy_async(x1, 0, x0, 0, N * sizeof(float), s1));
  ASSERT_OK(mgpu_scale(s1, x1, 0, N, MGPU_FLOAT32, 3.0));
  affine_args a1 = {mgpu_buffer_ptr(x1), N, 1.0f, 1.0f};
  ASSERT_OK(mgpu_launch(s1, &affine, MGPU_DIM3(2, 1, 1), MGPU_DIM3(1, 1, 1),
                        &a1, sizeof a1));
  ASSERT_OK(mgpu_stream_add_callback(s1, count_cb, &calls));
  ASSERT_OK(mgpu_event_record(e1, s1));
  ASSERT_OK(mgpu_stream_wait_event(s0, e1));
  /* The memset is recorded too, then overwritten by the axpy's input. */
  ASSERT_OK(mgpu_memcpy_async(t0, 0, x1, 0, N * sizeof(float), s0));
  ASSERT_OK(mgpu_memset_async(x0, 0, 0, sizeof(float), s0));
  ASSERT_OK(mgpu_axpy(s0, x0, 0, t0, 0, N, MGPU_FLOAT32, 1.0));
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(s0, &g));
  ASSERT_EQ(mgpu_stream_is_capturing(s0), 0);
  ASSERT_EQ(mgpu_stream_is_capturing(s1), 0);
  ASSERT_EQ(mgpu_graph_node_count(g), 8);
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  float out[N];
  read_floats(x1, out, N);
  ASSERT(out[3] == -5.0f); /* nothing ran */
  ASSERT_EQ(calls, 0);
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  for (int i = 0; i < 2; i++) ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_EQ(calls, 2);
  read_floats(x1, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 7.0f);
  read_floats(x0, out, N);
  ASSERT(out[0] == 7.0f); /* 0 (memset) + 7 */
  for (int i = 1; i < N; i++) ASSERT(out[i] == 9.0f);
  /* The streams work as before after the capture. */
  ASSERT_OK(mgpu_fill(s1, x1, 0, N, MGPU_FLOAT32, &two));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  read_floats(x1, out, N);
  ASSERT(out[0] == 2.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Host copies and waits on events of work outside the capture. */
TEST_IMPL(capture_host_copies_and_outside_events) {
  test_init();
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 0, N * sizeof(float)));
  mgpu_stream *s, *other;
  mgpu_event *outside;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_stream_create(&other, 0));
  ASSERT_OK(mgpu_event_create(&outside, 0));
  float in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (float)i;
  ASSERT_OK(mgpu_stream_begin_capture(s));
  ASSERT_OK(mgpu_stream_wait_event(s, outside));
  ASSERT_OK(mgpu_memcpy_htod_async(b, 0, in, sizeof in, s));
  ASSERT_OK(mgpu_scale(s, b, 0, N, MGPU_FLOAT32, 2.0));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out, b, 0, sizeof out, s));
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(s, &g));
  ASSERT_EQ(mgpu_graph_node_count(g), 4);
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_OK(mgpu_event_record(outside, other));
  memset(out, 0, sizeof out);
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  for (int i = 0; i < N; i++) ASSERT(out[i] == 2.0f * (float)i);
  in[5] = 100.0f; /* read at each launch */
  ASSERT_OK(mgpu_graph_launch(x, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(out[5] == 200.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* What a capture refuses: each is a coded error naming the call, and
 * leaves nothing queued. */
TEST_IMPL(capture_invalid) {
  int n = test_init();
  int d1 = n > 1 ? 1 : 0;
  mgpu_stream *s0, *s1;
  mgpu_event *e0, *e1;
  mgpu_buffer *b0, *b1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_event_create(&e0, 0));
  ASSERT_OK(mgpu_event_create(&e1, d1));
  ASSERT_OK(mgpu_malloc(&b0, 0, 256));
  ASSERT_OK(mgpu_malloc(&b1, d1, 256));
  mgpu_graph *g = NULL;
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_end_capture(s0, &g));
  ASSERT_DETAIL_HAS("is not capturing");
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_begin_capture(s0));
  ASSERT_DETAIL_HAS("already capturing");
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_stream_synchronize(s0));
  ASSERT_DETAIL_HAS("mgpu_stream_synchronize");
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_stream_query(s0));
  ASSERT_DETAIL_HAS("mgpu_stream_query");
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_device_synchronize(0));
  ASSERT_DETAIL_HAS("mgpu_device_synchronize");
  ASSERT_ERR(MGPU_EBUSY, mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_memset_async(b0, 0, 1, 256, s0));
  ASSERT_OK(mgpu_event_record(e0, s0));
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_event_synchronize(e0));
  ASSERT_DETAIL_HAS("mgpu_event_synchronize");
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_event_query(e0));
  /* Calls that cannot be recorded fail and queue nothing. */
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_memcpy_2d_async(b0, 0, 16, b0, 128, 16, 16, 4,
                                                s0));
  ASSERT_DETAIL_HAS("capturing");
  mgpu_buffer *pooled = NULL;
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_malloc_async(&pooled, 64, s0));
  int devs[2] = {0, d1};
  mgpu_comm *comm = NULL;
  if (d1 != 0) {
    ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
    /* Rank 0's stream captures and rank 1's does not (it has not joined
     * yet): the group is refused as a whole. */
    ASSERT_OK(mgpu_group_begin());
    ASSERT_OK(mgpu_allreduce(comm, 0, b0, b0, 4, MGPU_FLOAT32, MGPU_SUM, s0));
    ASSERT_OK(mgpu_allreduce(comm, 1, b1, b1, 4, MGPU_FLOAT32, MGPU_SUM, s1));
    ASSERT_ERR(MGPU_EINVAL, mgpu_group_end());
    ASSERT_DETAIL_HAS("does not capture");
    /* One rank alone would wait for the other at every replay. */
    ASSERT_ERR(MGPU_EINVAL, mgpu_allreduce(comm, 0, b0, b0, 4, MGPU_FLOAT32,
                                           MGPU_SUM, s0));
    ASSERT_DETAIL_HAS("every rank");
  }
  mgpu_graph_exec *x;
  mgpu_graph *small;
  ASSERT_OK(mgpu_graph_create(&small));
  ASSERT_OK(mgpu_graph_add_empty(small, 0, NULL, 0, NULL));
  ASSERT_OK(mgpu_graph_instantiate(small, &x));
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_graph_launch(x, s0));
  ASSERT_DETAIL_HAS("graph launch cannot be recorded");
  /* s1 joins and does not rejoin: the end fails, naming its device. */
  ASSERT_OK(mgpu_stream_wait_event(s1, e0));
  ASSERT_OK(mgpu_memset_async(b1, 0, 2, 256, s1));
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_end_capture(s1, &g));
  ASSERT_DETAIL_HAS("did not begin");
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_end_capture(s0, &g));
  char want[64];
  snprintf(want, sizeof want, "stream of device %d joined", d1);
  ASSERT_DETAIL_HAS(want);
  ASSERT(g == NULL);
  ASSERT_EQ(mgpu_stream_is_capturing(s0), 0);
  ASSERT_EQ(mgpu_stream_is_capturing(s1), 0);
  /* Destroying a communicator synchronizes its devices: after the capture. */
  if (comm != NULL) ASSERT_OK(mgpu_comm_destroy(comm));
  /* Nothing was run: the buffers are as allocated... */
  unsigned char bytes[256];
  ASSERT_OK(mgpu_memset_async(b0, 0, 9, 256, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  ASSERT_OK(mgpu_memcpy_dtoh(bytes, b1, 0, 256));
  ASSERT(bytes[0] != 2);
  /* ...and the event's capture is over: it can be waited for again. */
  ASSERT_OK(mgpu_event_synchronize(e0));
  ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(small));
  ASSERT_OK(mgpu_stream_destroy(s0));
  /* A capture left open at shutdown is dropped. */
  ASSERT_OK(mgpu_stream_begin_capture(s1));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- the fault sweep of graphs ----
 *
 * A workload that builds a graph node by node and one by capture across
 * two devices, instantiates and launches both, runs once to count its
 * fault sites, then once per site with that site made to fail (an
 * allocation: alone, and with every later one; a backend call: as an
 * error, and as a lost device), each run in a child process under
 * a timeout: every call must return 0 or a coded error with a detail,
 * everything made must be released (LeakSanitizer checks at exit), a run
 * whose calls all succeeded must have the right results, and mgpu must
 * start again afterwards. */

#define SWEEP_STEP(expr)                                                    \
  do {                                                                      \
    int step_rc_ = (expr);                                                  \
    if (step_rc_ != 0) {                                                    \
      if (step_rc_ > 0 || mgpu_error_detail()[0] == '\0') _exit(12);        \
      rc = step_rc_;                                                        \
      goto cleanup;                                                         \
    }                                                                       \
  } while (0)

/* A capture of a collective and a channel message across two devices:
 * x0 = 1, x1 = 2, an all-reduce of both (3), x0 = 2 * x0, sent into x1:
 * both 6 once it ran. */
static int sweep_collective(mgpu_stream *s0, mgpu_stream *s1, mgpu_event *e0,
                            mgpu_event *e1, mgpu_buffer *x0, mgpu_buffer *x1,
                            mgpu_comm **comm, mgpu_channel **ch,
                            mgpu_graph **out) {
  int devs[2] = {0, 1}, rc = 0;
  float one = 1.0f, two = 2.0f;
  SWEEP_STEP(mgpu_comm_create(devs, 2, comm));
  SWEEP_STEP(mgpu_channel_create(0, 1, N * sizeof(float), 1, ch));
  SWEEP_STEP(mgpu_stream_begin_capture(s0));
  SWEEP_STEP(mgpu_event_record(e0, s0));
  SWEEP_STEP(mgpu_stream_wait_event(s1, e0));
  SWEEP_STEP(mgpu_fill(s0, x0, 0, N, MGPU_FLOAT32, &one));
  SWEEP_STEP(mgpu_fill(s1, x1, 0, N, MGPU_FLOAT32, &two));
  SWEEP_STEP(mgpu_group_begin());
  int r0 = mgpu_allreduce(*comm, 0, x0, x0, N, MGPU_FLOAT32, MGPU_SUM, s0);
  int r1 = mgpu_allreduce(*comm, 1, x1, x1, N, MGPU_FLOAT32, MGPU_SUM, s1);
  int end = mgpu_group_end();
  SWEEP_STEP(r0 != 0 ? r0 : r1 != 0 ? r1 : end);
  SWEEP_STEP(mgpu_scale(s0, x0, 0, N, MGPU_FLOAT32, 2.0));
  SWEEP_STEP(mgpu_channel_send(*ch, x0, 0, N * sizeof(float), s0));
  SWEEP_STEP(mgpu_channel_recv(*ch, x1, 0, NULL, s1));
  SWEEP_STEP(mgpu_event_record(e1, s1));
  SWEEP_STEP(mgpu_stream_wait_event(s0, e1));
  SWEEP_STEP(mgpu_stream_end_capture(s0, out));
cleanup:
  return rc;
}

static int sweep_workload(void) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  int rc = mgpu_init(&cfg);
  if (rc != 0) return rc;
  mgpu_buffer *x0 = NULL, *x1 = NULL;
  mgpu_stream *s0 = NULL, *s1 = NULL;
  mgpu_event *e0 = NULL, *e1 = NULL;
  mgpu_graph *g = NULL, *c = NULL, *cc = NULL;
  mgpu_graph_exec *xg = NULL, *xc = NULL, *xcc = NULL;
  mgpu_comm *comm = NULL;
  mgpu_channel *ch = NULL;
  int calls = 0;
  float two = 2.0f, out[N];
  SWEEP_STEP(mgpu_malloc(&x0, 0, N * sizeof(float)));
  SWEEP_STEP(mgpu_malloc(&x1, 1, N * sizeof(float)));
  SWEEP_STEP(mgpu_stream_create(&s0, 0));
  SWEEP_STEP(mgpu_stream_create(&s1, 1));
  SWEEP_STEP(mgpu_event_create(&e0, 0));
  SWEEP_STEP(mgpu_event_create(&e1, 1));
  mgpu_graph_node fill, k0, cp;
  SWEEP_STEP(mgpu_graph_create(&g));
  SWEEP_STEP(mgpu_graph_add_fill(g, NULL, 0, x0, 0, N, MGPU_FLOAT32, &two,
                                 &fill));
  affine_args a0 = {mgpu_buffer_ptr(x0), N, 2.0f, 1.0f};
  SWEEP_STEP(mgpu_graph_add_kernel(g, 0, &fill, 1, &affine,
                                   MGPU_DIM3(2, 1, 1), MGPU_DIM3(1, 1, 1),
                                   &a0, sizeof a0, &k0));
  SWEEP_STEP(mgpu_graph_add_copy(g, &k0, 1, x1, 0, x0, 0, N * sizeof(float),
                                 &cp));
  SWEEP_STEP(mgpu_graph_add_host(g, 1, &cp, 1, count_cb, &calls, NULL));
  SWEEP_STEP(mgpu_graph_instantiate(g, &xg));
  SWEEP_STEP(mgpu_graph_launch(xg, s0));
  SWEEP_STEP(mgpu_graph_launch(xg, s0));
  SWEEP_STEP(mgpu_stream_synchronize(s0));
  SWEEP_STEP(mgpu_graph_exec_synchronize(xg));
  SWEEP_STEP(mgpu_memcpy_dtoh(out, x1, 0, sizeof out));
  if (calls != 2 || out[0] != 5.0f || out[N - 1] != 5.0f) _exit(13);
  /* The same across streams by capture, with an event node (node by
   * node). */
  SWEEP_STEP(mgpu_stream_begin_capture(s0));
  SWEEP_STEP(mgpu_memset_async(x0, 0, 0, N * sizeof(float), s0));
  SWEEP_STEP(mgpu_event_record(e0, s0));
  SWEEP_STEP(mgpu_stream_wait_event(s1, e0));
  SWEEP_STEP(mgpu_memcpy_async(x1, 0, x0, 0, N * sizeof(float), s1));
  SWEEP_STEP(mgpu_stream_add_callback(s1, count_cb, &calls));
  SWEEP_STEP(mgpu_event_record(e1, s1));
  SWEEP_STEP(mgpu_stream_wait_event(s0, e1));
  SWEEP_STEP(mgpu_stream_end_capture(s0, &c));
  SWEEP_STEP(mgpu_graph_instantiate(c, &xc));
  SWEEP_STEP(mgpu_graph_launch(xc, s0));
  SWEEP_STEP(mgpu_stream_synchronize(s0));
  SWEEP_STEP(mgpu_memcpy_dtoh(out, x1, 0, sizeof out));
  if (calls != 3 || out[0] != 0.0f) _exit(14);
  SWEEP_STEP(sweep_collective(s0, s1, e0, e1, x0, x1, &comm, &ch, &cc));
  SWEEP_STEP(mgpu_graph_instantiate(cc, &xcc));
  SWEEP_STEP(mgpu_graph_launch(xcc, s1));
  SWEEP_STEP(mgpu_graph_exec_synchronize(xcc));
  SWEEP_STEP(mgpu_memcpy_dtoh(out, x1, 0, sizeof out));
  if (out[0] != 6.0f || out[N - 1] != 6.0f) _exit(18);
cleanup:
  if (s0 != NULL && mgpu_stream_is_capturing(s0) == 1) {
    mgpu_graph *dropped = NULL;
    if (mgpu_stream_end_capture(s0, &dropped) == 0) mgpu_graph_destroy(dropped);
  }
  if (xcc != NULL) mgpu_graph_exec_destroy(xcc);
  if (cc != NULL) mgpu_graph_destroy(cc);
  if (comm != NULL) mgpu_comm_destroy(comm);
  if (ch != NULL) mgpu_channel_destroy(ch);
  if (xc != NULL) mgpu_graph_exec_destroy(xc);
  if (xg != NULL) mgpu_graph_exec_destroy(xg);
  if (c != NULL) mgpu_graph_destroy(c);
  if (g != NULL) mgpu_graph_destroy(g);
  if (e0 != NULL) mgpu_event_destroy(e0);
  if (e1 != NULL) mgpu_event_destroy(e1);
  if (s0 != NULL) mgpu_stream_destroy(s0);
  if (s1 != NULL) mgpu_stream_destroy(s1);
  if (x0 != NULL) mgpu_free(x0);
  if (x1 != NULL) mgpu_free(x1);
  mgpu_shutdown();
  return rc;
}

static void sweep_child(const char *spec, int fd) {
  alarm(10); /* the workload takes milliseconds: past 10 s it hangs */
  if (mgpu__fault_set(spec, NULL, 0) != 0) _exit(10);
  int rc = sweep_workload();
  uint64_t sites[2] = {mgpu__fault_calls(MGPU__FAULT_ALLOC),
                       mgpu__fault_calls(MGPU__FAULT_BACKEND)};
  mgpu__fault_set(NULL, NULL, 0);
  if (spec[0] == '\0' && rc != 0) _exit(15);
  if (fd >= 0 && write(fd, sites, sizeof sites) != (ssize_t)sizeof sites)
    _exit(16);
  mgpu_buffer *b;
  if (mgpu_init(NULL) != 0 || mgpu_malloc(&b, 0, 64) != 0 ||
      mgpu_shutdown() != 0)
    _exit(17);
  exit(0); /* exit, not _exit: LeakSanitizer checks here */
}

/* Runs one child; 0 when it exited 0. */
static int sweep_run(const char *spec, uint64_t *sites) {
  int fds[2] = {-1, -1};
  if (sites != NULL && pipe(fds) != 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (fds[0] >= 0) close(fds[0]);
    sweep_child(spec, fds[1]);
  }
  if (fds[1] >= 0) close(fds[1]);
  if (sites != NULL) {
    if (read(fds[0], sites, 2 * sizeof *sites) != 2 * sizeof *sites)
      sites[0] = sites[1] = 0;
    close(fds[0]);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  fprintf(stderr, "fault %s: %s %d\n", spec,
          WIFEXITED(status) ? "exit" : "signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  return 1;
}

TEST_IMPL(fault_sweep) {
  /* A child per fault site, each starting its devices: on host devices a
   * few milliseconds each; on a GPU a CUDA start each, minutes in all.
   * The sweep is the host run's. */
  test_init();
  mgpu_device_props p0 = {.size = sizeof p0};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  ASSERT_OK(mgpu_shutdown());
  if (p0.backend_kind == MGPU_BACKEND_CUDA) {
    printf("skipped: device 0 is a CUDA device\n");
    return TEST_SKIP;
  }
  /* One run, for a closer look: MGPU_GRAPH_SWEEP_SPEC=alloc:17 */
  const char *one = getenv("MGPU_GRAPH_SWEEP_SPEC");
  if (one != NULL) sweep_child(one, -1);
  uint64_t sites[2];
  ASSERT_EQ(sweep_run("", sites), 0);
  ASSERT(sites[0] > 20 && sites[1] > 20);
  printf("graph sweep: %llu allocation sites, %llu backend sites\n",
         (unsigned long long)sites[0], (unsigned long long)sites[1]);
  int bad = 0;
  char spec[64];
  uint64_t first, stride;
  test_sweep_sites("graph sweep", &first, &stride);
  for (uint64_t k = first; k <= sites[0]; k += stride)
    for (int later = 0; later < 2; later++) {
      snprintf(spec, sizeof spec, "alloc:%llu%s", (unsigned long long)k,
               later ? "+" : "");
      bad += sweep_run(spec, NULL) != 0;
    }
  for (uint64_t k = first; k <= sites[1]; k += stride)
    for (int lose = 0; lose < 2; lose++) {
      snprintf(spec, sizeof spec, "backend:%llu%s", (unsigned long long)k,
               lose ? "=devlost" : "");
      bad += sweep_run(spec, NULL) != 0;
    }
  ASSERT_EQ(bad, 0);
  return 0;
}

/* A backend that keeps to parts without a board, as the CUDA plugin does:
 * the host backend's graph slots behind a filter that refuses (with
 * MGPU_ENOTSUP) a part whose nodes wait for or post to other devices'
 * nodes, the joins' head and tail, and a tail that adopts other streams.
 * Counted, to see what was made and that all of it was freed. */
static const mgpu__backend_graph_ops *refusing_inner;
static int boardless_made, boardless_freed, boardless_refused;

static int boardless_create(mgpu__bdevice *d, const mgpu__bgraph_part *part,
                            void **out) {
  int real = 0, edges = 0;
  for (int i = 0; i < part->n; i++) {
    if (part->nodes[i].node < 0) continue; /* a join with the launch */
    real++;
    edges |= part->nodes[i].nwaits > 0 || part->nodes[i].signal >= 0;
  }
  if (part->nadopt > 0 || real == 0 || edges) {
    __atomic_fetch_add(&boardless_refused, 1, __ATOMIC_SEQ_CST);
    return mgpu__error(MGPU_ENOTSUP, "a part this backend cannot make");
  }
  int rc = refusing_inner->create(d, part, out);
  if (rc == 0) __atomic_fetch_add(&boardless_made, 1, __ATOMIC_SEQ_CST);
  return rc;
}

static void boardless_destroy(mgpu__bdevice *d, void *graph) {
  __atomic_fetch_add(&boardless_freed, 1, __ATOMIC_SEQ_CST);
  refusing_inner->destroy(d, graph);
}

/* x0 = 3, x1 = x0 (on device 0); x1 = 2 * x1 + 1, host function (device
 * 1); x0 = x0 + 100, host function (device 0): each pair after the last. */
static int segments_graph(mgpu_graph **out, mgpu_buffer *x0, mgpu_buffer *x1,
                          int *calls) {
  static affine_args a0, a1;
  a0 = (affine_args){mgpu_buffer_ptr(x0), N, 1.0f, 100.0f};
  a1 = (affine_args){mgpu_buffer_ptr(x1), N, 2.0f, 1.0f};
  float three = 3.0f;
  mgpu_graph *g;
  mgpu_graph_node f0, cp, k1, h1, k0;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, x0, 0, N, MGPU_FLOAT32, &three,
                                &f0));
  ASSERT_OK(mgpu_graph_add_copy(g, &f0, 1, x1, 0, x0, 0, N * sizeof(float),
                                &cp));
  ASSERT_OK(mgpu_graph_add_kernel(g, 1, &cp, 1, &affine, MGPU_DIM3(2, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a1, sizeof a1, &k1));
  ASSERT_OK(mgpu_graph_add_host(g, 1, &k1, 1, count_cb, calls, &h1));
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, &h1, 1, &affine, MGPU_DIM3(2, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a0, sizeof a0, &k0));
  ASSERT_OK(mgpu_graph_add_host(g, 0, &k0, 1, count_cb, calls, NULL));
  *out = g;
  return 0;
}

/* Parts a backend refuses with MGPU_ENOTSUP: a graph whose devices do not
 * wait for each other runs as parts joined by events, one with edges
 * between devices in segments joined by events; both are right, launched
 * from either device's stream, and every part made is freed. */
TEST_IMPL(parts_refused_fall_back) {
  int n = test_init();
  mgpu_device_props p0 = {.size = sizeof p0}, p1 = {.size = sizeof p1};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  if (n < 2) return TEST_SKIP;
  ASSERT_OK(mgpu_device_get_props(1, &p1));
  mgpu__device *dv[2] = {mgpu__device_get(0), mgpu__device_get(1)};
  if (p0.backend_kind != MGPU_BACKEND_HOST || dv[0]->ops != dv[1]->ops ||
      dv[0]->ops->graph == NULL || !replay_is("devices"))
    return TEST_SKIP; /* the filter wraps the host backend's slots */
  /* The table a device holds is the fault seam's copy of its backend's
   * (src/core/backend_fault.c), writable memory that only the calling
   * thread reads the graph slots of: the filter goes in its graph slots,
   * the slots it replaces behind it. */
  static mgpu__backend_graph_ops saved;
  mgpu__backend_graph_ops *slots = (mgpu__backend_graph_ops *)dv[0]->ops->graph;
  saved = *slots;
  refusing_inner = &saved;
  slots->create = boardless_create;
  slots->destroy = boardless_destroy;
  mgpu_buffer *x0, *x1;
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&x1, 1, N * sizeof(float)));
  mgpu_stream *s0, *s1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  int calls = 0;
  float three = 3.0f, seven = 7.0f, out[N];
  /* Apart: x0 = 3, x0 = 2 * x0 + 1 on device 0; x1 = 7, a host function
   * on device 1. */
  mgpu_graph *g;
  mgpu_graph_node f0, f1;
  ASSERT_OK(mgpu_graph_create(&g));
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, x0, 0, N, MGPU_FLOAT32, &three,
                                &f0));
  affine_args a0 = {mgpu_buffer_ptr(x0), N, 2.0f, 1.0f};
  ASSERT_OK(mgpu_graph_add_kernel(g, 0, &f0, 1, &affine, MGPU_DIM3(2, 1, 1),
                                  MGPU_DIM3(1, 1, 1), &a0, sizeof a0, NULL));
  ASSERT_OK(mgpu_graph_add_fill(g, NULL, 0, x1, 0, N, MGPU_FLOAT32, &seven,
                                &f1));
  ASSERT_OK(mgpu_graph_add_host(g, 1, &f1, 1, count_cb, &calls, NULL));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_EQ(boardless_made, 2); /* a part per device */
  for (int i = 0; i < 3; i++) ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_graph_launch(x, s1));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  ASSERT_EQ(calls, 4);
  ASSERT(boardless_refused >= 2); /* the joins, from each device */
  read_floats(x0, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 7.0f);
  read_floats(x1, out, N);
  for (int i = 0; i < N; i++) ASSERT(out[i] == 7.0f);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_EQ(boardless_freed, boardless_made);
  /* Edges both ways: x0 = 3, x1 = x0 (copied on device 0); x1 = 2 * x1 + 1
   * on device 1 after the copy, a host function after it; x0 = x0 + 100
   * on device 0 after that, a host function after it. No part per device
   * holds it: three segments of two nodes, each a part, joined by events. */
  int made = boardless_made;
  ASSERT_OK(segments_graph(&g, x0, x1, &calls));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  ASSERT_EQ(boardless_made, made + 3);
  calls = 0;
  for (int i = 0; i < 5; i++) {
    write_floats(x1, -1.0f, N);
    ASSERT_OK(mgpu_graph_launch(x, i % 2 ? s0 : s1));
    ASSERT_OK(mgpu_graph_exec_synchronize(x));
    read_floats(x1, out, N);
    for (int k = 0; k < N; k++) ASSERT(out[k] == 7.0f);
    read_floats(x0, out, N);
    for (int k = 0; k < N; k++) ASSERT(out[k] == 103.0f);
  }
  ASSERT_EQ(calls, 10);
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_EQ(boardless_freed, boardless_made);
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_free(x0));
  ASSERT_OK(mgpu_free(x1));
  *slots = saved;
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Captures, on n devices: x[r] = r + 1, an all-reduce of x in place and
 * a broadcast of it from the last rank (one group, every rank), y[r] =
 * 2 * x[r] after them; the ranks' streams
 * join the capture through an event and rejoin the origin. */
static int capture_allreduce(int n, mgpu_stream **s, mgpu_buffer **x,
                             mgpu_buffer **y, mgpu_comm *comm,
                             mgpu_graph **out) {
  mgpu_event *start, *done[MGPU_MAX_DEVICES];
  ASSERT_OK(mgpu_event_create(&start, 0));
  ASSERT_OK(mgpu_stream_begin_capture(s[0]));
  ASSERT_OK(mgpu_event_record(start, s[0]));
  for (int r = 1; r < n; r++) ASSERT_OK(mgpu_stream_wait_event(s[r], start));
  /* The last rank gets there by a longer way (x = (r + 1) / 8, doubled
   * three times): each member must wait for all of them. */
  for (int r = 0; r < n; r++) {
    float v = (float)(r + 1) / (r == n - 1 ? 8.0f : 1.0f);
    ASSERT_OK(mgpu_fill(s[r], x[r], 0, N, MGPU_FLOAT32, &v));
    for (int k = 0; r == n - 1 && k < 3; k++)
      ASSERT_OK(mgpu_scale(s[r], x[r], 0, N, MGPU_FLOAT32, 2.0));
  }
  /* Two collectives in one group: each rank's stream holds two members. */
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++)
    ASSERT_OK(mgpu_allreduce(comm, r, x[r], x[r], N, MGPU_FLOAT32, MGPU_SUM,
                             s[r]));
  for (int r = 0; r < n; r++)
    ASSERT_OK(mgpu_broadcast(comm, r, x[r], x[r], N, MGPU_FLOAT32, n - 1,
                             s[r]));
  ASSERT_OK(mgpu_group_end());
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_memcpy_async(y[r], 0, x[r], 0, N * sizeof(float), s[r]));
    ASSERT_OK(mgpu_scale(s[r], y[r], 0, N, MGPU_FLOAT32, 2.0));
    ASSERT_OK(mgpu_event_create(&done[r], r));
    ASSERT_OK(mgpu_event_record(done[r], s[r]));
  }
  for (int r = 1; r < n; r++) ASSERT_OK(mgpu_stream_wait_event(s[0], done[r]));
  ASSERT_OK(mgpu_stream_end_capture(s[0], out));
  ASSERT_OK(mgpu_event_destroy(start));
  for (int r = 0; r < n; r++) ASSERT_OK(mgpu_event_destroy(done[r]));
  return 0;
}

/* A collective captured with the work around it: nothing runs while
 * capturing, every launch runs it again (on every device, after the fills
 * and before the copies); a buffer freed since is refused before anything
 * is queued; a launch inside a group is refused; a group whose ranks
 * disagree is refused when it is recorded. */
TEST_IMPL(capture_collectives) {
  int n = test_init();
  if (n > 4) n = 4;
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  int devs[4] = {0, 1, 2, 3};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, n, &comm));
  mgpu_stream *s[4];
  mgpu_buffer *x[4], *y[4];
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_stream_create(&s[r], r));
    ASSERT_OK(mgpu_malloc(&x[r], r, N * sizeof(float)));
    ASSERT_OK(mgpu_malloc(&y[r], r, N * sizeof(float)));
    write_floats(x[r], -1.0f, N);
  }
  mgpu_graph *g;
  ASSERT_OK(capture_allreduce(n, s, x, y, comm, &g));
  float out[N], sum = (float)(n * (n + 1) / 2);
  read_floats(x[n - 1], out, N);
  ASSERT(out[0] == -1.0f); /* nothing ran */
  mgpu_graph_exec *e;
  ASSERT_OK(mgpu_graph_instantiate(g, &e));
  for (int launch = 0; launch < 3; launch++) {
    for (int r = 0; r < n; r++) write_floats(y[r], -5.0f, N);
    ASSERT_OK(mgpu_graph_launch(e, s[launch % n]));
    ASSERT_OK(mgpu_graph_exec_synchronize(e));
    for (int r = 0; r < n; r++) {
      read_floats(x[r], out, N);
      for (int i = 0; i < N; i++) ASSERT(out[i] == sum);
      read_floats(y[r], out, N);
      for (int i = 0; i < N; i++) ASSERT(out[i] == 2.0f * sum);
    }
  }
  /* Inside a group: refused before anything is queued. */
  ASSERT_OK(mgpu_stream_synchronize(s[0]));
  long before[4];
  for (int r = 0; r < n; r++) before[r] = host_ops_queued(s[r]);
  ASSERT_OK(mgpu_group_begin());
  ASSERT_ERR(MGPU_EINVAL, mgpu_graph_launch(e, s[0]));
  ASSERT_DETAIL_HAS("mgpu_group_begin");
  ASSERT_OK(mgpu_group_end());
  for (int r = 0; r < n; r++) ASSERT_EQ(host_ops_queued(s[r]), before[r]);
  ASSERT_OK(mgpu_graph_exec_synchronize(e));
  for (int r = 0; r < n; r++) {
    read_floats(x[r], out, N);
    ASSERT(out[0] == sum); /* no fill ran again (it would leave r + 1) */
  }
  /* The collective's communicator destroyed: refused, nothing queued. */
  ASSERT_OK(mgpu_comm_destroy(comm));
  long queued = host_ops_queued(s[0]);
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_launch(e, s[0]));
  ASSERT_DETAIL_HAS("recorded allreduce, rank 0");
  ASSERT_DETAIL_HAS("group of collectives");
  ASSERT_EQ(host_ops_queued(s[0]), queued);
  ASSERT_OK(mgpu_graph_exec_destroy(e));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_comm_create(devs, n, &comm));
  /* Ranks that disagree on the count: refused as they are recorded. */
  mgpu_event *ev;
  ASSERT_OK(mgpu_event_create(&ev, 0));
  ASSERT_OK(mgpu_stream_begin_capture(s[0]));
  ASSERT_OK(mgpu_event_record(ev, s[0]));
  for (int r = 1; r < n; r++) ASSERT_OK(mgpu_stream_wait_event(s[r], ev));
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < n; r++)
    ASSERT_OK(mgpu_allreduce(comm, r, x[r], x[r], r == 1 ? N / 2 : N,
                             MGPU_FLOAT32, MGPU_SUM, s[r]));
  ASSERT_ERR(MGPU_EMISMATCH, mgpu_group_end());
  ASSERT_DETAIL_HAS("count");
  for (int r = 1; r < n; r++) {
    mgpu_event *back;
    ASSERT_OK(mgpu_event_create(&back, r));
    ASSERT_OK(mgpu_event_record(back, s[r]));
    ASSERT_OK(mgpu_stream_wait_event(s[0], back));
    ASSERT_OK(mgpu_event_destroy(back));
  }
  ASSERT_OK(mgpu_stream_end_capture(s[0], &g));
  ASSERT_EQ(mgpu_graph_node_count(g), 0);
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_event_destroy(ev));
  ASSERT_OK(mgpu_comm_destroy(comm));
  for (int r = 0; r < n; r++) {
    ASSERT_OK(mgpu_free(x[r]));
    ASSERT_OK(mgpu_free(y[r]));
    ASSERT_OK(mgpu_stream_destroy(s[r]));
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Channel sends and receives captured from one thread in the order that
 * works live: x0 = i + 1 and a send of it (device 0), three times, each
 * received into its third of y1 (device 1), on a channel of capacity 2:
 * send 0, send 1, receive 0, send 2, receive 1, receive 2. Every launch
 * moves the three messages again; a channel destroyed since is refused
 * before anything is queued. */
TEST_IMPL(capture_channels) {
  int n = test_init();
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(0, 1, N * sizeof(float), 2, &ch));
  mgpu_stream *s0, *s1;
  mgpu_buffer *x0, *y1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  ASSERT_OK(mgpu_malloc(&x0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&y1, 1, 3 * N * sizeof(float)));
  mgpu_event *e0, *e1;
  ASSERT_OK(mgpu_event_create(&e0, 0));
  ASSERT_OK(mgpu_event_create(&e1, 1));
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_OK(mgpu_event_record(e0, s0));
  ASSERT_OK(mgpu_stream_wait_event(s1, e0));
  const char *steps = "ssrsrr";
  for (int i = 0, sent = 0, got = 0; steps[i] != '\0'; i++) {
    if (steps[i] == 's') {
      float v = (float)(++sent);
      ASSERT_OK(mgpu_fill(s0, x0, 0, N, MGPU_FLOAT32, &v));
      ASSERT_OK(mgpu_channel_send(ch, x0, 0, N * sizeof(float), s0));
    } else {
      size_t size = 7;
      ASSERT_OK(mgpu_channel_recv(ch, y1, (size_t)got++ * N * sizeof(float),
                                  &size, s1));
      ASSERT_EQ(size, 7); /* a recorded receive tells no size */
    }
  }
  ASSERT_OK(mgpu_event_record(e1, s1));
  ASSERT_OK(mgpu_stream_wait_event(s0, e1));
  mgpu_graph *g;
  ASSERT_OK(mgpu_stream_end_capture(s0, &g));
  mgpu_graph_exec *x;
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  float out[3 * N];
  for (int launch = 0; launch < 4; launch++) {
    float minus[3 * N];
    for (int i = 0; i < 3 * N; i++) minus[i] = -1.0f;
    ASSERT_OK(mgpu_memcpy_htod(y1, 0, minus, sizeof minus));
    ASSERT_OK(mgpu_graph_launch(x, launch % 2 ? s1 : s0));
    ASSERT_OK(mgpu_graph_exec_synchronize(x));
    ASSERT_OK(mgpu_memcpy_dtoh(out, y1, 0, sizeof out));
    for (int i = 0; i < 3 * N; i++) ASSERT(out[i] == (float)(i / N + 1));
  }
  /* Another capture running meanwhile: its lock is asked by every event
   * call of the launch, under the launch's and the channel's locks. */
  mgpu_stream *other;
  mgpu_graph *empty;
  ASSERT_OK(mgpu_stream_create(&other, 0));
  ASSERT_OK(mgpu_stream_begin_capture(other));
  ASSERT_OK(mgpu_graph_launch(x, s0));
  ASSERT_OK(mgpu_graph_exec_synchronize(x));
  ASSERT_OK(mgpu_stream_end_capture(other, &empty));
  ASSERT_OK(mgpu_graph_destroy(empty));
  ASSERT_OK(mgpu_stream_destroy(other));
  ASSERT_OK(mgpu_channel_close(ch));
  ASSERT_ERR(MGPU_ECLOSED, mgpu_graph_launch(x, s0));
  ASSERT_DETAIL_HAS("recorded channel send of channel 0 -> 1");
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_ERR(MGPU_EFREED, mgpu_graph_launch(x, s0));
  ASSERT_DETAIL_HAS("recorded channel send of channel 0 -> 1");
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  /* Recorded the other way round (both receives first, as a second thread
   * could): the receives still follow their sends in every replay, and
   * the second send the first receive (capacity 1). */
  ASSERT_OK(mgpu_channel_create(0, 1, N * sizeof(float), 1, &ch));
  ASSERT_OK(mgpu_stream_begin_capture(s0));
  ASSERT_OK(mgpu_event_record(e0, s0));
  ASSERT_OK(mgpu_stream_wait_event(s1, e0));
  for (int i = 0; i < 2; i++)
    ASSERT_OK(mgpu_channel_recv(ch, y1, (size_t)i * N * sizeof(float), NULL,
                                s1));
  for (int i = 0; i < 2; i++) {
    float v = (float)(10 + i);
    ASSERT_OK(mgpu_fill(s0, x0, 0, N, MGPU_FLOAT32, &v));
    ASSERT_OK(mgpu_channel_send(ch, x0, 0, N * sizeof(float), s0));
  }
  ASSERT_OK(mgpu_event_record(e1, s1));
  ASSERT_OK(mgpu_stream_wait_event(s0, e1));
  ASSERT_OK(mgpu_stream_end_capture(s0, &g));
  ASSERT_OK(mgpu_graph_instantiate(g, &x));
  for (int launch = 0; launch < 2; launch++) {
    ASSERT_OK(mgpu_graph_launch(x, s0));
    ASSERT_OK(mgpu_graph_exec_synchronize(x));
    ASSERT_OK(mgpu_memcpy_dtoh(out, y1, 0, 2 * N * sizeof(float)));
    for (int i = 0; i < 2 * N; i++) ASSERT(out[i] == (float)(10 + i / N));
  }
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_graph_exec_destroy(x));
  ASSERT_OK(mgpu_graph_destroy(g));
  ASSERT_OK(mgpu_event_destroy(e0));
  ASSERT_OK(mgpu_event_destroy(e1));
  ASSERT_OK(mgpu_free(x0));
  ASSERT_OK(mgpu_free(y1));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Captures, on streams s[0] and s[1], a group of an all-reduce and a
 * broadcast over devices 0 and 1: four nodes, the group's members in the
 * order recorded (all-reduce rank 0, rank 1, broadcast rank 0, rank 1). */
static int capture_group_of_two(mgpu_stream **s, mgpu_buffer **x,
                                mgpu_comm *comm, mgpu_graph **out) {
  mgpu_event *ev[2];
  ASSERT_OK(mgpu_event_create(&ev[0], 0));
  ASSERT_OK(mgpu_event_create(&ev[1], 1));
  ASSERT_OK(mgpu_stream_begin_capture(s[0]));
  ASSERT_OK(mgpu_event_record(ev[0], s[0]));
  ASSERT_OK(mgpu_stream_wait_event(s[1], ev[0]));
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(mgpu_allreduce(comm, r, x[r], x[r], N, MGPU_FLOAT32, MGPU_SUM,
                             s[r]));
  for (int r = 0; r < 2; r++)
    ASSERT_OK(mgpu_broadcast(comm, r, x[r], x[r], N, MGPU_FLOAT32, 1, s[r]));
  ASSERT_OK(mgpu_group_end());
  ASSERT_OK(mgpu_event_record(ev[1], s[1]));
  ASSERT_OK(mgpu_stream_wait_event(s[0], ev[1]));
  ASSERT_OK(mgpu_stream_end_capture(s[0], out));
  ASSERT_EQ(mgpu_graph_node_count(*out), 4);
  ASSERT_OK(mgpu_event_destroy(ev[0]));
  ASSERT_OK(mgpu_event_destroy(ev[1]));
  return 0;
}

/* An edge between two members of one recorded group: kept where it is the
 * order of one device's stream (the group issues its calls in the order
 * recorded), refused at instantiate otherwise, naming both nodes (the
 * members are issued together: such an edge was dropped without a word,
 * or reported as a cycle). */
TEST_IMPL(capture_group_member_edges) {
  int n = test_init();
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  int devs[2] = {0, 1};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  mgpu_stream *s[2];
  mgpu_buffer *x[2];
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_stream_create(&s[r], r));
    ASSERT_OK(mgpu_malloc(&x[r], r, N * sizeof(float)));
  }
  /* {from, to, kept}: 0 -> 2 and 1 -> 3 are each device's stream order. */
  const int edges[][3] = {{0, 2, 1}, {1, 3, 1}, {3, 0, 0}, {1, 0, 0},
                          {2, 0, 0}, {0, 3, 0}};
  for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) {
    mgpu_graph *g;
    mgpu_graph_exec *e;
    ASSERT_OK(capture_group_of_two(s, x, comm, &g));
    ASSERT_OK(mgpu_graph_add_dependency(g, edges[k][0], edges[k][1]));
    if (edges[k][2]) {
      float v = 2.0f, out[N];
      write_floats(x[1], v, N);
      write_floats(x[0], 1.0f, N);
      ASSERT_OK(mgpu_graph_instantiate(g, &e));
      ASSERT_OK(mgpu_graph_launch(e, s[0]));
      ASSERT_OK(mgpu_graph_exec_synchronize(e));
      read_floats(x[0], out, N);
      ASSERT(out[0] == 3.0f && out[N - 1] == 3.0f); /* broadcast of the sum */
      ASSERT_OK(mgpu_graph_exec_destroy(e));
    } else {
      ASSERT_ERR(MGPU_EINVAL, mgpu_graph_instantiate(g, &e));
      char want[64];
      snprintf(want, sizeof want, "node %d (member %d", edges[k][1],
               edges[k][1]);
      ASSERT_DETAIL_HAS(want);
      ASSERT_DETAIL_HAS("only the order of one device's stream");
    }
    ASSERT_OK(mgpu_graph_destroy(g));
  }
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_free(x[r]));
    ASSERT_OK(mgpu_stream_destroy(s[r]));
  }
  ASSERT_OK(mgpu_comm_destroy(comm));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(explicit_graph_across_devices)
TEST_ENTRY(explicit_graph_node_by_node)
TEST_ENTRY(launches_from_other_streams_run_in_order)
TEST_ENTRY(exec_update_kernel_and_copy)
TEST_ENTRY(updates_free_parts_of_done_launches)
TEST_ENTRY(captured_nodes_numbered_in_record_order)
TEST_ENTRY(graph_errors)
TEST_ENTRY(fault_inside_replay)
TEST_ENTRY(destroy_while_launched)
TEST_ENTRY(launch_is_one_operation_per_device)
TEST_ENTRY(next_launch_waits_for_work_between)
TEST_ENTRY(failure_on_other_device_reaches_launching_stream)
TEST_ENTRY(wait_on_event_of_ended_capture_refused)
TEST_ENTRY(device_lost_during_replay)
TEST_ENTRY(device_lost_inside_part)
TEST_ENTRY(trace_shows_launch_with_nodes_inside)
TEST_ENTRY(fault_sweep)
TEST_ENTRY(capture_across_devices)
TEST_ENTRY(capture_host_copies_and_outside_events)
TEST_ENTRY(capture_invalid)
TEST_ENTRY(parts_refused_fall_back)
TEST_ENTRY(capture_collectives)
TEST_ENTRY(capture_channels)
TEST_ENTRY(capture_group_member_edges)
TEST_LIST_END
