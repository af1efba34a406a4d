/* mgpu bench launch: what it costs to hand work to a device.
 *
 *  - mgpu_run_on_device of an empty function, round trip, next to a
 *    two-thread ping-pong measured in the same run (bench_pingpong_us): the
 *    spinning one (the least a round trip between two running threads
 *    costs) and the one on a mutex and condition variable (what a plain
 *    worker thread costs). Twice: as the machine is, and with every CPU
 *    taken by a thread that computes (bench_load_start), where no core is
 *    free for anyone to spin on;
 *  - mgpu_launch of an empty kernel, per launch in a burst of launches
 *    followed by one synchronize, next to a bare burst of hand-offs (items
 *    counted into a queue that a waiting thread drains, then one wait for
 *    the last). On CUDA
 *    devices the mgpu command links no CUDA code and so has no empty
 *    __global__ function: it launches the smallest built-in kernel
 *    (mgpu_fill of one element) instead; mgpu-bench-cuda (bench/cuda/)
 *    puts an empty kernel through mgpu_launch next to a bare
 *    cudaLaunchKernel. On OpenCL devices the burst is also timed through
 *    bare OpenCL calls on the same device (bench-opencl.h): the empty
 *    kernel's clEnqueueNDRangeKernel in a burst, then one clFinish, each
 *    bare burst right after an mgpu one; once on a queue without
 *    profiling, once on one with it, as mgpu's queues have by default
 *    (busy time and traces read it), which shows what profiling costs the
 *    implementation. The baseline of the kind of mgpu's own queue (read
 *    from it: plain under MGPU_OPENCL_BUSY=0) is named "like mgpu's
 *    queue": that is the like-for-like ratio.
 *    Also the calling thread's CPU time per launch, mgpu's burst next to
 *    the bare one without profiling: on a shared machine the wall time
 *    swings with what else runs, the CPU time of the thread that launches
 *    much less. And one launch followed by its synchronize, next to a bare
 *    clEnqueueNDRangeKernel + clFinish, in turns (queue without profiling,
 *    and with it).
 *  - the same launches in chains of 8: one launch of a graph captured from
 *    the 8 (mgpu_stream_begin_capture) next to the 8 issued one by one, in
 *    the same run (below 1: the replay is cheaper than the launches);
 *
 *  - a channel round trip between devices 0 and 1 (8 B and 4 KiB): one
 *    thread sends on a channel 0 -> 1 and receives the echo on a channel
 *    1 -> 0, an echo thread receives and sends back, each side
 *    synchronizing its stream after its pair of calls (so the bytes have
 *    landed), next to the two-thread ping-pongs moving the same bytes
 *    (bench_pingpong_bytes_us: a copy into a shared buffer and out of it,
 *    each way), and next to MPI's ping-pong of the same sizes between two
 *    local ranks (bench/peers/mpi_pingpong, MPI_Send and MPI_Recv): Open
 *    MPI's under mpirun and, where mpicc.mpich was found at configure
 *    time, MPICH's (mpi_pingpong_mpich) under mpiexec.mpich, each under a
 *    timeout; the goal is set against the faster of the two.
 *    Without one, its rows are missing and a line on stderr says why. The
 *    MPI peers are started once, gated (bench/gate.h), and the sides take
 *    turns batch by batch: in each round a batch of each size of mgpu's,
 *    then one of each MPI's (the two in turn first), so that each median
 *    is of batches spread over the same seconds. A pause after each of
 *    mgpu's batches lets its echo thread's watch end (it would take one
 *    of the CPUs from the next batch, mgpu's or MPI's).
 *
 * Figures are medians of --reps runs after a warm-up, in microseconds.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench-opencl.h"
#include "bench.h"
#include "cmd.h"
#include "gate.h"


/* ---- the baseline: a bare pthread hand-off ---- */

/* posted counts items handed over, done those the worker took; lock
 * guards both and stop. */
typedef struct handoff {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  long posted, done;
  int stop;
} handoff;

static void *handoff_worker(void *arg) {
  handoff *h = arg;
  pthread_mutex_lock(&h->lock);
  for (;;) {
    while (h->done == h->posted && !h->stop)
      pthread_cond_wait(&h->cond, &h->lock);
    if (h->stop) break;
    h->done++;
    if (h->done == h->posted) pthread_cond_broadcast(&h->cond);
  }
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

static void handoff_post(handoff *h) {
  pthread_mutex_lock(&h->lock);
  h->posted++;
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->lock);
}

