/* The failure-injection registry (src/util/fault.c): the spec syntax, which
 * call of each kind fails, the counters a sweep reads, thread safety, and
 * the library's own thread-creation site. */
#include <malloc.h>
#include <pthread.h>
#include <sys/types.h>

#include "alloc-sweep.h"
#include "task.h"
#include "util/fault.h"
#include "util/thread.h"

static char why[256];

TEST_IMPL(fault_spec_syntax) {
  const char *good[] = {"", "alloc:1", "alloc:17+", "backend:3",
                        "backend:memcpy:3", "backend:memcpy:3+", "thread:2",
                        "seed:42@p:0.01", "seed:0@p:1", "device:2@after:100",
                        "device:0@after:0", "alloc:5,thread:1,backend:launch:2",
                        "stall:barrier_release@us:300", "stall:x@us:0"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    if (mgpu__fault_set(good[i], why, sizeof why) != 0) {
      fprintf(stderr, "rejected \"%s\": %s\n", good[i], why);
      ASSERT(0);
    }
    ASSERT_EQ(mgpu__fault_armed(), good[i][0] != '\0');
  }
  const char *bad[] = {"alloc", "alloc:", "alloc:0", "alloc:x", "alloc:1x",
                       "alloc:+", "alloc:99999999999999999999", "thread:-1",
                       "backend:", "backend:memcpy:", "backend:MemCpy:1",
                       "backend::1", "seed:1", "seed:1@p:", "seed:1@p:1.5",
                       "seed:1@p:-0.1", "seed:1@p:nan", "seed:x@p:0.1",
                       "device:2", "device:2@after:", "device:x@after:1",
                       "device:99999@after:1", "disk:1", "alloc:1,", ",alloc:1",
                       "alloc:1,,thread:1", "backend:an_operation_name_too_long:1",
                       "stall:", "stall:x", "stall:x@us:", "stall:X@us:1",
                       "stall:@us:1", "stall:x@us:1000001", "stall:x@ms:1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ASSERT_OK(mgpu__fault_set("alloc:1", NULL, 0));
    if (mgpu__fault_set(bad[i], why, sizeof why) != MGPU_EINVAL) {
      fprintf(stderr, "accepted \"%s\"\n", bad[i]);
      ASSERT(0);
    }
    ASSERT(strstr(why, "rule") != NULL);
    ASSERT_EQ(mgpu__fault_armed(), 0); /* a bad spec clears the rules */
  }
  /* Seventeen rules are one too many. */
  char many[256] = "";
  for (int i = 0; i < MGPU__FAULT_MAX_RULES + 1; i++)
    strcat(many, i ? ",alloc:1" : "alloc:1");
  ASSERT_EQ(mgpu__fault_set(many, why, sizeof why), MGPU_EINVAL);
  ASSERT(strstr(why, "more than") != NULL);
  return 0;
}

TEST_IMPL(fault_alloc_nth) {
  ASSERT_OK(mgpu__fault_set("alloc:3", NULL, 0));
  void *p[6];
  for (int i = 0; i < 6; i++) p[i] = mgpu__malloc(16);
  for (int i = 0; i < 6; i++) ASSERT_EQ(p[i] == NULL, i == 2);
  for (int i = 0; i < 6; i++) mgpu__free(p[i]);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_ALLOC), 6);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), 1);

  /* Every entry of the seam is a site of the same count. */
  ASSERT_OK(mgpu__fault_set("alloc:2+", NULL, 0));
  char *s = mgpu__strdup("abc");
  ASSERT(s != NULL && strcmp(s, "abc") == 0);
  ASSERT(mgpu__calloc(4, 4) == NULL);
  ASSERT(mgpu__realloc(s, 64) == NULL); /* s is still ours */
  ASSERT(mgpu__aligned_alloc(64, 100) == NULL);
  ASSERT(mgpu__strdup("x") == NULL);
  ASSERT(mgpu__malloc(1) == NULL);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_ALLOC), 6);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), 5);
  mgpu__free(s);

  /* Cleared: nothing fails, counting goes on from 0. */
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  void *a = mgpu__aligned_alloc(4096, 10);
  ASSERT(a != NULL && ((uintptr_t)a & 4095) == 0);
  void *z = mgpu__calloc(8, 8);
  ASSERT(z != NULL && ((char *)z)[63] == 0);
  z = mgpu__realloc(z, 1024);
  ASSERT(z != NULL);
  mgpu__free(a);
  mgpu__free(z);
  mgpu__free(NULL);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_ALLOC), 3);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), 0);
  return 0;
}

