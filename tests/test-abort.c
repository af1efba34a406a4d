/* mgpu_comm_abort: a communicator whose collectives are blocked (a rank
 * that never calls, with no timeout) is aborted from another thread; every
 * blocked call ends with MGPU_ECANCELED naming the communicator, nothing
 * moved, and the handle is MGPU_EFREED afterwards. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "coll/coll-internal.h"
#include "task.h"

enum { COUNT = 256 };

typedef struct rank_arg {
  mgpu_comm *comm;
  int rank;
  int grouped; /* 1: ranks 0 and 1 from one thread, in a group */
  mgpu_buffer *buf[2];
  mgpu_stream *stream[2];
  int rc;
  char detail[512];
} rank_arg;

static void *allreduce_rank(void *p) {
  rank_arg *a = p;
  if (a->grouped) {
    mgpu_group_begin();
    for (int r = 0; r < 2; r++)
      mgpu_allreduce(a->comm, r, a->buf[r], a->buf[r], COUNT, MGPU_FLOAT32,
                     MGPU_SUM, a->stream[r]);
    a->rc = mgpu_group_end();
  } else {
    a->rc = mgpu_allreduce(a->comm, a->rank, a->buf[a->rank],
                           a->buf[a->rank], COUNT, MGPU_FLOAT32, MGPU_SUM,
                           a->stream[a->rank]);
  }
  snprintf(a->detail, sizeof a->detail, "%s", mgpu_error_detail());
  return NULL;
}

typedef struct fixture {
  mgpu_buffer *buf[2];
  mgpu_stream *stream[2];
} fixture;

static int fixture_open(fixture *f) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_malloc(&f->buf[r], r, COUNT * sizeof(float)));
    ASSERT_OK(mgpu_stream_create(&f->stream[r], r));
    float *p = mgpu_buffer_ptr(f->buf[r]);
    for (int i = 0; i < COUNT; i++) p[i] = (float)(r + 1);
  }
  return 0;
}

