/* Collectives recorded into a graph (core/capture.h, MGPU__GOP_CALL).
 *
 * A group whose calls' streams all capture one graph is recorded instead
 * of run: one mgpu__graph_call holds a copy of every call's arguments
 * (handles, not pointers), and each call becomes a node on its rank's
 * stream in the capture. A replay issues the calls again, inside a group
 * of their own, on the streams the replay names: the ranks meet at once,
 * since the one thread brings all of them. A call alone (outside a group)
 * is recorded the same way when its communicator has a single rank.
 *
 * The record is refused, and nothing recorded, unless it can replay: every
 * rank of each communicator called the same number of times, the k-th
 * calls of the ranks agree (kind, count, type, op, root, as the rendezvous
 * checks them), no communicator spans processes (the other processes'
 * ranks would have to replay in step), and all the streams capture the
 * same graph.
 */
#include <stdio.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "core/capture.h"
#include "util/fault.h"

typedef struct rec_call {
  mgpu_comm *comm;
  int grank;
  mgpu__coll_kind kind;
  mgpu_buffer *send, *recv;
  size_t count;
  mgpu_dtype dtype;
  mgpu_op op;
  int root;
} rec_call;

typedef struct rec {
  mgpu__graph_call base;
  rec_call call[]; /* base.nmembers */
} rec;

static int rec_issue_one(const rec_call *k, mgpu_stream *s) {
  switch (k->kind) {
    case MGPU__COLL_ALLREDUCE:
      return mgpu_allreduce(k->comm, k->grank, k->send, k->recv, k->count,
                            k->dtype, k->op, s);
    case MGPU__COLL_REDUCE:
      return mgpu_reduce(k->comm, k->grank, k->send, k->recv, k->count,
                         k->dtype, k->op, k->root, s);
    case MGPU__COLL_BROADCAST:
      return mgpu_broadcast(k->comm, k->grank, k->send, k->recv, k->count,
                            k->dtype, k->root, s);
    case MGPU__COLL_ALLGATHER:
      return mgpu_allgather(k->comm, k->grank, k->send, k->recv, k->count,
                            k->dtype, s);
    case MGPU__COLL_REDUCE_SCATTER:
      return mgpu_reduce_scatter(k->comm, k->grank, k->send, k->recv,
                                 k->count, k->dtype, k->op, s);
  }
  return mgpu__error(MGPU_EINVAL, "graph: recorded collective of unknown "
                     "kind %d", (int)k->kind);
}

/* The calls again, in a group of their own: its end checks every handle
 * before any of it runs, so a failure queues nothing. */
static int rec_issue(mgpu__graph_call *base, mgpu_stream *const *streams) {
  rec *r = (rec *)base;
  if (mgpu__coll_group_depth() > 0) /* rec_check refused it already */
    return mgpu__error(MGPU_EINVAL, "mgpu_graph_launch: a recorded %s "
                       "inside mgpu_group_begin/end", base->name);
  mgpu_group_begin();
  for (int i = 0; i < base->nmembers; i++)
    (void)rec_issue_one(&r->call[i], streams[i]); /* the end reports */
  return mgpu_group_end();
}

/* 0 while the calls can be issued: not inside a group, and their
 * communicators (not aborted) and buffers live. */
static int rec_check(const mgpu__graph_call *base) {
  const rec *r = (const rec *)base;
  if (mgpu__coll_group_depth() > 0)
    return mgpu__error(MGPU_EINVAL, "the graph holds a recorded %s, and a "
                       "launch inside mgpu_group_begin/end would leave it "
                       "for the group's end, after the launch's later work",
                       base->name);
  for (int i = 0; i < base->nmembers; i++) {
    const rec_call *k = &r->call[i];
    mgpu__comm *c;
    mgpu__buf *b;
    int rc = mgpu__comm_get(k->comm, &c);
    if (rc == 0) {
      mgpu__mutex_lock(&c->lock);
      if (c->aborted != 0)
        rc = mgpu__error(c->aborted, "its communicator was aborted: %s",
                         c->abort_detail);
      mgpu__mutex_unlock(&c->lock);
      mgpu__comm_put(c);
    }
    if (rc == 0 && k->send != NULL && (rc = mgpu__buf_get(k->send, "send",
                                                           &b)) == 0)
      mgpu__buf_put(b);
    if (rc == 0 && k->recv != NULL && (rc = mgpu__buf_get(k->recv, "recv",
                                                           &b)) == 0)
      mgpu__buf_put(b);
    if (rc != 0) {
      char detail[256];
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
      return mgpu__error(rc, "recorded %s, rank %d: %s",
                         mgpu__coll_kind_name(k->kind), k->grank, detail);
    }
  }
  return 0;
}

static void rec_release(mgpu__graph_call *base) { mgpu__free(base); }

/* Every rank of each communicator called as often, the k-th calls of the
 * ranks agree; no communicator spans processes. */
