/* pthread wrappers: see thread.h. Conditions use CLOCK_MONOTONIC so that
 * timeouts do not jump with the wall clock. */
#include "util/thread.h"

#include "util/fault.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "mgpu: fatal: %s failed: %s\n", what, strerror(rc));
    abort();
  }
}

#ifdef MGPU_LOCK_CHECK
static const char *const rank_names[MGPU__LOCK_COUNT] = {
    [MGPU__LOCK_NONE] = "no lock",
#define RANK_NAME(rank, what) [rank] = #rank " (" what ")",
    MGPU__LOCK_RANKS(RANK_NAME)
#undef RANK_NAME
};

/* The name of rank (its line in MGPU__LOCK_RANKS), for messages. */
static const char *lock_rank_name(mgpu__lock_rank rank) {
  if ((int)rank < 0 || rank >= MGPU__LOCK_COUNT) return "an unknown rank";
  return rank_names[rank];
}

/* The locks the calling thread holds, in the order taken: far deeper than
 * any path of the library goes (a few at most). */
#define HELD_MAX 32
typedef struct held_lock {
  const mgpu__mutex *m;
  const char *file;
  int line;
} held_lock;
static _Thread_local held_lock held[HELD_MAX];
static _Thread_local int nheld;

static void order_abort(const char *why, const mgpu__mutex *m,
                        const char *file, int line, const held_lock *h) {
  fprintf(stderr, "mgpu: fatal: lock order: %s %s at %s:%d", why,
          lock_rank_name(m->rank), file, line);
  if (h != NULL)
    fprintf(stderr, " while holding %s, taken at %s:%d",
            lock_rank_name(h->m->rank), h->file, h->line);
  fprintf(stderr, " (docs/ARCHITECTURE.md, \"Lock order\")\n");
  abort();
}

/* The held lock of the highest rank, or NULL when none is held. */
static const held_lock *highest_held(void) {
  const held_lock *top = NULL;
  for (int i = 0; i < nheld; i++)
    if (top == NULL || held[i].m->rank >= top->m->rank) top = &held[i];
  return top;
}

static void held_push(const mgpu__mutex *m, const char *file, int line) {
  if (nheld == HELD_MAX)
    order_abort("too many locks held, taking", m, file, line, &held[0]);
  held[nheld++] = (held_lock){m, file, line};
}

/* Drops m from the record; 0 when it was not there. */
static int held_remove(const mgpu__mutex *m) {
  for (int i = nheld - 1; i >= 0; i--) {
    if (held[i].m != m) continue;
    memmove(&held[i], &held[i + 1], (size_t)(nheld - i - 1) * sizeof held[0]);
    nheld--;
    return 1;
  }
  return 0;
}

void mgpu__mutex_init(mgpu__mutex *m, mgpu__lock_rank rank) {
  pthread_mutexattr_t attr;
  check(pthread_mutexattr_init(&attr), "pthread_mutexattr_init");
  check(pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK),
        "pthread_mutexattr_settype");
  check(pthread_mutex_init(&m->m, &attr), "pthread_mutex_init");
  pthread_mutexattr_destroy(&attr);
  m->rank = rank;
}
void mgpu__mutex_destroy(mgpu__mutex *m) {
  check(pthread_mutex_destroy(&m->m), "pthread_mutex_destroy");
}
void mgpu__mutex_lock_at(mgpu__mutex *m, const char *file, int line) {
  for (int i = 0; i < nheld; i++)
    if (held[i].m == m) order_abort("taking again", m, file, line, &held[i]);
  const held_lock *top = highest_held();
  if (top != NULL && m->rank <= top->m->rank)
    order_abort("taking", m, file, line, top);
  check(pthread_mutex_lock(&m->m), "pthread_mutex_lock");
  held_push(m, file, line);
}
void mgpu__mutex_unlock_at(mgpu__mutex *m, const char *file, int line) {
  if (!held_remove(m)) order_abort("unlocking, not held,", m, file, line, NULL);
  check(pthread_mutex_unlock(&m->m), "pthread_mutex_unlock");
}
int mgpu__mutex_trylock_at(mgpu__mutex *m, const char *file, int line) {
  int rc = pthread_mutex_trylock(&m->m);
  if (rc == EBUSY) return 0;
  check(rc, "pthread_mutex_trylock");
  held_push(m, file, line);
  return 1;
}
void mgpu__mutex_unlock_in_child(mgpu__mutex *m) {
  held_remove(m);
  mgpu__mutex_init(m, m->rank);
}
#define RAW(m) (&(m)->m)
#else
void mgpu__mutex_init(mgpu__mutex *m, mgpu__lock_rank rank) {
  (void)rank;
  check(pthread_mutex_init(m, NULL), "pthread_mutex_init");
}
void mgpu__mutex_destroy(mgpu__mutex *m) {
  check(pthread_mutex_destroy(m), "pthread_mutex_destroy");
}
void mgpu__mutex_lock(mgpu__mutex *m) {
  check(pthread_mutex_lock(m), "pthread_mutex_lock");
}
void mgpu__mutex_unlock(mgpu__mutex *m) {
  check(pthread_mutex_unlock(m), "pthread_mutex_unlock");
}
int mgpu__mutex_trylock(mgpu__mutex *m) {
  int rc = pthread_mutex_trylock(m);
  if (rc == EBUSY) return 0;
  check(rc, "pthread_mutex_trylock");
  return 1;
}
void mgpu__mutex_unlock_in_child(mgpu__mutex *m) { mgpu__mutex_unlock(m); }
#define RAW(m) (m)
#endif

