/* The rendezvous of collective calls, and groups.
 *
 * Each rank's call is first checked on its own (handles, devices, sizes).
 * It then joins the communicator's pending operation of its sequence number
 * (the k-th call of every rank forms operation k) and waits until every rank
 * has joined. The thread that brings the last rank checks the ranks against
 * each other (kind, count, type, op, root): a mismatch fails every rank's
 * call before any data moves. Otherwise it issues the work on every rank's
 * stream, still holding the communicator's lock, so that operations reach
 * the streams in sequence order.
 *
 * Waiting has a deadline: a call that waits longer than the communicator's
 * timeout aborts it, and every call of it returns MGPU_ETIMEDOUT naming the
 * devices that never arrived (NCCL's missing-rank hang, answered).
 *
 * Inside mgpu_group_begin/end, calls are only checked and recorded in the
 * thread's group; mgpu_group_end joins every recorded call first and only
 * then waits, so one thread can issue for every rank. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "core/capture.h"
#include "util/fault.h"

typedef struct group_call {
  mgpu_comm *comm;
  int grank;           /* the rank the caller named (global) */
  int rank;            /* local (devs[rank]): set by resolve */
  mgpu__coll_arg arg;
  mgpu__comm *held;    /* looked up and held, from resolve to collect */
  int pinned;          /* its handles are pins of the batch, not uses */
  mgpu__comm *c;       /* set while joined */
  mgpu__coll_op *op;
} group_call;

/* The calling thread's group; owned by that thread only. */
static _Thread_local struct {
  int depth;
  group_call *calls; /* local, or the heap once more are recorded */
  group_call local[8];
  int ncalls, cap;
  int first_rc;         /* the first error of a call inside the group */
  char first_detail[MGPU__COLL_DETAIL];
} group;

/* A thread that exits between mgpu_group_begin and mgpu_group_end leaves
 * its recorded calls behind: a key's destructor (run at thread exit, while
 * the thread's storage is still there) frees them. The key holds a pointer
 * to the thread's own group only while it has calls. */
static pthread_once_t group_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t group_key;
static int group_key_ok;

static void group_at_exit(void *arg) {
  (void)arg;
  if (group.calls != group.local) mgpu__free(group.calls);
  group.calls = NULL;
  group.ncalls = group.cap = group.depth = 0;
}

static void group_key_make(void) {
  group_key_ok = pthread_key_create(&group_key, group_at_exit) == 0;
  if (!group_key_ok)
    mgpu__log(MGPU_LOG_WARN, "group: no thread key: a thread that exits "
              "inside a group leaks its calls");
}

const char *mgpu__coll_kind_name(mgpu__coll_kind k) {
  switch (k) {
    case MGPU__COLL_ALLREDUCE: return "allreduce";
    case MGPU__COLL_REDUCE: return "reduce";
    case MGPU__COLL_BROADCAST: return "broadcast";
    case MGPU__COLL_ALLGATHER: return "allgather";
    case MGPU__COLL_REDUCE_SCATTER: return "reduce_scatter";
  }
  return "collective";
}

static int is_reduction(mgpu__coll_kind k) {
  return k == MGPU__COLL_ALLREDUCE || k == MGPU__COLL_REDUCE ||
         k == MGPU__COLL_REDUCE_SCATTER;
}

static int has_root(mgpu__coll_kind k) {
  return k == MGPU__COLL_REDUCE || k == MGPU__COLL_BROADCAST;
}

/* Resolves one buffer argument: on the rank's device and at least need
 * bytes. NULL is allowed only when need is 0. */
static int check_buf(const char *what, const char *arg, int rank, int dev,
                     mgpu_buffer *h, size_t need, void **ptr,
                     mgpu__buf **held, int pinned) {
  *ptr = NULL;
  *held = NULL;
  if (h == NULL && need == 0) return 0;
  mgpu__buf *b;
  int rc = 0;
  if (!pinned) {
    rc = mgpu__buf_get(h, arg, &b);
  } else {
    b = mgpu__handle_pinned((uintptr_t)h, MGPU__H_BUFFER, arg, &rc);
    if (b == NULL) {
      *held = NULL;
      return rc;
    }
    *held = b; /* a pin: given back with the batch */
  }
  if (rc != 0) return rc;
  *held = b; /* given back by arg_put, even when a check below fails */
  if (arg[0] == 'r' && (rc = mgpu__buf_check_writable(b, what)) != 0)
    return rc;
  if (b->dev != dev)
    return mgpu__error(MGPU_EWRONGDEV,
                       "%s rank %d: %s buffer is on device %d, rank %d is "
                       "device %d",
                       what, rank, arg, b->dev, rank, dev);
  if (b->size < need)
    return mgpu__error(MGPU_ERANGE,
                       "%s rank %d (device %d): %s buffer holds %zu bytes, "
                       "the collective needs %zu",
                       what, rank, dev, arg, b->size, need);
  *ptr = b->ptr;
  return 0;
}

/* Gives back the handles check_arg held (uses; pins go back with their
 * batch). */
static void arg_put(mgpu__coll_arg *p, int pinned) {
  if (!pinned) {
    mgpu__stream_put(p->stream);
    mgpu__buf_put(p->send_b);
    mgpu__buf_put(p->recv_b);
  }
  p->stream = NULL;
  p->send_b = p->recv_b = NULL;
}

