/* Executable graphs: instantiate, launch, update, destroy.
 *
 * An executable graph owns a copy of the graph's nodes, their order (each
 * after everything it depends on), one stream per device its nodes run on,
 * an event after each node that a node of another device waits for, and
 * per device an event at the start and one at the end of a launch. A launch
 * issues the nodes of the caller's stream's device on that stream itself
 * (so their failures surface at its next synchronize, as any work's), lets
 * the other devices' streams wait for a start event recorded there, issues
 * every node in order (a node waiting for another device's node waits for
 * that node's event first), and lets the caller's stream wait for every
 * other device's end: the caller's later work waits for the whole run, and
 * the nodes wait for the caller's earlier work. On host devices a tail on
 * the caller's stream moves a failure of a node on another device onto it;
 * elsewhere such a failure surfaces at the next launch (or at the
 * destroy), which finds it on that device's stream. Where every device
 * holds parts (parts.c), the start and end are signals of the parts'
 * board instead of events (issue_joined). Elsewhere the nodes go in
 * segments (segments.c): runs of a device's nodes, each one backend part
 * where its backend can make it, else each node issued through the public
 * call it records, so every backend replays graphs; docs/graphs.md says
 * what a backend with graph slots saves.
 */
#include <stdio.h>
#include <string.h>

#include "graph/graph-internal.h"
#include "util/fault.h"

typedef struct mgpu__exec {
  uintptr_t handle;
  mgpu__mutex lock; /* serializes launches and updates */
  mgpu__gnode *nodes;
  int n;
  int *order;        /* issue order */
  mgpu_event **done; /* by node: waited on by another device, else NULL */
  int devs[MGPU_MAX_DEVICES], ndevs; /* the devices of the nodes */
  mgpu_stream *streams[MGPU_MAX_DEVICES];
  /* By device: a launch queued work on streams[dev] (a launch from a
   * stream of dev runs dev's nodes there instead): only those streams can
   * hold an earlier launch's failure. */
  int used[MGPU_MAX_DEVICES];
  /* By device, made when first needed: the end of its part of a launch,
   * and the start recorded on a caller's stream of that device. */
  mgpu_event *end[MGPU_MAX_DEVICES];
  mgpu_event *start[MGPU_MAX_DEVICES];
  /* By caller's device, made at its first launch (parts.c): the tail that
   * moves the other devices' failures onto the caller's stream, or NULL. */
  void *tail[MGPU_MAX_DEVICES];
  int tail_made[MGPU_MAX_DEVICES];
  mgpu_stream *last_stream; /* of the last launch, or NULL */
  int last_dev;             /* its device */
  /* One part per device (parts.c), or NULL: then segments (segments.c),
   * some of them backend parts, the rest node by node. After an update
   * both are made again before the next launch (stale); the old ones are
   * retired until the launches that use them are done. */
  mgpu__parts *parts;
  mgpu__segs *segs;
  int parts_stale;
  int replay; /* MGPU_GRAPH_REPLAY at instantiate: enum replay */
  struct retired_parts *retired;
  uint64_t launches; /* launches numbered so far */
} mgpu__exec;

typedef struct retired_parts {
  mgpu__parts *parts;
  mgpu__segs *segs;
  /* Recorded on the last launch's stream when these were replaced: once
   * it is done, so are the launches that used them (NULL: none did). */
  mgpu_event *done;
  struct retired_parts *next;
} retired_parts;

/* How a graph replays (MGPU_GRAPH_REPLAY): one part per device where its
 * backend can, else segments; segments even where parts could be made;
 * node by node. */
enum replay { REPLAY_DEVICES, REPLAY_SEGMENTS, REPLAY_NODES };

static int replay_mode(int *mode) {
  static const char *const names[] = {"devices", "segments", "nodes"};
  const char *v = mgpu__env("MGPU_GRAPH_REPLAY");
  for (int i = 0; i < 3; i++)
    if (v == NULL || strcmp(v, names[i]) == 0) return *mode = i, 0;
  return mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: "
                     "MGPU_GRAPH_REPLAY='%s' (expected devices, segments or "
                     "nodes)", v);
}

