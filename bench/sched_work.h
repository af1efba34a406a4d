/* The workloads of mgpu bench sched, shared with its peer programs
 * (bench/peers/starpu_sched.c) so that both measure exactly the same thing:
 * the thread hand-off baseline, and the skewed task lengths with the body
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

/* ---- the hand-off baseline ----
 *
 * The least a cross-thread scheduler can pay: N items, each an empty
 * function to call, streamed from this thread to another through a
 * lock-free single-producer ring, timed until the consumer has called the
 * last one. The two threads are pinned to two different CPUs (the first two
 * this process may use) while it runs, so that the figure does not swing
 * with where the OS happens to put them. */

#define RING 1024

typedef void (*handoff_fn)(uintptr_t);

typedef struct handoff {
  _Alignas(64) _Atomic size_t head; /* producer */
  _Alignas(64) _Atomic size_t tail; /* consumer */
  _Atomic(uintptr_t) slot[RING];
  size_t n;
  handoff_fn fn;
  _Atomic int go;
  uintptr_t sink;
} handoff;

static void handoff_empty(uintptr_t x) { (void)x; }

static inline void *handoff_consumer(void *arg) {
  handoff *h = arg;
  while (!atomic_load_explicit(&h->go, memory_order_acquire)) sched_yield();
  size_t tail = 0;
  while (tail < h->n) {
    size_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    if (head == tail) {
      sched_yield();
      continue;
    }
    for (; tail < head; tail++)
      h->fn(atomic_load_explicit(&h->slot[tail % RING], memory_order_relaxed));
    atomic_store_explicit(&h->tail, tail, memory_order_release);
  }
  return NULL;
}

/* The first two CPUs of this thread's mask; 0 if it has fewer. */
static inline int handoff_cpus(cpu_set_t *mine, int *a, int *b) {
  if (pthread_getaffinity_np(pthread_self(), sizeof *mine, mine) != 0)
    return 0;
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
    if (CPU_ISSET(c, mine)) {
      if (found++ == 0) *a = c;
      else *b = c;
    }
  return found == 2;
}

/* ns per item handed from this thread to another. */
static inline double handoff_ns(size_t n) {
  handoff *h = calloc(1, sizeof *h);
  pthread_t th;
  pthread_attr_t attr;
  cpu_set_t mine, one;
  int a = 0, b = 0, pin = handoff_cpus(&mine, &a, &b);
  h->n = n;
  h->fn = handoff_empty;
  pthread_attr_init(&attr);
  if (pin) {
    CPU_ZERO(&one);
    CPU_SET(b, &one);
    pthread_attr_setaffinity_np(&attr, sizeof one, &one);
    CPU_ZERO(&one);
    CPU_SET(a, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  }
  pthread_create(&th, &attr, handoff_consumer, h);
  pthread_attr_destroy(&attr);
  double t0 = sched_work_now();
  atomic_store_explicit(&h->go, 1, memory_order_release);
  for (size_t i = 0; i < n; i++) {
    while (i - atomic_load_explicit(&h->tail, memory_order_acquire) >= RING)
      sched_yield();
    atomic_store_explicit(&h->slot[i % RING], (uintptr_t)(i + 1),
                          memory_order_relaxed);
    atomic_store_explicit(&h->head, i + 1, memory_order_release);
  }
  while (atomic_load_explicit(&h->tail, memory_order_acquire) < n)
    sched_yield();
  double dt = sched_work_now() - t0;
  pthread_join(th, NULL);
  if (pin) pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
  free(h);
  return dt * 1e9 / (double)n;
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