/* Sizes rank grank's send and recv buffers for its kind (roots and NCCL's
 * in-place layouts), checks and resolves them; part of check_arg. */
static int check_layout(const char *what, int grank, int dev, size_t bytes,
                        size_t total, mgpu__coll_arg *p, int pinned) {
  int rc;
  size_t need_send = 0, need_recv = 0;
  int is_root = !has_root(p->kind) || grank == p->root;
  switch (p->kind) {
    case MGPU__COLL_ALLREDUCE: need_send = need_recv = bytes; break;
    case MGPU__COLL_REDUCE:
      need_send = bytes;
      need_recv = is_root ? bytes : 0;
      if (!is_root) p->recv_h = NULL;
      break;
    case MGPU__COLL_BROADCAST:
      need_send = is_root ? bytes : 0;
      need_recv = bytes;
      if (!is_root) p->send_h = NULL;
      break;
    case MGPU__COLL_ALLGATHER: need_send = bytes; need_recv = total; break;
    case MGPU__COLL_REDUCE_SCATTER: need_send = total; need_recv = bytes; break;
  }
  p->in_place = p->send_h != NULL && p->send_h == p->recv_h;
  if (p->in_place && p->kind == MGPU__COLL_ALLGATHER) need_send = total;
  if (p->in_place && p->kind == MGPU__COLL_REDUCE_SCATTER) need_recv = total;
  void *send;
  rc = check_buf(what, "send", grank, dev, p->send_h, need_send, &send,
                 &p->send_b, pinned);
  if (rc != 0) return rc;
  rc = check_buf(what, "recv", grank, dev, p->recv_h, need_recv, &p->recv,
                 &p->recv_b, pinned);
  if (rc != 0) return rc;
  p->send = send;
  /* NCCL's in-place layouts: the rank's own block of the larger buffer. */
  if (p->in_place && p->kind == MGPU__COLL_ALLGATHER) {
    p->send_off = (size_t)grank * bytes;
    p->send = (char *)p->recv + p->send_off;
  }
  if (p->in_place && p->kind == MGPU__COLL_REDUCE_SCATTER) {
    p->recv_off = (size_t)grank * bytes;
    p->recv = (char *)send + p->recv_off;
  }
  return 0;
}

/* Checks a rank's call on its own and resolves its handles, which stay held
 * (also on failure) until arg_put. rank is the local rank (devs[rank]);
 * grank the global one, which roots, sizes and in-place blocks are counted
 * in (the same unless the comm spans processes). */
static int check_arg(mgpu__comm *c, int rank, mgpu__coll_arg *p,
                      int pinned) {
  const char *what = mgpu__coll_kind_name(p->kind);
  int grank = c->first + rank;
  if (rank < 0 || rank >= c->n)
    return mgpu__error(MGPU_EINVAL, "%s: rank %d of a communicator of %d%s",
                       what, grank, c->nglobal,
                       c->has_remote ? " is not in this process" : "");
  int dev = c->devs[rank];
  int rc = 0;
  if (!pinned) /* a capturing stream records the group (record.c) */
    rc = mgpu__stream_get_capturing(p->stream_h, &p->stream);
  else if ((p->stream = mgpu__handle_pinned((uintptr_t)p->stream_h,
                                            MGPU__H_STREAM, "stream",
                                            &rc)) == NULL)
    return rc;
  if (rc != 0) return rc;
  if (p->stream->dev != dev)
    return mgpu__error(MGPU_EWRONGDEV,
                       "%s rank %d: stream is on device %d, rank %d is device "
                       "%d",
                       what, grank, p->stream->dev, grank, dev);
  size_t esz = mgpu_dtype_size(p->dtype);
  if (esz == 0)
    return mgpu__error(MGPU_EINVAL, "%s rank %d: unknown type %d", what, grank,
                       (int)p->dtype);
  if (is_reduction(p->kind) && (p->op < MGPU_SUM || p->op > MGPU_MAX))
    return mgpu__error(MGPU_EINVAL, "%s rank %d: unknown op %d", what, grank,
                       (int)p->op);
  if (has_root(p->kind) && (p->root < 0 || p->root >= c->nglobal))
    return mgpu__error(MGPU_EINVAL, "%s rank %d: root %d of %d ranks", what,
                       grank, p->root, c->nglobal);
  size_t n = (size_t)c->nglobal, bytes, total;
  /* count * esz * n must fit, checked without dividing. */
  if (__builtin_mul_overflow(p->count, esz, &bytes) ||
      __builtin_mul_overflow(bytes, n, &total))
    return mgpu__error(MGPU_ERANGE, "%s rank %d: count %zu overflows", what,
                       grank, p->count);
  return check_layout(what, grank, dev, bytes, total, p, pinned);
}

