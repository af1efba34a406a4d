/* Internal state of the task pool (pool.c, task.c, slots.c, queue.c, with
 * the deque of deque.c).
 *
 * A pool has one worker per device. Each worker owns:
 *   inbox   a lock-free LIFO stack any thread pushes onto (submitters,
 *           completions on other workers); the owner, or a thief, takes the
 *           whole stack with one exchange
 *   deque   a Chase–Lev deque of tasks anyone may run; the owner pops at the
 *           bottom, thieves steal at the top
 *   prefer  a Chase–Lev deque of tasks that prefer this device; thieves take
 *           from it only as a last resort, while the owner is busy
 *   pinned  an owner-only FIFO list: tasks only this device may run
 *           (static placement), and any a deque had no memory for
 * The dynamic policy adds one shared FIFO ring (queue.c).
 *
 * Tasks live in a slot table that only grows (chunks of MGPU__TASK_CHUNK),
 * so a task pointer or index stays valid for the life of the pool; a free
 * list (a Treiber stack of slot indices tagged against ABA) recycles them.
 * A handle is generation << 32 | (index + 1); the generation changes each
 * time a slot is freed, so a stale handle is recognized, never followed.
 */
#ifndef MGPU_SCHED_INTERNAL_H
#define MGPU_SCHED_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/core-internal.h"
#include "mgpu/sched.h"
#include "sched/deque.h"

#define MGPU__TASK_CHUNK 1024
#define MGPU__TASK_MAX_CHUNKS 4096 /* 4 Mi tasks in flight or held */
#define MGPU__TASK_INLINE_ARGS 64
#define MGPU__TASK_INLINE_EDGES 2
#define MGPU__RING_CAP 16384
/* A worker hands freed slots, completions and metrics back every this many
 * tasks, and whenever it runs out of work. */
#define MGPU__FLUSH_BATCH 32

typedef struct mgpu__task mgpu__task;
/* The pool behind a public mgpu_pool * (a handle of the core's table). */
typedef struct mgpu__pool mgpu__pool;

/* A dependency: dep -> dependent. It lives inside the dependent (inline or
 * in its edges_heap array) and is linked into the dep's successor list. */
typedef struct mgpu__edge {
  mgpu__task *dependent;
  struct mgpu__edge *next; /* written before the CAS that publishes it */
} mgpu__edge;

/* A successor list that was sealed: the task has completed. */
#define MGPU__SEALED ((mgpu__edge *)(uintptr_t)1)

/* Task states (the futex word a single waiter sleeps on). */
enum { MGPU__T_PENDING = 0, MGPU__T_WAITED = 1, MGPU__T_DONE = 2 };

struct mgpu__task {
  /* Links: next for the inbox stacks, the completion worklist and the
   * pinned list; next_free (slot index + 1) for the free list. */
  _Atomic(mgpu__task *) next;
  _Atomic uint32_t next_free;
  _Atomic uint32_t gen;  /* bumped on free */
  uint32_t idx;          /* slot index, set once */

  /* The body: written by the submitter before the task is published,
   * read-only afterwards. */
  mgpu_task_fn fn;
  void *arg;
  const mgpu_kernel *kernel;
  mgpu_dim3 grid, block;
  void *args;            /* args_inline or a malloc'd copy */
  size_t args_size;
  int home;              /* worker index of the preferred device, -1 */
  int place;             /* static policy: the worker it was placed on */
  int rerunnable;        /* desc.rerunnable. home and place are changed
                            (by whoever holds the task, never while it is
                            queued) when their worker's device is lost */

  /* Dependencies. pending = unfinished deps + 1 while the submitter is
   * still adding edges; the thread that brings it to 0 makes it ready. */
  _Atomic int pending;
  _Atomic int dep_code;       /* first failed dep's result; its winner also
                                 writes detail */
  _Atomic(mgpu__edge *) succ; /* successors, MGPU__SEALED once complete */
  mgpu__edge edges_inline[MGPU__TASK_INLINE_EDGES];
  mgpu__edge *edges_heap;