/* The parts of x's nodes or, where they cannot be made, its segments. */
static int replay_build(const mgpu__exec *x, mgpu__parts **parts,
                        mgpu__segs **segs) {
  *parts = NULL;
  *segs = NULL;
  int rc = 0;
  if (x->replay == REPLAY_DEVICES)
    rc = mgpu__parts_build(x->nodes, x->n, x->order, parts);
  if (rc == 0 && *parts == NULL)
    rc = mgpu__segs_build(x->nodes, x->n, x->order,
                          x->replay != REPLAY_NODES, segs);
  return rc;
}

static const char *kind_name(mgpu__graph_op_kind k) {
  static const char *const names[] = {
      "empty", "kernel", "copy", "htod copy", "dtoh copy", "memset", "fill",
      "scale", "axpy", "elementwise", "host function", "event record",
      "event wait", "recorded call"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

/* Every handle a node names is live; else the code, the detail naming the
 * node. */
static int node_check(const mgpu__gnode *n, int index, const char *what) {
  const mgpu__graph_op *o = &n->op;
  const mgpu_buffer *bufs[3] = {o->dst, o->a, o->b};
  int rc = 0;
  for (int i = 0; rc == 0 && i < 3; i++) {
    mgpu__buf *b;
    if (bufs[i] == NULL) continue;
    rc = mgpu__buf_get(bufs[i], "buffer", &b);
    mgpu__buf_put(b);
  }
  if (rc == 0 && o->event != NULL) {
    mgpu__event *e;
    rc = mgpu__event_get(o->event, &e);
    mgpu__event_put(e);
  }
  /* A recorded call's check covers all its members: done at member 0. */
  if (rc == 0 && o->kind == MGPU__GOP_CALL && o->member == 0)
    rc = o->call->check(o->call);
  if (rc == 0 && mgpu__device_get(o->dev) == NULL)
    rc = mgpu__error(MGPU_ENODEV, "device %d is not open", o->dev);
  if (rc != 0) {
    char detail[256];
    snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
    rc = mgpu__error(rc, "%s: node %d (%s on device %d): %s", what, index,
                     o->kind == MGPU__GOP_CALL ? o->call->name
                                               : kind_name(o->kind),
                     o->dev, detail);
  }
  return rc;
}

/* The nodes of the recorded call of node i, by member, into members:
 * 0, or MGPU_EINVAL when one is missing or there twice. */
static int call_members(const mgpu__gnode *nodes, int n, int i,
                        int *members) {
  const mgpu__graph_call *call = nodes[i].op.call;
  int nm = call->nmembers, found = 0;
  for (int m = 0; m < nm; m++) members[m] = -1;
  for (int v = 0; v < n; v++) {
    if (nodes[v].op.kind != MGPU__GOP_CALL || nodes[v].op.call != call)
      continue;
    int m = nodes[v].op.member;
    if (m < 0 || m >= nm || members[m] >= 0)
      return mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: nodes %d and "
                         "%d are both member %d of one %s", m >= 0 && m < nm
                         ? members[m] : -1, v, m, call->name);
    members[m] = v;
    found++;
  }
  if (found != nm)
    return mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: node %d is "
                       "member %d of a %s of %d members, and %d of them are "
                       "in the graph", i, nodes[i].op.member, call->name, nm,
                       found);
  return 0;
}

/* Appends to g's edges each of all[0 .. nall) it lacks. */
static int deps_add(mgpu__gnode *g, const int *all, int nall) {
  for (int k = 0; k < nall; k++) {
    int have = 0;
    for (int j = 0; j < g->ndeps; j++) have |= g->deps[j] == all[k];
    if (have) continue;
    int rc = mgpu__graph_grow((void **)&g->deps, &g->deps_cap, g->ndeps + 1,
                              sizeof *g->deps, 4, "edges");
    if (rc != 0) return rc;
    g->deps[g->ndeps++] = all[k];
  }
  return 0;
}

/* An edge between two members of one recorded call: kept by the call
 * itself where it is the order of one device's stream (an earlier member
 * on the same device: the call issues its members in the order they were
 * recorded), else refused, since the members are issued together. Node v
 * depends on node d. */
