/* Stream capture: the recorder behind core/capture.h.
 *
 * A capture keeps, for each stream recording into it, the stream's tail:
 * the nodes its next call must wait for. A call on a capturing stream
 * becomes a node after the tail and is the new tail. An event recorded on
 * a capturing stream marks the tail at that point; a stream waiting for a
 * marked event adds the mark to its tail, and a stream that was not
 * capturing joins the capture with the mark as its tail (as on CUDA). The
 * end checks that every joined stream's tail leads back into the origin's
 * tail: the graph then has no work the origin's later work would not wait
 * for.
 *
 * capture_lock guards every capture, the list of them and the capture field
 * of their streams (written only here, under it). Capture is set up once
 * per graph, so one lock for all of them costs nothing that matters.
 */
#include <string.h>

#include "graph/graph-internal.h"
#include "util/fault.h"

typedef struct node_set {
  int *nodes;
  int n, cap;
} node_set;

typedef struct capture_stream {
  mgpu__stream *s;
  node_set tail;
} capture_stream;

typedef struct capture_mark {
  uintptr_t event; /* the event's handle */
  node_set at;
} capture_mark;

/* The producers and consumers recorded for one pair key, in order. */
typedef struct capture_pairs {
  const void *key;
  node_set producers, consumers;
} capture_pairs;

typedef struct capture {
  mgpu__graph *g;
  capture_pairs *pairs;
  int npairs, pairs_cap;
  capture_stream *streams; /* [0] is the origin */
  int nstreams, streams_cap;
  capture_mark *marks;
  int nmarks, marks_cap;
  struct capture *next;
} capture;

static mgpu__mutex capture_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_CAPTURE);
static capture *captures; /* in progress, guarded by capture_lock */

static int set_add(node_set *set, int node) {
  for (int i = 0; i < set->n; i++)
    if (set->nodes[i] == node) return 0;
  int rc = mgpu__graph_grow((void **)&set->nodes, &set->cap, set->n + 1,
                            sizeof *set->nodes, 4, "captured nodes");
  if (rc == 0) set->nodes[set->n++] = node;
  return rc;
}

static int set_union(node_set *dst, const node_set *src) {
  for (int i = 0; i < src->n; i++) {
    int rc = set_add(dst, src->nodes[i]);
    if (rc != 0) return rc;
  }
  return 0;
}

/* The events recorded in c stand, once it ended with a graph, for points
 * of that graph, not for any stream's work: mark them so that a wait for
 * one, or a synchronize or query of one, is refused (core/stream.c) until
 * it is recorded again outside a capture. An event destroyed since is
 * skipped. (A capture that ends without a graph leaves its events as they
 * were before it: their last record outside a capture counts.) */
static void marks_end(const capture *c) {
  for (int i = 0; i < c->nmarks; i++) {
    mgpu__event *e = mgpu__handle_hold(c->marks[i].event, MGPU__H_EVENT);
    if (e == NULL) continue;
    atomic_store_explicit(&e->capture_ended, 1, memory_order_relaxed);
    mgpu__handle_put(e->handle);
  }
}

static void capture_free(capture *c) {
  for (int i = 0; i < c->nstreams; i++) mgpu__free(c->streams[i].tail.nodes);
  for (int i = 0; i < c->nmarks; i++) mgpu__free(c->marks[i].at.nodes);
  for (int i = 0; i < c->npairs; i++) {
    mgpu__free(c->pairs[i].producers.nodes);
    mgpu__free(c->pairs[i].consumers.nodes);
  }
  mgpu__free(c->pairs);
  mgpu__free(c->streams);
  mgpu__free(c->marks);
  mgpu__graph_free(c->g);
  mgpu__free(c);
}

static capture_stream *stream_of(capture *c, const mgpu__stream *s) {
  for (int i = 0; i < c->nstreams; i++)
    if (c->streams[i].s == s) return &c->streams[i];
  return NULL;
}

static capture_mark *mark_of(capture *c, uintptr_t event) {
  for (int i = 0; i < c->nmarks; i++)
    if (c->marks[i].event == event) return &c->marks[i];
  return NULL;
}

/* The capture (in progress) whose mark e carries, with the mark. */
static capture *find_mark(uintptr_t event, capture_mark **mark) {
  for (capture *c = captures; c != NULL; c = c->next)
    if ((*mark = mark_of(c, event)) != NULL) return c;
  return NULL;
}

