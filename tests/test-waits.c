/* Tests that every wait on another party ends: MGPU_TIMEOUT and the
 * per-call timeouts of collectives, barriers and channels (the detail names
 * who did not come and what each did last, and the library stays usable),
 * the flight recorder, cycles of mgpu_run_on_device, mgpu_shutdown from the
 * library's own threads, stream creation beside mgpu_device_synchronize,
 * the current device across a re-init, a thread that ends inside a group,
 * and shutdown's work with many handles left open. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "task.h"

/* Each test that could hang without its fix ends the process instead. */
static void deadline_s(unsigned s) { alarm(s); }

/* mgpu_init on host:4 (or the environment's devices) with MGPU_TIMEOUT. */
static int init_with_timeout(int timeout_ms) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.timeout_ms = timeout_ms;
  ASSERT_OK(mgpu_init(&cfg));
  return mgpu_device_count();
}

TEST_IMPL(timeout_config_checked) {
  ASSERT(setenv("MGPU_TIMEOUT", "soon", 1) == 0);
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(NULL));
  ASSERT_DETAIL_HAS("MGPU_TIMEOUT");
  ASSERT(setenv("MGPU_TIMEOUT", "0", 1) == 0);
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(NULL));
  ASSERT(setenv("MGPU_TIMEOUT", "1234", 1) == 0);
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_EQ(mgpu__config()->timeout_ms, 1234);
  ASSERT_OK(mgpu_shutdown());
  ASSERT(unsetenv("MGPU_TIMEOUT") == 0);
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_EQ(mgpu__config()->timeout_ms, 30000);
  ASSERT_OK(mgpu_shutdown());
  /* A field the caller set wins over the environment. */
  ASSERT(setenv("MGPU_TIMEOUT", "1234", 1) == 0);
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.timeout_ms = 77;
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu__config()->timeout_ms, 77);
  ASSERT_OK(mgpu_shutdown());
  ASSERT(unsetenv("MGPU_TIMEOUT") == 0);
  return 0;
}

/* Queues a memset of 256 bytes on device dev: the missing party's last
 * operation, which the timeout's detail must name. */
static void mark_device(int dev, mgpu_buffer **buf, mgpu_stream **s) {
  ASSERT_OK(mgpu_malloc(buf, dev, 256));
  ASSERT_OK(mgpu_stream_create(s, dev));
  ASSERT_OK(mgpu_memset_async(*buf, 0, 7, 256, *s));
  ASSERT_OK(mgpu_stream_synchronize(*s));
}

typedef struct barrier_arg {
  mgpu_barrier *b;
  int rc;
} barrier_arg;

static void *barrier_thread(void *p) {
  barrier_arg *a = p;
  a->rc = mgpu_barrier_wait(a->b, 1, -1);
  return NULL;
}