int mgpu__coll_check_consistent(mgpu__comm *c, mgpu__coll_op *op) {
  const mgpu__coll_arg *a = &op->arg[0];
  const char *what = mgpu__coll_kind_name(a->kind);
  for (int r = 1; r < c->n; r++) {
    const mgpu__coll_arg *b = &op->arg[r];
    const char *field = NULL;
    char va[32] = "", vb[32] = "";
    if (b->kind != a->kind) {
      return mgpu__error(MGPU_EMISMATCH,
                         "collective #%llu: rank 0 (device %d) called %s, "
                         "rank %d (device %d) called %s",
                         (unsigned long long)op->seq, c->devs[0], what, r,
                         c->devs[r], mgpu__coll_kind_name(b->kind));
    } else if (b->count != a->count) {
      field = "count";
      snprintf(va, sizeof va, "%zu", a->count);
      snprintf(vb, sizeof vb, "%zu", b->count);
    } else if (b->dtype != a->dtype) {
      field = "dtype";
      snprintf(va, sizeof va, "%s", mgpu_dtype_name(a->dtype));
      snprintf(vb, sizeof vb, "%s", mgpu_dtype_name(b->dtype));
    } else if (is_reduction(a->kind) && b->op != a->op) {
      field = "op";
      snprintf(va, sizeof va, "%s", mgpu_op_name(a->op));
      snprintf(vb, sizeof vb, "%s", mgpu_op_name(b->op));
    } else if (has_root(a->kind) && b->root != a->root) {
      field = "root";
      snprintf(va, sizeof va, "%d", a->root);
      snprintf(vb, sizeof vb, "%d", b->root);
    }
    if (field != NULL)
      return mgpu__error(MGPU_EMISMATCH,
                         "%s #%llu: rank 0 (device %d) has %s %s, rank %d "
                         "(device %d) has %s %s",
                         what, (unsigned long long)op->seq, c->devs[0], field,
                         va, r, c->devs[r], field, vb);
  }
  return 0;
}

static int issue_nccl(mgpu__comm *c, mgpu__coll_op *op) {
  const mgpu__backend_coll_ops *ops = c->nccl_ops->coll;
  int rc = ops->group_start ? ops->group_start() : 0;
  if (rc != 0) return rc;
  for (int r = 0; r < c->n && rc == 0; r++) {
    const mgpu__coll_arg *p = &op->arg[r];
    mgpu__coll_args a = {p->kind, p->send, p->recv, p->count,
                         p->dtype, p->op, p->root};
    rc = ops->run(c->nccl, r, &a, p->stream->bstream);
  }
  int erc = ops->group_end ? ops->group_end() : 0;
  return rc != 0 ? rc : erc;
}

_Static_assert((int)MGPU_COLL_ALLREDUCE == (int)MGPU__COLL_ALLREDUCE &&
                   (int)MGPU_COLL_REDUCE == (int)MGPU__COLL_REDUCE &&
                   (int)MGPU_COLL_BROADCAST == (int)MGPU__COLL_BROADCAST &&
                   (int)MGPU_COLL_ALLGATHER == (int)MGPU__COLL_ALLGATHER &&
                   (int)MGPU_COLL_REDUCE_SCATTER ==
                       (int)MGPU__COLL_REDUCE_SCATTER,
               "public and internal collective kinds agree");

/* Across processes: the module's issue function runs it; or, when it
 * failed here first (code != 0), the module's fail function tells the
 * other processes. */
static int issue_remote(mgpu__comm *c, mgpu__coll_op *op, int code) {
  mgpu_coll_call calls[MGPU_MAX_DEVICES];
  for (int r = 0; r < c->n; r++) {
    const mgpu__coll_arg *p = &op->arg[r];
    calls[r] = (mgpu_coll_call){(int)p->kind, c->first + r, p->send_h,
                                p->send_off, p->recv_h, p->recv_off,
                                p->in_place, p->count, p->dtype, p->op,
                                p->root, p->stream_h};
  }
  if (code == 0) return c->remote.issue(c->remote.ctx, calls, c->n);
  if (c->remote.fail != NULL) {
    /* The detail of code is the local ranks' result: kept over whatever
     * fail leaves. */
    char detail[sizeof op->detail];
    snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
    c->remote.fail(c->remote.ctx, calls, c->n, code);
    mgpu__error(code, "%s", detail);
  }
  return code;
}

/* While tracing: every operation the issue queues on the ranks' streams
 * (chunks, reductions, copies) is a span named by the collective. */
static int trace_tag(const mgpu__comm *c, const mgpu__coll_op *op) {
  static const char *const names[] = {"coll.allreduce", "coll.reduce",
                                      "coll.broadcast", "coll.allgather",
                                      "coll.reduce_scatter"};
  const mgpu__coll_arg *p = &op->arg[0];
  const char *algo = c->has_remote                          ? "remote"
                     : c->provider == MGPU_COLL_PROVIDER_NCCL ? "nccl"
                     : c->algo == MGPU_COLL_ALGO_DIRECT     ? "direct"
                                                            : "ring";
  mgpu__trace_arg a[] = {
      MGPU__TARG_S("op", mgpu_op_name(p->op)),
      MGPU__TARG_S("dtype", mgpu_dtype_name(p->dtype)),
      MGPU__TARG_I("bytes", p->count * mgpu_dtype_size(p->dtype)),
      MGPU__TARG_S("algo", algo)};
  return mgpu__trace_tag_push(names[p->kind], a, 4);
}

static int lost_device(const mgpu__comm *c);