  /* Completion. result and detail are written before state becomes
   * MGPU__T_DONE (release) and before succ is sealed. */
  _Atomic uint32_t state;
  int result;
  char *detail;               /* malloc'd; failed tasks only */
  _Atomic uint64_t hold;      /* the handle while the user holds it, else 0 */
  _Atomic int refs;           /* 1 for the pool until completion, +1 held */

  unsigned char args_inline[MGPU__TASK_INLINE_ARGS];
};

typedef struct mgpu__ring_cell {
  _Atomic size_t seq;
  _Atomic(mgpu__task *) task;
} mgpu__ring_cell;

/* Bounded MPMC FIFO (Vyukov) with a locked overflow list, used when full:
 * while the overflow holds tasks, pushes go there too, so the ring drains
 * and the overflow cannot starve. */
typedef struct mgpu__ring {
  mgpu__ring_cell *cells;
  size_t mask;
  _Alignas(64) _Atomic size_t enq;
  _Alignas(64) _Atomic size_t deq;
  _Alignas(64) _Atomic int64_t overflow_count;
  mgpu__mutex overflow_lock; /* guards overflow_head, overflow_tail */
  mgpu__task *overflow_head, *overflow_tail;
} mgpu__ring;

typedef struct mgpu__worker {
  /* Set at creation, read-only afterwards. */
  struct mgpu__pool *pool;
  int index;             /* in the pool */
  int dev;               /* mgpu device id */
  mgpu_stream *stream;
  /* The stream resolved once, so that the per-task synchronize goes
   * straight to the backend without a handle lookup. */
  const mgpu__backend_ops *sync_ops;
  mgpu__bdevice *sync_dev;
  mgpu__bstream *sync_stream;
  _Atomic uint64_t *device_busy; /* the device's busy_ns counter */
  uint32_t trace_track;          /* the worker's track in the trace */
  mgpu__thread thread;
  int started;
  int victims[MGPU_MAX_DEVICES]; /* other workers, nearest first */

  mgpu__deque deque;     /* owner: push/pop; anyone: steal */
  mgpu__deque prefer;    /* same, for tasks preferring this device */
  mgpu__task *pinned_head, *pinned_tail; /* owner only */
  uint64_t clock_ns; /* owner only: end of the last task, 0 after idling */
  /* Owner only, handed over by mgpu__worker_flush: freed slots, completed
   * tasks not yet taken off the in-flight count, metrics not yet added. */
  mgpu__task *free_first, *free_last;
  int free_count;
  int64_t pending_done;
  uint64_t pending_run, pending_busy, pending_stolen;
  /* Owner only: the worker the task about to run was stolen from (-1:
   * none) and when, for the trace's steal arrow. */
  int stolen_from;
  uint64_t stolen_ns;

  _Alignas(64) _Atomic(mgpu__task *) inbox;
  _Alignas(64) _Atomic uint32_t wake_seq; /* futex word of the sleeper */
  _Atomic int sleeping;  /* 1 while parked or about to; cleared by the
                            waker that claims it (CAS 1 -> 0) */

  /* Written by the owner on every task, read by thieves and stats: kept off
   * the line submitters poke to wake the owner. */
  _Alignas(64) _Atomic int running; /* 1 while inside a task */
  _Atomic uint64_t tasks_run;
  _Atomic uint64_t tasks_stolen;
  _Atomic uint64_t tasks_failed;
  _Atomic uint64_t busy_ns;
  /* Set once by the owner when its device is lost: it runs nothing more,
   * hands its queued tasks to the others, and nothing is placed on it. */
  _Atomic int retired;
} mgpu__worker;

struct mgpu__pool {
  /* Set at creation, read-only afterwards. */
  uintptr_t handle;
  mgpu_sched_policy policy;
  mgpu_pool_on_destroy on_destroy;
  int n;
  mgpu__worker *workers;
  int dev_to_worker[MGPU_MAX_DEVICES]; /* -1: device not in the pool */
  uint16_t *static_table; /* static: worker of the k-th placement */
  int static_len;

  _Alignas(64) _Atomic uint64_t place_next; /* static and ws round-robin */
  _Alignas(64) _Atomic int nsleeping;
  _Alignas(64) _Atomic int64_t inflight; /* submitted, not yet completed */
  _Atomic uint32_t idle_seq;              /* futex word of wait_all */
  _Atomic int idle_waiters;
  _Atomic int canceling;
  _Atomic int stopping;

