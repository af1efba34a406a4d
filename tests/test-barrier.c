/* Tests of host barriers and stream barriers: nobody leaves a round before
 * everybody arrived, rounds reuse the barrier, a timeout names the missing
 * devices and leaves the barrier usable, stream barriers order work across
 * the streams of several devices without blocking the host. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "task.h"
#include "util/fault.h"

#define ROUNDS 300


typedef struct bar_arg {
  mgpu_barrier *b;
  int rank, n;
  atomic_int *arrivals; /* [round] */
} bar_arg;

static void *bar_thread(void *p) {
  bar_arg *a = p;
  for (int round = 0; round < ROUNDS; round++) {
    atomic_fetch_add(&a->arrivals[round], 1);
    ASSERT_OK(mgpu_barrier_wait(a->b, a->rank, 10000));
    /* Everybody arrived in this round before anybody left it. */
    ASSERT_EQ(atomic_load(&a->arrivals[round]), a->n);
    if ((round + a->rank) % 17 == 0) sched_yield();
  }
  return NULL;
}

/* n parties (devices 0 to n - 1, n <= 8), a thread each, ROUNDS rounds. */
static void run_rounds(int n) {
  int devs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  mgpu_barrier *b;
  ASSERT_OK(mgpu_barrier_create(devs, n, &b));
  atomic_int *arrivals = calloc(ROUNDS, sizeof *arrivals);
  pthread_t t[8];
  bar_arg args[8];
  for (int r = 0; r < n; r++) {
    args[r] = (bar_arg){b, r, n, arrivals};
    ASSERT(pthread_create(&t[r], NULL, bar_thread, &args[r]) == 0);
  }
  for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
  free(arrivals);
  ASSERT_OK(mgpu_barrier_destroy(b));
}

TEST_IMPL(host_rounds) {
  int ndev = test_init();
  run_rounds(ndev < 8 ? ndev : 8);
  return 0;
}

/* The last arrival of a round ends its generation, then raises the word
 * the waiters watch. A waiter can leave through the generation meanwhile
 * (its sleep looks there) and arrive in the next round: it must then wait
 * for that round, though the word still shows the one before (a first
 * version passed at once there; a raise that came late could also move
 * the word back). A stall of 300 us in that window (fault rule
 * "stall:barrier_release") makes it happen in most rounds: nobody may
 * leave a round before everybody arrived in it, with 2 and with all the
 * devices' parties. */
TEST_IMPL(late_release) {
  int ndev = test_init();
  if (ndev < 2) return TEST_SKIP;
  ASSERT_OK(mgpu__fault_set("stall:barrier_release@us:300", NULL, 0));
  for (int n = 2; n <= (ndev < 4 ? ndev : 4); n += 2) run_rounds(n);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return 0;
}

/* Two parties wait with the pair wait and leave without the barrier's lock
 * once their watch saw the round end: what one rank wrote before a round
 * (plain memory, so TSan sees a missing order) is what the other reads
 * after it, round after round; then a wait alone times out and the
 * barrier still works for both. */
#define PAIR_ROUNDS 5000

typedef struct pair_arg {
  mgpu_barrier *b;
  int rank;
  int *cells; /* [round][rank] */
} pair_arg;

static void *pair_thread(void *p) {
  pair_arg *a = p;
  for (int round = 0; round < PAIR_ROUNDS; round++) {
    a->cells[2 * round + a->rank] = round + 1;
    ASSERT_OK(mgpu_barrier_wait(a->b, a->rank, 10000));
    ASSERT_EQ(a->cells[2 * round + 1 - a->rank], round + 1);
  }
  return NULL;
}

static void *pair_round(void *p) {
  pair_arg *a = p;
  a->cells[a->rank] = 1;
  ASSERT_OK(mgpu_barrier_wait(a->b, a->rank, 10000));
  ASSERT_EQ(a->cells[1 - a->rank], 1);
  return NULL;
}

