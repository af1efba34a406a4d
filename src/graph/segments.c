/* Segments: an executable graph replayed as runs of each device's nodes,
 * joined by events, where one part per device (parts.c) cannot be made.
 *
 * A device's nodes, in the graph's issue order, are cut before each node
 * that waits for a node of another device and after each node that one of
 * another device waits for. A segment thus waits (for other devices'
 * events) only at its first node and is waited on only after its last.
 * Segments are issued in the order of their first nodes in the issue
 * order: an edge from segment T to segment S (S's first node waits for
 * T's last, or S follows T on one device) puts T's last node before S's
 * first, so T's first comes first too, and every wait is queued after the
 * record it waits for, as cudaStreamWaitEvent needs.
 *
 * A segment of two real nodes or more whose device has graph slots is run
 * as one backend part without a board (one CUDA graph on the CUDA plugin),
 * its waits and record queued around it on the device's stream as plain
 * event calls; any other segment, and one its backend refuses with
 * MGPU_ENOTSUP, is issued node by node. MGPU_GRAPH_REPLAY=nodes issues
 * every segment node by node, which is how a graph replays on backends
 * without graph slots.
 *
 * A member of a recorded call (MGPU__GOP_CALL: a collective's ranks) is a
 * segment of its own. The first of a call's segments leads: it queues
 * every member's waits on the member's stream, has the call issue all
 * members together, and records the members' events; the others are
 * skipped. Every member waits for what all of them wait for (exec.c), so
 * nothing that follows a member comes before the last member in the
 * issue order, and nothing a member waits for comes after the first.
 */
#include <assert.h>
#include <string.h>

#include "backend/graph.h"
#include "graph/graph-internal.h"
#include "util/fault.h"

typedef struct segment {
  int dev;
  int first, n; /* its nodes: in nodes[first .. first + n) */
  int kernels;  /* kernel nodes, counted when it runs as a part */
  void *part;   /* the backend's, or NULL: node by node */
  /* A recorded call's member: the leader holds the call's member nodes
   * (by member), the others NULL and follow (skipped). */
  int *members;
  int follows;
} segment;

struct mgpu__segs {
  segment *seg;
  int nseg;
  int *nodes; /* by segment, its nodes in issue order */
};

/* 1 when node v of nodes waits for a node of another device. */
static int waits_across(const mgpu__gnode *nodes, int v) {
  for (int j = 0; j < nodes[v].ndeps; j++)
    if (nodes[nodes[v].deps[j]].op.dev != nodes[v].op.dev) return 1;
  return 0;
}

/* posted[v] = 1 where a node of another device waits for node v. */
static void mark_posted(const mgpu__gnode *nodes, int n, char *posted) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < nodes[i].ndeps; j++) {
      int d = nodes[i].deps[j];
      if (nodes[d].op.dev != nodes[i].op.dev) posted[d] = 1;
    }
}

/* Cuts the nodes into segments (seg_of[v]: node v's segment) and fills
 * s->seg and s->nodes. */
static void cut(mgpu__segs *s, const mgpu__gnode *nodes, int n,
                const int *order, const char *posted, int *seg_of) {
  int open[MGPU_MAX_DEVICES];
  for (int d = 0; d < MGPU_MAX_DEVICES; d++) open[d] = -1;
  for (int k = 0; k < n; k++) {
    int v = order[k], dev = nodes[v].op.dev;
    int alone = nodes[v].op.kind == MGPU__GOP_CALL;
    if (open[dev] >= 0 && (alone || waits_across(nodes, v))) open[dev] = -1;
    if (open[dev] < 0) {
      open[dev] = s->nseg++;
      s->seg[open[dev]] = (segment){.dev = dev};
    }
    seg_of[v] = open[dev];
    s->seg[open[dev]].n++;
    if (posted[v] || alone) open[dev] = -1;
  }
  for (int i = 0, at = 0; i < s->nseg; i++) {
    s->seg[i].first = at;
    at += s->seg[i].n;
    s->seg[i].n = 0;
  }
  for (int k = 0; k < n; k++) {
    segment *g = &s->seg[seg_of[order[k]]];
    s->nodes[g->first + g->n++] = order[k];
  }
}

/* Makes segment g's backend part, where its device has graph slots and
 * can run every node in place: 0 (g->part NULL when it cannot), or a
 * code other than MGPU_ENOTSUP. */