static int member_edge(const mgpu__gnode *nodes, int v, int d) {
  const mgpu__graph_op *a = &nodes[d].op, *b = &nodes[v].op;
  if (a->dev == b->dev && a->member < b->member) return 0;
  return mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: node %d (member "
                     "%d of a %s, device %d) depends on node %d (member %d, "
                     "device %d) of the same %s, whose members are issued "
                     "together in the order they were recorded: only the "
                     "order of one device's stream holds between them", v,
                     b->member, b->call->name, b->dev, d, a->member, a->dev,
                     a->call->name);
}

/* Gives every member of the recorded call of node i, after its own edges
 * (nown), what any other member waits for, so that they can be issued
 * together (segments.c). */
static int call_merge(mgpu__gnode *nodes, int n, int i) {
  const mgpu__graph_call *call = nodes[i].op.call;
  int members[MGPU__GRAPH_CALL_MAX], *all = NULL, nall = 0, cap = 0;
  int rc = call_members(nodes, n, i, members);
  for (int m = 0; rc == 0 && m < call->nmembers; m++) {
    const mgpu__gnode *g = &nodes[members[m]];
    for (int j = 0; rc == 0 && j < g->ndeps; j++) {
      int d = g->deps[j], dup = nodes[d].op.call == call &&
                                nodes[d].op.kind == MGPU__GOP_CALL;
      if (dup && (rc = member_edge(nodes, members[m], d)) != 0) break;
      for (int k = 0; k < nall; k++) dup |= all[k] == d;
      if (dup) continue;
      rc = mgpu__graph_grow((void **)&all, &cap, nall + 1, sizeof *all, 8,
                            "edges");
      if (rc == 0) all[nall++] = d;
    }
  }
  for (int m = 0; rc == 0 && m < call->nmembers; m++) {
    mgpu__gnode *g = &nodes[members[m]];
    g->nown = g->ndeps;
    rc = deps_add(g, all, nall);
  }
  mgpu__free(all);
  return rc;
}

/* call_merge for each recorded call of the nodes, once. */
static int calls_merge(mgpu__gnode *nodes, int n) {
  int rc = 0;
  for (int i = 0; rc == 0 && i < n; i++) {
    if (nodes[i].op.kind != MGPU__GOP_CALL) continue;
    int first = 1;
    for (int v = 0; first && v < i; v++)
      first = nodes[v].op.kind != MGPU__GOP_CALL ||
              nodes[v].op.call != nodes[i].op.call;
    if (first) rc = call_merge(nodes, n, i);
  }
  return rc;
}

/* Kahn's order of g's nodes into order; a cycle is MGPU_EINVAL naming a
 * node on it. */
static int sort(const mgpu__graph *g, int *order) {
  int n = g->n, rc = 0, head = 0, tail = 0;
  int *waiting = mgpu__calloc((size_t)n + 1, sizeof *waiting);
  int *nsucc = mgpu__calloc((size_t)n + 1, sizeof *nsucc);
  int *first = mgpu__calloc((size_t)n + 1, sizeof *first);
  int total = 0;
  for (int i = 0; i < n; i++) total += g->nodes[i].ndeps;
  int *succ = mgpu__malloc(((size_t)total + 1) * sizeof *succ);
  if (waiting == NULL || nsucc == NULL || first == NULL || succ == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                     "memory for %d nodes", n);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    waiting[i] = g->nodes[i].ndeps;
    for (int j = 0; j < g->nodes[i].ndeps; j++) nsucc[g->nodes[i].deps[j]]++;
  }
  for (int i = 0, at = 0; i < n; i++) {
    first[i] = at;
    at += nsucc[i];
    nsucc[i] = 0;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].ndeps; j++) {
      int d = g->nodes[i].deps[j];
      succ[first[d] + nsucc[d]++] = i;
    }
  for (int i = 0; i < n; i++)
    if (waiting[i] == 0) order[tail++] = i;
  while (head < tail) {
    int v = order[head++];
    for (int j = 0; j < nsucc[v]; j++)
      if (--waiting[succ[first[v] + j]] == 0) order[tail++] = succ[first[v] + j];
  }
  if (tail < n) {
    /* Walk back from a node left over along its left-over dependencies:
     * the walk repeats a node, which is on a cycle. */
    int v = 0;
    while (waiting[v] == 0) v++;
    for (int steps = 0; steps < n; steps++) {
      const mgpu__gnode *node = &g->nodes[v];
      for (int j = 0; j < node->ndeps; j++)
        if (waiting[node->deps[j]] > 0) {
          v = node->deps[j];
          break;
        }
    }
    rc = mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: the graph has a "
                     "cycle through node %d (%s on device %d)", v,
                     kind_name(g->nodes[v].op.kind), g->nodes[v].op.dev);
  }