static int fixture_close(fixture *f) {
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(mgpu_stream_synchronize(f->stream[r]));
    const float *p = mgpu_buffer_ptr(f->buf[r]);
    for (int i = 0; i < COUNT; i++) ASSERT_EQ(p[i], (float)(r + 1));
    ASSERT_OK(mgpu_free(f->buf[r]));
    ASSERT_OK(mgpu_stream_destroy(f->stream[r]));
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Waits until n ranks joined the communicator's first pending collective
 * (they are then inside, waiting for the others). */
static void wait_joined(mgpu_comm *comm, int n) {
  for (;;) {
    mgpu__comm *c;
    ASSERT_OK(mgpu__comm_get(comm, &c));
    mgpu__mutex_lock(&c->lock);
    int arrived = c->ops != NULL ? c->ops->arrived : 0;
    mgpu__mutex_unlock(&c->lock);
    mgpu__comm_put(c);
    if (arrived >= n) return;
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
}

/* A communicator of 3 devices with no timeout; ranks 0 and 1 call an
 * all-reduce (each from its thread, or both from one thread in a group),
 * rank 2 never does. Only the abort can end their wait. */
static int abort_blocked(int grouped) {
  fixture f;
  if (fixture_open(&f) != 0) return 1;
  int devs[3] = {0, 1, 2};
  mgpu_comm_config cc = MGPU_COMM_CONFIG_INITIALIZER;
  cc.timeout_ms = -1;
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create_config(devs, 3, &cc, &comm));
  int nthreads = grouped ? 1 : 2;
  rank_arg args[2];
  pthread_t th[2];
  for (int t = 0; t < nthreads; t++) {
    args[t] = (rank_arg){.comm = comm, .rank = t, .grouped = grouped};
    memcpy(args[t].buf, f.buf, sizeof f.buf);
    memcpy(args[t].stream, f.stream, sizeof f.stream);
    ASSERT_EQ(pthread_create(&th[t], NULL, allreduce_rank, &args[t]), 0);
  }
  wait_joined(comm, 2); /* the ranks are waiting for rank 2 */
  struct timespec nap = {0, 20000000};
  nanosleep(&nap, NULL); /* and asleep, most likely */
  ASSERT_OK(mgpu_comm_abort(comm));
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  char name[64];
  snprintf(name, sizeof name, "comm %p was aborted", (void *)comm);
  for (int t = 0; t < nthreads; t++) {
    ASSERT_EQ(args[t].rc, MGPU_ECANCELED);
    ASSERT(strstr(args[t].detail, name) != NULL);
    ASSERT(strstr(args[t].detail, "collective #0") != NULL);
  }
  /* The handle is gone: later calls, a destroy and a second abort. */
  ASSERT_ERR(MGPU_EFREED, mgpu_allreduce(comm, 0, f.buf[0], f.buf[0], COUNT,
                                         MGPU_FLOAT32, MGPU_SUM, f.stream[0]));
  ASSERT_ERR(MGPU_EFREED, mgpu_comm_destroy(comm));
  ASSERT_ERR(MGPU_EFREED, mgpu_comm_abort(comm));
  return fixture_close(&f); /* nothing moved */
}

TEST_IMPL(abort_ends_blocked_ranks) { return abort_blocked(0); }

TEST_IMPL(abort_ends_blocked_group) { return abort_blocked(1); }

/* An abort with nothing pending frees the communicator; completed work
 * stays done. */
TEST_IMPL(abort_idle_comm) {
  fixture f;
  if (fixture_open(&f) != 0) return 1;
  int devs[2] = {0, 1};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(mgpu_allreduce(comm, r, f.buf[r], f.buf[r], COUNT, MGPU_FLOAT32,
                             MGPU_SUM, f.stream[r]));
  ASSERT_OK(mgpu_group_end());
  ASSERT_OK(mgpu_comm_abort(comm)); /* waits for the issued work */
  for (int r = 0; r < 2; r++) {
    const float *p = mgpu_buffer_ptr(f.buf[r]);
    for (int i = 0; i < COUNT; i++) ASSERT_EQ(p[i], 3.0f);
    float *w = mgpu_buffer_ptr(f.buf[r]);
    for (int i = 0; i < COUNT; i++) w[i] = (float)(r + 1);
  }
  ASSERT_ERR(MGPU_EFREED, mgpu_comm_abort(comm));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_comm_abort(NULL));
  return fixture_close(&f);
}

/* Aborts racing with ranks that are still arriving (under TSan in CI):
 * rank 2 never calls, so every call ends with MGPU_ECANCELED if it joined
 * before the abort, or MGPU_EFREED if it looked the handle up after. */
TEST_IMPL(abort_races_arriving_ranks) {
  fixture f;
  if (fixture_open(&f) != 0) return 1;
  int devs[3] = {0, 1, 2};
  mgpu_comm_config cc = MGPU_COMM_CONFIG_INITIALIZER;
  cc.timeout_ms = -1;
  for (int round = 0; round < 40; round++) {
    mgpu_comm *comm;
    ASSERT_OK(mgpu_comm_create_config(devs, 3, &cc, &comm));
    rank_arg args[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
      args[t] = (rank_arg){.comm = comm, .rank = t};
      memcpy(args[t].buf, f.buf, sizeof f.buf);
      memcpy(args[t].stream, f.stream, sizeof f.stream);
      ASSERT_EQ(pthread_create(&th[t], NULL, allreduce_rank, &args[t]), 0);
    }
    struct timespec nap = {0, (round % 8) * 100000L};
    nanosleep(&nap, NULL);
    ASSERT_OK(mgpu_comm_abort(comm));
    for (int t = 0; t < 2; t++) {
      pthread_join(th[t], NULL);
      ASSERT(args[t].rc == MGPU_ECANCELED || args[t].rc == MGPU_EFREED);
    }
  }
  return fixture_close(&f);
}

TEST_LIST_BEGIN
TEST_ENTRY(abort_ends_blocked_ranks)
TEST_ENTRY(abort_ends_blocked_group)
TEST_ENTRY(abort_idle_comm)
TEST_ENTRY(abort_races_arriving_ranks)
TEST_LIST_END