static void handoff_wait(handoff *h) {
  pthread_mutex_lock(&h->lock);
  while (h->done != h->posted) pthread_cond_wait(&h->cond, &h->lock);
  pthread_mutex_unlock(&h->lock);
}

static void handoff_burst(handoff *h, int iters) {
  for (int i = 0; i < iters; i++) handoff_post(h);
  handoff_wait(h);
}

/* Median microseconds per hand-off over reps runs of iters posted before
 * one wait. */
static double handoff_burst_us(int iters, int reps) {
  handoff h = {.posted = 0};
  pthread_mutex_init(&h.lock, NULL);
  pthread_cond_init(&h.cond, NULL);
  pthread_t t;
  if (pthread_create(&t, NULL, handoff_worker, &h) != 0) return 0;
  double *v = malloc((size_t)reps * sizeof *v);
  handoff_burst(&h, iters); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    handoff_burst(&h, iters);
    v[r] = (bench_now() - t0) / iters * 1e6;
  }
  pthread_mutex_lock(&h.lock);
  h.stop = 1;
  pthread_cond_broadcast(&h.cond);
  pthread_mutex_unlock(&h.lock);
  pthread_join(t, NULL);
  double m = bench_median(v, reps);
  free(v);
  pthread_mutex_destroy(&h.lock);
  pthread_cond_destroy(&h.cond);
  return m;
}

/* ---- mgpu ---- */

static int empty_fn(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return 0;
}

static double run_on_device_us(int dev, int iters, int reps) {
  double *v = malloc((size_t)reps * sizeof *v);
  for (int i = 0; i < iters; i++) mgpu_run_on_device(dev, empty_fn, NULL);
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    for (int i = 0; i < iters; i++) mgpu_run_on_device(dev, empty_fn, NULL);
    v[r] = (bench_now() - t0) / iters * 1e6;
  }
  double m = bench_median(v, reps);
  free(v);
  return m;
}

static void empty_kernel(const mgpu_kernel_ctx *ctx, const void *args) {
  (void)ctx;
  (void)args;
}

static const mgpu_kernel empty = {"empty", empty_kernel, NULL,
                                  "__kernel void empty(int arg) {}\n"};

enum { CHAIN = 8 }; /* launches in a captured chain */

/* One launch: the empty kernel on host devices, a one-element fill on
 * CUDA devices (see the top of the file). */
static int launch_once(mgpu_stream *s, mgpu_buffer *one, int cuda) {
  if (cuda) {
    int32_t v = 1;
    return mgpu_fill(s, one, 0, 1, MGPU_INT32, &v);
  }
  int arg = 0;
  return mgpu_launch(s, &empty, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), &arg,
                     sizeof arg);
}

/* Issues len launches on s (launch_once each). */
static int run_len(mgpu_stream *s, mgpu_buffer *one, int cuda, int len) {
  int rc = 0;
  for (int k = 0; k < len && rc == 0; k++) rc = launch_once(s, one, cuda);
  return rc;
}

/* The bare OpenCL bursts on the device of s (bench-opencl.h), or NULL
 * with a line on stderr. */
static bench_ocl *bare_open(mgpu_stream *s) {
  char why[160] = "";
  bench_ocl *o = bench_ocl_open(mgpu_stream_native(s), why, sizeof why);
  if (o == NULL)
    fprintf(stderr, "mgpu bench launch: no bare OpenCL baseline: %s\n", why);
  return o;
}

/* Median microseconds of one launch and its synchronize, iters of them per
 * repetition, in *out, and of a bare clEnqueueNDRangeKernel + clFinish on a
 * queue without profiling in *bare_out, timed in turns after a warm-up
 * (bare_out 0 when the bare baseline cannot be opened). OpenCL devices. */
