/* Lost devices: a host device lost by the test call (as a GPU's sticky error
 * would lose it) or by MGPU_FAULT=device:N@after:K fails its queued work and
 * refuses later work with MGPU_EDEVLOST naming it, mgpu_device_status says
 * so, the other devices go on, and the library shuts down and starts again
 * cleanly. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/core-internal.h"
#include "task.h"
#include "util/fault.h"

static void block_until(void *arg) {
  while (!atomic_load((atomic_int *)arg)) {
  }
}

TEST_IMPL(lost_device_fails_queued_and_later_work) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *s2, *s0;
  mgpu_buffer *b2, *b0;
  ASSERT_OK(mgpu_stream_create(&s2, 2));
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_malloc(&b2, 2, 4096));
  ASSERT_OK(mgpu_malloc(&b0, 0, 4096));
  unsigned char host[4096], back[4096];
  memset(host, 7, sizeof host);
  ASSERT_OK(mgpu_memset_async(b2, 0, 1, 4096, s2));
  ASSERT_OK(mgpu_stream_synchronize(s2));

  /* Work queued behind a blocked callback, then the device is lost. */
  atomic_int go = 0;
  ASSERT_OK(mgpu_stream_add_callback(s2, block_until, &go));
  ASSERT_OK(mgpu_memcpy_htod_async(b2, 0, host, sizeof host, s2));
  ASSERT_OK(mgpu_memset_async(b2, 0, 9, 16, s2));
  mgpu_device_state st = MGPU_DEVICE_LOST;
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  atomic_store(&go, 1);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s2));
  ASSERT_DETAIL_HAS("device 2");
  ASSERT_DETAIL_HAS("lost by the test");
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);

  /* Nothing queued ran: the buffer still holds what it held. */
  memcpy(back, mgpu_buffer_ptr(b2), sizeof back);
  for (size_t i = 0; i < sizeof back; i++) ASSERT_EQ(back[i], 1);

  /* Later work is refused at once, naming the device. */
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_memcpy_htod_async(b2, 0, host, 64, s2));
  ASSERT_DETAIL_HAS("device 2 was lost");
  mgpu_buffer *more;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_malloc(&more, 2, 64));
  mgpu_stream *s2b;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_create(&s2b, 2));
  float one = 1;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_fill(s2, b2, 0, 16, MGPU_FLOAT32, &one));

  /* The other devices go on. */
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu_memcpy_htod_async(b0, 0, host, sizeof host, s0));
  ASSERT_OK(mgpu_memcpy_dtoh_async(back, b0, 0, sizeof back, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT(memcmp(back, host, sizeof back) == 0);

  /* What belongs to the lost device is still released. */
  ASSERT_OK(mgpu_free(b2));
  ASSERT_OK(mgpu_stream_destroy(s2));
  ASSERT_OK(mgpu_free(b0));
  ASSERT_OK(mgpu_stream_destroy(s0));
  mgpu_shutdown();
  /* A new init opens a working device 2. */
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu_malloc(&b2, 2, 64));
  ASSERT_OK(mgpu_free(b2));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* MGPU_FAULT=device:1@after:3: device 1 runs three operations, then is
 * lost; the fourth and later fail. */
TEST_IMPL(lost_device_by_fault_rule) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  cfg.fault = "device:1@after:3";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *s;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s, 1));
  ASSERT_OK(mgpu_malloc(&b, 1, 8));
  memset(mgpu_buffer_ptr(b), 0, 8);
  int rc = 0;
  for (int i = 0; i < 6 && rc == 0; i++) {
    rc = mgpu_memset_async(b, (size_t)i, 5, 1, s);
    if (i < 3) ASSERT_OK(rc);
  }
  /* The worker may run ahead of this loop (a slow build, a busy machine):
   * the device is then lost before the last memsets are queued, and the
   * next one is refused at once instead of failing in the stream. */
  if (rc == 0) rc = mgpu_stream_synchronize(s);
  ASSERT_EQ(rc, MGPU_EDEVLOST);
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_DETAIL_HAS("device:1@after");
  mgpu_stream_synchronize(s); /* what was queued has run (or failed) */
  const unsigned char *p = mgpu_buffer_ptr(b);
  for (int i = 0; i < 6; i++) ASSERT_EQ(p[i], i < 3 ? 5 : 0);
  mgpu_device_state st;
  ASSERT_OK(mgpu_device_status(1, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_ERR(MGPU_EINVAL, mgpu_device_status(0, NULL));
  ASSERT_ERR(MGPU_ENODEV, mgpu_device_status(2, &st));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  mgpu_shutdown();
  cfg.fault = "";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- the task pool ---- */

enum { NTASKS = 60, LOSE = 1 };

typedef struct pool_case {
  mgpu_buffer *scratch[4]; /* one per device */
  atomic_int lost_once;
  atomic_int ran_on_lost_after;
  long result[NTASKS + 1];
  int where[NTASKS + 1];
} pool_case;

typedef struct task_arg {
  pool_case *pc;
  int i;
} task_arg;

/* Doubles i through the device: host -> device -> host on the task's
 * stream. The first task to run on device LOSE loses it first (as if the
 * GPU died under it), so its own copies fail. */
static int double_task(int dev, mgpu_stream *s, void *arg) {
  task_arg *a = arg;
  pool_case *pc = a->pc;
  if (dev == LOSE) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&pc->lost_once, &expected, 1)) {
      int rc = mgpu__device_lose(LOSE, "lost under a running task");
      if (rc != 0) return rc;
    } else {
      atomic_store(&pc->ran_on_lost_after, 1);
    }
  }
  long in = a->i, out = 0;
  int rc = mgpu_memcpy_htod_async(pc->scratch[dev], 0, &in, sizeof in, s);
  if (rc == 0) rc = mgpu_scale(s, pc->scratch[dev], 0, 1, MGPU_INT64, 2.0);
  if (rc == 0) rc = mgpu_memcpy_dtoh_async(&out, pc->scratch[dev], 0,
                                           sizeof out, s);
  if (rc == 0) rc = mgpu_stream_synchronize(s);
  if (rc != 0) return rc;
  pc->result[a->i] = out;
  pc->where[a->i] = dev;
  return 0;
}