static int segment_part(mgpu__segs *s, segment *g, const mgpu__gnode *nodes) {
  mgpu__device *d = mgpu__device_get(g->dev);
  if (g->n < 2 || d == NULL || d->ops->graph == NULL) return 0;
  mgpu__bgraph_node *buf = mgpu__calloc((size_t)g->n, sizeof *buf);
  if (buf == NULL)
    return mgpu__error(MGPU_ENOMEM, "graph: out of host memory for a "
                       "segment of %d nodes on device %d", g->n, g->dev);
  int ok = 1;
  for (int i = 0; ok && i < g->n; i++) {
    int v = s->nodes[g->first + i];
    ok = mgpu__parts_convert(&nodes[v].op, &buf[i]) == 0;
    buf[i].node = v;
    buf[i].signal = -1;
    g->kernels += buf[i].kind == MGPU__BG_LAUNCH;
  }
  mgpu__bgraph_part part = {buf, g->n, NULL, NULL, 0};
  int rc = ok ? d->ops->graph->create(d->bdev, &part, &g->part) : 0;
  mgpu__free(buf);
  if (rc != 0) g->part = NULL;
  return rc == MGPU_ENOTSUP ? 0 : rc; /* refused: node by node */
}

/* The first segment of each recorded call leads it, with its members'
 * nodes; the others follow. */
static int calls_lead(mgpu__segs *s, const mgpu__gnode *nodes, int n) {
  for (int i = 0; i < s->nseg; i++) {
    segment *g = &s->seg[i];
    const mgpu__graph_op *o = &nodes[s->nodes[g->first]].op;
    if (o->kind != MGPU__GOP_CALL) continue;
    for (int j = 0; j < i && !g->follows; j++)
      g->follows = s->seg[j].n == 1 &&
                   nodes[s->nodes[s->seg[j].first]].op.call == o->call;
    if (g->follows) continue;
    g->members = mgpu__calloc((size_t)o->call->nmembers, sizeof(int));
    if (g->members == NULL)
      return mgpu__error(MGPU_ENOMEM, "graph: out of host memory for a "
                         "%s of %d members", o->call->name,
                         o->call->nmembers);
    for (int v = 0; v < n; v++)
      if (nodes[v].op.kind == MGPU__GOP_CALL && nodes[v].op.call == o->call)
        g->members[nodes[v].op.member] = v;
  }
  return 0;
}

#ifndef NDEBUG
/* The segment that issues node v's segment: its call's leader for a
 * follower, else its own. */
static int issuer(const mgpu__segs *s, const mgpu__gnode *nodes,
                  const int *seg_of, int v) {
  int g = seg_of[v];
  if (!s->seg[g].follows) return g;
  for (int i = 0; i < g; i++)
    if (s->seg[i].members != NULL &&
        nodes[s->nodes[s->seg[i].first]].op.call == nodes[v].op.call)
      return i;
  return -1;
}

/* 1 when every node is issued after what it waits for: a node of another
 * device in an earlier segment, one of its own device earlier in the same
 * segment or before (checked in debug builds). */
static int issue_order_ok(const mgpu__segs *s, const mgpu__gnode *nodes,
                          int n, const int *seg_of) {
  for (int v = 0; v < n; v++)
    for (int j = 0; j < nodes[v].ndeps; j++) {
      int u = nodes[v].deps[j];
      int gu = issuer(s, nodes, seg_of, u), gv = issuer(s, nodes, seg_of, v);
      int across = nodes[u].op.dev != nodes[v].op.dev;
      if (gu < 0 || gv < 0 || gu > gv || (across && gu == gv)) return 0;
    }
  return 1;
}
#endif