/* Lends this thread the handles every rank of op holds (see issue). */
static void lend_handles(const mgpu__comm *c, const mgpu__coll_op *op) {
  uintptr_t h[3 * MGPU_MAX_DEVICES];
  int k = 0;
  for (int r = 0; r < c->n; r++) {
    const mgpu__coll_arg *p = &op->arg[r];
    h[k++] = (uintptr_t)p->stream_h;
    h[k++] = (uintptr_t)p->send_h;
    h[k++] = (uintptr_t)p->recv_h;
  }
  mgpu__handle_lend(h, k);
}

static void issue(mgpu__comm *c, mgpu__coll_op *op) {
  int rc = mgpu__coll_check_consistent(c, op);
  int lost = rc == 0 ? lost_device(c) : -1;
  if (lost >= 0) /* it would run nothing there and read what was not made */
    rc = mgpu__error(MGPU_EDEVLOST, "collective #%llu: device %d was lost; "
                     "nothing was issued", (unsigned long long)op->seq, lost);
  if (rc != 0 && c->has_remote) rc = issue_remote(c, op, rc);
  int pushed = rc == 0 && mgpu__trace_enabled() ? trace_tag(c, op) : 0;
  if (rc == 0) {
    for (int r = 0; r < c->n; r++) c->events_used[r] = 0;
    /* The algorithms look the ranks' streams and buffers up again. Each
     * rank's thread holds its own until it has collected the result, also
     * when a free of one has begun meanwhile (the free waits for it): this
     * thread acts for them, so those lookups must not fail half-way
     * through the issue, with some of the work queued. */
    lend_handles(c, op);
    /* A communicator with remote ranks never reaches the direct issue's
     * small-message paths (the calling thread running every rank's job):
     * its other ranks live in other processes. */
    if (c->has_remote)
      rc = issue_remote(c, op, 0);
    else if (c->provider == MGPU_COLL_PROVIDER_NCCL)
      rc = issue_nccl(c, op);
    else if (c->algo == MGPU_COLL_ALGO_DIRECT)
      rc = mgpu__coll_direct_issue(c, op);
    else
      rc = mgpu__coll_ring_issue(c, op);
  }
  mgpu__handle_lend_end();
  mgpu__trace_tag_pop(pushed);
  if (rc == 0) {
    enum mgpu__metric m = c->provider == MGPU_COLL_PROVIDER_NCCL
                              ? MGPU__M_coll_nccl
                              : MGPU__M_coll_ring;
    for (int r = 0; r < c->n; r++) {
      mgpu__metric_add(c->devs[r], MGPU__M_coll_ops, 1);
      mgpu__metric_add(c->devs[r], m, 1);
    }
  } else {
    snprintf(op->detail, sizeof op->detail, "%s", mgpu_error_detail());
  }
  op->rc = rc;
  op->done = 1;
}

/* Issues every complete operation at the head, in sequence order. Called
 * with c->lock held. */
static void issue_ready(mgpu__comm *c) {
  int any = 0;
  for (mgpu__coll_op *op = c->ops; op != NULL; op = op->next) {
    if (op->done) continue;
    if (op->arrived < c->n) break;
    issue(c, op);
    any = 1;
  }
  if (any) mgpu__cond_broadcast(&c->cond);
}

/* Called with c->lock held. */
static mgpu__coll_op *find_op(mgpu__comm *c, uint64_t seq) {
  mgpu__coll_op **link = &c->ops;
  for (; *link != NULL; link = &(*link)->next) {
    if ((*link)->seq == seq) return *link;
    if ((*link)->seq > seq) break;
  }
  size_t size = sizeof(mgpu__coll_op) + (size_t)c->n * sizeof(mgpu__coll_arg);
  mgpu__coll_op *op = c->spare;
  if (op != NULL) {
    /* Cleared as calloc would, but for the detail (a kilobyte, written
     * only on failure). */
    c->spare = NULL;
    memset(op, 0, offsetof(mgpu__coll_op, detail));
    op->detail[0] = '\0';
    op->pickups = 0;
    op->next = NULL;
    memset(op->arg, 0, (size_t)c->n * sizeof(mgpu__coll_arg));
  } else {
    op = mgpu__calloc(1, size);
    if (op == NULL) return NULL;
  }
  op->seq = seq;
  op->next = *link;
  *link = op;
  return op;
}

/* Called with c->lock held, when a wait ran out (lost_dev -1) or a device
 * of the communicator was lost (it will never call). */
static void abort_comm(mgpu__comm *c, mgpu__coll_op *late, int lost_dev) {
  char missing[96] = ""; /* what fits the detail after the sentence */
  size_t len = 0;
  int devs[MGPU_MAX_DEVICES], n = 0;
  for (int r = 0; r < c->n && len < sizeof missing - 16; r++)
    if (!late->arg[r].present) {
      len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                              len ? ", " : "", c->devs[r]);
      devs[n++] = c->devs[r];
    }
  /* What each missing device did last (the flight recorder). */
  char who[sizeof c->abort_detail - 256];
  mgpu__flight_list(devs, n, who, sizeof who);
  if (lost_dev >= 0)
    snprintf(c->abort_detail, sizeof c->abort_detail,
             "collective #%llu: device %d was lost (device(s) %s had not "
             "called it); the communicator is aborted. Last operations: %s",
             (unsigned long long)late->seq, lost_dev, missing, who);
  else
    snprintf(c->abort_detail, sizeof c->abort_detail,
             "collective #%llu timed out after %d ms: device(s) %s never "
             "called it; the communicator is aborted. Last operations: %s",
             (unsigned long long)late->seq, c->cfg.timeout_ms, missing, who);
  mgpu__comm_fail_pending(c, lost_dev >= 0 ? MGPU_EDEVLOST : MGPU_ETIMEDOUT);
}

