/* Core: init and shutdown, configuration, errors, devices, the current
 * device and mgpu_run_on_device. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "task.h"

TEST_IMPL(init_shutdown_twice) {
  ASSERT_EQ(mgpu_is_initialized(), 0);
  ASSERT_OK(mgpu_shutdown()); /* not initialized: harmless */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_device_count(), 3);
  ASSERT_ERR(MGPU_EALREADY, mgpu_init(&cfg));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_OK(mgpu_shutdown());
  ASSERT_ERR(MGPU_ENOINIT, mgpu_device_count());
  cfg.devices = "host:2,host:1";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_device_count(), 3);
  return 0;
}

TEST_IMPL(bad_device_spec_names_token) {
  const char *bad[] = {"gpu:2", "host:0", "host:x", "cuda:1/0", "host:2,,",
                       "host:99", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
    cfg.devices = bad[i];
    int rc = mgpu_init(&cfg);
    if (bad[i][0] == '\0') {
      /* An empty string counts as set-but-empty: refused too. */
      ASSERT(rc != 0 || mgpu_shutdown() == 0);
      continue;
    }
    ASSERT_ERR(MGPU_EINVAL, rc);
    ASSERT_EQ(mgpu_is_initialized(), 0);
  }
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2,gpu:3";
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("'gpu:3'");
  return 0;
}

/* mgpu_init refuses var=value, and the detail names both. */
static void expect_bad_env(const char *var, const char *value) {
  setenv(var, value, 1);
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(NULL));
  ASSERT_DETAIL_HAS(var);
  ASSERT_DETAIL_HAS(value);
  ASSERT_EQ(mgpu_is_initialized(), 0);
  unsetenv(var);
}

TEST_IMPL(config_from_environment) {
  setenv("MGPU_DEVICES", "host:2", 1);
  setenv("MGPU_HOST_MEM", "64M", 1);
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_EQ(mgpu_device_count(), 2);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(1, &p));
  ASSERT_EQ(p.total_mem, 64u << 20);
  ASSERT_OK(mgpu_shutdown());
  expect_bad_env("MGPU_HOST_MEM", "lots");
  expect_bad_env("MGPU_LOG", "loud");
  expect_bad_env("MGPU_HOST_PEER", "some");
  expect_bad_env("MGPU_STAGING_DEPTH", "1");
  expect_bad_env("MGPU_STAGING_DEPTH", "65");
  /* A chunk of 1 byte cuts a 1 MiB copy into a million pieces; 2G pins
   * gigabytes per copy. */
  expect_bad_env("MGPU_STAGING_CHUNK", "1");
  expect_bad_env("MGPU_STAGING_CHUNK", "4095");
  expect_bad_env("MGPU_STAGING_CHUNK", "2G");
  expect_bad_env("MGPU_STAGING_CHUNK", "65M");
  setenv("MGPU_STAGING_CHUNK", "64M", 1);
  ASSERT_OK(mgpu_init(NULL));
  size_t chunk = 0;
  ASSERT_OK(mgpu_staging_get(&chunk, NULL));
  ASSERT_EQ(chunk, (size_t)64 << 20);
  ASSERT_OK(mgpu_shutdown());
  unsetenv("MGPU_STAGING_CHUNK");
  expect_bad_env("MGPU_CUDA_BUSY", "sometimes");
  expect_bad_env("MGPU_OPENCL_BUSY", "2");
  expect_bad_env("MGPU_CUDA_GREEN", "2");
  /* A config field wins over the environment. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_device_count(), 1);
  ASSERT_OK(mgpu_shutdown());
  /* A field the caller set is held to the variable's bounds. */
  cfg.host_workers = 100;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("host_workers is 100");
  cfg.host_workers = 0;
  cfg.staging_depth = 1;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("staging_depth is 1");
  cfg.staging_depth = 0;
  expect_bad_env("MGPU_HOST_WORKERS", "65");
  /* A config with a wrong size field is refused. */
  cfg.size = 3;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  return 0;
}