static int streams_add(capture *c, mgpu__stream *s, capture_stream **out) {
  int rc = mgpu__graph_grow((void **)&c->streams, &c->streams_cap,
                            c->nstreams + 1, sizeof *c->streams, 4,
                            "capturing streams");
  if (rc != 0) return rc;
  *out = &c->streams[c->nstreams++];
  memset(*out, 0, sizeof **out);
  (*out)->s = s;
  return 0;
}

/* Records an event's mark: the tail of the stream it was recorded on. */
static int mark_set(capture *c, uintptr_t event, const node_set *tail) {
  capture_mark *m = mark_of(c, event);
  if (m == NULL) {
    int rc = mgpu__graph_grow((void **)&c->marks, &c->marks_cap,
                              c->nmarks + 1, sizeof *c->marks, 4,
                              "captured events");
    if (rc != 0) return rc;
    m = &c->marks[c->nmarks++];
    memset(m, 0, sizeof *m);
    m->event = event;
  }
  m->at.n = 0;
  return set_union(&m->at, tail);
}

/* The pairs of key in c, made empty when new. */
static int pairs_of(capture *c, const void *key, capture_pairs **out) {
  for (int i = 0; i < c->npairs; i++)
    if (c->pairs[i].key == key) return *out = &c->pairs[i], 0;
  int rc = mgpu__graph_grow((void **)&c->pairs, &c->pairs_cap, c->npairs + 1,
                            sizeof *c->pairs, 4, "paired calls");
  if (rc != 0) return rc;
  *out = &c->pairs[c->npairs++];
  memset(*out, 0, sizeof **out);
  (*out)->key = key;
  return 0;
}

/* Appends op after deps and, where it is paired (mgpu__graph_op), in
 * order with its partners whichever was recorded first: consumer j after
 * producer j, producer p after consumer p - depth. *node: its index. An
 * order that cannot be met is a cycle, which mgpu_graph_instantiate
 * names. */
static int append_paired(capture *c, const mgpu__graph_op *op,
                         const node_set *deps, int *node) {
  if (op->pair_role == 0)
    return mgpu__graph_append(c->g, op, deps->nodes, deps->n, node);
  capture_pairs *p = NULL;
  int rc = pairs_of(c, op->pair_key, &p);
  if (rc != 0) return rc;
  int producer = op->pair_role == 1, d = op->pair_depth;
  node_set *mine = producer ? &p->producers : &p->consumers;
  const node_set *other = producer ? &p->consumers : &p->producers;
  int k = mine->n; /* op is the k-th of its role */
  int after = producer ? k - d : k, before = producer ? k : k + d;
  /* Room first, so that nothing fails once the node is in the graph. */
  rc = mgpu__graph_grow((void **)&mine->nodes, &mine->cap, k + 1,
                        sizeof *mine->nodes, 4, "paired calls");
  node_set all = {0};
  if (rc == 0) rc = set_union(&all, deps);
  if (rc == 0 && after >= 0 && after < other->n)
    rc = set_add(&all, other->nodes[after]);
  if (rc == 0) rc = mgpu__graph_append(c->g, op, all.nodes, all.n, node);
  mgpu__free(all.nodes);
  if (rc != 0) return rc;
  mine->nodes[mine->n++] = *node;
  /* The partner that must follow op, recorded before it. */
  if (before < other->n)
    rc = mgpu__graph_edge_add(c->g, *node, other->nodes[before]);
  return rc;
}

static int record_in(capture *c, capture_stream *cs, const mgpu__graph_op *op) {
  uintptr_t ev = (uintptr_t)op->event;
  if (op->kind == MGPU__GOP_EVENT_RECORD) return mark_set(c, ev, &cs->tail);
  if (op->kind == MGPU__GOP_EVENT_WAIT) {
    capture_mark *m;
    capture *owner = find_mark(ev, &m);
    if (owner == c) return set_union(&cs->tail, &m->at);
    if (owner != NULL)
      return mgpu__error(MGPU_EINVAL, "mgpu_stream_wait_event: the stream of "
                         "device %d captures one graph and the event was "
                         "recorded in another capture", op->dev);
    /* An event of work outside the capture: a wait node. */
  }
  int node;
  int rc = append_paired(c, op, &cs->tail, &node);
  if (rc != 0) return rc;
  cs->tail.n = 0;
  return set_add(&cs->tail, node);
}

