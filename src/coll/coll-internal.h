/* Internal interface of the collectives (src/coll/).
 *
 * comm.c      communicators: create, destroy, queries, pooled resources.
 * group.c     the rendezvous: every rank's call is checked on its own, then
 *             parked in a pending operation until all ranks have called; the
 *             thread that brings the last rank checks the ranks against each
 *             other and issues the work on every rank's stream. Groups.
 * direct.c    the direct algorithm (host devices): each rank reduces its slice
 *             straight from every peer's buffer, writes it to every output.
 * ring.c      the ring (every backend): chunked, pipelined copies and
 *             reductions ordered by events.
 * reduce_host.c  mgpu_reduce_to_host.
 * barrier.c   host barriers and stream barriers.
 * lost.c      waking the waits above when a device is lost.
 *
 * Locking: comm->lock guards the pending operations, the per-rank sequence
 * numbers, the abort state and every pooled resource (events, scratch
 * buffers). Work is issued with comm->lock held, so the operations of one
 * communicator reach the streams in sequence order.
 */
#ifndef MGPU_COLL_INTERNAL_H
#define MGPU_COLL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/core-internal.h"
#include "mgpu/coll.h"
#include "mgpu/copy.h"

/* Bytes of a collective's error detail (a timeout names the missing
 * devices and their last operations). */
#define MGPU__COLL_DETAIL 1024

/* One rank's arguments to a collective (its arg), checked against its own
 * device. "part" names a distribution's share (src/part) and a graph's
 * per-device part, not this. */
typedef struct mgpu__coll_arg {
  int present;
  mgpu__coll_kind kind;
  size_t count;
  mgpu_dtype dtype;
  mgpu_op op;
  int root;
  mgpu_buffer *send_h; /* NULL where the kind ignores it on this rank */
  mgpu_buffer *recv_h;
  size_t send_off;     /* bytes into send_h where the data starts */
  size_t recv_off;
  const void *send;    /* device pointers of those starts */
  void *recv;
  int in_place;        /* send_h == recv_h */
  mgpu_stream *stream_h;
  /* Held by the rank's call from its check until its result is collected
   * (a free or destroy of any of them waits for that): */
  mgpu__stream *stream;
  struct mgpu__buf *send_b, *recv_b; /* NULL where ignored */
} mgpu__coll_arg;

/* One collective: the k-th call of every rank. */
typedef struct mgpu__coll_op {
  uint64_t seq;
  int arrived;      /* ranks whose arg is present */
  /* 1 once issued or failed: written under comm->lock, read without it by
   * callers that spin before they park. */
  _Atomic int done;
  int rc;           /* result for every rank */
  char detail[MGPU__COLL_DETAIL]; /* a failure's, handed to every rank */
  int pickups;      /* calls that still have to collect the result */
  struct mgpu__coll_op *next;
  mgpu__coll_arg arg[]; /* n */
} mgpu__coll_op;

typedef struct mgpu__comm {
  int n;                /* local ranks: devs[0 .. n) */
  int nglobal, first;   /* ranks over every process; global rank of devs[0]
                           (n and 0 unless remote) */
  int has_remote;
  mgpu_comm_remote remote; /* the module that runs collectives across
                              processes (mgpu_comm_create_remote) */
  int devs[MGPU_MAX_DEVICES];
  mgpu_comm_config cfg; /* resolved: no field left at its default */
  int provider;         /* MGPU_COLL_PROVIDER_MGPU or _NCCL */
  int algo;             /* MGPU_COLL_ALGO_RING or _DIRECT (provider MGPU) */
  /* peer_read[r]: rank r's device may read the previous rank's memory
   * directly in a kernel (ring). */
  int peer_read[MGPU_MAX_DEVICES];
  int all_read; /* every rank's device reads every other's memory */
  void *nccl;                      /* the provider's communicator */
  const mgpu__backend_ops *nccl_ops;

  mgpu__mutex lock;
  mgpu__cond cond;
  uint64_t next_seq[MGPU_MAX_DEVICES]; /* per rank: its next call's seq */
  mgpu__coll_op *ops;                  /* pending and done, seq order */
  int aborted;                         /* 0, or the code every call gets
                                          after an abort: MGPU_ETIMEDOUT,
                                          MGPU_EDEVLOST, MGPU_ECANCELED
                                          (mgpu_comm_abort) */
  char abort_detail[MGPU__COLL_DETAIL];
  /* Set by destroy after it closed the handle: a call inside (holding a
   * use of the handle, which destroy waits for) leaves with MGPU_EFREED. */
  int destroying;
  uintptr_t handle;
  mgpu__coll_op *spare; /* a freed operation kept for the next (lock) */
  mgpu__spin collect_spin; /* callers' watch for their operation */

  /* Pooled resources, created on first use, freed by destroy. */
  mgpu_event **events[MGPU_MAX_DEVICES];
  int nevents[MGPU_MAX_DEVICES];
  int events_used[MGPU_MAX_DEVICES]; /* in the operation being issued */
  mgpu_buffer *scratch[MGPU_MAX_DEVICES];
  /* Outgrown scratch buffers: work in flight may still use them, and
   * freeing one would wait for the device, so they are kept until destroy
   * (sizes grow geometrically: they add up to less than the current one). */
  mgpu_buffer *retired[MGPU_MAX_DEVICES][16];
  int nretired[MGPU_MAX_DEVICES];
  mgpu_stream *streams[MGPU_MAX_DEVICES]; /* internal, for reduce_to_host */
  /* The shared medium path's work lists (direct.c), created on first use:
   * one may still be looked at by a late worker while the next collective
   * runs, so there are a few. */
  struct mgpu__coll_shares *shares[4];
  mgpu__spin share_spin; /* the issuer's watch for the last share */
} mgpu__comm;

