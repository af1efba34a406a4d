/* Thin wrappers over pthreads. A failed lock, unlock, wait or signal is a bug
 * in mgpu, not a condition to handle: it aborts with a message. */
#ifndef MGPU_UTIL_THREAD_H
#define MGPU_UTIL_THREAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* The library's one lock order (docs/ARCHITECTURE.md, "Lock order", the
 * same list with what each lock guards): every mutex has a rank, and a
 * thread takes a lock only when every lock it holds has a lower rank, so
 * two of one rank are never held together. The list runs from the
 * outermost lock to the innermost; X(rank, "which lock"). Try-locks are
 * exempt (they cannot wait, so they cannot close a cycle). */
#define MGPU__LOCK_RANKS(X)                                                  \
  X(MGPU__LOCK_INIT, "core/init.c init_lock")                                \
  X(MGPU__LOCK_TOPO, "topo/topo.c measure_lock")                             \
  X(MGPU__LOCK_STORE_CONN, "store/client.c a connection's lock")             \
  X(MGPU__LOCK_STORE_REG, "store/client.c reg_lock")                         \
  X(MGPU__LOCK_GRAPH_EXEC, "graph/exec.c an executable graph's lock")        \
  X(MGPU__LOCK_CHANNEL, "chan/channel.c a channel's lock")                   \
  X(MGPU__LOCK_COMM, "coll/comm.c a communicator's lock")                    \
  X(MGPU__LOCK_BARRIER, "coll/barrier.c a host barrier's lock")              \
  X(MGPU__LOCK_POOL_GROW, "sched/slots.c a task pool's grow_lock")           \
  X(MGPU__LOCK_POOL_ERR, "sched/slots.c a task pool's err_lock")             \
  X(MGPU__LOCK_POOL_OVERFLOW, "sched/queue.c a ring's overflow_lock")        \
  X(MGPU__LOCK_STAGING, "copy/staged.c staging_lock")                        \
  X(MGPU__LOCK_PEER, "copy/peer.c peer_lock")                                \
  X(MGPU__LOCK_DEV_QUEUE, "core/init.c a device's queue_lock")               \
  X(MGPU__LOCK_DEV_STREAMS, "core/init.c a device's streams_lock")           \
  X(MGPU__LOCK_DEV_SPARE, "core/init.c a device's spare_lock")               \
  X(MGPU__LOCK_DEV_MEMPOOL, "core/init.c a device's mempool_lock")           \
  X(MGPU__LOCK_HANDLE_CLOSE, "core/handle.c close_lock")                     \
  X(MGPU__LOCK_HANDLE_TABLE, "core/handle.c table_lock")                     \
  X(MGPU__LOCK_MEM_REFS, "core/memory.c refs_lock")                          \
  X(MGPU__LOCK_BACKEND_WRAP, "core/backend_fault.c wrap_lock")               \
  X(MGPU__LOCK_HOST_ADOPT, "backend/host/graph.c a graph part's adopt_lock") \
  X(MGPU__LOCK_HOST_DEVICE, "backend/host/device.c a device's lock")         \
  X(MGPU__LOCK_GRAPH_BOARD, "graph/parts.c a graph board's lock")            \
  X(MGPU__LOCK_HOST_EVENT, "backend/host/event.c an event's lock")           \
  X(MGPU__LOCK_HOST_IPC, "backend/host/ipc.c import map lock")               \
  X(MGPU__LOCK_LOST_WAKE, "coll/lost.c wake_lock")                           \
  X(MGPU__LOCK_HOOKS, "core/init.c hooks_lock")                              \
  X(MGPU__LOCK_NUMA, "util/numa.c numa_lock")                                \
  X(MGPU__LOCK_TRACE_CTL, "obs/trace-file.c ctl_lock")                       \
  X(MGPU__LOCK_TRACE_REG, "obs/trace.c reg_lock")                            \
  X(MGPU__LOCK_TRACE_NAMES, "obs/trace.c names_lock")                        \
  X(MGPU__LOCK_CAPTURE, "graph/capture.c capture_lock")                      \
  X(MGPU__LOCK_METRICS_REG, "obs/metrics.c tc_lock")                         \
  X(MGPU__LOCK_FAULT_RULES, "util/fault.c rules_lock")

