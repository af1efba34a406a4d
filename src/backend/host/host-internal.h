/* The host backend's own state, shared by its files: host.c (the table),
 * queue.c, worker.c, device.c, memory.c, stream.c, event.c, work.c,
 * graph.c, ipc.c and kernels.c. How the backend works: host.c.
 *
 * Locks: a device's lock comes before an event's lock or a graph board's
 * lock (docs/ARCHITECTURE.md, "Lock order"); two devices' locks are held
 * together only through try-locks (stream_lock_idle).
 */
#ifndef MGPU_BACKEND_HOST_INTERNAL_H
#define MGPU_BACKEND_HOST_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/graph.h"
#include "obs/trace.h"
#include "util/thread.h"

/* The environment the core handed over (host.c); set before any device
 * opens, read-only afterwards. */
extern const mgpu__backend_env *mgpu__host_env;

/* Copies into device memory of at least this size bypass the cache. */
#define STREAMING_MIN ((size_t)256 << 10)

typedef enum op_kind {
  OP_COPY,
  OP_COPY2D,
  OP_MEMSET,
  OP_LAUNCH,
  OP_BUILTIN,
  OP_CALLBACK,
  OP_RECORD,
  OP_WAIT,
  OP_GRAPH
} op_kind;

typedef struct host_graph host_graph;

typedef struct op {
  op_kind kind;
  struct op *next;
  mgpu__trace_tag *tag; /* the span's name, while tracing; owned */
  union {
    struct {
      void *dst;
      const void *src;
      size_t size;
      int streaming; /* write dst with non-temporal stores */
      int path;      /* mgpu_metric_path, or -1 (host to host) */
    } copy;
    struct {
      unsigned char *dst;
      const unsigned char *src;
      size_t dpitch, spitch, width, height;
    } copy2d;
    struct {
      void *dst;
      int value;
      size_t size;
    } memset;
    struct {
      void (*fn)(const mgpu_kernel_ctx *, const void *);
      mgpu_dim3 grid, block;
      void *args;
      char name[40]; /* the kernel's, for a failure's detail */
    } launch;
    mgpu__builtin builtin;
    struct {
      void (*fn)(void *);
      void *arg;
    } callback;
    struct {
      mgpu__bevent *event;
      uint64_t seq;
      int watched; /* a wait: a worker watched the event once already */
      /* A record: the next record of the event not yet completed, in the
       * order of their numbers (the event's pending list, under its
       * lock). */
      struct op *pending_next;
    } event;
    struct {
      host_graph *graph;
      uint64_t launch;
      int next; /* the node to run next (owned by the running worker) */
      uint64_t t0; /* when its first slice began (a part that waits runs
                      in slices; its trace span covers them all) */
      int spun; /* its last slice ended on a wait it spun for in vain: the
                   next worker to take it parks it unless that is over */
    } graph;
  } u;
} op;

struct mgpu__bevent {
  mgpu__bdevice *dev;
  /* lock guards every field below. It comes after a device's lock
   * (docs/ARCHITECTURE.md, "Lock order"). */
  mgpu__mutex lock;
  mgpu__cond done;
  uint64_t recorded;  /* sequence number of the latest record call */
  /* Records are completed in the order their streams run them, not in the
   * order of their numbers (two streams): a wait for record k waits for
   * that record only, as cudaStreamWaitEvent waits for the record it
   * captured, not for a later one that completed first, and not for an
   * earlier one either.
   *  - pending: the records not completed yet, by number (their ops,
   *    linked through u.event.pending_next); record k is done when it is
   *    not on the list (mgpu__host_event_done);
   *  - completed: every record up to it is done (the first pending's
   *    number - 1, or recorded); written under lock, also read without it
   *    by a wait that watches it (worker.c), which may so see a record
   *    done late, never early;
   *  - top: the highest number completed, whose time and place time_ns
   *    and recorded_at keep. */
  struct op *pending, *pending_tail;
  _Atomic uint64_t completed;
  uint64_t top;
  /* A record call between taking its number and queuing its operation:
   * a wait takes the event's state only when none is (a wait that took a
   * number whose record was not queued yet, on the same stream, was
   * queued ahead of it and waited for ever). */
  int recording;
  uint64_t time_ns;   /* when `top` was completed */
  mgpu__trace_point recorded_at; /* where and when, for the trace's arrows */
  mgpu__bstream *waiters; /* streams parked on this event */
  /* The work before the latest completion depended on a device that was
   * lost (its id + 1; 0: it did not): a stream that waits for the event
   * fails with MGPU_EDEVLOST naming that device, as does a synchronize. */
  int lost_by;
  /* Record and wait operations queued that still point at the event. A
   * record can outlive a later one that completed first (records on two
   * streams), and a wait can outlive every record: destroy waits for both. */
  int ops;
  /* The watch budget of the waits for this event (util/thread.h). */
  mgpu__spin spin;
};