TEST_IMPL(barrier_takes_mgpu_timeout) {
  deadline_s(60);
  if (init_with_timeout(100) < 2) return TEST_SKIP;
  mgpu_buffer *buf;
  mgpu_stream *s;
  mark_device(1, &buf, &s);
  int devs[2] = {0, 1};
  mgpu_barrier *b;
  ASSERT_OK(mgpu_barrier_create(devs, 2, &b));
  /* Timeout 0 is MGPU_TIMEOUT: 100 ms, not an immediate return. */
  uint64_t t0 = mgpu_trace_now_ns();
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_barrier_wait(b, 0, 0));
  ASSERT(mgpu_trace_now_ns() - t0 >= 100000000ull);
  ASSERT_DETAIL_HAS("waited 100 ms");
  ASSERT_DETAIL_HAS("device 1 (last: memset_async 256 B stream");
  /* Usable: the next round with both ranks passes. */
  barrier_arg other = {b, -1};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, barrier_thread, &other) == 0);
  ASSERT_OK(mgpu_barrier_wait(b, 0, -1));
  pthread_join(t, NULL);
  ASSERT_OK(other.rc);
  ASSERT_OK(mgpu_barrier_destroy(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

typedef struct rank_arg {
  mgpu_comm *comm;
  int rank;
  mgpu_buffer *buf;
  mgpu_stream *stream;
  int rc;
} rank_arg;

static void *allreduce_thread(void *p) {
  rank_arg *a = p;
  a->rc = mgpu_allreduce(a->comm, a->rank, a->buf, a->buf, 4, MGPU_FLOAT32,
                         MGPU_SUM, a->stream);
  return NULL;
}

TEST_IMPL(collective_takes_mgpu_timeout) {
  deadline_s(60);
  if (init_with_timeout(150) < 2) return TEST_SKIP;
  int devs[2] = {0, 1};
  mgpu_buffer *buf[2];
  mgpu_stream *s[2];
  for (int r = 0; r < 2; r++) mark_device(r, &buf[r], &s[r]);
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm)); /* timeout 0: MGPU_TIMEOUT */
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_allreduce(comm, 0, buf[0], buf[0], 4,
                                            MGPU_FLOAT32, MGPU_SUM, s[0]));
  ASSERT_DETAIL_HAS("after 150 ms");
  ASSERT_DETAIL_HAS("device 1 (last: memset_async 256 B");
  ASSERT(strstr(mgpu_error_detail(), "device 0 (") == NULL);
  ASSERT_OK(mgpu_comm_destroy(comm));
  /* The library goes on: a new communicator all-reduces. */
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  float one[4] = {1, 1, 1, 1};
  for (int r = 0; r < 2; r++) ASSERT_OK(mgpu_memcpy_htod(buf[r], 0, one, 16));
  rank_arg a[2];
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    a[r] = (rank_arg){comm, r, buf[r], s[r], -1};
    ASSERT(pthread_create(&t[r], NULL, allreduce_thread, &a[r]) == 0);
  }
  for (int r = 0; r < 2; r++) {
    pthread_join(t[r], NULL);
    ASSERT_OK(a[r].rc);
    ASSERT_OK(mgpu_stream_synchronize(s[r]));
    float got[4];
    ASSERT_OK(mgpu_memcpy_dtoh(got, buf[r], 0, 16));
    for (int i = 0; i < 4; i++) ASSERT(got[i] == 2.0f);
  }
  ASSERT_OK(mgpu_comm_destroy(comm));
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_stream_destroy(s[r]));
    ASSERT_OK(mgpu_free(buf[r]));
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(channel_waits_end) {
  deadline_s(60);
  if (init_with_timeout(80) < 2) return TEST_SKIP;
  mgpu_buffer *src, *dst;
  mgpu_stream *ss, *ds;
  mark_device(0, &src, &ss);
  mark_device(1, &dst, &ds);
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(0, 1, 64, 1, &ch));
  /* Nothing sent: a receive ends after its own timeout, naming the sender. */
  size_t n = 0;
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_channel_recv_timeout(ch, dst, 0, &n, ds, 20));
  ASSERT_DETAIL_HAS("no message for 20 ms");
  ASSERT_DETAIL_HAS("device 0 (last: ");
  ASSERT_ERR(MGPU_EINVAL, mgpu_channel_recv_timeout(ch, dst, 0, &n, ds, -2));
  /* One slot: the second send finds no room and ends after MGPU_TIMEOUT,
   * naming the receiver and its last operations. */
  ASSERT_OK(mgpu_channel_send(ch, src, 0, 64, ss));
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_channel_send(ch, src, 64, 32, ss));
  ASSERT_DETAIL_HAS("no room");
  ASSERT_DETAIL_HAS("for 80 ms");
  ASSERT_DETAIL_HAS("device 1 (last: channel_recv 64 B");
  /* Nothing was sent by the failed call: one message comes out, then the
   * channel takes the next send. */
  ASSERT_OK(mgpu_channel_recv(ch, dst, 0, &n, ds));
  ASSERT_EQ(n, 64);
  ASSERT_OK(mgpu_channel_send_timeout(ch, src, 64, 32, ss, -1));
  ASSERT_OK(mgpu_channel_recv_timeout(ch, dst, 64, &n, ds, 1000));
  ASSERT_EQ(n, 32);
  ASSERT_OK(mgpu_stream_synchronize(ds));
  unsigned char got[96];
  ASSERT_OK(mgpu_memcpy_dtoh(got, dst, 0, 96));
  for (int i = 0; i < 96; i++) ASSERT_EQ(got[i], 7);
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_stream_destroy(ss));
  ASSERT_OK(mgpu_stream_destroy(ds));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Reads the whole of f (rewound) into a fresh string. */