static int launch_sync_us(int dev, int iters, int reps, double *out,
                          double *bare_out) {
  /* bare_out[1]: the same on a queue with profiling (mgpu's default). */
  mgpu_stream *s = NULL;
  mgpu_buffer *one = NULL;
  bench_ocl *bare = NULL;
  double *v = malloc((size_t)reps * sizeof *v);
  double *b = malloc((size_t)reps * sizeof *b);
  double *bp = malloc((size_t)reps * sizeof *bp);
  int rc = v == NULL || b == NULL || bp == NULL ? MGPU_ENOMEM
                                                : mgpu_stream_create(&s, dev);
  if (rc == 0) rc = mgpu_malloc(&one, dev, 64);
  if (rc == 0) bare = bare_open(s);
  int bare_ok = bare != NULL;
  for (int r = -1; rc == 0 && r < reps; r++) { /* -1: warm-up */
    double t0 = bench_now();
    for (int i = 0; rc == 0 && i < iters; i++) {
      rc = launch_once(s, one, 0);
      if (rc == 0) rc = mgpu_stream_synchronize(s);
    }
    double t1 = bench_now();
    for (int i = 0; bare_ok && i < iters; i++)
      bare_ok = bench_ocl_launch_burst(bare, 1, 0) == 0;
    double t2 = bench_now();
    for (int i = 0; bare_ok && i < iters; i++)
      bare_ok = bench_ocl_launch_burst(bare, 1, 1) == 0;
    if (r >= 0) v[r] = (t1 - t0) / iters * 1e6;
    if (r >= 0) b[r] = (t2 - t1) / iters * 1e6;
    if (r >= 0) bp[r] = (bench_now() - t2) / iters * 1e6;
  }
  if (rc == 0) *out = bench_median(v, reps);
  bare_out[0] = rc == 0 && bare_ok ? bench_median(b, reps) : 0;
  bare_out[1] = rc == 0 && bare_ok ? bench_median(bp, reps) : 0;
  bench_ocl_close(bare);
  if (one) mgpu_free(one);
  if (s) mgpu_stream_destroy(s);
  free(v);
  free(b);
  free(bp);
  return rc;
}

/* Median microseconds per item in bursts of iters items and one
 * synchronize, after a warm-up burst. An item is len launches issued one by
 * one, or with graph one launch of a graph captured from those len
 * launches. bare_out not NULL (an OpenCL device): also the medians of the
 * bare OpenCL bursts of iters * len launches timed right after each mgpu
 * burst, per item, on a queue without profiling (bare_out[0]) and with it
 * (bare_out[1]), and the calling thread's CPU time per item of mgpu's
 * burst (bare_out[2]) and of the bare one without profiling (bare_out[3]);
 * 0 when there is none; bare_out[4]: 1 when mgpu's queue has profiling (a
 * bare queue of the same kind is the like-for-like baseline), else 0. */
static int burst_us(int dev, int cuda, int len, int graph, int iters,
                    int reps, double *out, double *bare_out) {
  mgpu_stream *s = NULL;
  mgpu_buffer *one = NULL;
  mgpu_graph *g = NULL;
  mgpu_graph_exec *x = NULL;
  bench_ocl *bare = NULL;
  double *v = malloc((size_t)reps * sizeof *v);
  double *b = malloc((size_t)reps * sizeof *b);
  double *bp = malloc((size_t)reps * sizeof *bp);
  double *cpu = malloc((size_t)reps * sizeof *cpu);
  double *bcpu = malloc((size_t)reps * sizeof *bcpu);
  int rc = v == NULL || b == NULL || bp == NULL || cpu == NULL || bcpu == NULL
               ? MGPU_ENOMEM : mgpu_stream_create(&s, dev);
  if (rc == 0) rc = mgpu_malloc(&one, dev, 64);
  if (rc == 0 && bare_out != NULL) bare = bare_open(s);
  int bare_ok = bare != NULL;
  if (rc == 0 && graph) {
    rc = mgpu_stream_begin_capture(s);
    if (rc == 0) rc = run_len(s, one, cuda, len);
    int end = mgpu_stream_end_capture(s, &g);
    if (rc == 0) rc = end;
    if (rc == 0) rc = mgpu_graph_instantiate(g, &x);
  }
  for (int r = -1; rc == 0 && r < reps; r++) { /* -1: warm-up */
    double c0 = bench_thread_cpu(), t0 = bench_now();
    for (int i = 0; rc == 0 && i < iters; i++)
      rc = graph ? mgpu_graph_launch(x, s) : run_len(s, one, cuda, len);
    if (rc == 0) rc = mgpu_stream_synchronize(s);
    double t1 = bench_now(), c1 = bench_thread_cpu();
    if (r >= 0) v[r] = (t1 - t0) / iters * 1e6;
    if (r >= 0) cpu[r] = (c1 - c0) / iters * 1e6;
    if (bare_ok) bare_ok = bench_ocl_launch_burst(bare, iters * len, 0) == 0;
    double t2 = bench_now();
    if (r >= 0) bcpu[r] = (bench_thread_cpu() - c1) / iters * 1e6;
    if (bare_ok) bare_ok = bench_ocl_launch_burst(bare, iters * len, 1) == 0;
    if (r >= 0) b[r] = (t2 - t1) / iters * 1e6;
    if (r >= 0) bp[r] = (bench_now() - t2) / iters * 1e6;
  }
  if (rc == 0) *out = bench_median(v, reps);
  if (bare_out != NULL) {
    int ok = rc == 0 && bare_ok;
    bare_out[0] = ok ? bench_median(b, reps) : 0;
    bare_out[1] = ok ? bench_median(bp, reps) : 0;
    bare_out[2] = ok ? bench_median(cpu, reps) : 0;
    bare_out[3] = ok ? bench_median(bcpu, reps) : 0;
    bare_out[4] = bare != NULL ? bench_ocl_native_profiling(bare) : 0;
  }
  bench_ocl_close(bare);
  if (x) mgpu_graph_exec_destroy(x);
  if (g) mgpu_graph_destroy(g);
  if (one) mgpu_free(one);
  if (s) mgpu_stream_destroy(s);
  free(v);
  free(b);
  free(bp);
  free(cpu);
  free(bcpu);
  return rc;
}