TEST_IMPL(host_two_parties) {
  int ndev = test_init();
  if (ndev < 2) return TEST_SKIP;
  int devs[2] = {0, 1};
  mgpu_barrier *b;
  ASSERT_OK(mgpu_barrier_create(devs, 2, &b));
  int *cells = calloc(2 * PAIR_ROUNDS, sizeof *cells);
  pthread_t t;
  pair_arg args[2] = {{b, 0, cells}, {b, 1, cells}};
  ASSERT(pthread_create(&t, NULL, pair_thread, &args[1]) == 0);
  pair_thread(&args[0]);
  pthread_join(t, NULL);
  for (int i = 0; i < 2 * PAIR_ROUNDS; i++) ASSERT_EQ(cells[i], i / 2 + 1);
  free(cells);
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_barrier_wait(b, 1, 20));
  ASSERT_DETAIL_HAS("0 (rank 0) did not arrive");
  /* One more round of both: the withdrawn arrival left it consistent. */
  int last[2] = {0, 0};
  pair_arg one[2] = {{b, 0, last}, {b, 1, last}};
  ASSERT(pthread_create(&t, NULL, pair_round, &one[1]) == 0);
  pair_round(&one[0]);
  pthread_join(t, NULL);
  ASSERT_OK(mgpu_barrier_destroy(b));
  return 0;
}

typedef struct late_arg {
  mgpu_barrier *b;
  int rank;
  int rc;
} late_arg;

static void *wait_thread(void *p) {
  late_arg *a = p;
  a->rc = mgpu_barrier_wait(a->b, a->rank, 10000);
  return NULL;
}

TEST_IMPL(timeout) {
  int ndev = test_init();
  if (ndev < 3) return TEST_SKIP;
  int devs[3] = {0, 1, 2};
  mgpu_barrier *b;
  ASSERT_OK(mgpu_barrier_create(devs, 3, &b));
  /* Rank 1 comes, rank 2 never does: rank 0 times out naming device 2 (and
   * not device 1, which did arrive). */
  late_arg one = {b, 1, -1};
  pthread_t t1;
  ASSERT(pthread_create(&t1, NULL, wait_thread, &one) == 0);
  usleep(20000);
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_barrier_wait(b, 0, 50));
  ASSERT_DETAIL_HAS("device(s) 2 (rank 2) did not arrive");
  /* The barrier is still consistent: rank 0 withdrew, so a round with all
   * three completes. */
  late_arg two = {b, 2, -1};
  pthread_t t2;
  ASSERT(pthread_create(&t2, NULL, wait_thread, &two) == 0);
  ASSERT_OK(mgpu_barrier_wait(b, 0, 10000));
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  ASSERT_OK(one.rc);
  ASSERT_OK(two.rc);
  /* And the next round times out again on its own. */
  ASSERT_ERR(MGPU_ETIMEDOUT, mgpu_barrier_wait(b, 2, 10));
  ASSERT_DETAIL_HAS("0 (rank 0), 1 (rank 1)");
  ASSERT_OK(mgpu_barrier_destroy(b));
  return 0;
}

TEST_IMPL(errors) {
  int ndev = test_init();
  mgpu_barrier *b;
  int devs[2] = {0, ndev > 1 ? 1 : 0};
  int bad[1] = {ndev};
  ASSERT_ERR(MGPU_EINVAL, mgpu_barrier_create(devs, 0, &b));
  ASSERT_ERR(MGPU_ENODEV, mgpu_barrier_create(bad, 1, &b));
  ASSERT_OK(mgpu_barrier_create(devs, 2, &b));
  ASSERT_ERR(MGPU_EINVAL, mgpu_barrier_wait(b, 2, 0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_barrier_wait(b, 0, -5));
  /* A rank already waiting. */
  late_arg one = {b, 0, -1};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, wait_thread, &one) == 0);
  usleep(20000);
  ASSERT_ERR(MGPU_EINVAL, mgpu_barrier_wait(b, 0, 0));
  ASSERT_OK(mgpu_barrier_wait(b, 1, 1000));
  pthread_join(t, NULL);
  ASSERT_OK(one.rc);
  /* Destroy while somebody waits (forever): the waiter leaves, EFREED. */
  mgpu_barrier *gone;
  ASSERT_OK(mgpu_barrier_create(devs, 2, &gone));
  late_arg waiter = {gone, 0, -1};
  ASSERT(pthread_create(&t, NULL, wait_thread, &waiter) == 0);
  usleep(20000);
  ASSERT_OK(mgpu_barrier_destroy(gone));
  pthread_join(t, NULL);
  ASSERT_EQ(waiter.rc, MGPU_EFREED);
  /* One-rank barriers never wait. */
  mgpu_barrier *solo;
  ASSERT_OK(mgpu_barrier_create(devs, 1, &solo));
  for (int i = 0; i < 10; i++) ASSERT_OK(mgpu_barrier_wait(solo, 0, 0));
  ASSERT_OK(mgpu_barrier_destroy(solo));
  ASSERT_OK(mgpu_barrier_destroy(b));
  ASSERT_ERR(MGPU_EFREED, mgpu_barrier_wait(b, 0, 0));
  ASSERT_ERR(MGPU_EFREED, mgpu_barrier_destroy(b));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_barrier_destroy(NULL));
  return 0;
}