/* The first device of c that was lost, or -1. */
static int lost_device(const mgpu__comm *c) {
  for (int r = 0; r < c->n; r++)
    if (mgpu__device_is_lost(c->devs[r])) return c->devs[r];
  return -1;
}

/* Looks up and checks one call; what it holds stays held until unresolve
 * (after its result was collected), so no buffer, stream or communicator
 * of it can be freed while another rank's thread may issue its work.
 * pinned: the call's handles were pinned (pin_calls) and are checked, not
 * looked up with a use each. */
static int resolve(group_call *g, int pinned) {
  g->arg.stream = NULL;
  g->arg.send_b = g->arg.recv_b = NULL;
  g->held = NULL;
  g->pinned = pinned;
  g->rank = g->grank;
  int rc = 0;
  if (!pinned) {
    rc = mgpu__comm_get(g->comm, &g->held);
  } else if (!mgpu_is_initialized()) {
    rc = mgpu__error(MGPU_ENOINIT, "comm: mgpu_init has not been called");
  } else {
    g->held = mgpu__handle_pinned((uintptr_t)g->comm, MGPU__H_COMM, "comm",
                                  &rc);
  }
  if (g->held != NULL) {
    /* The caller names the global rank; a call is kept under its local
     * rank (the same unless the communicator spans processes). */
    g->rank = g->grank - g->held->first;
    rc = check_arg(g->held, g->rank, &g->arg, pinned);
  }
  return rc;
}

static void unresolve(group_call *g) {
  arg_put(&g->arg, g->pinned);
  if (!g->pinned) mgpu__comm_put(g->held);
  g->held = NULL;
}

/* Pins the handles of n calls in one batch (see core/core-internal.h); returns
 * the mark for mgpu__handle_unpin, or -1 when they did not fit (the calls
 * then take a use of each). */
static int pin_calls(const group_call *calls, int n) {
  uintptr_t h[4 * 15];
  if (n < 1 || n > 15) return -1;
  for (int i = 0; i < n; i++) {
    h[4 * i] = (uintptr_t)calls[i].comm;
    h[4 * i + 1] = (uintptr_t)calls[i].arg.stream_h;
    h[4 * i + 2] = (uintptr_t)calls[i].arg.send_h;
    h[4 * i + 3] = (uintptr_t)calls[i].arg.recv_h;
  }
  return mgpu__handle_pin(h, 4 * n);
}

static int collect_locked(mgpu__comm *c, group_call *g, uint64_t deadline,
                          char *detail, size_t dlen);

/* Joins k resolved calls of one communicator handle to their operations,
 * under one lock: a group that issues for every rank of a communicator takes
 * the lock once, and its last call issues the operation. Returns the first
 * error (calls after a failed one are not joined). With reserve (the group's
 * only communicator), first makes sure every operation the calls join
 * exists, as reserve() does for several. Operations done once joined (run
 * by this thread) are collected at once, under the same lock. */
static int join_run(group_call *g, int k, int reserve_here) {
  mgpu__comm *c = g[0].held;
  int rc = 0;
  mgpu__flight_record(c->devs[g->rank], mgpu__coll_kind_name(g->arg.kind),
                      g->arg.count * mgpu_dtype_size(g->arg.dtype),
                      (uintptr_t)g->arg.stream_h);
  mgpu__mutex_lock(&c->lock);
  for (int i = 0; reserve_here && i < k; i++) {
    uint64_t later = 0; /* this rank's calls earlier in the run */
    for (int j = 0; j < i; j++) later += g[j].rank == g[i].rank;
    if (!c->destroying && !c->aborted &&
        find_op(c, c->next_seq[g[i].rank] + later) == NULL) {
      mgpu__mutex_unlock(&c->lock);
      return mgpu__error(MGPU_ENOMEM, "group: out of host memory for call "
                         "%d (rank %d); no call of the group was issued", i,
                         g[i].rank);
    }
  }
  int any = 0;
  for (int i = 0; i < k && rc == 0; i++) {
    if (c->aborted) { /* before destroying: mgpu_comm_abort sets both */
      rc = mgpu__error(c->aborted, "%s", c->abort_detail);
    } else if (c->destroying) {
      rc = mgpu__error(MGPU_EFREED, "comm: destroyed during the call");
    } else {
      mgpu__coll_op *op = find_op(c, c->next_seq[g[i].rank]);
      if (op == NULL) {
        rc = mgpu__error(MGPU_ENOMEM, "comm: out of host memory");
        break;
      }
      op->arg[g[i].rank] = g[i].arg;
      op->arg[g[i].rank].present = 1;
      op->arrived++;
      op->pickups++;
      c->next_seq[g[i].rank]++;
      g[i].c = c;
      g[i].op = op;
      if (op->arrived == c->n) any = 1;
    }
  }
  if (any) issue_ready(c);
  int crc = 0;
  char detail[MGPU__COLL_DETAIL];
  detail[0] = '\0';
  for (int i = 0; any && i < k; i++)
    if (g[i].c != NULL && g[i].op->done) {
      int r = collect_locked(c, &g[i], 0, crc ? NULL : detail,
                             crc ? 0 : sizeof detail);
      if (r != 0 && crc == 0) crc = r;
    }
  mgpu__mutex_unlock(&c->lock);
  if (rc == 0 && crc != 0) rc = mgpu__error(crc, "%s", detail);
  return rc;
}