TEST_IMPL(fault_backend_ops) {
  /* backend:memcpy:2 counts memcpy calls only; backend:5 counts them all. */
  ASSERT_OK(mgpu__fault_set("backend:memcpy:2,backend:5", NULL, 0));
  const char *ops[] = {"memcpy", "launch", "memcpy", "memset", "launch",
                       "memcpy", "launch"};
  int expect[] = {0, 0, 1, 0, 1, 0, 0};
  for (int i = 0; i < 7; i++)
    ASSERT_EQ(mgpu__fault_hit(MGPU__FAULT_BACKEND, ops[i]), expect[i]);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_BACKEND), 7);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_BACKEND), 2);
  /* Other kinds count apart and do not fail. */
  ASSERT_EQ(mgpu__fault_hit(MGPU__FAULT_THREAD, NULL), 0);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_THREAD), 1);

  ASSERT_OK(mgpu__fault_set("backend:launch:2+", NULL, 0));
  int launch_fails = 0;
  for (int i = 0; i < 7; i++)
    launch_fails += mgpu__fault_hit(MGPU__FAULT_BACKEND, ops[i]);
  ASSERT_EQ(launch_fails, 2); /* the 2nd and 3rd launch */
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return 0;
}

TEST_IMPL(fault_random_seed) {
  /* The same seed fails the same calls; about p of them fail. */
  int first[4000], fails = 0;
  ASSERT_OK(mgpu__fault_set("seed:7@p:0.1", NULL, 0));
  for (int i = 0; i < 4000; i++) fails += first[i] = mgpu__fault_hit(MGPU__FAULT_ALLOC, NULL);
  ASSERT(fails > 300 && fails < 500);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), fails);
  ASSERT_OK(mgpu__fault_set("seed:7@p:0.1", NULL, 0));
  for (int i = 0; i < 4000; i++)
    ASSERT_EQ(mgpu__fault_hit(MGPU__FAULT_ALLOC, NULL), first[i]);
  ASSERT_OK(mgpu__fault_set("seed:8@p:0.1", NULL, 0));
  int same = 0;
  for (int i = 0; i < 4000; i++)
    same += mgpu__fault_hit(MGPU__FAULT_ALLOC, NULL) == first[i];
  ASSERT(same < 4000);
  ASSERT_OK(mgpu__fault_set("seed:1@p:0", NULL, 0));
  for (int i = 0; i < 1000; i++) ASSERT_EQ(mgpu__fault_hit(MGPU__FAULT_BACKEND, "x"), 0);
  ASSERT_OK(mgpu__fault_set("seed:1@p:1", NULL, 0));
  for (int i = 0; i < 1000; i++) ASSERT_EQ(mgpu__fault_hit(MGPU__FAULT_THREAD, NULL), 1);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return 0;
}

TEST_IMPL(fault_device_after) {
  ASSERT_EQ(mgpu__fault_device_op(2), 0); /* unarmed */
  ASSERT_OK(mgpu__fault_set("device:2@after:3,device:0@after:0", NULL, 0));
  for (int i = 0; i < 3; i++) ASSERT_EQ(mgpu__fault_device_op(2), 0);
  ASSERT_EQ(mgpu__fault_device_op(2), 1);
  ASSERT_EQ(mgpu__fault_device_op(2), 1); /* lost stays lost */
  ASSERT_EQ(mgpu__fault_device_op(0), 1);
  for (int i = 0; i < 10; i++) ASSERT_EQ(mgpu__fault_device_op(1), 0);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return 0;
}

enum { THREADS = 4, PER_THREAD = 20000 };