/* Reads task 0's result, which exists only once task 0 succeeded. */
static int after_first(int dev, mgpu_stream *s, void *arg) {
  (void)s;
  task_arg *a = arg;
  a->pc->result[NTASKS] = a->pc->result[0] + 1;
  a->pc->where[NTASKS] = dev;
  return 0;
}

/* mgpu_init on n host devices and a scratch buffer on each. */
static void open_case(pool_case *pc, const char *devices, int n) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = devices;
  ASSERT_OK(mgpu_init(&cfg));
  memset(pc, 0, sizeof *pc);
  for (int d = 0; d < n; d++)
    ASSERT_OK(mgpu_malloc(&pc->scratch[d], d, sizeof(long)));
}

/* Submits after_first, depending on dep. */
static void submit_after(mgpu_pool *pool, mgpu_task dep, task_arg *arg,
                         mgpu_task *out) {
  mgpu_task_desc d = MGPU_TASK_DESC_INITIALIZER;
  d.fn = after_first;
  d.arg = arg;
  d.deps = &dep;
  d.ndeps = 1;
  ASSERT_OK(mgpu_pool_submit(pool, &d, out));
}

static const mgpu_sched_policy lost_policies[] = {
    MGPU_SCHED_WS, MGPU_SCHED_DYNAMIC, MGPU_SCHED_STATIC};

/* Device 1 is lost under a running re-runnable task: that task and every
 * task queued on device 1 run on the others, with correct results; a task
 * depending on the lost one waits for its re-run; nothing runs on device 1
 * afterwards. Under each policy. */