/* With c->lock held, while g's operation waits for other ranks: when a
 * free (or destroy) of one of g's buffers or its stream has begun, takes
 * g's arg out of the operation, as if the call had never joined, so the
 * free does not wait for ranks that may never come (the thread that would
 * call them may be the one freeing). Only the rank's latest call can
 * leave: the sequence numbers of its later calls in a group are taken (that
 * call then waits, and the free with it, until the operation runs or times
 * out). Returns 1 when g left; the detail goes to detail. */
static int withdraw_if_freed(mgpu__comm *c, group_call *g, char *detail,
                             size_t dlen) {
  mgpu__coll_op *op = g->op;
  int r = g->rank;
  const mgpu__coll_arg *p = &op->arg[r];
  /* recv and send are 0 where the kind does not use them (never closing). */
  const char *what = mgpu__handle_closing((uintptr_t)p->recv_h)   ? "recv buffer"
                     : mgpu__handle_closing((uintptr_t)p->send_h) ? "send buffer"
                     : mgpu__handle_closing((uintptr_t)p->stream_h) ? "stream"
                                                                    : NULL;
  if (what == NULL || !p->present || c->next_seq[r] != op->seq + 1) return 0;
  const char *gone = strcmp(what, "stream") == 0 ? "destroyed" : "freed";
  if (detail != NULL)
    snprintf(detail, dlen, "%s #%llu rank %d (device %d): its %s was %s "
             "while it waited for the other ranks; it left the collective "
             "and nothing was moved", mgpu__coll_kind_name(p->kind),
             (unsigned long long)op->seq, c->first + r, c->devs[r], what,
             gone);
  memset(&op->arg[r], 0, sizeof op->arg[r]);
  op->arrived--;
  op->pickups--;
  c->next_seq[r]--;
  g->c = NULL;
  g->op = NULL;
  return 1;
}

/* With c->lock held: waits for a joined call's operation and collects its
 * result; the detail of a failure goes to detail. */
static int collect_locked(mgpu__comm *c, group_call *g, uint64_t deadline,
                          char *detail, size_t dlen) {
  mgpu__coll_waiter waiter;
  int waits = !g->op->done && !c->destroying;
  if (waits) mgpu__coll_wait_begin(&waiter, &c->cond); /* a loss wakes it */
  while (!g->op->done && !c->destroying) {
    mgpu__cond_timedwait(&c->cond, &c->lock, mgpu__coll_wait_until(deadline));
    if (g->op->done) continue;
    int lost = lost_device(c);
    if (lost >= 0) {
      abort_comm(c, g->op, lost);
    } else if (deadline != 0 && mgpu__now_ns() >= deadline) {
      abort_comm(c, g->op, -1);
    } else if (withdraw_if_freed(c, g, detail, dlen)) {
      if (waits) mgpu__coll_wait_end(&waiter);
      return MGPU_EFREED;
    }
  }
  if (waits) mgpu__coll_wait_end(&waiter);
  int rc = g->op->done ? g->op->rc : MGPU_EFREED;
  if (rc != 0)
    snprintf(detail, dlen, "%s",
             g->op->done ? g->op->detail : "comm: destroyed during the call");
  if (g->op->done && --g->op->pickups == 0 && g->op->arrived == c->n) {
    for (mgpu__coll_op **link = &c->ops; *link != NULL;
         link = &(*link)->next) {
      if (*link == g->op) {
        *link = g->op->next;
        if (c->spare == NULL) c->spare = g->op;
        else mgpu__free(g->op);
        break;
      }
    }
  }
  g->c = NULL;
  g->op = NULL;
  return rc;
}

/* Makes sure every operation the calls will join exists before any joins,
 * so that an allocation failure fails the whole group with nothing issued:
 * a rank that joined alone would leave the others' streams untouched and
 * wait for them until the communicator's timeout aborted it. An operation
 * made here and not joined stays in place for the rank's next call of it.
 * The calls are resolved (each holds its communicator). */
static int reserve(const group_call *calls, int n) {
  for (int i = 0; i < n; i++) {
    mgpu__comm *c = calls[i].held;
    uint64_t later = 0; /* this rank's calls on c earlier in the group */
    for (int j = 0; j < i; j++)
      later += calls[j].held == c && calls[j].rank == calls[i].rank;
    mgpu__mutex_lock(&c->lock);
    int missing = !c->destroying && !c->aborted &&
                  find_op(c, c->next_seq[calls[i].rank] + later) == NULL;
    mgpu__mutex_unlock(&c->lock);
    if (missing)
      return mgpu__error(MGPU_ENOMEM, "group: out of host memory for call %d "
                         "(rank %d); no call of the group was issued", i,
                         calls[i].rank);
  }
  return 0;
}

/* Collects k joined calls of one communicator under one lock, after a
 * spin on each operation (a thread whose operation another thread issues
 * usually sees it done without sleeping). The deadline counts from start
 * (read from the clock here when 0 and a wait is needed). Returns the first
 * error. */