static void *alloc_loop(void *arg) {
  int *nulls = arg;
  for (int i = 0; i < PER_THREAD; i++) {
    void *p = mgpu__malloc(8);
    if (p == NULL) (*nulls)++;
    mgpu__free(p);
  }
  return NULL;
}

/* Concurrent sites count every call once and fail exactly the calls the
 * rule names (run under TSan in CI). */
TEST_IMPL(fault_threads_count) {
  ASSERT_OK(mgpu__fault_set("alloc:1000,alloc:40001+", NULL, 0));
  pthread_t t[THREADS];
  int nulls[THREADS] = {0};
  for (int i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, alloc_loop, &nulls[i]), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  int total = 0;
  for (int i = 0; i < THREADS; i++) total += nulls[i];
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_ALLOC), THREADS * PER_THREAD);
  ASSERT_EQ(total, 1 + (THREADS * PER_THREAD - 40000));
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), total);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return 0;
}

static void *nothing(void *arg) { return arg; }

/* Thread creation is a site: the library's wrapper fails as pthread_create
 * would, and mgpu_init reports the failed start as an error with a detail,
 * then works once the fault is gone. */
TEST_IMPL(fault_thread_site) {
  ASSERT_OK(mgpu__fault_set("thread:2", NULL, 0));
  mgpu__thread th;
  ASSERT_EQ(mgpu__thread_create(&th, nothing, NULL), 0);
  mgpu__thread_join(th);
  ASSERT(mgpu__thread_create(&th, nothing, NULL) != 0);
  ASSERT_EQ(mgpu__thread_create(&th, nothing, NULL), 0);
  mgpu__thread_join(th);

  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_OK(mgpu_shutdown());
  uint64_t threads = mgpu__fault_calls(MGPU__FAULT_THREAD);
  ASSERT(threads > 0);
  printf("mgpu_init starts %llu threads\n", (unsigned long long)threads);
  for (uint64_t n = 1; n <= threads; n++) {
    char spec[32];
    snprintf(spec, sizeof spec, "thread:%llu", (unsigned long long)n);
    ASSERT_OK(mgpu__fault_set(spec, NULL, 0));
    int rc = mgpu_init(NULL);
    ASSERT(rc < 0);
    ASSERT(mgpu_error_detail()[0] != '\0');
    ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_THREAD), 1);
    ASSERT_EQ(mgpu_device_count(), MGPU_ENOINIT); /* nothing half-started */
  }
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  test_init();
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Every fallible backend call is a site named after its operation: a copy
 * whose backend call is made to fail returns MGPU_EBACKEND with a detail
 * naming the operation, and the next one works. */