TEST_IMPL(parse_size) {
  size_t v;
  ASSERT_OK(mgpu__parse_size("512M", &v));
  ASSERT_EQ(v, 512u << 20);
  ASSERT_OK(mgpu__parse_size("2G", &v));
  ASSERT_EQ(v, (size_t)2 << 30);
  ASSERT_OK(mgpu__parse_size("4096", &v));
  ASSERT_EQ(v, 4096);
  ASSERT_OK(mgpu__parse_size("1KiB", &v));
  ASSERT_EQ(v, 1024);
  ASSERT_EQ(mgpu__parse_size("M", &v), MGPU_EINVAL);
  ASSERT_EQ(mgpu__parse_size("12Q", &v), MGPU_EINVAL);
  ASSERT_EQ(mgpu__parse_size("-5", &v), MGPU_EINVAL);
  return 0;
}

TEST_IMPL(error_names_and_messages) {
  ASSERT(strcmp(mgpu_err_name(MGPU_ENOMEM), "MGPU_ENOMEM") == 0);
  ASSERT(strcmp(mgpu_strerror(MGPU_ENOMEM), "out of memory") == 0);
  ASSERT(strcmp(mgpu_err_name(0), "MGPU_OK") == 0);
  ASSERT(strcmp(mgpu_err_name(-9999), "MGPU_EUNKNOWN") == 0);
  ASSERT(mgpu_strerror(-9999) != NULL);
  /* Every code has a distinct name. */
  const int codes[] = {
#define X(name, value, msg) MGPU_##name,
      MGPU_ERRNO_MAP(X)
#undef X
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    ASSERT(codes[i] < 0);
    for (size_t j = 0; j < i; j++)
      ASSERT(strcmp(mgpu_err_name(codes[i]), mgpu_err_name(codes[j])) != 0);
  }
  return 0;
}

static void *detail_thread(void *arg) {
  (void)arg;
  mgpu_error_clear();
  ASSERT_ERR(MGPU_ENODEV, mgpu_set_device(77));
  ASSERT_DETAIL_HAS("77");
  return NULL;
}

TEST_IMPL(error_detail_is_thread_local) {
  test_init();
  ASSERT_ERR(MGPU_ENODEV, mgpu_set_device(-1));
  ASSERT_DETAIL_HAS("device -1");
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, detail_thread, NULL), 0);
  pthread_join(t, NULL);
  ASSERT_DETAIL_HAS("device -1"); /* the other thread's failure is its own */
  return 0;
}

TEST_IMPL(device_props) {
  int n = test_init();
  mgpu_device_props p = {.size = sizeof p};
  for (int i = 0; i < n; i++) {
    ASSERT_OK(mgpu_device_get_props(i, &p));
    ASSERT(p.name[0] != '\0');
    ASSERT(p.backend[0] != '\0');
    ASSERT(p.total_mem > 0);
    ASSERT(p.free_mem <= p.total_mem);
    ASSERT(p.multiprocessors > 0);
  }
  ASSERT_ERR(MGPU_ENODEV, mgpu_device_get_props(n, &p));
  ASSERT_DETAIL_HAS("does not exist");
  mgpu_device_props small = {.size = 8};
  ASSERT_ERR(MGPU_EINVAL, mgpu_device_get_props(0, &small));
  ASSERT_ERR(MGPU_EINVAL, mgpu_device_get_props(0, NULL));
  return 0;
}

TEST_IMPL(host_memory_shows_in_free_mem) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  cfg.host_mem = 8u << 20;
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 1, 3u << 20));
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(1, &p));
  ASSERT_EQ(p.total_mem, 8u << 20);
  ASSERT_EQ(p.free_mem, 5u << 20);
  ASSERT_OK(mgpu_device_get_props(0, &p));
  ASSERT_EQ(p.free_mem, 8u << 20);
  ASSERT_OK(mgpu_free(b));
  return 0;
}

static void *new_thread_device(void *arg) {
  int *out = arg;
  ASSERT_OK(mgpu_get_device(out));
  return NULL;
}