void mgpu__cond_init(mgpu__cond *c) {
  pthread_condattr_t attr;
  check(pthread_condattr_init(&attr), "pthread_condattr_init");
  check(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC),
        "pthread_condattr_setclock");
  check(pthread_cond_init(c, &attr), "pthread_cond_init");
  pthread_condattr_destroy(&attr);
}
void mgpu__cond_destroy(mgpu__cond *c) {
  check(pthread_cond_destroy(c), "pthread_cond_destroy");
}
void mgpu__cond_wait(mgpu__cond *c, mgpu__mutex *m) {
  check(pthread_cond_wait(c, RAW(m)), "pthread_cond_wait");
}
int mgpu__cond_timedwait(mgpu__cond *c, mgpu__mutex *m, uint64_t deadline_ns) {
  struct timespec ts;
  ts.tv_sec = (time_t)(deadline_ns / 1000000000u);
  ts.tv_nsec = (long)(deadline_ns % 1000000000u);
  int rc = pthread_cond_timedwait(c, RAW(m), &ts);
  if (rc == ETIMEDOUT) return rc;
  check(rc, "pthread_cond_timedwait");
  return 0;
}
void mgpu__cond_signal(mgpu__cond *c) {
  check(pthread_cond_signal(c), "pthread_cond_signal");
}
void mgpu__cond_broadcast(mgpu__cond *c) {
  check(pthread_cond_broadcast(c), "pthread_cond_broadcast");
}

int mgpu__thread_create(mgpu__thread *t, void *(*fn)(void *), void *arg) {
  /* A fault site: an injected failure is what the system says when it is
   * out of threads. */
  if (mgpu__fault_hit(MGPU__FAULT_THREAD, NULL)) return EAGAIN;
  return pthread_create(t, NULL, fn, arg);
}
void mgpu__thread_join(mgpu__thread t) {
  check(pthread_join(t, NULL), "pthread_join");
}

uint64_t mgpu__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t mgpu__now_coarse_ns(void) {
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Thread_local const char *thread_role;

void mgpu__thread_role_set(const char *role) { thread_role = role; }
const char *mgpu__thread_role(void) { return thread_role; }
/* ---- spin-then-park ---- */

#define SPIN_DEFAULT_NS 16000u
#define SPIN_MIN_NS 1000u
#define SPIN_MAX_NS 64000u
#define PAIR_PARK 1u /* a pair's budget: park at once */
#define PAIR_PROBE_EVERY 16u
#define PAIR_MOVE_EVERY 64u

static _Atomic int spinners; /* threads in mgpu__spin_wait now */
/* Threads running work (mgpu__cpu_busy), and whether the calling thread is
 * one of them (its own, written by it only). */
static _Atomic int busy_threads;
static _Thread_local int busy_self;
static _Atomic int ncpus;    /* CPUs this process may run on; 0: not read */

static int cpu_count(void) {
  int n = atomic_load_explicit(&ncpus, memory_order_relaxed);
  if (n == 0) {
#if defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
    atomic_store_explicit(&ncpus, n, memory_order_relaxed);
  }
  return n;
}

typedef struct change_arg {
  const _Atomic int *word;
  int old;
} change_arg;

static int changed(const void *p) {
  const change_arg *a = p;
  return atomic_load_explicit(a->word, memory_order_acquire) != a->old;
}

int mgpu__spin_wait_change(mgpu__spin *site, const _Atomic int *word,
                           int old) {
  change_arg a = {word, old};
  return mgpu__spin_until(site, changed, &a);
}


/* Busy threads by the CPU each last saw itself on (mgpu__cpu_spread), and
 * where the calling thread is counted (-1: nowhere). */
#define SPREAD_CPUS 1024
#define SPREAD_EVERY_NS 1000000u
static _Atomic int busy_on[SPREAD_CPUS];
static _Thread_local int busy_cpu = -1;
static _Thread_local unsigned spread_calls;
static _Thread_local uint64_t spread_next_ns;

static void busy_count_move(int to) {
  if (to >= SPREAD_CPUS) to = -1;
  if (to == busy_cpu) return;
  if (busy_cpu >= 0)
    atomic_fetch_sub_explicit(&busy_on[busy_cpu], 1, memory_order_relaxed);
  busy_cpu = to;
  if (to >= 0) atomic_fetch_add_explicit(&busy_on[to], 1, memory_order_relaxed);
}

void mgpu__cpu_busy(int busy) {
  busy = busy != 0;
  if (busy == busy_self) return;
  busy_self = busy;
  atomic_fetch_add_explicit(&busy_threads, busy ? 1 : -1,
                            memory_order_relaxed);
  busy_count_move(busy ? mgpu__cpu_now() : -1);
}

/* Whether one of the process's CPUs has at most most busy threads. */
static int cpu_with_at_most(int most) {
#if defined(__linux__) && defined(CPU_COUNT)
  cpu_set_t set;
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0)
    return 0;
  for (int c = 0; c < SPREAD_CPUS && c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) &&
        atomic_load_explicit(&busy_on[c], memory_order_relaxed) <= most)
      return 1;