TEST_IMPL(pool_reruns_lost_device_tasks) {
  static pool_case pc;
  static task_arg args[NTASKS + 1];
  for (int k = 0; k < 3; k++) {
    open_case(&pc, "host:3", 3);
    mgpu_pool_opts o = MGPU_POOL_OPTS_INITIALIZER;
    o.policy = lost_policies[k];
    mgpu_pool *pool;
    ASSERT_OK(mgpu_pool_create(&pool, &o));
    mgpu_task first;
    for (int i = 0; i < NTASKS; i++) {
      args[i] = (task_arg){&pc, i};
      mgpu_task_desc t = MGPU_TASK_DESC_INITIALIZER;
      t.fn = double_task;
      t.arg = &args[i];
      t.rerunnable = 1;
      /* Task 0 and a third of the rest prefer the device that is lost. */
      if (i % 3 == 0) t.device = LOSE;
      ASSERT_OK(mgpu_pool_submit(pool, &t, i == 0 ? &first : NULL));
      if (i == 0) {
        args[NTASKS] = (task_arg){&pc, NTASKS};
        submit_after(pool, first, &args[NTASKS], NULL);
      }
    }
    ASSERT_OK(mgpu_pool_wait_all(pool));
    ASSERT_EQ(atomic_load(&pc.lost_once), 1);
    ASSERT_EQ(atomic_load(&pc.ran_on_lost_after), 0);
    for (int i = 0; i < NTASKS; i++) {
      ASSERT_EQ(pc.result[i], 2L * i);
      ASSERT(pc.where[i] != LOSE);
    }
    ASSERT_EQ(pc.result[NTASKS], 1); /* after task 0's re-run */
    mgpu_device_state st;
    ASSERT_OK(mgpu_device_status(LOSE, &st));
    ASSERT_EQ(st, MGPU_DEVICE_LOST);
    /* A task preferring the lost device, submitted now, runs elsewhere. */
    mgpu_task_desc t = MGPU_TASK_DESC_INITIALIZER;
    t.fn = double_task;
    args[5] = (task_arg){&pc, 5};
    t.arg = &args[5];
    t.device = LOSE;
    pc.where[5] = -1;
    mgpu_task h;
    ASSERT_OK(mgpu_pool_submit(pool, &t, &h));
    ASSERT_OK(mgpu_pool_wait(pool, h));
    ASSERT(pc.where[5] != LOSE && pc.where[5] >= 0);
    ASSERT_OK(mgpu_pool_destroy(pool));
    for (int d = 0; d < 3; d++) ASSERT_OK(mgpu_free(pc.scratch[d]));
    mgpu_shutdown();
  }
  return 0;
}

/* A task that is not re-runnable fails with MGPU_EDEVLOST naming the
 * device when its device is lost under it; its dependents fail too. */
TEST_IMPL(pool_lost_task_not_rerunnable_fails) {
  static pool_case pc;
  static task_arg arg, dep_arg;
  open_case(&pc, "host:2", 2);
  mgpu_pool *pool;
  mgpu_pool_opts o = MGPU_POOL_OPTS_INITIALIZER;
  o.policy = MGPU_SCHED_STATIC;
  ASSERT_OK(mgpu_pool_create(&pool, &o));
  arg = (task_arg){&pc, 3};
  mgpu_task_desc t = MGPU_TASK_DESC_INITIALIZER;
  t.fn = double_task;
  t.arg = &arg;
  t.device = LOSE;
  mgpu_task h, hd;
  ASSERT_OK(mgpu_pool_submit(pool, &t, &h));
  dep_arg = (task_arg){&pc, NTASKS};
  submit_after(pool, h, &dep_arg, &hd);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_pool_wait(pool, h));
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_ERR(MGPU_EDEPFAIL, mgpu_pool_wait(pool, hd));
  ASSERT_EQ(pc.result[NTASKS], 0);
  mgpu_pool_wait_all(pool); /* returns the failure once more */
  ASSERT_OK(mgpu_pool_destroy(pool));
  for (int d = 0; d < 2; d++) ASSERT_OK(mgpu_free(pc.scratch[d]));
  mgpu_shutdown();
  return 0;
}