typedef enum mgpu__lock_rank {
  MGPU__LOCK_NONE = 0, /* below every rank: what a thread holding nothing has */
#define MGPU__LOCK_ENUM(rank, what) rank,
  MGPU__LOCK_RANKS(MGPU__LOCK_ENUM)
#undef MGPU__LOCK_ENUM
  MGPU__LOCK_COUNT
} mgpu__lock_rank;

/* MGPU_LOCK_CHECK builds (CMake option, on by default in Debug and sanitizer
 * builds) make every mutex an error-checking one that knows its rank, and
 * keep a per-thread record of the locks held: taking a lock whose rank is
 * not above every rank held aborts with a message naming both locks and
 * where each was taken; so does unlocking a mutex the thread does not hold,
 * or locking one it holds. Other builds keep plain mutexes and no record. */
#ifdef MGPU_LOCK_CHECK
typedef struct mgpu__mutex {
  pthread_mutex_t m;
  mgpu__lock_rank rank;
} mgpu__mutex;
#ifdef PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP
#define MGPU__MUTEX_INITIALIZER(rank) \
  { PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP, (rank) }
#else /* without _GNU_SOURCE: ranked, not error-checking */
#define MGPU__MUTEX_INITIALIZER(rank) { PTHREAD_MUTEX_INITIALIZER, (rank) }
#endif
#else
typedef pthread_mutex_t mgpu__mutex;
#define MGPU__MUTEX_INITIALIZER(rank) PTHREAD_MUTEX_INITIALIZER
#endif
typedef pthread_cond_t mgpu__cond;
typedef pthread_t mgpu__thread;

/* Initialises m as a lock of rank rank (one of MGPU__LOCK_RANKS); a static
 * mutex is initialised with MGPU__MUTEX_INITIALIZER(rank) instead. */
void mgpu__mutex_init(mgpu__mutex *m, mgpu__lock_rank rank);
void mgpu__mutex_destroy(mgpu__mutex *m);
/* mgpu__mutex_lock, mgpu__mutex_unlock, and mgpu__mutex_trylock, which
 * returns 1 when m was free and is now held by the caller, 0 when it is
 * taken. A try-lock is exempt from the lock order (it does not wait), but
 * once held m counts as held for the locks taken after it. */
#ifdef MGPU_LOCK_CHECK
void mgpu__mutex_lock_at(mgpu__mutex *m, const char *file, int line);
void mgpu__mutex_unlock_at(mgpu__mutex *m, const char *file, int line);
int mgpu__mutex_trylock_at(mgpu__mutex *m, const char *file, int line);
#define mgpu__mutex_lock(m) mgpu__mutex_lock_at((m), __FILE__, __LINE__)
#define mgpu__mutex_unlock(m) mgpu__mutex_unlock_at((m), __FILE__, __LINE__)
#define mgpu__mutex_trylock(m) mgpu__mutex_trylock_at((m), __FILE__, __LINE__)
#else
void mgpu__mutex_lock(mgpu__mutex *m);
void mgpu__mutex_unlock(mgpu__mutex *m);
int mgpu__mutex_trylock(mgpu__mutex *m);
#endif
/* Releases m in the child of a fork, where the forking thread held it (a
 * pthread_atfork child handler): an error-checking mutex still names the
 * parent's thread as its owner and refuses an unlock, so it is made anew. */
void mgpu__mutex_unlock_in_child(mgpu__mutex *m);

void mgpu__cond_init(mgpu__cond *c);
void mgpu__cond_destroy(mgpu__cond *c);
void mgpu__cond_wait(mgpu__cond *c, mgpu__mutex *m);
/* Returns 0, or ETIMEDOUT once deadline_ns (mgpu__now_ns clock) passed. */
int mgpu__cond_timedwait(mgpu__cond *c, mgpu__mutex *m, uint64_t deadline_ns);
void mgpu__cond_signal(mgpu__cond *c);
void mgpu__cond_broadcast(mgpu__cond *c);