/* ---- channel round trip ---- */

typedef struct echo {
  mgpu_channel *in, *out; /* 0 -> 1, 1 -> 0 */
  mgpu_buffer *buf;       /* on device 1 */
  mgpu_stream *s;
  long rounds;
  int rc;
} echo;

static void *echo_thread(void *p) {
  echo *e = p;
  for (long i = 0; i < e->rounds && e->rc == 0; i++) {
    size_t len = 0;
    e->rc = mgpu_channel_recv(e->in, e->buf, 0, &len, e->s);
    if (e->rc == 0) e->rc = mgpu_channel_send(e->out, e->buf, 0, len, e->s);
    if (e->rc == 0) e->rc = mgpu_stream_synchronize(e->s);
  }
  /* A failed echo answers no more: closing its way back ends the
   * receive that waits for the answer, rather than its timeout. */
  if (e->rc != 0) mgpu_channel_close(e->out);
  return NULL;
}

/* The round trips of one size between devices a and b: the channels,
 * streams and buffers, and the echo thread, there for the batches. */
typedef struct rtt {
  echo e;
  mgpu_stream *s;
  mgpu_buffer *buf; /* on device a */
  size_t bytes;
  pthread_t t;
  int started;
} rtt;

/* Sets x up for rounds round trips of bytes between a and b. On failure
 * too the caller ends x with rtt_close. */
static int rtt_open(rtt *x, int a, int b, size_t bytes, long rounds) {
  memset(x, 0, sizeof *x);
  x->bytes = bytes;
  x->e.rounds = rounds;
  int rc = mgpu_channel_create(a, b, bytes, 1, &x->e.in);
  if (rc == 0) rc = mgpu_channel_create(b, a, bytes, 1, &x->e.out);
  if (rc == 0) rc = mgpu_stream_create(&x->s, a);
  if (rc == 0) rc = mgpu_stream_create(&x->e.s, b);
  if (rc == 0) rc = mgpu_malloc(&x->buf, a, bytes);
  if (rc == 0) rc = mgpu_malloc(&x->e.buf, b, bytes);
  if (rc == 0) rc = mgpu_memset_async(x->buf, 0, 1, bytes, x->s);
  if (rc == 0) rc = mgpu_memset_async(x->e.buf, 0, 1, bytes, x->e.s);
  if (rc == 0) rc = mgpu_stream_synchronize(x->s);
  if (rc == 0) rc = mgpu_stream_synchronize(x->e.s);
  if (rc != 0) return rc;
  int err = pthread_create(&x->t, NULL, echo_thread, &x->e);
  x->started = err == 0;
  if (err != 0)
    fprintf(stderr, "mgpu bench launch: cannot start the echo thread of "
            "the %zu B round trips: %s\n", bytes, strerror(err));
  return err == 0 ? 0 : MGPU_ENOMEM;
}

