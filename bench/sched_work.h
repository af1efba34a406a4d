/* The workloads of mgpu bench sched, shared with its peer programs
 * (bench/peers/starpu_sched.c) so that both measure exactly the same thing:
 * the plain thread-pool baseline, and the skewed task lengths with the body
 * that "runs" one. Header-only; each includer uses what it needs. */
#ifndef MGPU_BENCH_SCHED_WORK_H
#define MGPU_BENCH_SCHED_WORK_H

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static inline double sched_work_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the plain thread-pool baseline ----
 *
 * What a user would otherwise write: nthreads worker threads draining one
 * queue under a mutex, sleeping on a condition variable when it is empty;
 * N items (each an empty function to call) pushed from this thread, which
 * then sleeps until the workers have called the last one. The figure is
 * wall time / N, submit to completion, exactly as the pools are measured.
 * (It replaces a one-way lock-free ring that never woke anyone, whose 4 ns
 * per item was no hand-off between threads.) */

typedef struct plain_pool {
  pthread_mutex_t lock;
  pthread_cond_t work, done;
  size_t pushed, taken, finished; /* lock */
  int stop, sleeping;             /* lock */
} plain_pool;

static void plain_empty(size_t i) { (void)i; }

static inline void *plain_worker(void *arg) {
  plain_pool *p = arg;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (p->taken == p->pushed && !p->stop) {
      p->sleeping++;
      pthread_cond_wait(&p->work, &p->lock);
      p->sleeping--;
    }
    if (p->taken == p->pushed) break; /* stop, and nothing left */
    size_t i = p->taken++;
    pthread_mutex_unlock(&p->lock);
    plain_empty(i);
    pthread_mutex_lock(&p->lock);
    if (++p->finished == p->pushed) pthread_cond_broadcast(&p->done);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* ns per item through a plain pool of nthreads workers. */
static inline double plain_pool_ns(size_t n, int nthreads) {
  plain_pool *p = calloc(1, sizeof *p);
  pthread_t th[16];
  if (p == NULL) return 0;
  if (nthreads > 16) nthreads = 16;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  int started = 0;
  for (int i = 0; i < nthreads; i++)
    if (pthread_create(&th[i], NULL, plain_worker, p) == 0) started++;
  double t0 = sched_work_now();
  for (size_t i = 0; i < n; i++) {
    pthread_mutex_lock(&p->lock);
    p->pushed++;
    if (p->sleeping > 0) pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_lock(&p->lock);
  while (p->finished < p->pushed) pthread_cond_wait(&p->done, &p->lock);
  double dt = sched_work_now() - t0;
  p->stop = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->lock);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p);
  return started == nthreads ? dt * 1e9 / (double)n : 0;
}

/* ---- skewed lengths ---- */

typedef struct skew_task {
  uint64_t length_ns;
  uint64_t ran_ns; /* measured */
} skew_task;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps length_ns: device work that occupies the device, not a core. The
 * default 50 us timer slack would stretch every short task, so it is set
 * to 1 ns on the thread first. */
/* The ideal makespan in ms of tasks that ran on ndev devices: their total
 * time spread evenly, or the longest task if that is longer. */
static inline double skew_ideal_ms(const skew_task *t, int n, int ndev) {
  double sum = 0, longest = 0;
  for (int i = 0; i < n; i++) {
    sum += (double)t[i].ran_ns;
    if ((double)t[i].ran_ns > longest) longest = (double)t[i].ran_ns;
  }
  double ideal = sum / ndev;
  return (ideal > longest ? ideal : longest) * 1e-6;
}

static inline void skew_run_one(skew_task *t) {
  static _Thread_local int slack_set;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    slack_set = 1;
  }
  uint64_t t0 = now_ns(), end = t0 + t->length_ns;
  struct timespec ts = {(time_t)(end / 1000000000u),
                        (long)(end % 1000000000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
  }
  t->ran_ns = now_ns() - t0;
}

/* Log-uniform in [1 us, 1 ms], xorshift64* with a fixed seed. */
static inline void skew_lengths(skew_task *t, int n) {
  uint64_t x = 0x5eed5eed12345678ull;
  for (int i = 0; i < n; i++) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    double u = (double)((x * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    t[i].length_ns = (uint64_t)(1000.0 * pow(1000.0, u));
    t[i].ran_ns = 0;
  }
}

#endif /* MGPU_BENCH_SCHED_WORK_H */