/* Returns 0 or an errno value. */
int mgpu__thread_create(mgpu__thread *t, void *(*fn)(void *), void *arg);
void mgpu__thread_join(mgpu__thread t);

/* What the calling thread is to the library, for calls it must not make
 * (mgpu_shutdown would wait for the thread itself): a static phrase such
 * as "a device's host thread", set by the thread when it starts; NULL for
 * every thread the library did not start. */
void mgpu__thread_role_set(const char *role);
const char *mgpu__thread_role(void);

/* Monotonic clock in nanoseconds. */
uint64_t mgpu__now_ns(void);
/* The same clock read coarsely (to a few milliseconds) and cheaply, where
 * a record must cost next to nothing (the flight recorder). */
uint64_t mgpu__now_coarse_ns(void);

/* Spin-then-park. A thread that waits for another first watches a flag for
 * a while (the spin), and only then sleeps on its condition variable (the
 * park): a hand-off to a thread that is running costs a few cache-line
 * transfers instead of a wake-up. Each waiting site keeps its own budget and
 * adapts it: it doubles (to 64 us) after a spin that saw the flag turn and
 * halves (to 1 us) after one that ran out, so a site whose partner is
 * usually asleep soon parks at once. The spin pauses the CPU only while
 * the threads of the process that spin or work (mgpu__cpu_busy) are fewer
 * than its CPUs; past that, and on a machine of one CPU, it yields at every
 * turn, so a spinning thread never holds a core that the thread it waits
 * for, or another that works, needs. */
typedef struct mgpu__spin {
  _Atomic unsigned budget_ns; /* 0: the default */
  _Atomic unsigned probe;     /* mgpu__spin_pair_until's count of parks */
} mgpu__spin;

/* Marks the calling thread as running work (busy 1) or as idle (0) in
 * the process's count that mgpu__spin_until weighs: a thread that runs
 * work on a library thread (a host device's worker) says so when it takes
 * work and when it runs out, so that idle watchers do not pause on a core
 * it needs. A spin of a busy thread counts it as spinning only. A busy
 * thread is also counted on the CPU it became busy on, for
 * mgpu__cpu_spread. Cheap when the state does not change (a thread-local
 * test). */
void mgpu__cpu_busy(int busy);
/* Called by a busy thread as it takes each piece of work: at most once a
 * millisecond (and every 16th call) it looks whether its CPU runs at least
 * two busy threads more than another CPU of the process does, and then
 * moves itself off it (mgpu__thread_leave_cpu: the scheduler picks where;
 * nothing stays pinned). The scheduler's balancing leaves threads that
 * sleep and wake often, each busy less than all the time, three on one CPU
 * and one on the other for hundreds of milliseconds: host devices' workers
 * replaying a graph on an oversubscribed machine ran half as fast so. */
void mgpu__cpu_spread(void);
/* 1 when the threads marked busy are at least the process's CPUs: a
 * thread woken now would wait for a CPU. */
int mgpu__cpus_all_busy(void);
/* The CPUs this process may run on (read once). */
int mgpu__cpus(void);

/* Waits up to site's budget for ready(arg) to return nonzero (ready reads
 * with acquire); returns 1 when it did, 0 when the caller should park. */
int mgpu__spin_until(mgpu__spin *site, int (*ready)(const void *arg),
                     const void *arg);
/* The same, for a wait on a thread that is counted busy as it works (a
 * host device's worker running another device's part of a graph): since
 * that thread holds one of the CPUs counted, the spin pauses while the
 * busy threads and the spinners, this one included, are at most the
 * CPUs (and another thread is busy at all), where mgpu__spin_until would
 * yield; a yield costs each look at ready a system call, and the thread
 * that spins saw the other's post 0.5-0.8 us late instead of 0.12-0.3
 * (2 host devices on 2 CPUs). */