/* One batch of iters round trips of x: microseconds each into *us. */
static int rtt_batch(rtt *x, int iters, double *us) {
  int rc = 0;
  double t0 = bench_now();
  for (int i = 0; i < iters && rc == 0; i++) {
    size_t len = 0;
    rc = mgpu_channel_send(x->e.in, x->buf, 0, x->bytes, x->s);
    if (rc == 0) rc = mgpu_channel_recv(x->e.out, x->buf, 0, &len, x->s);
    if (rc == 0) rc = mgpu_stream_synchronize(x->s);
  }
  *us = (bench_now() - t0) / iters * 1e6;
  return rc;
}

/* Ends x after its batches (rc: theirs) and frees what it holds; returns
 * rc, or the echo's failure. */
static int rtt_close(rtt *x, int rc) {
  if (x->started) {
    /* The echo waits for rounds that will not come: closing ends it. */
    mgpu_channel_close(x->e.in);
    pthread_join(x->t, NULL);
    if (rc == 0 && x->e.rc != 0 && x->e.rc != MGPU_ECLOSED) rc = x->e.rc;
  }
  if (x->buf) mgpu_free(x->buf);
  if (x->e.buf) mgpu_free(x->e.buf);
  if (x->s) mgpu_stream_destroy(x->s);
  if (x->e.s) mgpu_stream_destroy(x->e.s);
  if (x->e.in) mgpu_channel_destroy(x->e.in);
  if (x->e.out) mgpu_channel_destroy(x->e.out);
  return rc;
}

/* The run_on_device rows: as the machine is, then with every CPU busy. */
static void report_handoffs(bench_report *r, int iters, int reps) {
  for (int loaded = 0; loaded < 2; loaded++) {
    int cpus = bench_cpus();
    if (loaded) bench_load_start(cpus);
    double spin = bench_pingpong_us(1, iters, reps);
    double cv = bench_pingpong_us(0, iters, reps);
    double rod = run_on_device_us(0, iters, reps);
    if (loaded) bench_load_stop();
    char name[96];
    snprintf(name, sizeof name, "run_on_device round trip%s",
             loaded ? ", every CPU busy" : "");
    bench_report_add(r, name, "latency", rod, "us", "spinning ping-pong", spin);
    bench_report_add(r, name, "latency", rod, "us", "mutex+cond ping-pong", cv);
  }
}

/* A baseline name, in buf: name, and where the bare queue is of the kind
 * of mgpu's (profiling or plain, as MGPU_OPENCL_BUSY made it), a note that
 * it is the like-for-like baseline. */
static const char *bare_name(char *buf, size_t size, const char *name,
                             int bare_profiling, int mgpu_profiling) {
  snprintf(buf, size, "%s%s", name,
           bare_profiling == mgpu_profiling
               ? (mgpu_profiling ? " (like mgpu's queue: profiling)"
                                 : " (like mgpu's queue: plain)")
               : "");
  return buf;
}

/* The bare OpenCL rows of device 0, next to mgpu's burst of l us a launch
 * (bare: burst_us's bare_out), and the launch + synchronize latency. */
/* Two rows of case what: value next to the bare figures on a plain queue
 * (plain, named plain_name) and on a profiling one (prof_name); prof: mgpu's
 * own queue profiles, which bare_name marks. */
static void add_bare_pair(bench_report *r, const char *what,
                          const char *metric, double value,
                          const char *plain_name, double plain,
                          const char *prof_name, double profiled, int prof) {
  char n[96];
  bench_report_add(r, what, metric, value, "us",
                   bare_name(n, sizeof n, plain_name, 0, prof), plain);
  bench_report_add(r, what, metric, value, "us",
                   bare_name(n, sizeof n, prof_name, 1, prof), profiled);
}

static int report_bare(bench_report *r, int iters, int reps, double l,
                       const double *bare) {
  static const char burst[] = "launch empty kernel burst, device 0";
  int prof = bare[4] != 0;
  char n[96];
  add_bare_pair(r, burst, "per_launch", l,
                "bare clEnqueueNDRangeKernel burst + clFinish", bare[0],
                "the same bare burst, queue with profiling", bare[1], prof);
  bench_report_add(r, burst, "cpu_per_launch", bare[2], "us",
                   bare_name(n, sizeof n, "bare burst (plain queue), the "
                             "launching thread's CPU time", 0, prof),
                   bare[3]);
  double ls = 0, bls[2] = {0, 0};
  int rc = launch_sync_us(0, iters / 10 > 0 ? iters / 10 : 1, reps, &ls, bls);
  if (rc != 0 || bls[0] <= 0) return rc;
  add_bare_pair(r, "launch empty kernel + synchronize, device 0", "latency",
                ls, "bare clEnqueueNDRangeKernel + clFinish", bls[0],
                "the same bare pair, queue with profiling", bls[1], prof);
  return 0;
}