static int collect_run(group_call *g, int k, uint64_t *start) {
  mgpu__comm *c = NULL;
  int pending = 0;
  for (int i = 0; i < k; i++)
    if (g[i].c != NULL) {
      c = g[i].c;
      if (!g[i].op->done &&
          !mgpu__spin_wait(&c->collect_spin, &g[i].op->done))
        pending = 1;
    }
  if (c == NULL) return 0;
  int timeout = c->cfg.timeout_ms;
  uint64_t deadline = 0;
  if (pending && timeout >= 0) {
    if (*start == 0) *start = mgpu__now_ns();
    deadline = *start + (uint64_t)timeout * 1000000ull;
  }
  int first = 0;
  char detail[MGPU__COLL_DETAIL];
  detail[0] = '\0';
  mgpu__mutex_lock(&c->lock);
  for (int i = 0; i < k; i++) {
    if (g[i].c == NULL) continue;
    int rc = collect_locked(c, &g[i], deadline, first ? NULL : detail,
                            first ? 0 : sizeof detail);
    if (rc != 0 && first == 0) first = rc;
  }
  mgpu__mutex_unlock(&c->lock);
  if (first != 0) mgpu__error(first, "%s", detail);
  return first;
}

/* The resolved calls of a group whose streams capture, recorded into the
 * graph (record.c). */
static int record(const group_call *calls, int n) {
  mgpu__coll_recorded rec[MGPU__GRAPH_CALL_MAX];
  if (n > MGPU__GRAPH_CALL_MAX)
    return mgpu__error(MGPU_ENOTSUP, "%s rank %d: a group of %d calls is "
                       "recorded into a graph, and one holds %d at most",
                       mgpu__coll_kind_name(calls[0].arg.kind),
                       calls[0].grank, n, MGPU__GRAPH_CALL_MAX);
  for (int i = 0; i < n; i++)
    rec[i] = (mgpu__coll_recorded){calls[i].comm, calls[i].held,
                                   calls[i].grank, calls[i].rank,
                                   &calls[i].arg};
  return mgpu__coll_record(rec, n);
}

/* Resolves every call (a handle freed since the call fails the whole group
 * before anything is joined), joins every call, then collects every result;
 * returns the first error. Consecutive calls on one communicator are joined
 * and collected together; every call's handles stay held until its result
 * was collected. */
static int submit(group_call *calls, int n) {
  int first = 0;
  char detail[MGPU__COLL_DETAIL];
  detail[0] = '\0';
  int mark = pin_calls(calls, n);
  for (int i = 0; i < n && first == 0; i++) {
    first = resolve(&calls[i], mark >= 0);
    if (first != 0) {
      for (int k = 0; k <= i; k++) unresolve(&calls[k]);
      mgpu__handle_unpin(mark);
      return first;
    }
  }
  int capturing = 0;
  for (int i = 0; i < n; i++)
    capturing |= mgpu__stream_capture(calls[i].arg.stream) != NULL;
  if (capturing) {
    first = record(calls, n);
    for (int k = 0; k < n; k++) unresolve(&calls[k]);
    mgpu__handle_unpin(mark);
    return first;
  }
  int one_comm = 1;
  for (int i = 1; i < n; i++) one_comm &= calls[i].comm == calls[0].comm;
  if (!one_comm && (first = reserve(calls, n)) != 0) {
    for (int k = 0; k < n; k++) unresolve(&calls[k]);
    mgpu__handle_unpin(mark);
    return first;
  }
  for (int i = 0, j; i < n; i = j) {
    for (j = i + 1; j < n && calls[j].comm == calls[i].comm; j++) continue;
    int rc = join_run(&calls[i], j - i, one_comm);
    if (rc != 0 && first == 0) {
      first = rc;
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
    }
  }
  uint64_t start = 0; /* the deadlines count from here, read when needed */
  for (int i = 0, j; i < n; i = j) {
    for (j = i + 1; j < n && calls[j].comm == calls[i].comm; j++) continue;
    int rc = collect_run(&calls[i], j - i, &start);
    if (rc != 0 && first == 0) {
      first = rc;
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
    }
  }
  for (int i = 0; i < n; i++) unresolve(&calls[i]);
  mgpu__handle_unpin(mark);
  if (first != 0) mgpu__error(first, "%s", detail);
  return first;
}

/* Fills every field of a call's arg (no memset and no copy of the whole
 * struct: both cost a "rep" string instruction on the small path). */
static void arg_init(mgpu__coll_arg *p, mgpu__coll_kind kind,
                      const mgpu_buffer *send, mgpu_buffer *recv,
                      size_t count, mgpu_dtype dtype, mgpu_op op, int root,
                      mgpu_stream *stream) {
  p->present = 0;
  p->kind = kind;
  p->count = count;
  p->dtype = dtype;
  p->op = op;
  p->root = root;
  p->send_h = (mgpu_buffer *)send;
  p->recv_h = recv;
  p->send_off = p->recv_off = 0;
  p->send = NULL;
  p->recv = NULL;
  p->in_place = 0;
  p->stream_h = stream;
  p->stream = NULL;
  p->send_b = p->recv_b = NULL;
}

