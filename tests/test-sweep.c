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
 * silently. MGPU_SWEEP_STRIDE=k tries every k-th site only (local runs). */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"
#include "util/fault.h"

#define NDEV 3
#define N 4096 /* floats per buffer */

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
  mgpu_comm *comm = NULL;
  mgpu_channel *chan = NULL;
  mgpu_barrier *barrier = NULL;
  mgpu_stream_barrier *sbar = NULL;
  mgpu_dist *dist = NULL;
  mgpu_buffer *parts[NDEV] = {0};
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
  }
  STEP(mgpu_malloc_host(&pinned, 0, N * sizeof(float)));
  STEP(mgpu_malloc_unified(&unified, 1, N * sizeof(float)));
  STEP(mgpu_event_create(&ev[0], 0));
  STEP(mgpu_event_create(&ev[1], 0));

  /* Copies of every path: host to device, same device, direct peer
   * (0 -> 1), host-staged (0 -> 2 with peer access off), device to host. */
  for (int i = 0; i < N; i++) host[i] = (float)i;
  STEP(mgpu_peer_disable(0, 2));
  STEP(mgpu_event_record(ev[0], s[0]));
  STEP(mgpu_memcpy_htod_async(buf[0], 0, host, sizeof host, s[0]));
  STEP(mgpu_memcpy_async(pinned, 0, buf[0], 0, sizeof host, s[0]));
  STEP(mgpu_event_record(ev[1], s[0]));
  STEP(mgpu_stream_wait_event(s[1], ev[1]));
  STEP(mgpu_stream_wait_event(s[2], ev[1]));
  STEP(mgpu_memcpy_async(buf[1], 0, buf[0], 0, sizeof host, s[1]));
  STEP(mgpu_memcpy_async(buf[2], 0, buf[0], 0, sizeof host, s[2]));
  STEP(mgpu_memcpy_async(unified, 0, buf[1], 0, sizeof host, s[1]));
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

  /* Collectives: an all-reduce in a group, then a broadcast. */
  STEP(mgpu_comm_create(devs, NDEV, &comm));
  STEP(mgpu_group_begin());
  group_open = 1;
  for (int r = 0; r < NDEV; r++)
    STEP(mgpu_allreduce(comm, r, buf[r], recv[r], N, MGPU_FLOAT32, MGPU_SUM,
                        s[r]));
  group_open = 0;
  STEP(mgpu_group_end());
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
  }
  if (barrier) mgpu_barrier_destroy(barrier);
  if (sbar) mgpu_stream_barrier_destroy(sbar);
  if (chan) mgpu_channel_destroy(chan);
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
  const char *stride_env = getenv("MGPU_SWEEP_STRIDE");
  uint64_t stride = stride_env ? strtoull(stride_env, NULL, 10) : 1;
  if (stride == 0) stride = 1;
  int bad = 0;
  uint64_t runs = 0;
  double slowest = 0;
  char slowest_spec[64] = "";
  for (uint64_t n = 1; n <= total; n += stride) {
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