TEST_IMPL(current_device_per_thread) {
  int n = test_init();
  int dev = -1;
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, 0);
  ASSERT_OK(mgpu_set_device(n - 1));
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, n - 1);
  /* A new thread starts on device 0, as in CUDA. */
  int other = -1;
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, new_thread_device, &other), 0);
  pthread_join(t, NULL);
  ASSERT_EQ(other, 0);
  ASSERT_ERR(MGPU_ENODEV, mgpu_set_device(n));
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, n - 1); /* a failed set leaves it alone */
  ASSERT_ERR(MGPU_EINVAL, mgpu_get_device(NULL));
  return 0;
}

typedef struct probe {
  int seen_dev;
  int current;
  pthread_t thread;
} probe;

static int record_device(int dev, void *arg) {
  probe *p = arg;
  p->seen_dev = dev;
  p->thread = pthread_self();
  mgpu_get_device(&p->current);
  return 40 + dev;
}

static int fail_bare(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return MGPU_EIO;
}

TEST_IMPL(run_on_device_sync) {
  int n = test_init();
  ASSERT_OK(mgpu_set_device(0));
  for (int d = 0; d < n; d++) {
    probe p = {-1, -1, 0};
    ASSERT_EQ(mgpu_run_on_device(d, record_device, &p), 40 + d);
    ASSERT_EQ(p.seen_dev, d);
    ASSERT_EQ(p.current, d);
    ASSERT(!pthread_equal(p.thread, pthread_self()));
    probe again = {-1, -1, 0};
    mgpu_run_on_device(d, record_device, &again);
    ASSERT(pthread_equal(p.thread, again.thread)); /* the device's own thread */
  }
  int dev = -1;
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, 0); /* the caller's current device is untouched */
  ASSERT_ERR(MGPU_ENODEV, mgpu_run_on_device(n, record_device, NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_run_on_device(0, NULL, NULL));
  /* A function that fails without a detail: the caller gets one naming
   * the device, not its own last detail (of the ENODEV above). */
  ASSERT_ERR(MGPU_EIO, mgpu_run_on_device(n - 1, fail_bare, NULL));
  ASSERT_DETAIL_HAS("the function returned MGPU_EIO without a detail");
  mgpu_work *w;
  ASSERT_OK(mgpu_run_on_device_async(n - 1, fail_bare, NULL, &w));
  ASSERT_ERR(MGPU_ENODEV, mgpu_run_on_device(n, record_device, NULL));
  ASSERT_ERR(MGPU_EIO, mgpu_work_wait(w));
  ASSERT_DETAIL_HAS("without a detail");
  return 0;
}

static int inner(int dev, void *arg) {
  (void)arg;
  int cur = -1;
  mgpu_get_device(&cur);
  return cur == dev ? 7 : -100;
}

static int outer(int dev, void *arg) {
  (void)arg;
  /* Same device: runs inline instead of deadlocking. */
  int r = mgpu_run_on_device(dev, inner, NULL);
  if (r != 7) return -1;
  /* Another device from inside fn, then back: current device restored. */
  int other = (dev + 1) % mgpu_device_count();
  if (mgpu_run_on_device(other, inner, NULL) != 7) return -2;
  mgpu_work *w;
  if (mgpu_run_on_device_async(dev, inner, NULL, &w) != 0) return -3;
  if (mgpu_work_wait(w) != 7) return -4;
  int cur = -1;
  mgpu_get_device(&cur);
  return cur == dev ? 0 : -5;
}

TEST_IMPL(run_on_device_reentrant) {
  int n = test_init();
  for (int d = 0; d < n; d++) ASSERT_EQ(mgpu_run_on_device(d, outer, NULL), 0);
  return 0;
}

static int slow_add(int dev, void *arg) {
  _Atomic int *counter = arg;
  for (volatile int i = 0; i < 20000; i++) {
  }
  atomic_fetch_add(counter, dev + 1);
  return dev;
}