/* The device lost by an injected sticky error ("=devlost") of the 4th
 * mgpu_scale, whichever device makes it: its tasks (re-runnable) finish on
 * the others with correct results, and only that device reads lost. */
TEST_IMPL(pool_reruns_after_injected_device_loss) {
  static pool_case pc;
  static task_arg args[NTASKS];
  open_case(&pc, "host:3", 3);
  atomic_store(&pc.lost_once, 1); /* double_task must not lose one itself */
  ASSERT_OK(mgpu__fault_set("backend:builtin:4=devlost", NULL, 0));
  mgpu_pool *pool;
  ASSERT_OK(mgpu_pool_create(&pool, NULL));
  for (int i = 0; i < NTASKS; i++) {
    args[i] = (task_arg){&pc, i};
    mgpu_task_desc t = MGPU_TASK_DESC_INITIALIZER;
    t.fn = double_task;
    t.arg = &args[i];
    t.rerunnable = 1;
    t.device = i % 3;
    ASSERT_OK(mgpu_pool_submit(pool, &t, NULL));
  }
  ASSERT_OK(mgpu_pool_wait_all(pool));
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  for (int i = 0; i < NTASKS; i++) ASSERT_EQ(pc.result[i], 2L * i);
  int lost = 0;
  for (int d = 0; d < 3; d++) {
    mgpu_device_state st;
    ASSERT_OK(mgpu_device_status(d, &st));
    lost += st == MGPU_DEVICE_LOST;
  }
  ASSERT_EQ(lost, 1);
  ASSERT_OK(mgpu_pool_destroy(pool));
  for (int d = 0; d < 3; d++) ASSERT_OK(mgpu_free(pc.scratch[d]));
  mgpu_shutdown();
  return 0;
}

/* ---- collectives and channels ---- */

typedef struct rank_arg {
  mgpu_comm *comm;
  mgpu_barrier *barrier;
  int rank;
  mgpu_buffer *buf;
  mgpu_stream *stream;
  int rc;
  char detail[256];
} rank_arg;

static void *allreduce_rank(void *p) {
  rank_arg *a = p;
  a->rc = mgpu_allreduce(a->comm, a->rank, a->buf, a->buf, 16, MGPU_FLOAT32,
                         MGPU_SUM, a->stream);
  snprintf(a->detail, sizeof a->detail, "%s", mgpu_error_detail());
  return NULL;
}

static void *barrier_rank(void *p) {
  rank_arg *a = p;
  a->rc = mgpu_barrier_wait(a->barrier, a->rank, 20000);
  snprintf(a->detail, sizeof a->detail, "%s", mgpu_error_detail());
  return NULL;
}

/* Runs fn for ranks 0 and 1 on threads of their own. */
static void start_ranks(rank_arg *ranks, pthread_t *th, void *(*fn)(void *)) {
  for (int r = 0; r < 2; r++)
    ASSERT_EQ(pthread_create(&th[r], NULL, fn, &ranks[r]), 0);
}

/* Joins them: both end with MGPU_EDEVLOST, their detail holding text, well
 * before their timeout of 20 s or more (counted from t0). */
static void join_ranks_lost(rank_arg *ranks, pthread_t *th, uint64_t t0,
                            const char *text) {
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  ASSERT((mgpu__now_ns() - t0) < 10000000000ull);
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ(ranks[r].rc, MGPU_EDEVLOST);
    ASSERT(strstr(ranks[r].detail, text) != NULL);
  }
}

/* A collective whose device 2 is lost ends on the other ranks with
 * MGPU_EDEVLOST naming it, at once, not at the communicator's 30 s timeout;
 * later calls on the communicator say so too. */