  mgpu__ring shared; /* dynamic only */

  /* The slot table. grow_lock guards growing (chunk count and the chunk
   * pointers' stores); chunks are read without it. */
  mgpu__mutex grow_lock;
  _Atomic(mgpu__task *) chunks[MGPU__TASK_MAX_CHUNKS];
  _Atomic uint32_t nchunks;
  _Alignas(64) _Atomic uint64_t free_head; /* tag << 32 | index + 1 */

  /* The first failure since the last wait_all. err_lock guards both. */
  mgpu__mutex err_lock;
  int first_err;
  char first_detail[256];
};

/* pool.c: looks a public pool up and holds it until mgpu__pool_put (a
 * destroy waits for the calls holding it). */
int mgpu__pool_get(mgpu_pool *h, mgpu__pool **out);
void mgpu__pool_put(mgpu__pool *p);

/* slots.c */
int mgpu__task_table_init(mgpu__pool *p);
void mgpu__task_table_destroy(mgpu__pool *p);
mgpu__task *mgpu__task_at(mgpu__pool *p, uint32_t idx);
/* A free slot, or NULL when out of memory or slots. */
mgpu__task *mgpu__task_alloc(mgpu__pool *p);
/* Drops a reference; the last frees the slot (into self's batch when the
 * caller is a worker of the pool). */
void mgpu__task_unref(mgpu__pool *p, mgpu__task *t, mgpu__worker *self);
/* Counts n tasks as no longer in flight; the last one wakes wait_all. */
void mgpu__inflight_done(mgpu__pool *p, int64_t n);

static inline uint64_t mgpu__task_handle(const mgpu__task *t) {
  return (uint64_t)atomic_load_explicit(&t->gen, memory_order_relaxed)
             << 32 |
         (uint64_t)(t->idx + 1);
}

/* task.c */
/* Runs a ready task on worker w (or completes it without running when a
 * dependency failed or the pool is canceling). */
void mgpu__task_run(mgpu__worker *w, mgpu__task *t);
/* Completes t with result r (0 or a code) and releases its dependents. */
void mgpu__task_complete(mgpu__pool *p, mgpu__task *t, int r,
                         mgpu__worker *self);

/* slots.c: hands back the worker's batched slots, completions and metrics
 * (owner thread only). */
void mgpu__worker_flush(mgpu__worker *w);
/* Waits until no task is in flight (wait_all, destroy). */
void mgpu__pool_drain(mgpu__pool *p);
/* Returns and clears the first failure, setting the caller's detail. */
int mgpu__pool_take_error(mgpu__pool *p);

/* pool.c */
/* Puts a ready task where the policy wants it and wakes a worker. self is
 * the calling worker, or NULL on other threads. */
void mgpu__sched_ready(mgpu__pool *p, mgpu__task *t, mgpu__worker *self);
/* A task that cannot run on w (its device was lost): placed on a worker
 * whose device works, or completed with MGPU_EDEVLOST when none does. */
void mgpu__sched_elsewhere(mgpu__pool *p, mgpu__task *t, mgpu__worker *w);
/* Whether w's device was lost. */
int mgpu__worker_lost(const mgpu__worker *w);
/* The worker of the calling thread if it belongs to p, else NULL. */
mgpu__worker *mgpu__sched_self(mgpu__pool *p);

/* queue.c */
void mgpu__inbox_push(_Atomic(mgpu__task *) *inbox, mgpu__task *t);
/* Takes every task, oldest first, as a list linked through next. */
mgpu__task *mgpu__inbox_take(_Atomic(mgpu__task *) *inbox);
int mgpu__ring_init(mgpu__ring *r, size_t cap);
void mgpu__ring_destroy(mgpu__ring *r);
void mgpu__ring_push(mgpu__ring *r, mgpu__task *t);
mgpu__task *mgpu__ring_pop(mgpu__ring *r);
int mgpu__ring_empty(mgpu__ring *r);

/* queue.c: futex sleeping. */
void mgpu__park_wait(_Atomic uint32_t *word, uint32_t expected);
void mgpu__park_wake(_Atomic uint32_t *word, int count);

#endif /* MGPU_SCHED_INTERNAL_H */
