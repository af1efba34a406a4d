/* The fault sweep: a workload that touches every layer (init, buffers of
 * each kind, pool allocations, streams, events, copies of every path,
 * kernels, the task pool, distributions, collectives, channels, barriers,
 * shutdown) runs once to count its fault sites of a kind, then once per site
 * with that site made to fail (MGPU_FAULT-style rules through
 * mgpu__fault_set), each run in a child process under a timeout.
 *
 * Every run must end well: each call returns 0 or a negative code with a
 * detail; the workload then releases what it made, and mgpu_shutdown
 * followed by a fresh mgpu_init (no faults) and a copy must work. A run whose
 * calls all succeeded must have correct results (a swallowed failure must
 * not change them). Crashes, hangs and (under ASan) leaks fail the sweep and
 * name the site. The count of sites is printed, so it cannot shrink
 * silently. MGPU_SWEEP_STRIDE=k tries every k-th site only, from the
 * MGPU_SWEEP_OFFSET-th (local runs, and .ci/run's TSan pass). */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"
#include "util/fault.h"

#define NDEV 3
#define N 4096 /* floats per buffer */
/* Floats per rank of the large all-reduce: over the 4 MiB up to which the
 * direct algorithm may run a call on the issuing thread, so its work is
 * queued (stream barriers, a launch per rank). */
#define BIG (5 << 18)

/* Fails the workload when a call fails: the code must be a known negative
 * one and come with a detail. */