#else
  (void)most;
#endif
  return 0;
}

void mgpu__cpu_spread(void) {
  if (!busy_self || (++spread_calls & 15u) != 0) return;
  uint64_t now = mgpu__now_coarse_ns();
  if (now < spread_next_ns) return;
  spread_next_ns = now + SPREAD_EVERY_NS;
  int c = mgpu__cpu_now();
  if (c < 0 || c >= SPREAD_CPUS) return;
  busy_count_move(c);
  int here = atomic_load_explicit(&busy_on[c], memory_order_relaxed);
  if (here >= 2 && cpu_with_at_most(here - 2) &&
      mgpu__thread_leave_cpu(c) == 0)
    busy_count_move(mgpu__cpu_now());
}

int mgpu__cpus(void) { return cpu_count(); }

int mgpu__cpus_all_busy(void) {
  return atomic_load_explicit(&busy_threads, memory_order_relaxed) >=
         cpu_count();
}

/* Spins as mgpu__spin_until and mgpu__spin_until_busy say; busy_waited:
 * the thread it waits for is among those counted busy. */
static int spin(mgpu__spin *site, int (*ready)(const void *arg),
                const void *arg, int busy_waited) {
  if (ready(arg)) return 1;
  unsigned budget = atomic_load_explicit(&site->budget_ns, memory_order_relaxed);
  if (budget == 0) budget = SPIN_DEFAULT_NS;
  int cpus = cpu_count();
  /* Pausing keeps the core: only while another one is left for the thread
   * this one waits for, after those that spin and those that work; or,
   * where that thread is one of those that work, none has to be left. */
  int others_busy =
      atomic_load_explicit(&busy_threads, memory_order_relaxed) - busy_self;
  int pause = atomic_fetch_add_explicit(&spinners, 1, memory_order_relaxed) +
                  1 + others_busy < cpus + (busy_waited && others_busy > 0);
  uint64_t deadline = mgpu__now_ns() + budget;
  int seen = 0;
  for (unsigned i = 1;; i++) {
    if (ready(arg)) {
      seen = 1;
      break;
    }
    if (pause) {
      cpu_relax();
      if ((i & 31) != 0) continue;
    } else {
      sched_yield();
    }
    if (mgpu__now_ns() >= deadline) break;
  }
  atomic_fetch_sub_explicit(&spinners, 1, memory_order_relaxed);
  budget = seen ? budget * 2 : budget / 2;
  if (budget < SPIN_MIN_NS) budget = SPIN_MIN_NS;
  if (budget > SPIN_MAX_NS) budget = SPIN_MAX_NS;
  atomic_store_explicit(&site->budget_ns, budget, memory_order_relaxed);
  return seen;
}

int mgpu__spin_until(mgpu__spin *site, int (*ready)(const void *arg),
                     const void *arg) {
  return spin(site, ready, arg, 0);
}

int mgpu__spin_until_busy(mgpu__spin *site, int (*ready)(const void *arg),
                          const void *arg) {
  return spin(site, ready, arg, 1);
}