/* The launch rows of device 0 (p its properties): bursts, the bare OpenCL
 * baselines where it is an OpenCL device, and the chain as a graph. */
static int report_launches(bench_report *r, const mgpu_device_props *p,
                           int iters, int reps) {
  int cuda = p->backend_kind == MGPU_BACKEND_CUDA;
  double base_burst = handoff_burst_us(iters, reps);
  double l = 0, by_op = 0, by_graph = 0, bare[5] = {0, 0, 0, 0, 0};
  int rc = burst_us(0, cuda, 1, 0, iters, reps, &l,
                    p->backend_kind == MGPU_BACKEND_OPENCL ? bare : NULL);
  if (rc == 0)
    rc = burst_us(0, cuda, CHAIN, 0, iters / CHAIN, reps, &by_op, NULL);
  if (rc == 0)
    rc = burst_us(0, cuda, CHAIN, 1, iters / CHAIN, reps, &by_graph, NULL);
  if (rc != 0) return rc;
  bench_report_add(r, cuda ? "launch fill(1 elem) burst, device 0"
                           : "launch empty kernel burst, device 0",
                   "per_launch", l, "us", "pthread hand-off burst",
                   base_burst);
  if (bare[0] > 0 && (rc = report_bare(r, iters, reps, l, bare)) != 0)
    return rc;
  char chain[96];
  snprintf(chain, sizeof chain, "graph of %d %s, device 0", CHAIN,
           cuda ? "fills(1 elem)" : "empty kernels");
  bench_report_add(r, chain, "per_chain", by_graph, "us",
                   "the same launches one by one", by_op);
  return 0;
}

enum { NMPI = 2 };

/* The timed rounds of the channel rows, a warm-up first: in each, a batch
 * of each size of x, then one of each live MPI peer g (the two in turn
 * first). v holds reps figures of each size a side (mgpu's, then each
 * MPI's), in microseconds; live[m] drops to 0 for a peer that stopped
 * answering. */
static int rtt_rounds(rtt x[2], bench_gate g[NMPI], int live[NMPI],
                      int iters, int reps, double *v) {
  int rc = 0;
  for (int r = -1; r < reps && rc == 0; r++) {
    double us[2];
    for (int k = 0; k < 2 && rc == 0; k++) {
      rc = rtt_batch(&x[k], iters, &us[k]);
      if (r >= 0) v[k * reps + r] = us[k];
      /* The echo watches for its next message up to 64 us before it
       * sleeps: not into the next batch's time, mgpu's or MPI's. */
      usleep(200);
    }
    for (int j = 0; j < NMPI && rc == 0; j++) {
      int m = r & 1 ? NMPI - 1 - j : j;
      char line[128];
      if (live[m] && (bench_gate_batch(&g[m], line, sizeof line) != 0 ||
                      sscanf(line, "%lf %lf", &us[0], &us[1]) != 2 ||
                      us[0] <= 0 || us[1] <= 0))
        live[m] = 0;
      for (int k = 0; live[m] && r >= 0 && k < 2; k++)
        v[((1 + m) * 2 + k) * reps + r] = us[k] * 1e6;
    }
  }
  return rc;
}

/* The channel round trips of 8 B and 4 KiB between devices a and b, and
 * each MPI's ping-pong of the same sizes, in turns: medians into ch[k]
 * and mpi[m][k] (0 where a peer did not run: why[m] says why). */