TEST_IMPL(fault_backend_site) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  test_init();
  mgpu_stream *s;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&b, 0, 64));
  char host[64] = "abc", back[64] = "";
  ASSERT_OK(mgpu__fault_set("backend:memcpy_async:1", NULL, 0));
  ASSERT_ERR(MGPU_EBACKEND, mgpu_memcpy_htod_async(b, 0, host, 64, s));
  ASSERT_DETAIL_HAS("memcpy_async");
  ASSERT_DETAIL_HAS("injected");
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_BACKEND), 1);
  ASSERT_OK(mgpu_memcpy_htod_async(b, 0, host, 64, s));
  ASSERT_OK(mgpu_memcpy_dtoh_async(back, b, 0, 64, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT(strcmp(back, "abc") == 0);
  ASSERT(mgpu__fault_calls(MGPU__FAULT_BACKEND) >= 3);
  /* A failed stream creation leaves nothing behind. */
  ASSERT_OK(mgpu__fault_set("backend:stream_create:1", NULL, 0));
  mgpu_stream *s2;
  ASSERT_ERR(MGPU_EBACKEND, mgpu_stream_create(&s2, 1 % mgpu_device_count()));
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* A channel send whose publishing event cannot be recorded is not sent and
 * leaves no copy in flight: destroying the channel right after must not
 * free the slots under the copy (a use after free under ASan before). The
 * same for a receive. Pinned host buffers at both ends keep both calls on
 * the queued path, the one that records events (the small path copies
 * device memory by hand and records none). */
TEST_IMPL(fault_channel_record) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  int n = test_init();
  int dst = n > 1 ? 1 : 0;
  mgpu_stream *ss, *ds;
  mgpu_buffer *src, *out;
  mgpu_channel *ch;
  ASSERT_OK(mgpu_stream_create(&ss, 0));
  ASSERT_OK(mgpu_stream_create(&ds, dst));
  ASSERT_OK(mgpu_malloc_host(&src, 0, 1 << 20));
  ASSERT_OK(mgpu_malloc_host(&out, dst, 1 << 20));
  for (int round = 0; round < 2; round++) {
    ASSERT_OK(mgpu_channel_create(0, dst, 1 << 20, 2, &ch));
    if (round == 1) { /* one message in, so the receive has one to take */
      ASSERT_OK(mgpu_channel_send(ch, src, 0, 1 << 20, ss));
      ASSERT_OK(mgpu_stream_synchronize(ss));
    }
    ASSERT_OK(mgpu__fault_set("backend:event_record:1", NULL, 0));
    if (round == 0) {
      ASSERT_ERR(MGPU_EBACKEND, mgpu_channel_send(ch, src, 0, 1 << 20, ss));
    } else {
      size_t got = 0;
      ASSERT_ERR(MGPU_EBACKEND, mgpu_channel_recv(ch, out, 0, &got, ds));
      ASSERT_EQ(got, 0);
    }
    ASSERT_DETAIL_HAS(round == 0 ? "not sent" : "not taken");
    ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
    ASSERT_OK(mgpu_channel_destroy(ch));
  }
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(out));
  ASSERT_OK(mgpu_stream_destroy(ss));
  ASSERT_OK(mgpu_stream_destroy(ds));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* MGPU_FAULT (and mgpu_config.fault) is read by mgpu_init: a bad rule is
 * refused naming the variable, a good one applies from init on. */
TEST_IMPL(fault_env_variable) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  setenv("MGPU_FAULT", "alloc:0", 1);
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(NULL));
  ASSERT_DETAIL_HAS("MGPU_FAULT");
  ASSERT_DETAIL_HAS("alloc:0");
  ASSERT_EQ(mgpu_is_initialized(), 0);
  setenv("MGPU_FAULT", "thread:1", 1);
  int rc = mgpu_init(NULL);
  ASSERT(rc < 0);
  ASSERT(mgpu_error_detail()[0] != '\0');
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_THREAD), 1);
  unsetenv("MGPU_FAULT");
  /* The field wins over the environment; "" clears the rules. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.fault = "backend:stream_create:1";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *st;
  ASSERT_ERR(MGPU_EBACKEND, mgpu_stream_create(&st, 0));
  ASSERT_OK(mgpu_stream_create(&st, 0));
  ASSERT_OK(mgpu_stream_destroy(st));
  ASSERT_OK(mgpu_shutdown());
  cfg.fault = "";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu__fault_armed(), 0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

typedef struct group_exit_arg {
  mgpu_comm *comm;
  mgpu_buffer *buf;
  mgpu_stream *stream;
  int rc;
} group_exit_arg;

static void *group_then_exit(void *p) {
  group_exit_arg *a = p;
  mgpu_group_begin();
  a->rc = mgpu_allreduce(a->comm, 0, a->buf, a->buf, 4, MGPU_FLOAT32,
                         MGPU_SUM, a->stream);
  return NULL; /* exits inside the group */
}

/* A thread that exits between mgpu_group_begin and mgpu_group_end does not
 * leak the calls it recorded: 200 such threads leaked about 350 KB of the
 * heap before (LeakSanitizer misses it: the pointer stays in the dead
 * thread's cached TLS). Nothing of the group was issued. */