int mgpu__thread_leave_cpu(int cpu) {
#if defined(__linux__) && defined(CPU_COUNT)
  cpu_set_t set, without;
  if (cpu < 0 || cpu >= CPU_SETSIZE ||
      pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0 ||
      !CPU_ISSET(cpu, &set) || CPU_COUNT(&set) < 2)
    return -1;
  without = set;
  CPU_CLR(cpu, &without);
  /* The first call moves the thread off cpu at once; the second gives the
   * set back without moving it again. */
  int rc = pthread_setaffinity_np(pthread_self(), sizeof without, &without);
  if (rc == 0) pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  return rc == 0 ? 0 : -1;
#else
  (void)cpu;
  return -1;
#endif
}

int mgpu__cpu_now(void) {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

int mgpu__spin_pair_until(mgpu__spin *site, int (*ready)(const void *arg),
                          const void *arg, const _Atomic int *partner_cpu,
                          int partner_awake, uint64_t *since) {
  *since = 0;
  if (ready(arg)) return 1;
  unsigned old = atomic_load_explicit(&site->budget_ns, memory_order_relaxed);
  unsigned budget = old != 0 ? old : SPIN_DEFAULT_NS;
  if (budget == PAIR_PARK && partner_awake) {
    budget = SPIN_MIN_NS; /* it may answer at once: worth a short look */
  } else if (budget == PAIR_PARK) {
    /* Spins ran out often: park at once, but for one probe in
     * PAIR_PROBE_EVERY waits, which may find the partner running again. */
    unsigned n = atomic_load_explicit(&site->probe, memory_order_relaxed) + 1;
    atomic_store_explicit(&site->probe, n, memory_order_relaxed);
    if (n % PAIR_PROBE_EVERY != 0) {
      *since = mgpu__now_ns();
      return 0;
    }
    budget = SPIN_MIN_NS;
  }
  int single = cpu_count() == 1;
  if (!single && atomic_load_explicit(partner_cpu, memory_order_relaxed) ==
                     mgpu__cpu_now()) {
    /* The partner shares this CPU: once in PAIR_MOVE_EVERY waits, park, so
     * that the wake-up may place this thread on a CPU that became free
     * (two threads yielding to each other on one CPU stay there). */
    unsigned n = atomic_load_explicit(&site->probe, memory_order_relaxed) + 1;
    atomic_store_explicit(&site->probe, n, memory_order_relaxed);
    if (n % PAIR_MOVE_EVERY == 0) return 0;
  }
  uint64_t now = mgpu__now_ns();
  *since = now;
  uint64_t deadline = now + budget;
  int seen = 0;
  for (unsigned i = 0;; i++) {
    if (ready(arg)) {
      seen = 1;
      break;
    }
    /* Yields while the partner shares this CPU (it can only answer once
     * this thread gives the CPU up), pauses while it runs on another. */
    if (single || atomic_load_explicit(partner_cpu, memory_order_relaxed) ==
                      mgpu__cpu_now()) {
      sched_yield();
    } else {
      cpu_relax();
      if ((i & 31) != 31) continue;
    }
    now = mgpu__now_ns();
    if (now >= deadline) break;
  }
  budget = seen ? budget * 2 : budget / 2;
  if (budget > SPIN_MAX_NS) budget = SPIN_MAX_NS;
  if (budget < SPIN_MIN_NS) budget = PAIR_PARK;
  if (budget != old)
    atomic_store_explicit(&site->budget_ns, budget, memory_order_relaxed);
  return seen;
}

/* Sets site's budget to twice waited when waited is under limit: a spin
 * that long would have seen the partner's answer. */
static void rebudget(mgpu__spin *site, uint64_t waited, uint64_t limit) {
  if (waited >= limit) return;
  uint64_t budget = waited * 2;
  if (budget < SPIN_MIN_NS) budget = SPIN_MIN_NS;
  if (budget > SPIN_MAX_NS) budget = SPIN_MAX_NS;
  atomic_store_explicit(&site->budget_ns, (unsigned)budget,
                        memory_order_relaxed);
}

void mgpu__spin_pair_woke(mgpu__spin *site, uint64_t since) {
  if (since == 0) return;
  /* The partner answered soon after the park: a spin of twice that would
   * have seen it, and spares both sides a wake-up next time. */
  rebudget(site, mgpu__now_ns() - since, SPIN_MAX_NS / 2);
}

void mgpu__spin_pair_answered(mgpu__spin *site, uint64_t since,
                              uint64_t answered_ns) {
  if (since == 0 || answered_ns < since) return;
  rebudget(site, answered_ns - since, SPIN_MAX_NS);
}