struct mgpu__bstream {
  mgpu__bdevice *dev;
  uint32_t track; /* the stream's track in the trace; set at creation */
  /* Owned by the worker running the stream: when its last operation ran,
   * and the arrow a wait left for the next operation (arrow_name NULL:
   * none). An arrow starts inside the span before a record and ends
   * inside the span after a wait, where Perfetto binds its ends. */
  uint64_t last_t0, last_t1;
  mgpu__trace_point arrow_from;
  const char *arrow_name;
  /* Guarded by dev->lock. */
  op *head, *tail;
  int queued;               /* on the ready list */
  int running;              /* a worker runs its head */
  int parked;               /* waiting on an event */
  /* First asynchronous error, 0 if none: written under dev->lock, read
   * without it by synchronize's look at an idle stream. */
  _Atomic int error;
  char error_detail[320];   /* its detail */
  /* The lost device (its id + 1) whose loss the stream's work since its
   * last synchronize depends on: its own, or one whose event it waited for.
   * Written under dev->lock, read without it when an event completes. */
  _Atomic int lost_from;
  /* Operations queued and finished since creation: synchronize waits for
   * the count queued at its call, not for the queue to run dry, which a
   * thread that keeps queueing could put off for ever. syncs: threads in
   * synchronize; sync_at: the least count one of them waits for (0: none
   * registered), so that a worker wakes them when it is reached, not at
   * every finished operation (a synchronize behind a queue of graph
   * launches woke at each of their operations). */
  _Atomic uint64_t nqueued;   /* written under dev->lock (a load and a
                                 store); synchronize reads both counts
                                 without it */
  _Atomic uint64_t nfinished; /* written under dev->lock; synchronize
                                 watches it without the lock */
  uint64_t sync_at;
  int syncs; /* also counts a destroy waiting for the stream to run dry */
  mgpu__bstream *ready_next;
  mgpu__bstream *wait_next; /* in an event's waiters (event lock) */
};

struct mgpu__bdevice {
  int id;
  int nworkers;
  mgpu__thread *workers;
  /* lock guards the ready list, stopping and every stream's queue. */
  mgpu__mutex lock;
  mgpu__cond work;  /* a stream became ready, or stopping */
  mgpu__cond idle;  /* some stream's queue became empty, or an operation
                       finished on a stream being synchronized */
  mgpu__bstream *ready_head, *ready_tail;
  int stopping;
  /* Streams on the ready list, readable without the lock: an idle worker
   * watches it for a few microseconds before it sleeps. */
  _Atomic int nready;
  /* Workers awake and watching nready (lock): a push wakes a sleeping
   * worker only for a stream that no watcher will take, since a worker
   * woken for nothing spins on a core that the work needs. */
  int watching;
  /* Spin budgets (util/thread.h): idle workers watching nready, and
   * synchronize watching a stream's nfinished. */
  mgpu__spin work_spin, sync_spin;
  /* Peer access this device has enabled, by mgpu device id (lock). */
  unsigned char peer_enabled[MGPU_MAX_DEVICES];
  /* A lost device (host_lose, or MGPU_FAULT's device:N@after:K counted by
   * the workers) runs no more work: its queued operations fail the stream
   * with MGPU_EDEVLOST, events still complete so nobody waits for ever, and
   * host callbacks still run (they free what the work used). lost_why is
   * written once, under lock, before lost is set. */
  _Atomic int lost;
  char lost_why[96];
};

/* A counter to watch until it reaches a target (mgpu__spin_until): a
 * stream's finished operations, a graph's signal. seq_cst: a graph's
 * waiter counts itself parked and then looks, a poster stores and then
 * looks for parked waiters, and one of the two must see the other. */
typedef struct counter_target {
  const _Atomic uint64_t *counter;
  uint64_t target;
} counter_target;