static char *slurp(FILE *f) {
  long len = ftell(f);
  ASSERT(len >= 0);
  rewind(f);
  char *text = calloc(1, (size_t)len + 1);
  ASSERT(text != NULL);
  ASSERT(fread(text, 1, (size_t)len, f) == (size_t)len);
  return text;
}

static int count_lines(const char *text) {
  int n = 0;
  for (; *text; text++) n += *text == '\n';
  return n;
}

TEST_IMPL(flight_recorder) {
  int ndev = test_init();
  int dev = ndev > 2 ? 2 : ndev - 1;
  mgpu_buffer *buf;
  mgpu_stream *s;
  ASSERT_OK(mgpu_malloc(&buf, dev, 4096));
  ASSERT_OK(mgpu_stream_create(&s, dev));
  unsigned char host[4096] = {0};
  ASSERT_OK(mgpu_memcpy_htod_async(buf, 0, host, 4096, s));
  float two = 2.0f;
  ASSERT_OK(mgpu_fill(s, buf, 0, 1000, MGPU_FLOAT32, &two));
  ASSERT_OK(mgpu_stream_synchronize(s));
  FILE *f = tmpfile();
  ASSERT(f != NULL);
  ASSERT_OK(mgpu_flight_recorder_dump(f, dev));
  char *text = slurp(f);
  char head[64];
  snprintf(head, sizeof head, "device %d: 2 operation(s)", dev);
  ASSERT(strstr(text, head) != NULL);
  char *copy = strstr(text, "memcpy_htod_async");
  char *fill = strstr(text, "kernel fill");
  ASSERT(copy != NULL && fill != NULL && copy < fill); /* oldest first */
  ASSERT(strstr(copy, "4096 B") != NULL && strstr(fill, "1000 B") != NULL);
  char stream[32];
  snprintf(stream, sizeof stream, "%p", (void *)s);
  ASSERT(strstr(copy, stream) != NULL);
  free(text);
  /* The ring keeps the last MGPU_FLIGHT_RECORDER_OPS, numbered on. */
  for (int i = 0; i < 100; i++)
    ASSERT_OK(mgpu_memset_async(buf, (size_t)i, 1, 1, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  rewind(f);
  ASSERT(ftruncate(fileno(f), 0) == 0);
  ASSERT_OK(mgpu_flight_recorder_dump(f, dev));
  text = slurp(f);
  ASSERT_EQ(count_lines(text), 1 + MGPU_FLIGHT_RECORDER_OPS);
  ASSERT(strstr(text, "#101 ") != NULL && strstr(text, "#37 ") == NULL);
  ASSERT(strstr(text, "memcpy_htod_async") == NULL);
  free(text);
  /* -1: every device that recorded something. */
  rewind(f);
  ASSERT(ftruncate(fileno(f), 0) == 0);
  ASSERT_OK(mgpu_flight_recorder_dump(f, -1));
  text = slurp(f);
  snprintf(head, sizeof head, "device %d: 102 operation(s)", dev);
  ASSERT(strstr(text, head) != NULL);
  free(text);
  ASSERT_ERR(MGPU_EINVAL, mgpu_flight_recorder_dump(NULL, 0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_flight_recorder_dump(f, MGPU_MAX_DEVICES));
  fclose(f);
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(buf));
  /* A new init starts with empty rings. */
  ASSERT_OK(mgpu_shutdown());
  test_init();
  char out[128];
  ASSERT(strcmp(mgpu__flight_format(dev, 3, out, sizeof out),
                "no operation recorded") == 0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- cycles of mgpu_run_on_device ---- */

static int noop(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return 5;
}

/* arg: the devices still to call, -1-terminated; the last calls noop. */
static int call_next(int dev, void *arg) {
  (void)dev;
  const int *next = arg;
  if (next[0] < 0) return 5;
  return mgpu_run_on_device(next[0], call_next, (void *)(next + 1));
}

/* On device 1: runs something on device 0, whose host thread waits for
 * this one. */
static int back_to_zero(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return mgpu_run_on_device(0, noop, NULL);
}

static int async_to_one(int dev, void *arg) {
  (void)dev;
  (void)arg;
  mgpu_work *w;
  int rc = mgpu_run_on_device_async(1, back_to_zero, NULL, &w);
  return rc != 0 ? rc : mgpu_work_wait(w);
}

static atomic_int zero_ran;

static int count_zero(int dev, void *arg) {
  (void)dev;
  (void)arg;
  atomic_fetch_add(&zero_ran, 1);
  return 0;
}

TEST_IMPL(run_on_device_cycle) {
  deadline_s(30);
  if (test_init() < 3) return TEST_SKIP;
  /* 0 -> 1 -> 0: the inner call fails, nothing hangs. */
  int two[] = {1, 0, -1};
  ASSERT_ERR(MGPU_EDEADLK, mgpu_run_on_device(0, call_next, two));
  ASSERT_DETAIL_HAS("device 1: its host thread would wait for device 0's");
  ASSERT_DETAIL_HAS("1 -> 0 -> 1");
  /* 0 -> 1 -> 2 -> 0 */
  int three[] = {1, 2, 0, -1};
  ASSERT_ERR(MGPU_EDEADLK, mgpu_run_on_device(0, call_next, three));
  ASSERT_DETAIL_HAS("device 2");
  ASSERT_DETAIL_HAS("2 -> 0 -> 1 -> 2");
  /* Through an asynchronous call and mgpu_work_wait: either device 1's
   * call for device 0 is refused (device 0 already waits), or device 0's
   * mgpu_work_wait is (device 1's call came first); the refused wait spends
   * the handle, and the work still runs. The detail travels back with the
   * result either way. */
  for (int round = 0; round < 20; round++) {
    ASSERT_EQ(mgpu_run_on_device(0, async_to_one, NULL), MGPU_EDEADLK);
    ASSERT(strstr(mgpu_error_detail(), "1 -> 0 -> 1") != NULL ||
           strstr(mgpu_error_detail(), "0 -> 1 -> 0") != NULL);
  }
  /* Everything queued has run: a function queued now on each device runs. */
  atomic_store(&zero_ran, 0);
  ASSERT_OK(mgpu_run_on_device(1, count_zero, NULL));
  ASSERT_OK(mgpu_run_on_device(0, count_zero, NULL));
  ASSERT_EQ(atomic_load(&zero_ran), 2);
  /* Chains without a cycle run, and the marks left behind are clear. */
  int chain[] = {1, 2, 3, -1};
  ASSERT_EQ(mgpu_run_on_device(0, call_next, chain), 5);
  int back[] = {2, 1, 0, -1};
  ASSERT_EQ(mgpu_run_on_device(3, call_next, back), 5);
  for (int i = 0; i < 200; i++) {
    int hop[] = {1, -1};
    ASSERT_EQ(mgpu_run_on_device(0, call_next, hop), 5);
    int hop2[] = {0, -1};
    ASSERT_EQ(mgpu_run_on_device(1, call_next, hop2), 5);
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Two host threads closing one cycle at the same time: one of the two
 * sees the other and fails, the other's call runs. */
typedef struct race_arg {
  int from, to;
  int rc;
} race_arg;

static atomic_int race_go, race_ready;

static int race_inner(int dev, void *arg) {
  race_arg *a = arg;
  (void)dev;
  atomic_fetch_add(&race_ready, 1);
  while (atomic_load(&race_go) == 0) sched_yield();
  a->rc = mgpu_run_on_device(a->to, noop, NULL);
  return 0;
}

static void *race_thread(void *p) {
  race_arg *a = p;
  mgpu_run_on_device(a->from, race_inner, a);
  return NULL;
}

TEST_IMPL(run_on_device_cycle_race) {
  deadline_s(60);
  if (test_init() < 2) return TEST_SKIP;
  for (int round = 0; round < 50; round++) {
    race_arg a = {0, 1, 1}, b = {1, 0, 1};
    atomic_store(&race_go, 0);
    atomic_store(&race_ready, 0);
    pthread_t ta, tb;
    ASSERT(pthread_create(&ta, NULL, race_thread, &a) == 0);
    ASSERT(pthread_create(&tb, NULL, race_thread, &b) == 0);
    /* Both host threads run race_inner: their calls close one cycle. */
    while (atomic_load(&race_ready) < 2) sched_yield();
    atomic_store(&race_go, 1);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ASSERT(a.rc == 5 || a.rc == MGPU_EDEADLK);
    ASSERT(b.rc == 5 || b.rc == MGPU_EDEADLK);
    ASSERT(a.rc == MGPU_EDEADLK || b.rc == MGPU_EDEADLK);
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- mgpu_shutdown from the library's threads ---- */

static int shutdown_rc;
static char shutdown_detail[1024];

static void try_shutdown(void) {
  shutdown_rc = mgpu_shutdown();
  snprintf(shutdown_detail, sizeof shutdown_detail, "%s",
           mgpu_error_detail());
}

static int shutdown_fn(int dev, void *arg) {
  (void)dev;
  (void)arg;
  try_shutdown();
  return 0;
}

static void shutdown_callback(void *arg) {
  (void)arg;
  try_shutdown();
}

static int shutdown_task(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  (void)arg;
  try_shutdown();
  return 0;
}

TEST_IMPL(shutdown_from_library_threads) {
  deadline_s(60);
  test_init();
  shutdown_rc = 0;
  ASSERT_OK(mgpu_run_on_device(0, shutdown_fn, NULL));
  ASSERT_EQ(shutdown_rc, MGPU_EBUSY);
  ASSERT(strstr(shutdown_detail, "host thread") != NULL);
  ASSERT(mgpu_is_initialized());

  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  shutdown_rc = 0;
  ASSERT_OK(mgpu_stream_add_callback(s, shutdown_callback, NULL));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_EQ(shutdown_rc, MGPU_EBUSY);
  ASSERT(strstr(shutdown_detail, "stream callback") != NULL);
  ASSERT_OK(mgpu_stream_destroy(s));

  mgpu_pool *pool;
  ASSERT_OK(mgpu_pool_create(&pool, NULL));
  shutdown_rc = 0;
  ASSERT_OK(mgpu_pool_submit_fn(pool, shutdown_task, NULL, NULL));
  ASSERT_OK(mgpu_pool_wait_all(pool));
  ASSERT_EQ(shutdown_rc, MGPU_EBUSY);
  ASSERT(strstr(shutdown_detail, "task pool worker") != NULL);
  ASSERT_OK(mgpu_pool_destroy(pool));

  /* Still usable, and the program's own thread shuts it down. */
  mgpu_buffer *buf;
  ASSERT_OK(mgpu_malloc(&buf, 0, 64));
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_shutdown());
  ASSERT(!mgpu_is_initialized());
  return 0;
}

/* ---- stream creation beside mgpu_device_synchronize ---- */

static atomic_int stream_made;
static atomic_int callback_saw;

/* A callback that waits (at most 10 s) for the main thread to create a
 * stream of the same device. */
static void wait_for_main(void *arg) {
  (void)arg;
  for (int i = 0; i < 10000 && !atomic_load(&stream_made); i++) usleep(1000);
  atomic_store(&callback_saw, atomic_load(&stream_made) ? 1 : -1);
}

static void *sync_thread(void *arg) {
  (void)arg;
  ASSERT_OK(mgpu_device_synchronize(0));
  return NULL;
}

TEST_IMPL(stream_create_beside_device_synchronize) {
  deadline_s(60);
  test_init();
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  atomic_store(&stream_made, 0);
  atomic_store(&callback_saw, 0);
  ASSERT_OK(mgpu_stream_add_callback(s, wait_for_main, NULL));
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, sync_thread, NULL) == 0);
  usleep(20000); /* the other thread is (most likely) in synchronize */
  /* Before, creation waited for the synchronize, which waited for the
   * callback, which waited for this creation. */
  mgpu_stream *fresh;
  ASSERT_OK(mgpu_stream_create(&fresh, 0));
  atomic_store(&stream_made, 1);
  pthread_join(t, NULL);
  ASSERT_EQ(atomic_load(&callback_saw), 1);
  ASSERT_OK(mgpu_stream_destroy(fresh));
  ASSERT_OK(mgpu_stream_destroy(s));
  /* Streams destroyed while another thread synchronizes the device. */
  for (int round = 0; round < 20; round++) {
    mgpu_stream *many[8];
    for (int i = 0; i < 8; i++) {
      ASSERT_OK(mgpu_stream_create(&many[i], 0));
      ASSERT_OK(mgpu_stream_add_callback(many[i], wait_for_main, NULL));
    }
    ASSERT(pthread_create(&t, NULL, sync_thread, NULL) == 0);
    for (int i = 0; i < 8; i++) ASSERT_OK(mgpu_stream_destroy(many[i]));
    pthread_join(t, NULL);
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- a thread that ends inside a group ---- */

typedef struct group_arg {
  mgpu_comm *comm;
  mgpu_buffer *buf;
  mgpu_stream *stream;
} group_arg;

static void *group_thread(void *p) {
  group_arg *a = p;
  ASSERT_OK(mgpu_group_begin());
  /* Calls that pass their checks are recorded in the thread's group (which
   * allocates its list); the thread ends before mgpu_group_end. */
  for (int i = 0; i < 40; i++)
    ASSERT_OK(mgpu_allreduce(a->comm, 0, a->buf, a->buf, 4, MGPU_FLOAT32,
                             MGPU_SUM, a->stream));
  return NULL;
}

TEST_IMPL(thread_ends_inside_group) {
  /* Without the release at thread exit, LeakSanitizer (the ASan build)
   * reports the group's recorded calls. */
  if (test_init() < 2) return TEST_SKIP;
  int devs[2] = {0, 1};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  mgpu_buffer *buf;
  mgpu_stream *s;
  mark_device(0, &buf, &s);
  group_arg a = {comm, buf, s};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, group_thread, &a) == 0);
  pthread_join(t, NULL);
  /* Nothing was issued: the communicator is idle and goes away. */
  ASSERT_OK(mgpu_comm_destroy(comm));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(buf));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(timeout_config_checked)
TEST_ENTRY(barrier_takes_mgpu_timeout)
TEST_ENTRY(collective_takes_mgpu_timeout)
TEST_ENTRY(channel_waits_end)
TEST_ENTRY(flight_recorder)
TEST_ENTRY(run_on_device_cycle)
TEST_ENTRY(run_on_device_cycle_race)
TEST_ENTRY(shutdown_from_library_threads)
TEST_ENTRY(stream_create_beside_device_synchronize)
TEST_ENTRY(thread_ends_inside_group)
TEST_LIST_END
