/* The lock order (src/util/thread.h, docs/ARCHITECTURE.md "Lock order"):
 * in a lock-checking build (MGPU_LOCK_CHECK) taking a lock whose rank is not
 * above every rank held aborts with a message naming both locks, and so do
 * taking a lock twice and unlocking one not held; the right order, and a
 * try-lock out of order, pass. Each case runs in a child process (it is
 * meant to abort) whose signal, exit status and message the test reads. In
 * other builds the mutexes are plain ones: those tests skip, and one checks
 * that nothing was added to them. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "task.h"
#include "util/thread.h"

typedef struct outcome {
  int signal; /* the signal that ended the child, or 0 */
  int status; /* its exit status when it exited */
  char err[2048]; /* what it wrote to stderr */
} outcome;

/* Runs fn in a child process that stops itself (SIGALRM) after 60 s, and
 * reads what ended it and what it wrote to stderr. */
static void run_child(void (*fn)(void), outcome *o) {
  int fds[2];
  ASSERT(pipe(fds) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    alarm(60);
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  /* n < sizeof o->err - 1 on every read (GCC 13 cannot see it otherwise
   * and warns that the read may overflow err). */
  while (n < sizeof o->err - 1) {
    ssize_t r = read(fds[0], o->err + n, sizeof o->err - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  o->err[n] = '\0';
  close(fds[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0) ASSERT(errno == EINTR);
  o->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  o->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count(const char *s, const char *word) {
  int n = 0;
  for (const char *p = strstr(s, word); p != NULL; p = strstr(p + 1, word)) n++;
  return n;
}

/* Runs fn in a child that must abort with a message naming the lock it
 * took (what) and the one held (held, or NULL), and places in this file
 * (test-locks.c:line) as many times as places. */
static void expect_abort(void (*fn)(void), const char *what,
                         const char *held, int places) {
  outcome o;
  run_child(fn, &o);
  int ok = o.signal == SIGABRT && strstr(o.err, what) != NULL &&
           (held == NULL || strstr(o.err, held) != NULL) &&
           count(o.err, "test-locks.c:") == places;
  if (!ok)
    fprintf(stderr, "child: signal %d, status %d; expected \"%s\", \"%s\" "
            "and %d places in:\n%s\n", o.signal, o.status, what,
            held ? held : "", places, o.err);
  ASSERT(ok);
}

static void expect_pass(const outcome *o) {
  if (o->signal != 0 || o->status != 0)
    fprintf(stderr, "child: signal %d, status %d, stderr:\n%s\n", o->signal,
            o->status, o->err);
  ASSERT_EQ(o->signal, 0);
  ASSERT_EQ(o->status, 0);
  ASSERT_EQ(strlen(o->err), 0);
}

/* Two locks of the library's ranks: outer is taken before inner. */
static mgpu__mutex outer = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_CHANNEL);
static mgpu__mutex inner;

static void init_inner(void) {
  mgpu__mutex_init(&inner, MGPU__LOCK_HOST_DEVICE);
}

static void right_order(void) {
  init_inner();
  for (int i = 0; i < 3; i++) {
    mgpu__mutex_lock(&outer);
    mgpu__mutex_lock(&inner);
    mgpu__mutex_unlock(&inner);
    mgpu__mutex_unlock(&outer);
  }
  /* Released out of order, then taken again: nothing is left recorded. */
  mgpu__mutex_lock(&outer);
  mgpu__mutex_lock(&inner);
  mgpu__mutex_unlock(&outer);
  mgpu__mutex_unlock(&inner);
  mgpu__mutex_lock(&inner);
  mgpu__mutex_unlock(&inner);
  mgpu__mutex_lock(&outer);
  mgpu__mutex_unlock(&outer);
  mgpu__mutex_destroy(&inner);
}

static void wrong_order(void) {
  init_inner();
  mgpu__mutex_lock(&inner);
  mgpu__mutex_lock(&outer); /* aborts */
}

static void same_rank(void) {
  mgpu__mutex other;
  init_inner();
  mgpu__mutex_init(&other, MGPU__LOCK_HOST_DEVICE);
  mgpu__mutex_lock(&inner);
  mgpu__mutex_lock(&other); /* aborts: two of one rank */
}

static void twice(void) {
  mgpu__mutex_lock(&outer);
  mgpu__mutex_lock(&outer); /* aborts: not a self-deadlock */
}

static void not_held(void) {
  mgpu__mutex_unlock(&outer); /* aborts */
}

/* A try-lock cannot wait, so it may go against the order; what it took
 * counts as held afterwards. */
static void trylock_out_of_order(void) {
  init_inner();
  mgpu__mutex_lock(&inner);
  if (!mgpu__mutex_trylock(&outer)) _exit(3);
  mgpu__mutex_unlock(&outer);
  mgpu__mutex_unlock(&inner);
}

static void after_trylock(void) {
  init_inner();
  if (!mgpu__mutex_trylock(&inner)) _exit(3);
  mgpu__mutex_lock(&outer); /* aborts: inner is held */
}

/* A condition wait gives the lock up and takes it back: still held once. */
static void cond_wait_keeps_record(void) {
  mgpu__cond c;
  mgpu__cond_init(&c);
  mgpu__mutex_lock(&outer);
  ASSERT_EQ(mgpu__cond_timedwait(&c, &outer, mgpu__now_ns() + 1000000),
            ETIMEDOUT);
  mgpu__mutex_unlock(&outer);
  mgpu__mutex_lock(&outer); /* the record did not keep a second entry */
  mgpu__mutex_unlock(&outer);
  mgpu__cond_destroy(&c);
}

static void stream_with(mgpu__mutex *held) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  if (mgpu_init(&cfg) != 0) _exit(3);
  mgpu_stream *s;
  mgpu__mutex_lock(held);
  if (mgpu_stream_create(&s, 0) != 0 || mgpu_stream_destroy(s) != 0) _exit(4);
  mgpu__mutex_unlock(held);
  if (mgpu_shutdown() != 0) _exit(5);
}

static void stream_under_lock(void) {
  init_inner();
  stream_with(&inner); /* aborts */
}

/* A lock of a rank before the core's may be held. */
static void stream_in_order(void) { stream_with(&outer); }

#ifdef MGPU_LOCK_CHECK
#define NEED_CHECK() ((void)0)
#else
#define NEED_CHECK() return TEST_SKIP
#endif

TEST_IMPL(right_order_passes) {
  NEED_CHECK();
  outcome o;
  run_child(right_order, &o);
  expect_pass(&o);
  run_child(trylock_out_of_order, &o);
  expect_pass(&o);
  run_child(cond_wait_keeps_record, &o);
  expect_pass(&o);
  return 0;
}

TEST_IMPL(wrong_order_aborts) {
  NEED_CHECK();
  /* Both locks by rank, which one was being taken, and where each was
   * taken. */
  expect_abort(wrong_order, "lock order: taking MGPU__LOCK_CHANNEL (",
               "while holding MGPU__LOCK_HOST_DEVICE (", 2);
  expect_abort(after_trylock, "lock order: taking MGPU__LOCK_CHANNEL (",
               "while holding MGPU__LOCK_HOST_DEVICE (", 2);
  return 0;
}

/* The library's own mutexes carry their ranks: a stream created while a
 * lock of a later rank is held takes its device's streams_lock out of
 * order. */
TEST_IMPL(library_lock_out_of_order_aborts) {
  NEED_CHECK();
  expect_abort(stream_under_lock, "lock order: taking MGPU__LOCK_DEV_STREAMS (",
               "while holding MGPU__LOCK_HOST_DEVICE (", 1);
  outcome o;
  run_child(stream_in_order, &o);
  expect_pass(&o);
  return 0;
}

TEST_IMPL(same_rank_aborts) {
  NEED_CHECK();
  expect_abort(same_rank, "lock order: taking MGPU__LOCK_HOST_DEVICE (",
               "while holding MGPU__LOCK_HOST_DEVICE (", 2);
  return 0;
}

TEST_IMPL(misuse_aborts) {
  NEED_CHECK();
  expect_abort(twice, "lock order: taking again MGPU__LOCK_CHANNEL (",
               "while holding MGPU__LOCK_CHANNEL (", 2);
  expect_abort(not_held, "unlocking, not held, MGPU__LOCK_CHANNEL (", NULL,
               1);
  return 0;
}

/* Builds without the check keep pthread's own mutex, unchanged. */
TEST_IMPL(plain_without_check) {
#ifdef MGPU_LOCK_CHECK
  return TEST_SKIP;
#else
  ASSERT_EQ(sizeof(mgpu__mutex), sizeof(pthread_mutex_t));
  outcome o;
  run_child(right_order, &o);
  expect_pass(&o);
  return 0;
#endif
}

TEST_LIST_BEGIN
TEST_ENTRY(right_order_passes)
TEST_ENTRY(wrong_order_aborts)
TEST_ENTRY(same_rank_aborts)
TEST_ENTRY(misuse_aborts)
TEST_ENTRY(library_lock_out_of_order_aborts)
TEST_ENTRY(plain_without_check)
TEST_LIST_END