TEST_IMPL(collective_with_lost_device_ends) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  int devs[3] = {0, 1, 2};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 3, &comm));
  rank_arg ranks[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    ranks[r] = (rank_arg){.comm = comm, .rank = r};
    ASSERT_OK(mgpu_malloc(&ranks[r].buf, r, 64));
    ASSERT_OK(mgpu_stream_create(&ranks[r].stream, r));
  }
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  uint64_t t0 = mgpu__now_ns();
  start_ranks(ranks, th, allreduce_rank);
  join_ranks_lost(ranks, th, t0, "device 2 was lost");
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_allreduce(comm, 0, ranks[0].buf, ranks[0].buf,
                                           16, MGPU_FLOAT32, MGPU_SUM,
                                           ranks[0].stream));
  ASSERT_OK(mgpu_comm_destroy(comm));
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_free(ranks[r].buf));
    ASSERT_OK(mgpu_stream_destroy(ranks[r].stream));
  }
  mgpu_shutdown();
  return 0;
}

typedef struct recv_arg {
  mgpu_channel *ch;
  mgpu_buffer *dst;
  mgpu_stream *stream;
  int rc;
} recv_arg;

static void *recv_thread(void *p) {
  recv_arg *a = p;
  a->rc = mgpu_channel_recv(a->ch, a->dst, 0, NULL, a->stream);
  return NULL;
}

/* A receiver waiting on a channel whose source device is lost ends with
 * MGPU_EDEVLOST naming it; so does a sender waiting for room that a lost
 * receiving device will never make. */
TEST_IMPL(channel_with_lost_device_ends) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_channel *ch, *full;
  mgpu_stream *s0, *s1;
  mgpu_buffer *b0, *b1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  ASSERT_OK(mgpu_malloc(&b0, 0, 64));
  ASSERT_OK(mgpu_malloc(&b1, 1, 64));
  ASSERT_OK(mgpu_channel_create(2, 1, 64, 2, &ch));
  /* 0 -> 2 with one slot, full: the next send waits for room that the
   * receiving device, once lost, never makes. */
  ASSERT_OK(mgpu_channel_create(0, 2, 64, 1, &full));
  ASSERT_OK(mgpu_channel_send(full, b0, 0, 64, s0));
  recv_arg ra = {ch, b1, s1, 0};
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, recv_thread, &ra), 0);
  struct timespec nap = {0, 20000000};
  nanosleep(&nap, NULL); /* the receiver is waiting */
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  pthread_join(th, NULL);
  ASSERT_EQ(ra.rc, MGPU_EDEVLOST);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_channel_recv(ch, b1, 0, NULL, s1));
  ASSERT_DETAIL_HAS("device 2 was lost");
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_channel_send(full, b0, 0, 64, s0));
  ASSERT_DETAIL_HAS("device 2 was lost");
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_channel_destroy(full));
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_free(b0));
  ASSERT_OK(mgpu_free(b1));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  mgpu_shutdown();
  return 0;
}

/* MGPU_FAULT's "=devlost": the 2nd memset_async fails as a sticky driver
 * error would, so its device (1) is lost from then on; device 0 goes on. */