out:
  mgpu__free(succ);
  mgpu__free(first);
  mgpu__free(nsucc);
  mgpu__free(waiting);
  return rc;
}

static void retired_drop(retired_parts *r) {
  mgpu__parts_free(r->parts);
  mgpu__segs_free(r->segs);
  if (r->done != NULL) mgpu_event_destroy(r->done);
  mgpu__free(r);
}

/* Frees the retired parts whose launches are done (all: every launch is
 * done, as in exec_free). An event that fails (its device lost) is done
 * too: what it waited for will not run. */
static void retired_free(mgpu__exec *x, int all) {
  for (retired_parts **at = &x->retired; *at != NULL;) {
    retired_parts *r = *at;
    if (!all && r->done != NULL && mgpu_event_query(r->done) == MGPU_EAGAIN) {
      at = &r->next;
      continue;
    }
    *at = r->next;
    retired_drop(r);
  }
}

/* Frees x after its work; returns the first failure of that work. */
static int exec_free(mgpu__exec *x) {
  int rc = 0;
  /* The last launch's end on its caller's stream follows every launch. */
  if (x->last_stream != NULL) mgpu_event_synchronize(x->end[x->last_dev]);
  for (int i = 0; i < MGPU_MAX_DEVICES; i++) {
    if (x->streams[i] != NULL) {
      int r = mgpu_stream_destroy(x->streams[i]);
      if (rc == 0) rc = r;
    }
    if (x->end[i] != NULL) mgpu_event_destroy(x->end[i]);
    mgpu__parts_tail_free(i, x->tail[i]);
    if (x->start[i] != NULL) mgpu_event_destroy(x->start[i]);
  }
  for (int i = 0; x->done != NULL && i < x->n; i++)
    if (x->done[i] != NULL) mgpu_event_destroy(x->done[i]);
  mgpu__parts_free(x->parts);
  mgpu__segs_free(x->segs);
  retired_free(x, 1);
  for (int i = 0; x->nodes != NULL && i < x->n; i++)
    mgpu__gnode_clear(&x->nodes[i]);
  mgpu__free(x->nodes);
  mgpu__free(x->order);
  mgpu__free(x->done);
  mgpu__mutex_destroy(&x->lock);
  mgpu__free(x);
  return rc;
}

/* The streams and events of x (its nodes in place). */
static int exec_build(mgpu__exec *x) {
  int rc = 0;
  for (int i = 0; rc == 0 && i < x->n; i++) {
    int dev = x->nodes[i].op.dev;
    if (x->streams[dev] == NULL) {
      rc = mgpu_stream_create(&x->streams[dev], dev);
      if (rc == 0) x->devs[x->ndevs++] = dev;
    }
    /* Events for the edges a replay waits for. */
    for (int j = 0; rc == 0 && j < mgpu__gnode_waited(&x->nodes[i]); j++) {
      int d = x->nodes[i].deps[j];
      int ddev = x->nodes[d].op.dev;
      if (ddev != dev && x->done[d] == NULL)
        rc = mgpu_event_create(&x->done[d], ddev);
    }
  }
  return rc;
}