/* Fills the fields of a call other than its arg: nothing held yet. */
static void call_fill(group_call *g, mgpu_comm *comm, int grank) {
  g->comm = comm;
  g->grank = g->rank = grank;
  g->held = NULL;
  g->pinned = 0;
  g->c = NULL;
  g->op = NULL;
}

/* Makes room for one more call in this thread's group (grank names the
 * call in the detail): the list moves from its local array to the heap,
 * then doubles. */
static int group_grow(int grank) {
  if (group.calls == NULL) {
    group.calls = group.local;
    group.cap = (int)(sizeof group.local / sizeof group.local[0]);
  }
  if (group.ncalls < group.cap) return 0;
  int cap = group.cap * 2;
  group_call *calls =
      group.calls == group.local
          ? mgpu__malloc((size_t)cap * sizeof *calls)
          : mgpu__realloc(group.calls, (size_t)cap * sizeof *calls);
  if (calls != NULL && group.calls == group.local)
    memcpy(calls, group.local, sizeof group.local);
  if (calls == NULL)
    /* Recorded like a failed check: mgpu_group_end must not issue the
     * group's other calls, which would wait for this one in vain. */
    return mgpu__error(MGPU_ENOMEM, "group: out of host memory for call %d "
                       "(rank %d)", group.ncalls, grank);
  if (group.calls == group.local) { /* arm the exit hook for this thread */
    pthread_once(&group_key_once, group_key_make);
    if (group_key_ok) pthread_setspecific(group_key, &group);
  }
  group.calls = calls;
  group.cap = cap;
  return 0;
}

static int call(mgpu_comm *comm, int grank, mgpu__coll_kind kind,
                const mgpu_buffer *send, mgpu_buffer *recv, size_t count,
                mgpu_dtype dtype, mgpu_op op, int root, mgpu_stream *stream) {
  if (group.depth == 0) {
    group_call g;
    call_fill(&g, comm, grank);
    arg_init(&g.arg, kind, send, recv, count, dtype, op, root, stream);
    return submit(&g, 1);
  }
  /* In a group: checked now, for the caller's error, and again (from the
   * handles) by mgpu_group_end. Nothing stays held in between, so the
   * thread may free what it passed before mgpu_group_end: the group then
   * fails as a whole. The call is checked in its place in the group's
   * list, which first grows if it must. */
  int rc = group_grow(grank);
  if (rc == 0) {
    group_call *g = &group.calls[group.ncalls];
    call_fill(g, comm, grank);
    arg_init(&g->arg, kind, send, recv, count, dtype, op, root, stream);
    int mark = pin_calls(g, 1);
    rc = resolve(g, mark >= 0);
    unresolve(g);
    mgpu__handle_unpin(mark);
    if (rc == 0) group.ncalls++;
  }
  if (rc != 0 && group.first_rc == 0) {
    group.first_rc = rc;
    snprintf(group.first_detail, sizeof group.first_detail, "%s",
             mgpu_error_detail());
  }
  return rc;
}

int mgpu__coll_group_depth(void) { return group.depth; }

int mgpu_group_begin(void) {
  group.depth++;
  return 0;
}

int mgpu_group_end(void) {
  if (group.depth == 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_group_end without group_begin");
  if (--group.depth > 0) return 0;
  /* A call that failed its own check drops the whole group: nothing of it
   * reaches a stream. */
  int rc = group.first_rc != 0
               ? mgpu__error(group.first_rc, "%s", group.first_detail)
               : submit(group.calls, group.ncalls);
  if (group.calls != group.local) mgpu__free(group.calls);
  group.calls = NULL;
  pthread_once(&group_key_once, group_key_make);
  if (group_key_ok) pthread_setspecific(group_key, NULL);
  group.ncalls = group.cap = 0;
  group.first_rc = 0;
  return rc;
}

int mgpu_allreduce(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                   mgpu_buffer *recv, size_t count, mgpu_dtype dtype,
                   mgpu_op op, mgpu_stream *stream) {
  return call(comm, rank, MGPU__COLL_ALLREDUCE, send, recv, count, dtype,
              op, 0, stream);
}

int mgpu_reduce(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                mgpu_buffer *recv, size_t count, mgpu_dtype dtype, mgpu_op op,
                int root, mgpu_stream *stream) {
  return call(comm, rank, MGPU__COLL_REDUCE, send, recv, count, dtype, op,
              root, stream);
}

int mgpu_broadcast(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                   mgpu_buffer *recv, size_t count, mgpu_dtype dtype, int root,
                   mgpu_stream *stream) {
  return call(comm, rank, MGPU__COLL_BROADCAST, send, recv, count, dtype,
              MGPU_SUM, root, stream);
}

int mgpu_allgather(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                   mgpu_buffer *recv, size_t count, mgpu_dtype dtype,
                   mgpu_stream *stream) {
  return call(comm, rank, MGPU__COLL_ALLGATHER, send, recv, count, dtype,
              MGPU_SUM, 0, stream);
}

int mgpu_reduce_scatter(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                        mgpu_buffer *recv, size_t count, mgpu_dtype dtype,
                        mgpu_op op, mgpu_stream *stream) {
  return call(comm, rank, MGPU__COLL_REDUCE_SCATTER, send, recv, count,
              dtype, op, 0, stream);
}