TEST_IMPL(lost_device_by_injected_backend_error) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *s[2];
  mgpu_buffer *b[2];
  for (int d = 0; d < 2; d++) {
    ASSERT_OK(mgpu_stream_create(&s[d], d));
    ASSERT_OK(mgpu_malloc(&b[d], d, 64));
  }
  ASSERT_OK(mgpu__fault_set("backend:memset_async:2=devlost", NULL, 0));
  ASSERT_OK(mgpu_memset_async(b[0], 0, 3, 64, s[0]));
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_memset_async(b[1], 0, 3, 64, s[1]));
  ASSERT_DETAIL_HAS("device 1 was lost in memset_async");
  ASSERT_DETAIL_HAS("=devlost");
  mgpu_device_state st;
  ASSERT_OK(mgpu_device_status(1, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  /* Later work for device 1 is refused; device 0's runs. */
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_memset_async(b[1], 0, 4, 64, s[1]));
  ASSERT_DETAIL_HAS("device 1 was lost");
  ASSERT_OK(mgpu_memset_async(b[0], 8, 4, 8, s[0]));
  ASSERT_OK(mgpu_stream_synchronize(s[0]));
  const unsigned char *p0 = mgpu_buffer_ptr(b[0]);
  for (int i = 0; i < 64; i++) ASSERT_EQ(p0[i], i >= 8 && i < 16 ? 4 : 3);
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  for (int d = 0; d < 2; d++) {
    ASSERT_OK(mgpu_free(b[d]));
    ASSERT_OK(mgpu_stream_destroy(s[d]));
  }
  mgpu_shutdown();
  /* The rule itself is checked: "=devlost" only on backend rules. */
  char why[256];
  ASSERT_ERR(MGPU_EINVAL, mgpu__fault_set("alloc:3=devlost", why, sizeof why));
  ASSERT_ERR(MGPU_EINVAL, mgpu__fault_set("backend:=devlost", why, sizeof why));
  ASSERT_OK(mgpu__fault_set("backend:7+=devlost", why, sizeof why));
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  return 0;
}

/* A host barrier over devices 0, 1, 2 whose device 2 is lost while ranks 0
 * and 1 wait: both end with MGPU_EDEVLOST naming device 2, not at their
 * 20 s timeout; a later call fails at once the same way. */
TEST_IMPL(barrier_with_lost_device_ends) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  int devs[3] = {0, 1, 2};
  mgpu_barrier *barrier;
  ASSERT_OK(mgpu_barrier_create(devs, 3, &barrier));
  rank_arg ranks[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++)
    ranks[r] = (rank_arg){.barrier = barrier, .rank = r};
  start_ranks(ranks, th, barrier_rank);
  struct timespec nap = {0, 20000000};
  nanosleep(&nap, NULL); /* the ranks are waiting */
  uint64_t t0 = mgpu__now_ns();
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  join_ranks_lost(ranks, th, t0, "device 2 (rank 2) was lost");
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_barrier_wait(barrier, 0, 20000));
  ASSERT_DETAIL_HAS("device 2 (rank 2) was lost");
  ASSERT_OK(mgpu_barrier_destroy(barrier));
  /* A barrier of working devices still works. */
  ASSERT_OK(mgpu_barrier_create(devs, 1, &barrier));
  ASSERT_OK(mgpu_barrier_wait(barrier, 0, 1000));
  ASSERT_OK(mgpu_barrier_destroy(barrier));
  mgpu_shutdown();
  return 0;
}

/* An all-reduce already issued on every rank when device 2 is lost (its
 * stream is held by a callback, so its part has not run): the other ranks'
 * streams read what device 2 never made, so their synchronize fails with
 * MGPU_EDEVLOST naming device 2 instead of returning wrong sums. Both of
 * mgpu's algorithms. */