static int rtt_time(int a, int b, int iters, int reps, double ch[2],
                    double mpi[NMPI][2], char why[NMPI][PATH_MAX + 128]) {
  static const size_t sizes[2] = {8, 4096};
  rtt x[2];
  bench_gate g[NMPI];
  int live[NMPI], rc = 0;
  double *v = calloc((size_t)(1 + NMPI) * 2 * (size_t)reps, sizeof *v);
  long rounds = (long)iters * (reps + 1);
  for (int k = 0; k < 2; k++) {
    int e = rtt_open(&x[k], a, b, sizes[k], rounds);
    if (rc == 0) rc = e;
  }
  if (v == NULL && rc == 0) rc = MGPU_ENOMEM;
  void (*pipe_was)(int) = signal(SIGPIPE, SIG_IGN); /* a rank that died */
  char args[96], ready[64];
  snprintf(args, sizeof args, "--iters %d --bytes 8 --bytes 4096", iters);
  for (int m = 0; m < NMPI; m++)
    live[m] = rc == 0 &&
              bench_gate_start((mgpu_cmd_mpi)m, "mpi_pingpong", 2, 120, args,
                               &g[m], ready, sizeof ready, why[m],
                               sizeof why[m]) == 0;
  int started[NMPI] = {live[0], live[1]};
  if (rc == 0) rc = rtt_rounds(x, g, live, iters, reps, v);
  for (int m = 0; m < NMPI; m++) {
    mpi[m][0] = mpi[m][1] = 0;
    /* A peer that failed gives no figure, not some. */
    if (!started[m] ||
        bench_gate_end(&g[m], live[m], why[m], sizeof why[m]) != 0)
      continue;
    for (int k = 0; k < 2; k++)
      mpi[m][k] = bench_median(v + ((1 + m) * 2 + k) * reps, reps);
  }
  signal(SIGPIPE, pipe_was);
  for (int k = 0; k < 2; k++) {
    rc = rtt_close(&x[k], rc);
    if (rc == 0) ch[k] = bench_median(v + k * reps, reps);
  }
  free(v);
  return rc;
}

/* The channel round trips between devices 0 and 1 (or 0 and 0), next to
 * the two-thread ping-pongs and each MPI's ping-pong. */
static int report_channels(bench_report *r, int iters, int reps) {
  int peer = mgpu_device_count() > 1 ? 1 : 0;
  static const size_t sizes[] = {8, 4096};
  char name[2][96], why[NMPI][PATH_MAX + 128] = {"", ""};
  double ch[2] = {0, 0}, mpi[NMPI][2];
  int rc = rtt_time(0, peer, iters, reps, ch, mpi, why);
  if (rc != 0) return rc;
  for (int k = 0; k < 2; k++) {
    double spin = bench_pingpong_bytes_us(1, sizes[k], iters, reps);
    double cv = bench_pingpong_bytes_us(0, sizes[k], iters, reps);
    snprintf(name[k], sizeof name[k],
             "channel round trip %zu B, devices 0 and %d", sizes[k], peer);
    bench_report_add(r, name[k], "latency", ch[k], "us",
                     "spinning ping-pong, same bytes", spin);
    bench_report_add(r, name[k], "latency", ch[k], "us",
                     "mutex+cond ping-pong, same bytes", cv);
  }
  for (int m = 0; m < NMPI; m++) {
    if (mpi[m][0] <= 0) {
      fprintf(stderr, "mgpu bench launch: no %s ping-pong baseline: %s\n",
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), why[m]);
      continue;
    }
    for (int k = 0; k < 2; k++) {
      char base[64];
      snprintf(base, sizeof base, "%s ping-pong, same bytes, 2 ranks",
               mgpu_cmd_mpi_name((mgpu_cmd_mpi)m));
      bench_report_add(r, name[k], "latency", ch[k], "us", base,
                       mpi[m][k]);
    }
  }
  return 0;
}

int mgpu_bench_launch(int argc, char **argv) {
  bench_opts o;
  int nrest = 0;
  int rc = bench_parse(argc, argv, "mgpu bench launch [--json] [--quick] "
                       "[--reps N]", &o, NULL, 0, &nrest);
  if (rc != 0) return rc;
  int iters = o.quick ? 200 : 2000;
  mgpu_device_props p = {.size = sizeof p};
  rc = mgpu_device_get_props(0, &p);
  if (rc != 0) {
    fprintf(stderr, "mgpu bench launch: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    return 1;
  }
  bench_report *r = bench_report_new("launch");
  report_handoffs(r, iters, o.reps);
  rc = report_launches(r, &p, iters, o.reps);
  if (rc != 0) {
    fprintf(stderr, "mgpu bench launch: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
  } else if ((rc = report_channels(r, iters, o.reps)) != 0) {
    fprintf(stderr, "mgpu bench launch: channel: %s: %s\n",
            mgpu_err_name(rc), mgpu_error_detail());
  }
  bench_report_finish(r, o.json);
  return rc != 0 ? 1 : 0;
}