int mgpu_graph_instantiate(mgpu_graph *h, mgpu_graph_exec **out) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  mgpu__graph *g = mgpu__handle_get((uintptr_t)h, MGPU__H_GRAPH, "graph", &err);
  if (g == NULL) return err;
  int rc = 0;
  mgpu__exec *x = NULL;
  if (out == NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_graph_instantiate: NULL output "
                     "pointer");
  for (int i = 0; rc == 0 && i < g->n; i++)
    rc = node_check(&g->nodes[i], i, "mgpu_graph_instantiate");
  if (rc == 0 && (x = mgpu__calloc(1, sizeof *x)) == NULL)
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                     "memory");
  if (rc != 0) goto out;
  mgpu__mutex_init(&x->lock, MGPU__LOCK_GRAPH_EXEC);
  x->nodes = mgpu__calloc((size_t)g->n + 1, sizeof *x->nodes);
  x->order = mgpu__calloc((size_t)g->n + 1, sizeof *x->order);
  x->done = mgpu__calloc((size_t)g->n + 1, sizeof *x->done);
  if (x->nodes == NULL || x->order == NULL || x->done == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                     "memory for %d nodes", g->n);
    goto fail;
  }
  for (int i = 0; rc == 0 && i < g->n; i++, x->n++)
    rc = mgpu__gnode_copy(&x->nodes[i], &g->nodes[i]);
  if (rc == 0) rc = calls_merge(x->nodes, x->n);
  if (rc == 0)
    rc = sort(&(mgpu__graph){.nodes = x->nodes, .n = x->n}, x->order);
  if (rc == 0) rc = exec_build(x);
  if (rc == 0) rc = replay_mode(&x->replay);
  if (rc == 0) rc = replay_build(x, &x->parts, &x->segs);
  if (rc != 0) goto fail;
  x->handle = mgpu__handle_new(MGPU__H_GRAPH_EXEC, x);
  if (x->handle == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: no handles left");
    goto fail;
  }
  *out = (mgpu_graph_exec *)x->handle;
  goto out;
fail:
  exec_free(x);
out:
  mgpu__handle_put(g->handle);
  return rc;
}

static int exec_get(mgpu_graph_exec *h, mgpu__exec **out) {
  int err = 0;
  *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_GRAPH_EXEC, "executable graph",
                          &err);
  return *out != NULL ? 0 : err;
}

static int event_of(mgpu_event **slot, int dev) {
  return *slot != NULL ? 0 : mgpu_event_create(slot, dev);
}

/* A failure an earlier launch left on a device's stream, else 0. */
static int earlier_failure(mgpu__exec *x) {
  for (int i = 0; i < x->ndevs; i++) {
    if (!x->used[x->devs[i]]) continue;
    int rc = mgpu_stream_query(x->streams[x->devs[i]]);
    if (rc != 0 && rc != MGPU_EAGAIN) {
      char detail[256];
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
      return mgpu__error(rc, "mgpu_graph_launch: an earlier launch failed "
                         "on device %d: %s", x->devs[i], detail);
    }
  }
  return 0;
}

/* Makes the parts again after an update; the old ones are freed once the
 * launches that used them are done (x->lock held): each set retired has
 * an event of its own recorded after the last launch, so a loop of
 * updates and launches that runs ahead of its devices keeps only the sets
 * still in use. */
static int parts_refresh(mgpu__exec *x) {
  if (x->retired != NULL) retired_free(x, 0);
  if (!x->parts_stale) return 0;
  retired_parts *r = mgpu__calloc(1, sizeof *r);
  mgpu__parts *parts;
  mgpu__segs *segs;
  int rc = r == NULL ? mgpu__error(MGPU_ENOMEM, "mgpu_graph_launch: out of "
                                   "host memory")
                     : replay_build(x, &parts, &segs);
  if (rc != 0) {
    mgpu__free(r);
    return rc;
  }
  if (x->last_stream != NULL &&
      (mgpu_event_create(&r->done, x->last_dev) != 0 ||
       mgpu_event_record(r->done, x->last_stream) != 0)) {
    /* No event (the stream of the last launch is gone, or memory is
     * short): the end of that launch, which follows every earlier one. */
    mgpu_event_synchronize(x->end[x->last_dev]);
    retired_free(x, 1);
    if (r->done != NULL) mgpu_event_destroy(r->done);
    r->done = NULL;
  }
  r->parts = x->parts;
  r->segs = x->segs;
  r->next = x->retired;
  x->retired = r;
  x->parts = parts;
  x->segs = segs;
  x->parts_stale = 0;
  return 0;
}

/* Queues one run as parts joined to stream through their board (x->lock
 * held, the handles checked, x->parts joins sdev): no event between the
 * caller's stream and the parts, whose waits spin before they park. */