static int check_complete(const mgpu__coll_recorded *calls, int n) {
  for (int i = 0; i < n; i++) {
    const mgpu__comm *c = calls[i].c;
    int first = 1, count[MGPU_MAX_DEVICES] = {0};
    for (int j = 0; first && j < i; j++) first = calls[j].c != c;
    if (!first) continue;
    if (c->has_remote)
      return mgpu__error(MGPU_ENOTSUP, "%s rank %d: the communicator spans "
                         "processes, whose ranks cannot be recorded in one "
                         "process's graph",
                         mgpu__coll_kind_name(calls[i].arg->kind),
                         calls[i].grank);
    for (int j = i; j < n; j++)
      if (calls[j].c == c) count[calls[j].rank]++;
    for (int r = 0; r < c->n; r++)
      if (count[r] != count[calls[i].rank])
        return mgpu__error(MGPU_EINVAL, "%s rank %d: recorded into a graph, "
                           "a collective needs the calls of every rank of "
                           "its communicator in one group (rank %d called "
                           "%d times, rank %d %d times)",
                           mgpu__coll_kind_name(calls[i].arg->kind),
                           calls[i].grank, calls[i].grank,
                           count[calls[i].rank], c->first + r, count[r]);
  }
  return 0;
}

/* The k-th calls of the ranks of each communicator agree, as the
 * rendezvous would check them. */
static int check_agree(const mgpu__coll_recorded *calls, int n) {
  int rc = 0;
  for (int i = 0; rc == 0 && i < n; i++) {
    mgpu__comm *c = calls[i].c;
    if (calls[i].rank != 0) continue; /* rank 0's k-th call leads */
    int k = 0, seen[MGPU_MAX_DEVICES] = {0};
    for (int j = 0; j < i; j++) k += calls[j].c == c && calls[j].rank == 0;
    mgpu__coll_op *op = mgpu__calloc(1, sizeof *op + (size_t)c->n *
                                                        sizeof op->arg[0]);
    if (op == NULL)
      return mgpu__error(MGPU_ENOMEM, "graph: out of host memory to check "
                         "a recorded %s of %d ranks",
                         mgpu__coll_kind_name(calls[i].arg->kind), c->n);
    op->seq = (uint64_t)k;
    for (int j = 0; j < n; j++)
      if (calls[j].c == c && seen[calls[j].rank]++ == k)
        op->arg[calls[j].rank] = *calls[j].arg;
    rc = mgpu__coll_check_consistent(c, op);
    mgpu__free(op);
    if (rc != 0) {
      char detail[MGPU__COLL_DETAIL];
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
      rc = mgpu__error(rc, "recording a group into a graph: %s (#%d: the "
                       "ranks' call %d in the group)", detail, k, k + 1);
    }
  }
  return rc;
}

/* The record of the calls, with a reference for the caller. */
static int rec_make(const mgpu__coll_recorded *calls, int n, rec **out) {
  rec *r = mgpu__calloc(1, sizeof *r + (size_t)n * sizeof r->call[0]);
  if (r == NULL)
    return mgpu__error(MGPU_ENOMEM, "graph: out of host memory to record "
                       "%d collective calls", n);
  atomic_init(&r->base.refs, 1);
  r->base.nmembers = n;
  r->base.name = mgpu__coll_kind_name(calls[0].arg->kind);
  for (int i = 1; i < n; i++)
    if (calls[i].arg->kind != calls[0].arg->kind)
      r->base.name = "group of collectives";
  r->base.issue = rec_issue;
  r->base.check = rec_check;
  r->base.release = rec_release;
  for (int i = 0; i < n; i++) {
    const mgpu__coll_arg *a = calls[i].arg;
    r->call[i] = (rec_call){calls[i].comm, calls[i].grank, a->kind,
                            a->send_h, a->recv_h, a->count, a->dtype,
                            a->op, a->root};
  }
  *out = r;
  return 0;
}

/* Every call's stream captures the graph the first capturing one does. */
static int check_same_capture(const mgpu__coll_recorded *calls, int n) {
  int f = 0;
  while (f < n - 1 && mgpu__stream_capture(calls[f].arg->stream) == NULL) f++;
  void *capture = mgpu__stream_capture(calls[f].arg->stream);
  for (int i = 0; i < n; i++) {
    void *mine = mgpu__stream_capture(calls[i].arg->stream);
    if (mine != capture)
      return mgpu__error(MGPU_EINVAL, "%s rank %d: its stream (device %d) "
                         "%s, and rank %d's (device %d) captures a graph: a "
                         "group is recorded into one graph whole, or run",
                         mgpu__coll_kind_name(calls[i].arg->kind),
                         calls[i].grank, calls[i].arg->stream->dev,
                         mine == NULL ? "does not capture"
                                      : "captures another graph",
                         calls[f].grank, calls[f].arg->stream->dev);
  }
  return 0;
}

int mgpu__coll_record(const mgpu__coll_recorded *calls, int n) {
  int rc = check_same_capture(calls, n);
  if (rc == 0) rc = check_complete(calls, n);
  if (rc == 0) rc = check_agree(calls, n);
  rec *r = NULL;
  if (rc == 0) rc = rec_make(calls, n, &r);
  if (rc != 0) return rc;
  mgpu__stream *s[MGPU__GRAPH_CALL_MAX];
  mgpu__graph_op ops[MGPU__GRAPH_CALL_MAX];
  for (int i = 0; i < n; i++) {
    s[i] = calls[i].arg->stream;
    ops[i] = (mgpu__graph_op){.kind = MGPU__GOP_CALL, .dev = s[i]->dev,
                              .call = &r->base, .member = i};
  }
  rc = mgpu__capture_record_all(s, ops, n); /* all members, or none */
  mgpu__graph_call_unref(&r->base);
  return rc;
}