TEST_IMPL(run_on_device_async) {
  int n = test_init();
  _Atomic int counter = 0;
  mgpu_work *w[64];
  int k = 0;
  for (int rep = 0; rep < 8; rep++)
    for (int d = 0; d < n && k < 64; d++)
      ASSERT_OK(mgpu_run_on_device_async(d, slow_add, &counter, &w[k++]));
  int expect = 0;
  for (int i = 0; i < k; i++) {
    int d = i % n;
    ASSERT_EQ(mgpu_work_wait(w[i]), d);
    expect += d + 1;
  }
  ASSERT_EQ(counter, expect);
  ASSERT_ERR(MGPU_EINVAL, mgpu_run_on_device_async(0, slow_add, NULL, NULL));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_work_wait(NULL));
  return 0;
}

/* Several threads call one device at once: one at a time goes through
 * the lane, the others through the queue; each sees its own result, a
 * failure's detail, and the work it queued before its call run first. */
typedef struct many_caller {
  _Atomic int *total;
  int mine; /* this thread's own count, bumped by its queued work */
  int bad;  /* what went wrong, 0: nothing */
} many_caller;

static int bump(int dev, void *arg) {
  _Atomic int *c = arg;
  atomic_fetch_add(c, 1);
  return dev + 5;
}

static int bump_plain(int dev, void *arg) {
  ((many_caller *)arg)->mine++;
  return dev;
}

static int read_mine(int dev, void *arg) {
  (void)dev;
  return ((many_caller *)arg)->mine;
}

static int fail_nodev(int dev, void *arg) {
  (void)arg;
  return mgpu_run_on_device(mgpu_device_count() + dev, bump, NULL);
}

static void *many_calls(void *p) {
  many_caller *m = p;
  for (int i = 0; i < 300 && m->bad == 0; i++) {
    if (i % 7 == 3) {
      if (mgpu_run_on_device(0, fail_nodev, NULL) != MGPU_ENODEV ||
          strstr(mgpu_error_detail(), "does not exist") == NULL)
        m->bad = 1;
    } else if (i % 5 == 1) {
      mgpu_work *w = NULL;
      int before = m->mine;
      if (mgpu_run_on_device_async(0, bump_plain, m, &w) != 0) m->bad = 2;
      else if (mgpu_run_on_device(0, read_mine, m) != before + 1) m->bad = 3;
      if (w != NULL && mgpu_work_wait(w) != 0) m->bad = 4;
    } else if (mgpu_run_on_device(0, bump, m->total) != 5) {
      m->bad = 5;
    }
  }
  return NULL;
}