static int issue_joined(mgpu__exec *x, mgpu_stream *stream, int sdev,
                        int *queued) {
  mgpu_stream *on[MGPU_MAX_DEVICES];
  int rc = event_of(&x->end[sdev], sdev), tailed = 0;
  for (int i = 0; i < x->ndevs; i++) {
    int dev = x->devs[i];
    on[dev] = dev == sdev ? stream : x->streams[dev];
    x->used[dev] |= dev != sdev;
  }
  if (rc == 0 && x->last_stream != NULL && x->last_stream != stream &&
      (rc = mgpu_stream_wait_event(stream, x->end[x->last_dev])) == 0)
    *queued = 1;
  if (rc == 0) {
    rc = mgpu__parts_run(x->parts, sdev, stream, on, ++x->launches, &tailed);
    *queued = 1; /* some parts may be queued when it fails */
  }
  if (rc == 0) rc = mgpu_event_record(x->end[sdev], stream);
  if (rc != 0 && tailed) mgpu__parts_drop_tail(x->parts, sdev);
  if (rc == 0) {
    x->last_stream = stream;
    x->last_dev = sdev;
  }
  return rc;
}

/* The end of launch number launch on the caller's stream, after it
 * waited for every other device's end (issue). */
static int issue_end(mgpu__exec *x, mgpu_stream *stream, int sdev,
                     uint64_t launch) {
  /* The other devices' failures surface on the caller's stream, as its
   * own nodes' do. */
  int rc = 0, tailed = 0;
  if (x->tail[sdev] != NULL) {
    rc = mgpu__parts_tail_launch(sdev, x->tail[sdev], stream, launch);
    tailed = rc == 0;
  }
  if (rc == 0) rc = mgpu_event_record(x->end[sdev], stream);
  if (rc != 0 && tailed) {
    mgpu__parts_tail_cancel(sdev, x->tail[sdev]);
    mgpu__parts_tail_free(sdev, x->tail[sdev]);
    x->tail[sdev] = NULL;
    x->tail_made[sdev] = 0;
  }
  if (rc == 0) {
    x->last_stream = stream;
    x->last_dev = sdev;
  }
  return rc;
}

/* MGPU_EDEVLOST naming a lost device of x, else 0: a launch refuses it
 * before anything is queued (the backend would refuse that device's work
 * half-way through the launch). */
static int lost_device(const mgpu__exec *x) {
  for (int i = 0; i < x->ndevs; i++)
    if (mgpu__device_is_lost(x->devs[i]))
      return mgpu__error(MGPU_EDEVLOST, "mgpu_graph_launch: device %d was "
                         "lost: nothing of the launch was queued",
                         x->devs[i]);
  return 0;
}

/* Queues one run (x->lock held, the handles checked); *queued becomes 1
 * once something of it was queued (issue_failed). */
static int issue(mgpu__exec *x, mgpu_stream *stream, int sdev, int *queued) {
  mgpu_stream *on[MGPU_MAX_DEVICES];
  int rc = lost_device(x);
  if (rc != 0) return rc;
  int joined = x->parts != NULL
                   ? mgpu__parts_joins(x->parts, sdev, x->streams) : 0;
  if (joined != 0)
    return joined > 0 ? issue_joined(x, stream, sdev, queued) : joined;
  rc = event_of(&x->start[sdev], sdev);
  if (rc == 0) rc = event_of(&x->end[sdev], sdev);
  if (rc == 0 && !x->tail_made[sdev]) {
    rc = mgpu__parts_tail_make(sdev, x->streams, x->devs, x->ndevs,
                               &x->tail[sdev]);
    x->tail_made[sdev] = rc == 0;
  }
  for (int i = 0; rc == 0 && i < x->ndevs; i++) {
    int dev = x->devs[i];
    on[dev] = dev == sdev ? stream : x->streams[dev];
    x->used[dev] |= dev != sdev;
    if (dev != sdev) rc = event_of(&x->end[dev], dev);
  }
  /* Launches of one graph run one after another, also from streams of
   * different devices. */
  if (rc == 0 && x->last_stream != NULL && x->last_stream != stream &&
      (rc = mgpu_stream_wait_event(stream, x->end[x->last_dev])) == 0)
    *queued = 1;
  if (rc == 0 && (rc = mgpu_event_record(x->start[sdev], stream)) == 0)
    *queued = 1;
  for (int i = 0; rc == 0 && i < x->ndevs; i++)
    if (x->devs[i] != sdev)
      rc = mgpu_stream_wait_event(on[x->devs[i]], x->start[sdev]);
  uint64_t launch = ++x->launches;
  if (rc == 0 && x->parts != NULL) mgpu__parts_start(x->parts, launch);
  for (int i = 0; rc == 0 && x->parts != NULL && i < x->ndevs; i++) {
    rc = mgpu__parts_launch(x->parts, x->devs[i], on[x->devs[i]], launch);
    for (int j = i; rc != 0 && j < x->ndevs; j++) /* it and the rest */
      mgpu__parts_cancel(x->parts, x->devs[j], launch);
  }
  if (rc == 0 && x->parts == NULL)
    rc = mgpu__segs_issue(x->segs, x->nodes, on, x->done, launch);
  for (int i = 0; rc == 0 && i < x->ndevs; i++) {
    int dev = x->devs[i];
    if (dev == sdev) continue;
    rc = mgpu_event_record(x->end[dev], on[dev]);
    if (rc == 0) rc = mgpu_stream_wait_event(stream, x->end[dev]);
  }
  return rc != 0 ? rc : issue_end(x, stream, sdev, launch);
}