TEST_IMPL(issued_collective_with_lost_device_fails) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  const int algos[2] = {MGPU_COLL_ALGO_RING, MGPU_COLL_ALGO_DIRECT};
  enum { N = 4096 };
  for (int a = 0; a < 2; a++) {
    int devs[3] = {0, 1, 2};
    mgpu_comm_config cc = MGPU_COMM_CONFIG_INITIALIZER;
    cc.algo = algos[a];
    cc.chunk_bytes = 4096;
    mgpu_comm *comm;
    ASSERT_OK(mgpu_comm_create_config(devs, 3, &cc, &comm));
    mgpu_stream *s[3];
    mgpu_buffer *b[3];
    for (int r = 0; r < 3; r++) {
      ASSERT_OK(mgpu_stream_create(&s[r], r));
      ASSERT_OK(mgpu_malloc(&b[r], r, N * sizeof(float)));
      float *p = mgpu_buffer_ptr(b[r]);
      for (int i = 0; i < N; i++) p[i] = 1.0f;
    }
    atomic_int go = 0;
    ASSERT_OK(mgpu_stream_add_callback(s[2], block_until, &go));
    ASSERT_OK(mgpu_group_begin());
    for (int r = 0; r < 3; r++)
      ASSERT_OK(mgpu_allreduce(comm, r, b[r], b[r], N, MGPU_FLOAT32, MGPU_SUM,
                               s[r]));
    ASSERT_OK(mgpu_group_end());
    ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
    atomic_store(&go, 1);
    for (int r = 0; r < 2; r++) {
      ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s[r]));
      ASSERT_DETAIL_HAS("host device 2, which was lost");
    }
    ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s[2]));
    /* Reported once: the streams work on. */
    for (int r = 0; r < 2; r++) {
      ASSERT_OK(mgpu_memset_async(b[r], 0, 0, 16, s[r]));
      ASSERT_OK(mgpu_stream_synchronize(s[r]));
    }
    /* Later collectives fail at once. */
    ASSERT_ERR(MGPU_EDEVLOST, mgpu_allreduce(comm, 0, b[0], b[0], N,
                                             MGPU_FLOAT32, MGPU_SUM, s[0]));
    ASSERT_DETAIL_HAS("device 2");
    ASSERT_OK(mgpu_comm_destroy(comm));
    for (int r = 0; r < 3; r++) {
      ASSERT_OK(mgpu_free(b[r]));
      ASSERT_OK(mgpu_stream_destroy(s[r]));
    }
    mgpu_shutdown();
    ASSERT_OK(mgpu_init(&cfg));
  }
  mgpu_shutdown();
  return 0;
}

/* A host-staged copy from device 2 to device 0, queued on device 0's
 * stream, whose source is lost before its pieces run: device 0's stream
 * waited for pieces device 2 never copied, so it fails with MGPU_EDEVLOST
 * naming device 2 (it returned 0 with the destination holding whatever
 * was in the bounce buffers). */
TEST_IMPL(staged_copy_from_lost_device_fails) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  cfg.host_peer = 0; /* host devices copy through pinned host memory */
  ASSERT_OK(mgpu_init(&cfg));
  enum { SIZE = 1 << 20 };
  mgpu_buffer *src, *dst;
  mgpu_stream *s0;
  ASSERT_OK(mgpu_malloc(&src, 2, SIZE));
  ASSERT_OK(mgpu_malloc(&dst, 0, SIZE));
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  memset(mgpu_buffer_ptr(src), 5, SIZE);
  memset(mgpu_buffer_ptr(dst), 0, SIZE);
  mgpu_copy_path path;
  ASSERT_OK(mgpu_copy_path_get(2, 0, &path));
  ASSERT_EQ(path, MGPU_PATH_STAGED);
  atomic_int go = 0;
  ASSERT_OK(mgpu_stream_add_callback(s0, block_until, &go));
  ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, SIZE, s0));
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  atomic_store(&go, 1);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s0));
  ASSERT_DETAIL_HAS("host device 2, which was lost");
  mgpu_device_synchronize(0); /* the copy's helper stream reports it too */
  /* Device 0 goes on. */
  ASSERT_OK(mgpu_memset_async(dst, 0, 7, 64, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_EQ(((unsigned char *)mgpu_buffer_ptr(dst))[63], 7);
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_free(src));
  mgpu_shutdown();
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(lost_device_fails_queued_and_later_work)
TEST_ENTRY(lost_device_by_fault_rule)
TEST_ENTRY(pool_reruns_lost_device_tasks)
TEST_ENTRY(pool_lost_task_not_rerunnable_fails)
TEST_ENTRY(pool_reruns_after_injected_device_loss)
TEST_ENTRY(collective_with_lost_device_ends)
TEST_ENTRY(channel_with_lost_device_ends)
TEST_ENTRY(lost_device_by_injected_backend_error)
TEST_ENTRY(barrier_with_lost_device_ends)
TEST_ENTRY(issued_collective_with_lost_device_fails)
TEST_ENTRY(staged_copy_from_lost_device_fails)
TEST_LIST_END