TEST_IMPL(run_on_device_many_callers) {
  test_init();
  _Atomic int total = 0;
  many_caller m[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    m[i] = (many_caller){&total, 0, 0};
    ASSERT_EQ(pthread_create(&t[i], NULL, many_calls, &m[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  int plain = 0, queued = 0;
  for (int i = 0; i < 300; i++) {
    plain += i % 7 != 3 && i % 5 != 1;
    queued += i % 7 != 3 && i % 5 == 1;
  }
  for (int i = 0; i < 4; i++) {
    ASSERT_EQ(m[i].bad, 0);
    ASSERT_EQ(m[i].mine, queued);
  }
  ASSERT_EQ(total, 4 * plain);
  return 0;
}

typedef struct late_job {
  mgpu_buffer *buf;
  int seen_initialized;
} late_job;

/* Queued work that starts late and still uses mgpu: shutdown must let it
 * run while its buffer and the library are still there. */
static int late_copy(int dev, void *arg) {
  (void)dev;
  late_job *j = arg;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  j->seen_initialized = mgpu_is_initialized();
  int v = 42;
  return mgpu_memcpy_htod(j->buf, 0, &v, sizeof v);
}

TEST_IMPL(shutdown_waits_for_queued_device_work) {
  test_init();
  late_job j = {NULL, 0};
  ASSERT_OK(mgpu_malloc(&j.buf, 0, 64));
  mgpu_work *w;
  ASSERT_OK(mgpu_run_on_device_async(0, late_copy, &j, &w));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_OK(mgpu_work_wait(w));
  ASSERT_EQ(j.seen_initialized, 1);
  return 0;
}

typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
  int target;
} gate;

/* Every device's fn waits until all have arrived: passes only if the device
 * threads really run at once. */
static int meet(int dev, void *arg) {
  (void)dev;
  gate *g = arg;
  pthread_mutex_lock(&g->lock);
  g->arrived++;
  pthread_cond_broadcast(&g->cond);
  while (g->arrived < g->target) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
  return 0;
}

TEST_IMPL(devices_run_concurrently) {
  int n = test_init();
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, n};
  mgpu_work *w[MGPU_MAX_DEVICES];
  for (int d = 0; d < n; d++)
    ASSERT_OK(mgpu_run_on_device_async(d, meet, &g, &w[d]));
  for (int d = 0; d < n; d++) ASSERT_OK(mgpu_work_wait(w[d]));
  ASSERT_EQ(g.arrived, n);
  return 0;
}

TEST_IMPL(calls_before_init_fail_cleanly) {
  mgpu_buffer *b = NULL;
  ASSERT_ERR(MGPU_ENOINIT, mgpu_malloc(&b, 0, 16));
  ASSERT_ERR(MGPU_ENOINIT, mgpu_set_device(0));
  ASSERT_ERR(MGPU_ENOINIT, mgpu_run_on_device(0, inner, NULL));
  mgpu_stream *s = NULL;
  ASSERT_ERR(MGPU_ENOINIT, mgpu_stream_create(&s, 0));
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_ERR(MGPU_ENOINIT, mgpu_metrics_snapshot(&m));
  return 0;
}

TEST_IMPL(version) {
  ASSERT_EQ(mgpu_version(), MGPU_VERSION_HEX);
  ASSERT(strcmp(mgpu_version_string(), MGPU_VERSION_STRING) == 0);
  return 0;
}

static int nothing_task(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  (void)arg;
  return 0;
}

/* The child's checks: every call fails at once with MGPU_EFORK and a detail
 * naming the parent, nothing waits on the parent's threads. */
static int fork_child_checks(pid_t parent, mgpu_buffer *buf, mgpu_stream *s,
                             mgpu_pool *pool) {
  char parent_text[32];
  snprintf(parent_text, sizeof parent_text, "process %d", (int)parent);
  mgpu_buffer *b2;
  ASSERT_ERR(MGPU_EFORK, mgpu_malloc(&b2, 0, 64));
  ASSERT_DETAIL_HAS(parent_text);
  char host[64];
  ASSERT_ERR(MGPU_EFORK, mgpu_memcpy_dtoh_async(host, buf, 0, 64, s));
  ASSERT_DETAIL_HAS("fork");
  ASSERT_ERR(MGPU_EFORK, mgpu_stream_synchronize(s));
  ASSERT_ERR(MGPU_EFORK, mgpu_device_synchronize(0));
  ASSERT_ERR(MGPU_EFORK, mgpu_free(buf));
  ASSERT_ERR(MGPU_EFORK, mgpu_device_count());
  ASSERT_ERR(MGPU_EFORK, mgpu_pool_submit_fn(pool, nothing_task, NULL, NULL));
  ASSERT_ERR(MGPU_EFORK, mgpu_pool_wait_all(pool));
  ASSERT_ERR(MGPU_EFORK, mgpu_pool_destroy(pool));
  ASSERT_EQ(mgpu_is_initialized(), 0);
  ASSERT_ERR(MGPU_EFORK, mgpu_init(NULL));
  ASSERT_ERR(MGPU_EFORK, mgpu_shutdown());
  return 0;
}

/* A process forked after mgpu_init gets MGPU_EFORK from mgpu calls in the
 * child instead of hanging on threads that only the parent has, while a
 * host device is busy at the moment of the fork; the parent goes on. */
TEST_IMPL(fork_child_gets_efork) {
  test_init();
  mgpu_buffer *buf;
  mgpu_stream *s;
  mgpu_pool *pool;
  ASSERT_OK(mgpu_malloc(&buf, 0, 1 << 20));
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_pool_create(&pool, NULL));
  float one = 1;
  for (int i = 0; i < 20; i++) /* keep the device busy across fork */
    ASSERT_OK(mgpu_fill(s, buf, 0, (1 << 20) / 4, MGPU_FLOAT32, &one));
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    alarm(20); /* a hang is a failure, not a stuck test */
    int rc = fork_child_checks(parent, buf, s, pool);
    fflush(stdout);
    _exit(rc); /* nothing of the parent's to free or to report as leaked */
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    ASSERT(0);
  }
  /* The parent is untouched. */
  ASSERT_OK(mgpu_pool_submit_fn(pool, nothing_task, NULL, NULL));
  ASSERT_OK(mgpu_pool_wait_all(pool));
  ASSERT_OK(mgpu_pool_destroy(pool));
  float back = 0;
  ASSERT_OK(mgpu_memcpy_dtoh_async(&back, buf, 4096, sizeof back, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(back == 1.0f);
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

static void *get_device_in_thread(void *arg) {
  int *dev = arg;
  ASSERT_OK(mgpu_get_device(dev));
  return NULL;
}

static int report_current(int dev, void *arg) {
  (void)dev;
  return mgpu_get_device(arg);
}

/* After mgpu_shutdown and an init with fewer devices, a thread's current
 * device no longer names a device of the old init (it named device 3 of 1). */
TEST_IMPL(current_device_after_reinit) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:4";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_set_device(3));
  int dev = -1;
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, 3);
  ASSERT_OK(mgpu_shutdown());
  cfg.devices = "host:1";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, 0);
  /* Inside mgpu_run_on_device the target is current, also after re-init. */
  ASSERT_OK(mgpu_run_on_device(0, report_current, &dev));
  ASSERT_EQ(dev, 0);
  ASSERT_OK(mgpu_shutdown());
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_set_device(2));
  ASSERT_OK(mgpu_run_on_device(1, report_current, &dev));
  ASSERT_EQ(dev, 1);
  ASSERT_OK(mgpu_get_device(&dev));
  ASSERT_EQ(dev, 2);
  pthread_t t;
  dev = -1;
  ASSERT_EQ(pthread_create(&t, NULL, get_device_in_thread, &dev), 0);
  pthread_join(t, NULL);
  ASSERT_EQ(dev, 0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* mgpu_timeout_ms: the default before init, what init resolved (the
 * config's own value, else MGPU_TIMEOUT), kept past shutdown. */
TEST_IMPL(timeout_as_resolved) {
  unsetenv("MGPU_TIMEOUT");
  ASSERT_EQ(mgpu_timeout_ms(), 30000);
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  cfg.timeout_ms = 1234;
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_timeout_ms(), 1234);
  ASSERT_OK(mgpu_shutdown());
  setenv("MGPU_TIMEOUT", "777", 1);
  cfg.timeout_ms = 0;
  ASSERT_OK(mgpu_init(&cfg));
  unsetenv("MGPU_TIMEOUT");
  ASSERT_EQ(mgpu_timeout_ms(), 777);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(timeout_as_resolved)
TEST_ENTRY(init_shutdown_twice)
TEST_ENTRY(bad_device_spec_names_token)
TEST_ENTRY(config_from_environment)
TEST_ENTRY(parse_size)
TEST_ENTRY(error_names_and_messages)
TEST_ENTRY(error_detail_is_thread_local)
TEST_ENTRY(device_props)
TEST_ENTRY(host_memory_shows_in_free_mem)
TEST_ENTRY(current_device_per_thread)
TEST_ENTRY(run_on_device_sync)
TEST_ENTRY(run_on_device_reentrant)
TEST_ENTRY(run_on_device_async)
TEST_ENTRY(run_on_device_many_callers)
TEST_ENTRY(shutdown_waits_for_queued_device_work)
TEST_ENTRY(devices_run_concurrently)
TEST_ENTRY(calls_before_init_fail_cleanly)
TEST_ENTRY(version)
TEST_ENTRY(fork_child_gets_efork)
TEST_ENTRY(current_device_after_reinit)
TEST_LIST_END