/* A launch that failed may have queued part of its work: the end event
 * recorded after it on the caller's stream, so that the next launch, a
 * synchronize and the destroy wait for that work too, as for a launch
 * that went through (the failure's detail is kept). */
static void issue_failed(mgpu__exec *x, mgpu_stream *stream, int sdev,
                         int rc) {
  if (x->end[sdev] == NULL) return;
  char detail[512];
  snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
  if (mgpu_event_record(x->end[sdev], stream) == 0) {
    x->last_stream = stream;
    x->last_dev = sdev;
  }
  mgpu__error(rc, "%s", detail);
}

int mgpu_graph_launch(mgpu_graph_exec *h, mgpu_stream *stream) {
  mgpu__exec *x;
  mgpu__stream *s = NULL;
  int rc = exec_get(h, &x);
  if (rc != 0) return rc;
  rc = mgpu__stream_get(stream, &s);
  if (rc != 0) {
    if (rc == MGPU_ENOTSUP)
      rc = mgpu__error(MGPU_ENOTSUP, "mgpu_graph_launch: the stream is "
                       "capturing a graph: a graph launch cannot be recorded");
    mgpu__handle_put(x->handle);
    return rc;
  }
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  mgpu__mutex_lock(&x->lock);
  for (int i = 0; rc == 0 && i < x->n; i++)
    rc = node_check(&x->nodes[i], i, "mgpu_graph_launch");
  if (rc == 0) rc = earlier_failure(x);
  if (rc == 0) rc = parts_refresh(x);
  int queued = 0;
  if (rc == 0 && (rc = issue(x, stream, s->dev, &queued)) != 0 && queued)
    issue_failed(x, stream, s->dev, rc);
  mgpu__mutex_unlock(&x->lock);
  if (rc == 0) mgpu__metric_add(s->dev, MGPU__M_graph_launches, 1);
  if (t0 != 0) {
    mgpu__trace_arg a[] = {MGPU__TARG_I("nodes", x->n),
                           MGPU__TARG_I("devices", x->ndevs)};
    mgpu__trace_thread_span("graph launch", t0, mgpu__now_ns(), a, 2);
  }
  mgpu__stream_put(s);
  mgpu__handle_put(x->handle);
  return rc;
}

/* The node of an update: in range and of the kind. */
static int update_node(mgpu__exec *x, int node, mgpu__graph_op_kind kind,
                       const char *what) {
  char nodes[48];
  if (node < 0 || node >= x->n)
    return mgpu__error(MGPU_EINVAL, "%s: node %d, and the graph has %s", what,
                       node, mgpu__graph_nodes_text(x->n, nodes, sizeof nodes));
  if (x->nodes[node].op.kind != kind)
    return mgpu__error(MGPU_EINVAL, "%s: node %d is a %s node, not a %s "
                       "node", what, node, kind_name(x->nodes[node].op.kind),
                       kind_name(kind));
  return 0;
}