/* group.c */
const char *mgpu__coll_kind_name(mgpu__coll_kind k);
/* Checks the ranks of a complete operation against each other:
 * MGPU_EMISMATCH naming the first field two ranks disagree on. */
int mgpu__coll_check_consistent(mgpu__comm *c, mgpu__coll_op *op);
/* How deep the calling thread is inside mgpu_group_begin. */
int mgpu__coll_group_depth(void);

/* record.c: a group whose streams capture a graph is recorded into it. */
typedef struct mgpu__coll_recorded {
  mgpu_comm *comm;
  mgpu__comm *c; /* held by the caller */
  int grank, rank;
  const mgpu__coll_arg *arg; /* resolved: its stream held */
} mgpu__coll_recorded;
/* Records n resolved calls (n at most MGPU__GRAPH_CALL_MAX, some of whose
 * streams capture) as one call of the graph (core/capture.h): 0, or a
 * code with nothing recorded. */
int mgpu__coll_record(const mgpu__coll_recorded *calls, int n);

/* comm.c */
/* With c->lock held: the communicator is aborted with code (its detail in
 * c->abort_detail): every pending operation of every rank fails with it,
 * and every call waiting in c is woken. Later calls fail the same way. */
void mgpu__comm_fail_pending(mgpu__comm *c, int code);
/* Looks a communicator up and holds it until mgpu__comm_put. */
int mgpu__comm_get(const mgpu_comm *h, mgpu__comm **out);
void mgpu__comm_put(mgpu__comm *c);
/* The next free event of rank r in the operation being issued; events are
 * recycled across operations (a wait takes the event's state when it is
 * queued, as cudaStreamWaitEvent does). */
int mgpu__comm_event(mgpu__comm *c, int r, mgpu_event **out);
/* A scratch buffer of at least size bytes on rank r's device, kept for later
 * operations (never allocated per call once large enough). */
int mgpu__comm_scratch(mgpu__comm *c, int r, size_t size, mgpu_buffer **out);
int mgpu__comm_stream(mgpu__comm *c, int r, mgpu_stream **out);

/* Issue an operation whose args are all present and consistent; called
 * with c->lock held. */
int mgpu__coll_direct_issue(mgpu__comm *c, mgpu__coll_op *op);
int mgpu__coll_ring_issue(mgpu__comm *c, mgpu__coll_op *op);
/* Completes op on the calling thread: waits for every rank's stream, then
 * runs every rank's job of the direct algorithm there (host devices only:
 * it reads and writes their memory from the CPU). For an issue that failed
 * after some of its work was queued, when the call must not fail any more.
 * Returns 0, or MGPU_EDEVLOST. */
int mgpu__coll_direct_complete(mgpu__comm *c, mgpu__coll_op *op);
/* 0 when every device of the (checked) list has the same backend, else
 * MGPU_ENOTSUP naming two that differ. */
int mgpu__coll_same_backend(const char *what, const int *devs, int n);

/* lost.c: a wait for other ranks registers its condition variable while it
 * waits, so that the core's device-lost hook wakes it. wait_begin and
 * wait_end may be called with the waiter's own lock held. A waiter sleeps
 * until mgpu__coll_wait_until(deadline) at most (deadline 0: none), then
 * looks at its devices again. */
#define MGPU__COLL_LOST_POLL_NS 10000000u
typedef struct mgpu__coll_waiter {
  mgpu__cond *cond;
  struct mgpu__coll_waiter *prev, *next;
} mgpu__coll_waiter;
void mgpu__coll_wait_begin(mgpu__coll_waiter *w, mgpu__cond *cond);
void mgpu__coll_wait_end(mgpu__coll_waiter *w);
uint64_t mgpu__coll_wait_until(uint64_t deadline);

/* Splits count elements into n near-equal slices; slice i is
 * [lo(i), lo(i+1)). */
static inline size_t mgpu__coll_slice(size_t count, int n, int i) {
  if (i == 0) return 0;
  if (i == n) return count; /* no division for one slice (small messages) */
  size_t un = (size_t)n, ui = (size_t)i;
  return (count / un) * ui + ((count % un) * ui) / un;
}

#endif /* MGPU_COLL_INTERNAL_H */