static inline int counter_reached(const void *p) {
  const counter_target *t = p;
  return atomic_load(t->counter) >= t->target;
}

/* queue.c: ready_push puts s on d's ready list (d->lock held); enqueue
 * queues o on s (taking the lock; s owns o from then on); op_new makes an
 * operation (NULL when out of memory: op_nomem sets the detail). */
void mgpu__host_ready_push(mgpu__bdevice *d, mgpu__bstream *s);
void mgpu__host_enqueue(mgpu__bstream *s, op *o);
op *mgpu__host_op_new(op_kind kind);
int mgpu__host_op_nomem(mgpu__bdevice *d);
/* stream.c: counts one more operation queued on s (d->lock held). */
void mgpu__host_count_queued(mgpu__bstream *s);

/* worker.c: what the workers run (mgpu__host_worker_main is each one's
 * thread). op_free releases an operation that ran or was never queued;
 * lose_locked marks d lost (d->lock held). */
void mgpu__host_unpark(mgpu__bstream *w);
/* e->lock held: whether record seq of e is done (0 never recorded: done). */
int mgpu__host_event_done(const mgpu__bevent *e, uint64_t seq);
/* The span of operation o that ran from t0 to t1 on s (and the arrow of a
 * wait before it). */
void mgpu__host_trace_op(mgpu__bstream *s, const op *o, uint64_t t0,
                         uint64_t t1);
/* s->dev->lock held, an operation of s just finished: wakes the threads in
 * synchronize once the count one of them waits for is reached. */
void mgpu__host_sync_wake(mgpu__bdevice *d, mgpu__bstream *s);
/* A kernel launch as run_launch runs it: a stream's operation or a graph's
 * node (name: the kernel's, for a failure's detail). */
typedef struct mgpu__host_kernel_run {
  void (*fn)(const mgpu_kernel_ctx *, const void *);
  mgpu_dim3 grid, block;
  const void *args;
  const char *name;
} mgpu__host_kernel_run;
void mgpu__host_run_launch(mgpu__bdevice *d, mgpu__bstream *s,
                           const mgpu__host_kernel_run *l);
void mgpu__host_op_free(op *o);
void mgpu__host_lose_locked(mgpu__bdevice *d, const char *why);
/* d->lock held, d lost: s fails with MGPU_EDEVLOST naming d (unless it
 * failed already), and the streams that wait for it in turn. */
void mgpu__host_stream_lost_locked(mgpu__bdevice *d, mgpu__bstream *s);
void *mgpu__host_worker_main(void *arg);

/* graph.c: a device's part of a graph, run as one operation
 * (graph_must_park: the stream's device lock held); the table's graph
 * slots are declared below. */
void mgpu__host_graph_unref(host_graph *g);
int mgpu__host_graph_unfinished(const op *o);
int mgpu__host_graph_must_park(mgpu__bstream *s, op *o);
void mgpu__host_graph_run(mgpu__bdevice *d, mgpu__bstream *s, op *o);

/* The table's slots (host.c holds the table; the files above define them):
 * mgpu__host_<slot> for the core table, the claim and the loss sub-tables,
 * mgpu__host_graph_<slot> for the graph sub-table, declared from
 * backend.h's lists so that each signature is written once. (The core
 * table's optional stream_order_native is declared and not defined: the
 * host backend leaves that slot NULL.) */
#define MGPU__HOST_SLOT(group, seam, ret, name, params, args, dev)            \
  ret mgpu__host_##name params;
#define MGPU__HOST_GRAPH_SLOT(group, seam, ret, name, params, args, dev)      \
  ret mgpu__host_graph_##name params;
MGPU__BACKEND_CORE_SLOTS(MGPU__HOST_SLOT)
MGPU__BACKEND_CLAIM_SLOTS(MGPU__HOST_SLOT)
MGPU__BACKEND_LOSS_SLOTS(MGPU__HOST_SLOT)
MGPU__BACKEND_GRAPH_SLOTS(MGPU__HOST_GRAPH_SLOT)
#undef MGPU__HOST_SLOT
#undef MGPU__HOST_GRAPH_SLOT

/* Runs a built-in kernel on the calling thread (kernels.c). */
void mgpu__host_builtin_run(const mgpu__builtin *b);

#endif /* MGPU_BACKEND_HOST_INTERNAL_H */