int mgpu_graph_exec_update_kernel(mgpu_graph_exec *h, mgpu_graph_node node,
                                  const void *args, size_t args_size) {
  const char *what = "mgpu_graph_exec_update_kernel";
  mgpu__exec *x;
  int rc = exec_get(h, &x);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&x->lock);
  rc = update_node(x, node, MGPU__GOP_KERNEL, what);
  if (rc == 0 && args_size > 0 && args == NULL)
    rc = mgpu__error(MGPU_EINVAL, "%s: node %d given %zu bytes of arguments "
                     "at NULL", what, node, args_size);
  if (rc == 0) rc = mgpu__gnode_set_args(&x->nodes[node], args, args_size);
  if (rc == 0) x->parts_stale = 1;
  mgpu__mutex_unlock(&x->lock);
  mgpu__handle_put(x->handle);
  return rc;
}

int mgpu_graph_exec_update_copy(mgpu_graph_exec *h, mgpu_graph_node node,
                                mgpu_buffer *dst, size_t dst_offset,
                                const mgpu_buffer *src, size_t src_offset,
                                size_t size) {
  const char *what = "mgpu_graph_exec_update_copy";
  mgpu__exec *x;
  int rc = exec_get(h, &x);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&x->lock);
  rc = update_node(x, node, MGPU__GOP_COPY, what);
  int dev = -1;
  if (rc == 0)
    rc = mgpu__graph_check_copy(what, dst, dst_offset, src, src_offset, size,
                                &dev);
  if (rc == 0 && dev != x->nodes[node].op.dev)
    rc = mgpu__error(MGPU_EWRONGDEV, "%s: node %d runs on device %d and the "
                     "new source is on device %d", what, node,
                     x->nodes[node].op.dev, dev);
  if (rc == 0) {
    mgpu__graph_op *o = &x->nodes[node].op;
    o->dst = dst;
    o->dst_offset = dst_offset;
    o->a = src;
    o->a_offset = src_offset;
    o->size = size;
    x->parts_stale = 1;
  }
  mgpu__mutex_unlock(&x->lock);
  mgpu__handle_put(x->handle);
  return rc;
}

int mgpu__graph_exec_retired(mgpu_graph_exec *h) {
  mgpu__exec *x;
  int rc = exec_get(h, &x), n = 0;
  if (rc != 0) return rc;
  mgpu__mutex_lock(&x->lock);
  for (retired_parts *r = x->retired; r != NULL; r = r->next) n++;
  mgpu__mutex_unlock(&x->lock);
  mgpu__handle_put(x->handle);
  return n;
}

int mgpu_graph_exec_synchronize(mgpu_graph_exec *h) {
  mgpu__exec *x;
  int rc = exec_get(h, &x);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&x->lock);
  /* The end of the last launch first: a launch's tail may have moved a
   * failure onto its caller's stream, which reports it then. */
  if (x->last_stream != NULL) rc = mgpu_event_synchronize(x->end[x->last_dev]);
  for (int i = 0; i < x->ndevs; i++) {
    int r = mgpu_stream_synchronize(x->streams[x->devs[i]]);
    if (r != 0 && rc == 0) {
      char detail[256];
      snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
      rc = mgpu__error(r, "mgpu_graph_exec_synchronize: a node on device %d "
                       "failed: %s", x->devs[i], detail);
    }
  }
  mgpu__mutex_unlock(&x->lock);
  mgpu__handle_put(x->handle);
  return rc;
}

int mgpu_graph_exec_destroy(mgpu_graph_exec *h) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  /* Waits for the launches inside; exec_free waits for the work queued. */
  mgpu__exec *x = mgpu__handle_release((uintptr_t)h, MGPU__H_GRAPH_EXEC,
                                       "executable graph", &err);
  if (x == NULL) return err;
  return exec_free(x);
}

/* ---- shutdown ---- */

static void release_exec(void *obj, void *arg) {
  (void)arg;
  mgpu__exec *x = obj;
  mgpu__handle_retire(x->handle);
  exec_free(x);
}

static void release_graph(void *obj, void *arg) {
  (void)arg;
  mgpu__graph *g = obj;
  mgpu__handle_retire(g->handle);
  mgpu__graph_free(g);
}

static void graphs_shutdown(void) {
  mgpu__handle_foreach(MGPU__H_GRAPH_EXEC, release_exec, NULL);
  mgpu__handle_foreach(MGPU__H_GRAPH, release_graph, NULL);
}
MGPU__ON_SHUTDOWN(graphs_shutdown, MGPU__LAYER_WORK)