#define STEP(expr)                                                          \
  do {                                                                      \
    int step_rc_ = (expr);                                                  \
    if (step_rc_ != 0) {                                                    \
      check_failure(step_rc_, #expr, __LINE__);                             \
      rc = step_rc_;                                                        \
      goto cleanup;                                                         \
    }                                                                       \
  } while (0)

static void check_failure(int code, const char *what, int line) {
  const char *name = mgpu_err_name(code);
  if (code >= 0 || strcmp(name, "MGPU_EUNKNOWN") == 0) {
    fprintf(stderr, "line %d: %s returned %d, not an mgpu error\n", line, what,
            code);
    _exit(11);
  }
  if (mgpu_error_detail()[0] == '\0') {
    fprintf(stderr, "line %d: %s returned %s without a detail\n", line, what,
            name);
    _exit(12);
  }
  if (getenv("MGPU_SWEEP_VERBOSE"))
    fprintf(stderr, "  line %d: %s: %s: %s\n", line, what, name,
            mgpu_error_detail());
}

/* What the call being made writes: its output regions, filled with SENTINEL
 * (through their host pointers, before any work on them) before the call.
 * A call that fails must leave them so (docs/faults.md, "The sweep"). Set
 * before the call, cleared once it returned 0. */
#define SENTINEL 0x5a
#define MAX_WATCH 8
static struct {
  int n, line;
  const char *what;
  mgpu_buffer *buf[MAX_WATCH];
  size_t bytes[MAX_WATCH];
} watch;

/* Fills the buffer with the sentinel (host devices: host memory, with
 * nothing queued on it yet) and watches it from now on. */
static void watch_fill(mgpu_buffer *b, size_t bytes) {
  memset(mgpu_buffer_ptr(b), SENTINEL, bytes);
}

static void watch_set(const char *what, int line, mgpu_buffer *const *bufs,
                      int n, size_t bytes) {
  watch.what = what;
  watch.line = line;
  watch.n = n;
  for (int i = 0; i < n; i++) {
    watch.buf[i] = bufs[i];
    watch.bytes[i] = bytes;
  }
}

/* After a failed call (rc, not a lost device, whose memory is gone): once
 * every queued operation has run, its outputs must hold the sentinel. */
static void watch_check(int rc) {
  if (watch.n == 0 || rc == 0 || rc == MGPU_EDEVLOST) return;
  for (int d = 0; d < NDEV; d++)
    if (mgpu_device_synchronize(d) == MGPU_EDEVLOST) return;
  for (int i = 0; i < watch.n; i++) {
    const unsigned char *p = mgpu_buffer_ptr(watch.buf[i]);
    if (p == NULL) continue; /* never made */
    for (size_t k = 0; k < watch.bytes[i]; k++)
      if (p[k] != SENTINEL) {
        fprintf(stderr, "line %d: %s failed with %s, but changed byte %zu "
                "of its output %d\n", watch.line, watch.what,
                mgpu_err_name(rc), k, i);
        _exit(18);
      }
  }
}

/* STEP for a call that writes the n buffers (bytes each): they are filled
 * with the sentinel before it and checked after it if it failed. */
#define OUT_STEP(expr, bufs, nbufs, bytes)                                  \
  do {                                                                      \
    watch_set(#expr, __LINE__, bufs, nbufs, bytes);                         \
    STEP(expr);                                                             \
    watch.n = 0;                                                            \
  } while (0)

static void add_one(const mgpu_kernel_ctx *ctx, const void *args) {
  const struct {
    float *p;
    size_t n;
  } *a = args;
  size_t per = a->n / ctx->grid_dim.x, begin = ctx->block_idx.x * per;
  for (size_t i = begin; i < begin + per; i++) a->p[i] += 1.0f;
}
static const mgpu_kernel add_one_kernel = {"add_one", add_one, NULL, NULL};

static int task_add(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  *(int *)arg += 1;
  return 0;
}

/* A task that allocates: under a fault it fails, and its detail must reach
 * mgpu_pool_wait_all even when no memory is left to keep it. */
static int task_alloc(int dev, mgpu_stream *s, void *arg) {
  (void)s;
  (void)arg;
  mgpu_buffer *b;
  int rc = mgpu_malloc(&b, dev, 64);
  if (rc == 0) rc = mgpu_free(b);
  return rc;
}

typedef struct barrier_arg {
  mgpu_barrier *barrier;
  int rc;
} barrier_arg;

static void *barrier_rank1(void *p) {
  barrier_arg *a = p;
  a->rc = mgpu_barrier_wait(a->barrier, 1, 5000);
  if (a->rc != 0 && a->rc != MGPU_ETIMEDOUT && mgpu_error_detail()[0] == '\0')
    _exit(12);
  return NULL;
}

/* The workload; 0 when every call worked and the results are right. */
static int workload(void) {
  int rc = 0, devs[NDEV] = {0, 1, 2};
  mgpu_buffer *buf[NDEV] = {0}, *pinned = NULL, *unified = NULL;
  mgpu_buffer *pooled = NULL, *recv[NDEV] = {0};
  mgpu_stream *s[NDEV] = {0};
  mgpu_event *ev[2] = {0};
  mgpu_pool *pool = NULL;
  mgpu_comm *comm = NULL, *ring = NULL;
  mgpu_channel *chan = NULL;
  mgpu_barrier *barrier = NULL;
  mgpu_stream_barrier *sbar = NULL;
  mgpu_dist *dist = NULL;
  mgpu_buffer *parts[NDEV] = {0};
  /* Outputs of one collective each (watched), and of the copies. */
  mgpu_buffer *reduced = NULL, *bcast[NDEV] = {0}, *gathered[NDEV] = {0};
  mgpu_buffer *scattered[NDEV] = {0}, *ring_out[NDEV] = {0};
  mgpu_buffer *big_in[NDEV] = {0}, *big_out[NDEV] = {0};
  static float host[N], back[N], whole[N];
  int group_open = 0, ran = 0;

  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  cfg.host_workers = 1;
  cfg.staging_chunk = 4096; /* several chunks per staged copy */
  STEP(mgpu_init(&cfg));
  for (int d = 0; d < NDEV; d++) {
    STEP(mgpu_stream_create(&s[d], d));
    STEP(mgpu_malloc(&buf[d], d, N * sizeof(float)));
    STEP(mgpu_malloc(&recv[d], d, N * sizeof(float)));
    STEP(mgpu_malloc(&bcast[d], d, N * sizeof(float)));
    STEP(mgpu_malloc(&gathered[d], d, NDEV * N * sizeof(float)));
    STEP(mgpu_malloc(&scattered[d], d, N / NDEV * sizeof(float)));
    watch_fill(buf[d], N * sizeof(float));
    watch_fill(recv[d], N * sizeof(float));
    watch_fill(bcast[d], N * sizeof(float));
    watch_fill(gathered[d], NDEV * N * sizeof(float));
    watch_fill(scattered[d], N / NDEV * sizeof(float));
    STEP(mgpu_malloc(&ring_out[d], d, N * sizeof(float)));
    watch_fill(ring_out[d], N * sizeof(float));
    STEP(mgpu_malloc(&big_in[d], d, BIG * sizeof(float)));
    STEP(mgpu_malloc(&big_out[d], d, BIG * sizeof(float)));
    float *in = mgpu_buffer_ptr(big_in[d]);
    for (size_t i = 0; i < BIG; i++) in[i] = (float)(d + 1);
    watch_fill(big_out[d], BIG * sizeof(float));
  }
  STEP(mgpu_malloc(&reduced, 1, N * sizeof(float)));
  watch_fill(reduced, N * sizeof(float));
  STEP(mgpu_malloc_host(&pinned, 0, N * sizeof(float)));
  STEP(mgpu_malloc_unified(&unified, 1, N * sizeof(float)));
  watch_fill(pinned, N * sizeof(float));
  watch_fill(unified, N * sizeof(float));
  STEP(mgpu_event_create(&ev[0], 0));
  STEP(mgpu_event_create(&ev[1], 0));

  /* Copies of every path: host to device, same device, direct peer
   * (0 -> 1), host-staged (0 -> 2 with peer access off), device to host. */
  for (int i = 0; i < N; i++) host[i] = (float)i;
  STEP(mgpu_peer_disable(0, 2));
  STEP(mgpu_event_record(ev[0], s[0]));
  OUT_STEP(mgpu_memcpy_htod_async(buf[0], 0, host, sizeof host, s[0]),
           &buf[0], 1, sizeof host);
  OUT_STEP(mgpu_memcpy_async(pinned, 0, buf[0], 0, sizeof host, s[0]),
           &pinned, 1, sizeof host);
  STEP(mgpu_event_record(ev[1], s[0]));
  STEP(mgpu_stream_wait_event(s[1], ev[1]));
  STEP(mgpu_stream_wait_event(s[2], ev[1]));
  OUT_STEP(mgpu_memcpy_async(buf[1], 0, buf[0], 0, sizeof host, s[1]),
           &buf[1], 1, sizeof host);
  OUT_STEP(mgpu_memcpy_async(buf[2], 0, buf[0], 0, sizeof host, s[2]),
           &buf[2], 1, sizeof host);
  OUT_STEP(mgpu_memcpy_async(unified, 0, buf[1], 0, sizeof host, s[1]),
           &unified, 1, sizeof host);
  STEP(mgpu_memset_async(recv[0], 0, 0, sizeof host, s[0]));
  STEP(mgpu_event_synchronize(ev[1]));
  float ms;
  STEP(mgpu_event_elapsed_ms(ev[0], ev[1], &ms));

  /* Kernels: built-ins and a launch. */
  struct {
    float *p;
    size_t n;
  } args = {mgpu_buffer_ptr(buf[2]), N};
  STEP(mgpu_scale(s[1], buf[1], 0, N, MGPU_FLOAT32, 2.0));
  STEP(mgpu_axpy(s[1], buf[1], 0, unified, 0, N, MGPU_FLOAT32, 1.0));
  STEP(mgpu_launch(s[2], &add_one_kernel, (mgpu_dim3){4, 1, 1},
                   (mgpu_dim3){1, 1, 1}, &args, sizeof args));
  STEP(mgpu_stream_synchronize(s[1]));
  STEP(mgpu_stream_synchronize(s[2]));

  /* The stream-ordered pool. */
  STEP(mgpu_malloc_async(&pooled, N * sizeof(float), s[0]));
  STEP(mgpu_memcpy_async(pooled, 0, buf[0], 0, sizeof host, s[0]));
  STEP(mgpu_free_async(pooled, s[0]));
  pooled = NULL;

  /* The task pool, with a dependency. */
  mgpu_pool_opts po = MGPU_POOL_OPTS_INITIALIZER;
  STEP(mgpu_pool_create(&pool, &po));
  mgpu_task first;
  STEP(mgpu_pool_submit_fn(pool, task_add, &ran, &first));
  mgpu_task_desc td = MGPU_TASK_DESC_INITIALIZER;
  td.fn = task_add;
  td.arg = &ran;
  td.deps = &first;
  td.ndeps = 1;
  td.device = 1;
  STEP(mgpu_pool_submit(pool, &td, NULL));
  STEP(mgpu_pool_submit_fn(pool, task_alloc, NULL, NULL));
  STEP(mgpu_pool_wait_all(pool));
  STEP(mgpu_pool_destroy(pool));
  pool = NULL;

  /* A distribution: scatter and gather. */
  mgpu_dist_opts dopts = MGPU_DIST_OPTS_INITIALIZER;
  dopts.kind = MGPU_DIST_BLOCK_CYCLIC;
  dopts.block = 1000;
  STEP(mgpu_dist_create(&dist, N, &dopts));
  STEP(mgpu_dist_alloc_buffers(dist, sizeof(float), parts));
  STEP(mgpu_scatter(dist, host, sizeof(float), parts, NULL));
  STEP(mgpu_gather(dist, whole, sizeof(float), parts, NULL));

  /* Collectives, each a group over every rank: all-reduce (its receive
   * buffers were written by nothing yet but recv[0]'s memset, after which
   * they are watched), reduce, broadcast, all-gather, reduce-scatter. */
  STEP(mgpu_comm_create(devs, NDEV, &comm));
  STEP(mgpu_stream_synchronize(s[0]));
  watch_fill(recv[0], N * sizeof(float));
  watch_set("allreduce group", __LINE__, recv, NDEV, N * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_allreduce(comm, r, buf[r], recv[r], N, MGPU_FLOAT32, MGPU_SUM,
                        s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  watch_set("reduce group", __LINE__, &reduced, 1, N * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_reduce(comm, r, buf[r], r == 1 ? reduced : NULL, N,
                     MGPU_FLOAT32, MGPU_SUM, 1, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  watch_set("broadcast group", __LINE__, bcast, NDEV, N * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_broadcast(comm, r, r == 0 ? buf[0] : NULL, bcast[r], N,
                        MGPU_FLOAT32, 0, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  watch_set("allgather group", __LINE__, gathered, NDEV,
            NDEV * N * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_allgather(comm, r, buf[r], gathered[r], N, MGPU_FLOAT32, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  watch_set("reduce_scatter group", __LINE__, scattered, NDEV,
            N / NDEV * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_reduce_scatter(comm, r, buf[r], scattered[r], N / NDEV,
                             MGPU_FLOAT32, MGPU_SUM, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  watch_set("large allreduce group", __LINE__, big_out, NDEV,
            BIG * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_allreduce(comm, r, big_in[r], big_out[r], BIG, MGPU_FLOAT32,
                        MGPU_SUM, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  /* The ring queues its work (chunks, events, copies, reductions) where
   * the direct algorithm above may run a small call on the issuing thread:
   * every one of those steps is a site, none may leave an output changed. */
  mgpu_comm_config ring_cfg = MGPU_COMM_CONFIG_INITIALIZER;
  ring_cfg.algo = MGPU_COLL_ALGO_RING;
  ring_cfg.chunk_bytes = 4096;
  STEP(mgpu_comm_create_config(devs, NDEV, &ring_cfg, &ring));
  watch_set("ring allreduce group", __LINE__, ring_out, NDEV,
            N * sizeof(float));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_allreduce(ring, r, buf[r], ring_out[r], N, MGPU_FLOAT32,
                        MGPU_SUM, s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
  watch.n = 0;
  for (int r = 0; r < NDEV; r++) STEP(mgpu_stream_synchronize(s[r]));

  /* A channel 0 -> 2, a stream barrier and a host barrier. */
  size_t got = 0;
  STEP(mgpu_channel_create(0, 2, 64, 2, &chan));
  STEP(mgpu_channel_send(chan, buf[0], 0, 64, s[0]));
  STEP(mgpu_channel_recv(chan, recv[2], 64, &got, s[2]));
  STEP(mgpu_channel_close(chan));
  STEP(mgpu_stream_barrier_create(s, NDEV, &sbar));
  STEP(mgpu_stream_barrier_wait(sbar));
  STEP(mgpu_barrier_create(devs, 2, &barrier));
  barrier_arg ba = {barrier, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, barrier_rank1, &ba) != 0) _exit(13);
  int brc = mgpu_barrier_wait(barrier, 0, 5000);
  pthread_join(th, NULL);
  STEP(brc);
  STEP(ba.rc);
  for (int r = 0; r < NDEV; r++) STEP(mgpu_stream_synchronize(s[r]));
  STEP(mgpu_memcpy_dtoh_async(back, recv[1], 0, sizeof back, s[1]));
  STEP(mgpu_stream_synchronize(s[1]));

  /* Every call worked: the results must be right. buf0 = i, buf1 =
   * 2i + i = 3i, buf2 = i + 1; their sum is 5i + 1. */
  for (int i = 0; i < N; i++) {
    if (back[i] != 5.0f * (float)i + 1.0f || whole[i] != (float)i) {
      fprintf(stderr, "wrong result at %d: %g, %g\n", i, back[i], whole[i]);
      _exit(14);
    }
  }
  /* The other collectives, which may have completed on the calling thread
   * after a failure part-way (they must then be right too). Read through
   * the host pointers: every stream was synchronized above. */
  const float *ring1 = mgpu_buffer_ptr(ring_out[1]);
  const float *red = mgpu_buffer_ptr(reduced), *bc2 = mgpu_buffer_ptr(bcast[2]);
  const float *big0 = mgpu_buffer_ptr(big_out[0]);
  for (int i = 0; i < N; i++) {
    if (ring1[i] != 5.0f * (float)i + 1.0f || red[i] != ring1[i] ||
        bc2[i] != (float)i) {
      fprintf(stderr, "wrong collective result at %d: ring %g, reduce %g, "
              "broadcast %g\n", i, ring1[i], red[i], bc2[i]);
      _exit(14);
    }
  }
  for (size_t i = 0; i < BIG; i++)
    if (big0[i] != 6.0f) {
      fprintf(stderr, "wrong large all-reduce result at %zu: %g\n", i,
              big0[i]);
      _exit(14);
    }
  if (ran != 2 || got != 64) {
    fprintf(stderr, "tasks ran %d times, channel gave %zu bytes\n", ran, got);
    _exit(14);
  }

cleanup:
  /* Release in reverse; each release may itself fail under a fault (its
   * code is checked the same way), and mgpu_shutdown frees what is left. */
  if (group_open) {
    int r = mgpu_group_end();
    if (r != 0) check_failure(r, "mgpu_group_end (cleanup)", __LINE__);
    if (r == 0) watch.n = 0; /* a call in the group failed, not the group */
  }
  watch_check(rc);
  watch.n = 0;
  if (barrier) mgpu_barrier_destroy(barrier);
  if (sbar) mgpu_stream_barrier_destroy(sbar);
  if (chan) mgpu_channel_destroy(chan);
  if (ring) mgpu_comm_destroy(ring);
  if (comm) mgpu_comm_destroy(comm);
  if (dist) {
    mgpu_dist_free_buffers(dist, parts);
    mgpu_dist_destroy(dist);
  }
  if (pool) mgpu_pool_destroy(pool);
  int r = mgpu_shutdown();
  if (r != 0) check_failure(r, "mgpu_shutdown", __LINE__);
  return rc;
}

/* After the workload, with no fault: the library starts again and works. */
static int afterwards(void) {
  mgpu__fault_set(NULL, NULL, 0);
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  if (mgpu_init(&cfg) != 0) return 1;
  mgpu_buffer *a, *b;
  float x = 42, y = 0;
  if (mgpu_malloc(&a, 0, 4) || mgpu_malloc(&b, 1, 4) ||
      mgpu_memcpy_htod(a, 0, &x, 4) || mgpu_memcpy(b, 0, a, 0, 4) ||
      mgpu_memcpy_dtoh(&y, b, 0, 4) || y != 42)
    return 1;
  return mgpu_shutdown() != 0;
}

/* One child: the workload under spec, then the check. Exit status 0 when
 * all is well; the counts of sites go to fd (dry run). */
static void child(const char *spec, int fd) {
  /* The workload takes milliseconds: a run past 10 s waited on something
   * that will not come, which is a failure of this site. */
  alarm(10);
  char why[256];
  if (mgpu__fault_set(spec, why, sizeof why) != 0) {
    fprintf(stderr, "bad spec %s: %s\n", spec, why);
    _exit(10);
  }
  int rc = workload();
  uint64_t counts[MGPU__FAULT_KINDS], fired = 0;
  for (int k = 0; k < MGPU__FAULT_KINDS; k++) {
    counts[k] = mgpu__fault_calls((mgpu__fault_kind)k);
    fired += mgpu__fault_fired((mgpu__fault_kind)k);
  }
  if (spec[0] == '\0' && rc != 0) {
    fprintf(stderr, "the workload fails without a fault: %s\n",
            mgpu_error_detail());
    _exit(15);
  }
  if (fd >= 0 && write(fd, counts, sizeof counts) != (ssize_t)sizeof counts)
    _exit(16);
  if (afterwards() != 0) {
    fprintf(stderr, "after the fault (%s), mgpu_init and a copy failed: %s\n",
            fired ? "fired" : "not fired", mgpu_error_detail());
    _exit(17);
  }
  exit(0); /* exit, not _exit: LeakSanitizer checks here */
}

/* Runs one child; returns its status as a word ("ok", "exit 12", "signal
 * 6"), ok meaning exit 0. */
static const char *run_child(const char *spec, uint64_t *counts) {
  static char status_text[64];
  int fds[2] = {-1, -1};
  if (counts != NULL && pipe(fds) != 0) return "pipe failed";
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    if (fds[0] >= 0) close(fds[0]);
    child(spec, fds[1]);
  }
  if (fds[1] >= 0) close(fds[1]);
  if (counts != NULL) {
    ssize_t got = read(fds[0], counts, MGPU__FAULT_KINDS * sizeof *counts);
    close(fds[0]);
    if (got != (ssize_t)(MGPU__FAULT_KINDS * sizeof *counts))
      memset(counts, 0, MGPU__FAULT_KINDS * sizeof *counts);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid) return "waitpid failed";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "ok";
  if (WIFEXITED(status))
    snprintf(status_text, sizeof status_text, "exit %d", WEXITSTATUS(status));
  else
    snprintf(status_text, sizeof status_text, "signal %d (%s)",
             WTERMSIG(status), WTERMSIG(status) == SIGALRM ? "hang" :
             strsignal(WTERMSIG(status)));
  return status_text;
}

/* rule "alloc" fails the Nth site only; suffix "+" the Nth and every later
 * one (harder on the unwinding paths, which then fail too); "=devlost" (a
 * backend site) fails it as a lost device, which then fails everything
 * after it. */
static int sweep(mgpu__fault_kind kind, const char *rule, const char *suffix) {
  uint64_t counts[MGPU__FAULT_KINDS];
  const char *st = run_child("", counts);
  if (strcmp(st, "ok") != 0) {
    fprintf(stderr, "the workload without faults: %s\n", st);
    return 1;
  }
  uint64_t total = counts[kind];
  printf("sweep %s%s: the workload has %llu %s sites (alloc %llu, backend "
         "%llu, thread %llu)\n", rule, suffix,
         (unsigned long long)total,
         mgpu__fault_kind_name(kind), (unsigned long long)counts[0],
         (unsigned long long)counts[1], (unsigned long long)counts[2]);
  ASSERT(total > 0);
  uint64_t first, stride;
  test_sweep_sites("sweep", &first, &stride);
  int bad = 0;
  uint64_t runs = 0;
  double slowest = 0;
  char slowest_spec[64] = "";
  for (uint64_t n = first; n <= total; n += stride) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s:%llu%s", rule, (unsigned long long)n,
             suffix);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = run_child(spec, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) +
                 (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (sec > slowest) {
      slowest = sec;
      snprintf(slowest_spec, sizeof slowest_spec, "%s", spec);
    }
    runs++;
    if (strcmp(st, "ok") != 0) {
      printf("FAIL %s: %s\n", spec, st);
      bad++;
    }
  }
  printf("sweep %s%s: %llu runs, %d failed; slowest %s (%.2f s)\n", rule,
         suffix, (unsigned long long)runs, bad, slowest_spec,
         slowest);
  return bad != 0;
}

TEST_IMPL(sweep_alloc) { return sweep(MGPU__FAULT_ALLOC, "alloc", ""); }
TEST_IMPL(sweep_alloc_from) { return sweep(MGPU__FAULT_ALLOC, "alloc", "+"); }
TEST_IMPL(sweep_backend) { return sweep(MGPU__FAULT_BACKEND, "backend", ""); }
TEST_IMPL(sweep_backend_from) {
  return sweep(MGPU__FAULT_BACKEND, "backend", "+");
}
TEST_IMPL(sweep_backend_lost) {
  return sweep(MGPU__FAULT_BACKEND, "backend", "=devlost");
}
TEST_IMPL(sweep_thread) { return sweep(MGPU__FAULT_THREAD, "thread", ""); }

/* One run, for a closer look: MGPU_SWEEP_SPEC=alloc:17 MGPU_SWEEP_VERBOSE=1
 * bin/test-sweep sweep_one. */
TEST_IMPL(sweep_one) {
  const char *spec = getenv("MGPU_SWEEP_SPEC");
  const char *st = run_child(spec ? spec : "", NULL);
  printf("%s: %s\n", spec ? spec : "(no fault)", st);
  return strcmp(st, "ok") != 0;
}

TEST_LIST_BEGIN
TEST_HELPER(sweep_one)
TEST_ENTRY(sweep_alloc)
TEST_ENTRY(sweep_alloc_from)
TEST_ENTRY(sweep_backend)
TEST_ENTRY(sweep_backend_from)
TEST_ENTRY(sweep_backend_lost)
TEST_ENTRY(sweep_thread)
TEST_LIST_END