int mgpu__spin_until_busy(mgpu__spin *site, int (*ready)(const void *arg),
                          const void *arg);

/* The same for a hand-off between two threads (one waits for the one
 * other), cheaper and fit for a machine where no core is free:
 *  - it writes no line shared with other waiters (the process's count of
 *    spinners is not kept), and site's budget only when it changes;
 *  - while partner_cpu (the CPU the partner last published with
 *    mgpu__cpu_now) is the waiter's own, it yields at each turn, since the
 *    partner can only answer once the waiter gives the CPU up; else it
 *    pauses;
 *  - the budget doubles after a spin that saw ready() (to 64 us), halves
 *    after one that ran out, and below 1 us the site parks at once (the
 *    partner was not running: spinning only holds a CPU that it, or another
 *    thread, needs, and a thread woken from a sleep gets a CPU sooner than
 *    one that spun), but for one spin of 1 us in 16 waits, which may find
 *    the partner running again; or for a spin of 1 us when partner_awake
 *    says the partner was awake at the hand-off (it did not have to be
 *    woken), which is likely to be answered at once. */
int mgpu__spin_pair_until(mgpu__spin *site, int (*ready)(const void *arg),
                          const void *arg, const _Atomic int *partner_cpu,
                          int partner_awake, uint64_t *since);

/* After a park that followed mgpu__spin_pair_until (since: what it wrote):
 * a wait that ended within 32 us sets the site's budget to twice it, so the
 * next wait spins through it rather than park (two sides that each park
 * before the other's wake-up lands would otherwise stay parked). */
void mgpu__spin_pair_woke(mgpu__spin *site, uint64_t since);

/* The same where the partner tells when it answered (answered_ns, the
 * mgpu__now_ns clock, read by the partner as it published to a parked
 * waiter): an answer within 64 us of since sets the budget to twice that
 * (at most 64 us). The waiter's own wake-up is not counted: on a virtual
 * machine it lasts as long as the partner's, so that two sides parking in
 * turn each wait two wake-ups and mgpu__spin_pair_woke's rule would not
 * see that one spin of the length of one would have sufficed. */
void mgpu__spin_pair_answered(mgpu__spin *site, uint64_t since,
                              uint64_t answered_ns);

/* The CPU the calling thread runs on now (-1: unknown), for a partner of
 * mgpu__spin_pair_until to publish: a waiter whose partner last ran on its
 * own CPU yields at once rather than pausing, since the partner can only
 * run once the waiter gives the CPU up. */
int mgpu__cpu_now(void);

/* A sequentially consistent fence, for a store-then-load handshake
 * (Dekker) between two threads. ThreadSanitizer does not model fences
 * (GCC refuses them under it with -Werror=tsan): there a sequentially
 * consistent read-modify-write of a word on the caller's stack stands in,
 * the same full barrier on the hardware; TSan checks the handshake's
 * words, which are atomics, for races. */
#if defined(__SANITIZE_THREAD__)
#define MGPU__TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MGPU__TSAN 1
#endif
#endif
static inline void mgpu__fence_seq_cst(void) {
#ifdef MGPU__TSAN
  _Atomic int word = 0;
  atomic_fetch_add(&word, 0);
#else
  atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* Moves the calling thread off CPU cpu (to another of the CPUs it may run
 * on) and gives it back the same set of CPUs: for a thread that finds its
 * partner in a hand-off on its own CPU, since the scheduler leaves two
 * threads that yield to each other there for milliseconds. 0 when it
 * moved; -1 when it could not (one CPU, not on cpu's set, not Linux). */
int mgpu__thread_leave_cpu(int cpu);

/* The same, for *word to differ from old. */
int mgpu__spin_wait_change(mgpu__spin *site, const _Atomic int *word, int old);

/* The same, for a flag that becomes nonzero. */
static inline int mgpu__spin_wait(mgpu__spin *site, const _Atomic int *flag) {
  return mgpu__spin_wait_change(site, flag, 0);
}

#endif /* MGPU_UTIL_THREAD_H */