/* Undoes what a record of several ops did in c: the nodes from first on
 * go, the streams' tails are as saved[i] (tails[i] of s[i]). Unpaired
 * ops only (a recorded call's members). */
static void record_undo(capture *c, mgpu__stream *const *s, int n, int first,
                        node_set *saved) {
  while (c->g->n > first) mgpu__gnode_clear(&c->g->nodes[--c->g->n]);
  for (int i = n - 1; i >= 0; i--) { /* the first save of a stream wins */
    capture_stream *cs = stream_of(c, s[i]);
    cs->tail.n = 0;
    (void)set_union(&cs->tail, &saved[i]); /* within its old capacity */
  }
}

static int hook_record(mgpu__stream *const *s, const mgpu__graph_op *ops,
                       int n) {
  node_set saved[MGPU__GRAPH_CALL_MAX] = {{0}};
  mgpu__mutex_lock(&capture_lock);
  capture *c = mgpu__stream_capture(s[0]);
  int rc = 0, first = c != NULL ? c->g->n : 0, nsaved = 0;
  for (int i = 0; rc == 0 && i < n; i++) {
    capture_stream *cs = mgpu__stream_capture(s[i]) == c && c != NULL
                             ? stream_of(c, s[i]) : NULL;
    if (cs == NULL)
      rc = mgpu__error(MGPU_EINVAL, "device %d: the stream %s", s[i]->dev,
                       c == NULL || mgpu__stream_capture(s[i]) == NULL
                           ? "does not capture (its capture ended meanwhile)"
                           : "captures another graph than the call's other "
                             "streams");
    if (rc == 0 && n > 1 && (rc = set_union(&saved[i], &cs->tail)) == 0)
      nsaved++;
    if (rc == 0) rc = record_in(c, cs, &ops[i]);
  }
  if (rc != 0 && n > 1 && c != NULL) record_undo(c, s, nsaved, first, saved);
  mgpu__mutex_unlock(&capture_lock);
  for (int k = 0; k < n && n > 1; k++) mgpu__free(saved[k].nodes);
  return rc;
}

static int hook_join(mgpu__stream *s, mgpu__event *e) {
  mgpu__mutex_lock(&capture_lock);
  capture_mark *m;
  capture *c = find_mark(e->handle, &m);
  int rc = 0;
  if (c != NULL) {
    capture_stream *cs = NULL;
    rc = streams_add(c, s, &cs);
    if (rc == 0) rc = set_union(&cs->tail, &m->at);
    if (rc == 0) {
      atomic_store_explicit(&s->capture, c, memory_order_release);
      rc = 1;
    } else if (cs != NULL) {
      mgpu__free(cs->tail.nodes);
      c->nstreams--;
    }
  }
  mgpu__mutex_unlock(&capture_lock);
  return rc;
}

static void hook_forget(mgpu__event *e) {
  mgpu__mutex_lock(&capture_lock);
  capture_mark *m;
  capture *c;
  while ((c = find_mark(e->handle, &m)) != NULL) {
    mgpu__free(m->at.nodes);
    *m = c->marks[--c->nmarks];
  }
  mgpu__mutex_unlock(&capture_lock);
}

static int hook_marked(mgpu__event *e) {
  mgpu__mutex_lock(&capture_lock);
  capture_mark *m;
  int marked = find_mark(e->handle, &m) != NULL;
  mgpu__mutex_unlock(&capture_lock);
  return marked;
}

static void detach(capture *c);

static void hook_drop_all(void) {
  mgpu__mutex_lock(&capture_lock);
  while (captures != NULL) {
    capture *c = captures;
    detach(c);
    capture_free(c);
  }
  mgpu__mutex_unlock(&capture_lock);
}

static const mgpu__capture_hooks hooks = {
    .record = hook_record,
    .join = hook_join,
    .forget = hook_forget,
    .marked = hook_marked,
    .drop_all = hook_drop_all,
};

__attribute__((constructor)) static void register_hooks(void) {
  mgpu__capture_hooks_set(&hooks);
}