int mgpu__segs_build(const mgpu__gnode *nodes, int n, const int *order,
                     int with_parts, mgpu__segs **out) {
  *out = NULL;
  mgpu__segs *s = mgpu__calloc(1, sizeof *s);
  char *posted = mgpu__calloc((size_t)n + 1, 1);
  int *seg_of = mgpu__calloc((size_t)n + 1, sizeof *seg_of);
  int rc = 0;
  if (s != NULL) {
    s->seg = mgpu__calloc((size_t)n + 1, sizeof *s->seg);
    s->nodes = mgpu__calloc((size_t)n + 1, sizeof *s->nodes);
  }
  if (s == NULL || posted == NULL || seg_of == NULL || s->seg == NULL ||
      s->nodes == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                     "memory for the segments of %d nodes", n);
  } else {
    mark_posted(nodes, n, posted);
    cut(s, nodes, n, order, posted, seg_of);
    rc = calls_lead(s, nodes, n);
    assert(rc != 0 || issue_order_ok(s, nodes, n, seg_of));
    int parts = 0;
    for (int i = 0; with_parts && rc == 0 && i < s->nseg; i++) {
      rc = segment_part(s, &s->seg[i], nodes);
      parts += s->seg[i].part != NULL;
    }
    mgpu__log(MGPU_LOG_DEBUG, "graph: %d nodes replay as %d segments, %d of "
              "them backend parts", n, s->nseg, parts);
  }
  mgpu__free(seg_of);
  mgpu__free(posted);
  if (rc == 0) *out = s;
  else mgpu__segs_free(s);
  return rc;
}

void mgpu__segs_free(mgpu__segs *s) {
  if (s == NULL) return;
  for (int i = 0; s->seg != NULL && i < s->nseg; i++) {
    mgpu__device *d = mgpu__device_get(s->seg[i].dev);
    if (s->seg[i].part != NULL && d != NULL)
      d->ops->graph->destroy(d->bdev, s->seg[i].part);
    mgpu__free(s->seg[i].members);
  }
  mgpu__free(s->seg);
  mgpu__free(s->nodes);
  mgpu__free(s);
}

/* Queues node v's waits for other devices' nodes on st (its own edges:
 * mgpu__gnode_waited; none for a member of its own call, issued with it). */
static int wait_across(const mgpu__gnode *nodes, int v, mgpu_stream *st,
                       mgpu_event *const *done) {
  int rc = 0;
  for (int j = 0; rc == 0 && j < mgpu__gnode_waited(&nodes[v]); j++) {
    const mgpu__gnode *u = &nodes[nodes[v].deps[j]];
    if (u->op.dev != nodes[v].op.dev &&
        !(u->op.kind == MGPU__GOP_CALL && u->op.call == nodes[v].op.call))
      rc = mgpu_stream_wait_event(st, done[nodes[v].deps[j]]);
  }
  return rc;
}

/* Queues a recorded call led by segment g: each member's waits on its
 * stream, the call, each member's record. */
static int call_issue(const segment *g, const mgpu__gnode *nodes,
                      mgpu_stream *const *on, mgpu_event *const *done) {
  mgpu__graph_call *call = nodes[g->members[0]].op.call;
  mgpu_stream *streams[MGPU__GRAPH_CALL_MAX];
  int rc = 0;
  for (int m = 0; rc == 0 && m < call->nmembers; m++) {
    int v = g->members[m];
    streams[m] = on[nodes[v].op.dev];
    rc = wait_across(nodes, v, streams[m], done);
  }
  if (rc == 0) rc = call->issue(call, streams);
  for (int m = 0; rc == 0 && m < call->nmembers; m++)
    if (done[g->members[m]] != NULL)
      rc = mgpu_event_record(done[g->members[m]], streams[m]);
  return rc;
}

int mgpu__segs_issue(const mgpu__segs *s, const mgpu__gnode *nodes,
                     mgpu_stream *const *on, mgpu_event *const *done,
                     uint64_t launch) {
  int rc = 0;
  for (int i = 0; rc == 0 && i < s->nseg; i++) {
    const segment *g = &s->seg[i];
    mgpu_stream *st = on[g->dev];
    const int *v = &s->nodes[g->first];
    if (g->follows) continue; /* issued by its call's leader */
    if (g->members != NULL) {
      rc = call_issue(g, nodes, on, done);
      continue;
    }
    if (g->part != NULL) {
      /* Only its first node waits, only its last is waited on. */
      rc = wait_across(nodes, v[0], st, done);
      if (rc == 0)
        rc = mgpu__parts_queue(g->dev, g->part, g->kernels, st, launch);
      if (rc == 0 && done[v[g->n - 1]] != NULL)
        rc = mgpu_event_record(done[v[g->n - 1]], st);
      continue;
    }
    for (int k = 0; rc == 0 && k < g->n; k++) {
      rc = wait_across(nodes, v[k], st, done);
      if (rc == 0) rc = mgpu__gnode_issue(&nodes[v[k]], st);
      if (rc == 0 && done[v[k]] != NULL)
        rc = mgpu_event_record(done[v[k]], st);
    }
  }
  return rc;
}