TEST_IMPL(fault_group_thread_exit) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  int n = test_init();
  if (n < 2) return TEST_SKIP;
  int devs[2] = {0, 1};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  group_exit_arg a = {comm, NULL, NULL, -1};
  ASSERT_OK(mgpu_malloc(&a.buf, 0, 64));
  ASSERT_OK(mgpu_stream_create(&a.stream, 0));
  size_t before = 0;
  for (int i = 0; i < 250; i++) {
    /* After 50 threads: the allocator's per-thread setup is done by then. */
    if (i == 50) before = mallinfo2().uordblks;
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, group_then_exit, &a), 0);
    pthread_join(th, NULL);
    ASSERT_OK(a.rc);
  }
  size_t after = mallinfo2().uordblks; /* 0 under ASan: no check there */
  printf("heap in use grew by %zd bytes over 200 threads\n",
         (ssize_t)(after - before));
  ASSERT(after < before + 64 * 1024);
  ASSERT_OK(mgpu_stream_synchronize(a.stream)); /* nothing was queued */
  ASSERT_OK(mgpu_comm_destroy(comm));
  ASSERT_OK(mgpu_free(a.buf));
  ASSERT_OK(mgpu_stream_destroy(a.stream));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

static void fail_in_block_2(const mgpu_kernel_ctx *ctx, const void *args) {
  int *ran = *(int *const *)args;
  ran[ctx->block_idx.x] = 1;
  if (ctx->block_idx.x == 2)
    mgpu_kernel_fail(ctx, MGPU_ERANGE, "index 42 out of bounds");
}
static const mgpu_kernel failing_kernel = {"failing", fail_in_block_2, NULL, NULL};

/* A host kernel variant can fail: the launch call succeeds (it is
 * asynchronous), the blocks after the failing one do not run, and the next
 * synchronize returns the code with a detail naming device, kernel, block and
 * message; the stream works again afterwards. */
TEST_IMPL(fault_host_kernel_fails) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  test_init();
  if (!test_device_is_host(0)) return TEST_SKIP;
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  static int ran[5];
  int *ptr = ran;
  ASSERT_OK(mgpu_launch(s, &failing_kernel, MGPU_DIM3(5, 1, 1),
                        MGPU_DIM3(1, 1, 1), &ptr, sizeof ptr));
  ASSERT_ERR(MGPU_ERANGE, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("kernel 'failing' failed in block (2, 0, 0)");
  ASSERT_DETAIL_HAS("index 42 out of bounds");
  ASSERT_EQ(ran[0] + ran[1] + ran[2], 3);
  ASSERT_EQ(ran[3] + ran[4], 0);
  ASSERT_OK(mgpu_stream_synchronize(s)); /* reported once */
  mgpu_kernel_ctx none = {{0, 0, 0}, {1, 1, 1}, {1, 1, 1}, 0};
  ASSERT_ERR(MGPU_EINVAL, mgpu_kernel_fail(&none, MGPU_ERANGE, "outside"));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* An mgpu_malloc of 4 KiB on device 0 into *arg, which stays NULL when it
 * fails. */
static int malloc_4k(void *arg) {
  mgpu_buffer **b = arg;
  *b = NULL;
  int rc = mgpu_malloc(b, 0, 4096);
  if (rc != 0) ASSERT(*b == NULL);
  return rc;
}

static void free_4k(void *arg) { ASSERT_OK(mgpu_free(*(mgpu_buffer **)arg)); }

/* Host device memory is allocated through the allocation seam: failing
 * each allocation of an mgpu_malloc in turn reaches the host backend's own
 * (its detail says the system refused the bytes), and every failure leaves
 * no buffer behind. */
TEST_IMPL(fault_host_memory_is_a_site) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_buffer *b = NULL;
  ASSERT_EQ(test_alloc_sweep(malloc_4k, free_4k, &b, "the system refused"),
            1);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(fault_spec_syntax)
TEST_ENTRY(fault_alloc_nth)
TEST_ENTRY(fault_backend_ops)
TEST_ENTRY(fault_random_seed)
TEST_ENTRY(fault_device_after)
TEST_ENTRY(fault_threads_count)
TEST_ENTRY(fault_thread_site)
TEST_ENTRY(fault_backend_site)
TEST_ENTRY(fault_channel_record)
TEST_ENTRY(fault_env_variable)
TEST_ENTRY(fault_group_thread_exit)
TEST_ENTRY(fault_host_kernel_fails)
TEST_ENTRY(fault_host_memory_is_a_site)
TEST_LIST_END