int mgpu_stream_begin_capture(mgpu_stream *h) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc != 0) return rc;
  capture *c = mgpu__calloc(1, sizeof *c);
  capture_stream *cs;
  if (c == NULL || (c->g = mgpu__graph_new()) == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_stream_begin_capture: out of host "
                     "memory (device %d)", s->dev);
  } else {
    rc = streams_add(c, s, &cs);
  }
  mgpu__mutex_lock(&capture_lock);
  if (rc == 0 && mgpu__stream_capture(s) != NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_stream_begin_capture: the stream of "
                     "device %d is already capturing", s->dev);
  if (rc == 0) {
    c->next = captures;
    captures = c;
    atomic_store_explicit(&s->capture, c, memory_order_release);
    atomic_fetch_add(&mgpu__captures_active, 1);
  }
  mgpu__mutex_unlock(&capture_lock);
  if (rc != 0 && c != NULL) capture_free(c);
  mgpu__stream_put(s);
  return rc;
}

/* Takes c off the list and every stream out of it (capture_lock held). */
static void detach(capture *c) {
  for (capture **p = &captures; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  for (int i = 0; i < c->nstreams; i++)
    atomic_store_explicit(&c->streams[i].s->capture, NULL,
                          memory_order_release);
  atomic_fetch_sub(&mgpu__captures_active, 1);
}

/* 0 when every joined stream's tail leads into the origin's tail, else
 * MGPU_EINVAL naming the first stream that does not. */
static int check_joined(capture *c) {
  mgpu__graph *g = c->g;
  char *reaches = mgpu__calloc((size_t)g->n + 1, 1);
  int *stack = mgpu__malloc(((size_t)g->n + 1) * sizeof *stack);
  int rc = 0, top = 0;
  if (reaches == NULL || stack == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_stream_end_capture: out of host "
                     "memory for %d nodes", g->n);
    goto out;
  }
  const node_set *origin = &c->streams[0].tail;
  for (int i = 0; i < origin->n; i++) {
    reaches[origin->nodes[i]] = 1;
    stack[top++] = origin->nodes[i];
  }
  while (top > 0) {
    const mgpu__gnode *n = &g->nodes[stack[--top]];
    for (int i = 0; i < n->ndeps; i++)
      if (!reaches[n->deps[i]]) {
        reaches[n->deps[i]] = 1;
        stack[top++] = n->deps[i];
      }
  }
  for (int i = 1; rc == 0 && i < c->nstreams; i++)
    for (int j = 0; j < c->streams[i].tail.n; j++)
      if (!reaches[c->streams[i].tail.nodes[j]]) {
        rc = mgpu__error(MGPU_EINVAL, "mgpu_stream_end_capture: a stream of "
                         "device %d joined the capture and its work (node "
                         "%d) does not rejoin the origin stream of device %d",
                         c->streams[i].s->dev, c->streams[i].tail.nodes[j],
                         c->streams[0].s->dev);
        break;
      }
out:
  mgpu__free(stack);
  mgpu__free(reaches);
  return rc;
}

int mgpu_stream_end_capture(mgpu_stream *h, mgpu_graph **out) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc != 0) return rc;
  if (out == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "mgpu_stream_end_capture: NULL output "
                     "pointer (device %d)", s->dev);
    mgpu__stream_put(s);
    return rc;
  }
  mgpu__mutex_lock(&capture_lock);
  capture *c = mgpu__stream_capture(s);
  if (c == NULL || c->streams[0].s != s) {
    rc = mgpu__error(MGPU_EINVAL, "mgpu_stream_end_capture: the stream of "
                     "device %d %s", s->dev,
                     c == NULL ? "is not capturing"
                               : "joined a capture it did not begin");
    c = NULL;
  } else {
    rc = check_joined(c);
    detach(c);
  }
  mgpu__mutex_unlock(&capture_lock);
  mgpu__stream_put(s);
  if (c == NULL) return rc;
  if (rc == 0) marks_end(c);
  mgpu__graph *g = c->g;
  c->g = NULL;
  capture_free(c);
  if (rc != 0) {
    mgpu__graph_free(g);
    return rc;
  }
  return mgpu__graph_publish(g, out);
}

int mgpu_stream_is_capturing(mgpu_stream *h) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc != 0) return rc;
  rc = mgpu__stream_capture(s) != NULL;
  mgpu__stream_put(s);
  return rc;
}