/* Stream barriers: before round k every stream publishes k (one of them
 * slowly); after the barrier every stream must see every other's k. The
 * work runs as stream callbacks, so this holds on every backend. */
#define SROUNDS 60
static atomic_int published[8];
static atomic_int failures;

typedef struct pub {
  int idx, round, slow;
} pub;

static void publish(void *p) {
  pub *a = p;
  if (a->slow) usleep(200);
  atomic_store(&published[a->idx], a->round);
}

typedef struct chk {
  int n, round;
} chk;

static void check(void *p) {
  chk *c = p;
  for (int i = 0; i < c->n; i++)
    if (atomic_load(&published[i]) < c->round) atomic_fetch_add(&failures, 1);
}

TEST_IMPL(stream_rounds) {
  test_init();
  int devs[8];
  int ndev = test_same_backend(devs, 8);
  int n = ndev < 4 ? 2 * ndev : 8; /* two streams per device where few */
  if (n > 8) n = 8;
  mgpu_stream *s[8];
  for (int i = 0; i < n; i++) ASSERT_OK(mgpu_stream_create(&s[i], devs[i % ndev]));
  mgpu_stream_barrier *sb;
  ASSERT_OK(mgpu_stream_barrier_create(s, n, &sb));
  static pub pubs[SROUNDS][8];
  static chk chks[SROUNDS];
  for (int k = 1; k < SROUNDS; k++) {
    chks[k] = (chk){n, k};
    for (int i = 0; i < n; i++) {
      pubs[k][i] = (pub){i, k, (i + k) % n == 0};
      ASSERT_OK(mgpu_stream_add_callback(s[i], publish, &pubs[k][i]));
    }
    ASSERT_OK(mgpu_stream_barrier_wait(sb));
    for (int i = 0; i < n; i++) ASSERT_OK(mgpu_stream_add_callback(s[i], check, &chks[k]));
  }
  for (int i = 0; i < n; i++) ASSERT_OK(mgpu_stream_synchronize(s[i]));
  ASSERT_EQ(atomic_load(&failures), 0);
  ASSERT_OK(mgpu_stream_barrier_destroy(sb));
  ASSERT_ERR(MGPU_EFREED, mgpu_stream_barrier_wait(sb));
  mgpu_stream *twice[2] = {s[0], s[0]};
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_barrier_create(twice, 2, &sb));
  ASSERT_ERR(MGPU_EINVAL, mgpu_stream_barrier_create(s, 0, &sb));
  /* Streams of two backends cannot wait on each other's events. */
  mgpu_device_props p0 = {.size = sizeof p0}, pd = {.size = sizeof pd};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  for (int d = 1; d < mgpu_device_count(); d++) {
    ASSERT_OK(mgpu_device_get_props(d, &pd));
    if (pd.backend_kind == p0.backend_kind) continue;
    mgpu_stream *mixed[2] = {s[0], NULL};
    ASSERT_OK(mgpu_stream_create(&mixed[1], d));
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_stream_barrier_create(mixed, 2, &sb));
    ASSERT_DETAIL_HAS("different backends");
    ASSERT_OK(mgpu_stream_destroy(mixed[1]));
    break;
  }
  for (int i = 0; i < n; i++) ASSERT_OK(mgpu_stream_destroy(s[i]));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(host_rounds)
TEST_ENTRY(host_two_parties)
TEST_ENTRY(late_release)
TEST_ENTRY(timeout)
TEST_ENTRY(errors)
TEST_ENTRY(stream_rounds)
TEST_LIST_END
