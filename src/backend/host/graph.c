/* The host backend's graphs (backend/graph.h).
 *
 * A device's part of a graph is one operation: the worker that takes it
 * runs the part's nodes in order, in place, waiting for the signals of
 * other devices' nodes on the board (a short spin, then a park; no park
 * while every CPU is busy) and posting its own. One hand-off per device and
 * launch instead of one per node; in a loop of launches, the start of the
 * next one is posted as soon as the part before it ends
 * (post_next_start). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/graph.h"
#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/thread.h"

/* How long a part's wait goes on without parking while every CPU is
 * busy (mgpu__host_graph_run). */
#define NO_PARK_NS 1000000u

struct host_graph {
  _Atomic int refs; /* the owner's, and one per run queued */
  mgpu__graph_board *board;
  mgpu__bgraph_node *nodes; /* args and waits point into blob */
  int n;
  void *blob;
  mgpu__bstream **adopt; /* mgpu__bgraph_part's */
  int nadopt;
  /* adopt_lock guards adopt_off, set by a cancel: from then on no run
   * looks at the adopted streams, which may be freed. It comes before a
   * device's lock (docs/ARCHITECTURE.md, "Lock order"). */
  mgpu__mutex adopt_lock;
  int adopt_off;
};

void mgpu__host_graph_unref(host_graph *g) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (g->board != NULL) mgpu__graph_board_unref(g->board);
  mgpu__mutex_destroy(&g->adopt_lock);
  mgpu__free(g->adopt);
  mgpu__free(g->blob);
  mgpu__free(g->nodes);
  mgpu__free(g);
}

/* The first wait of o's next node that is not over, or -1. */
static int pending_wait(const op *o) {
  const host_graph *g = o->u.graph.graph;
  const mgpu__bgraph_node *n = &g->nodes[o->u.graph.next];
  for (int j = 0; j < n->nwaits; j++) {
    counter_target w = {&g->board->signals[n->waits[j]],
                        2 * o->u.graph.launch};
    if (!counter_reached(&w)) return n->waits[j];
  }
  return -1;
}

int mgpu__host_graph_unfinished(const op *o) {
  return o->kind == OP_GRAPH && o->u.graph.next < o->u.graph.graph->n;
}

/* With s's device lock held, s's head o a part: 1 when its last slice
 * spun in vain and its next node must still wait, and s is now parked on
 * the board (a post puts it back). A part not yet run, or one that moved
 * on, is run first: its wait spins before it parks. */
int mgpu__host_graph_must_park(mgpu__bstream *s, op *o) {
  if (!o->u.graph.spun || !mgpu__host_graph_unfinished(o) ||
      atomic_load_explicit(&s->dev->lost, memory_order_acquire))
    return 0;
  mgpu__graph_board *b = o->u.graph.graph->board;
  mgpu__mutex_lock(&b->lock);
  atomic_fetch_add(&b->nparked, 1);
  int park = pending_wait(o) >= 0;
  if (park) {
    s->parked = 1;
    s->wait_next = b->parked;
    b->parked = s;
  } else {
    atomic_fetch_sub(&b->nparked, 1);
  }
  mgpu__mutex_unlock(&b->lock);
  return park;
}

/* Posts value to signal sig and puts the streams parked on b back on their
 * devices' ready lists (each looks at its wait again when taken). A
 * signal only grows: the cancel of a part already queued (launch 0, whose
 * 1 is below every launch's value) leaves a later launch's post as it is. */
static void board_post(mgpu__graph_board *b, int sig, uint64_t value) {
  uint64_t now = atomic_load(&b->signals[sig]);
  while (now < value &&
         !atomic_compare_exchange_weak(&b->signals[sig], &now, value)) {
  }
  if (atomic_load(&b->nparked) == 0) return;
  mgpu__mutex_lock(&b->lock);
  mgpu__bstream *w = b->parked;
  b->parked = NULL;
  for (mgpu__bstream *x = w; x != NULL; x = x->wait_next)
    atomic_fetch_sub(&b->nparked, 1);
  mgpu__mutex_unlock(&b->lock);
  mgpu__host_unpark(w);
}

/* Node node of s's part waited for a node of device lost_dev, which was
 * lost: what it reads was never made. */
static void graph_wait_lost(mgpu__bdevice *d, mgpu__bstream *s, int node,
                            int lost_dev) {
  mgpu__mutex_lock(&d->lock);
  if (s->error == 0) {
    s->error = MGPU_EDEVLOST;
    if (lost_dev < 0) /* the start, posted on the launching stream */
      snprintf(s->error_detail, sizeof s->error_detail,
               "host device %d: a graph launch's part waited for the "
               "launching stream, whose device was lost", d->id);
    else if (node < 0) /* the end of a part, awaited on the launching stream */
      snprintf(s->error_detail, sizeof s->error_detail,
               "host device %d: a graph launch waited for its part on host "
               "device %d, which was lost or not queued (the launch failed)",
               d->id, lost_dev);
    else
      snprintf(s->error_detail, sizeof s->error_detail,
               "host device %d: graph node %d waited for a node of host "
               "device %d, which was lost", d->id, node, lost_dev);
  }
  mgpu__mutex_unlock(&d->lock);
}

static void run_graph_node(mgpu__bdevice *d, mgpu__bstream *s,
                           const mgpu__bgraph_node *n) {
  switch (n->kind) {
    case MGPU__BG_NOP: break;
    case MGPU__BG_COPY: memmove(n->dst, n->src, n->size); break;
    case MGPU__BG_MEMSET: memset(n->dst, n->value, n->size); break;
    case MGPU__BG_BUILTIN: mgpu__host_builtin_run(&n->builtin); break;
    case MGPU__BG_CALLBACK: n->fn(n->arg); break;
    case MGPU__BG_LAUNCH: {
      /* The name is the kernel's own: copied only into a failure's
       * detail, not at every replay. */
      mgpu__host_kernel_run k = {
          n->kernel->host_fn, n->grid, n->block, n->args,
          n->kernel->name != NULL ? n->kernel->name : "?"};
      mgpu__host_run_launch(d, s, &k);
      break;
    }
  }
}

/* Takes over the first failure of each of g's adopted streams (cleared
 * there) onto s, the stream g's part ran on: the failure of a node of
 * another device surfaces where the launch was queued. A part's failure
 * is set before that part posts its end, which s's part has seen (the
 * board's signals are seq_cst), so a look without the stream's device
 * lock finds it: a clean stream (every launch's but a failed one's)
 * costs no lock of another device, whose worker may hold it as it takes
 * its next part. */
static void adopt_failures(mgpu__bdevice *d, mgpu__bstream *s,
                           host_graph *g) {
  if (g->nadopt == 0) return;
  mgpu__mutex_lock(&g->adopt_lock);
  for (int i = 0; !g->adopt_off && i < g->nadopt; i++) {
    mgpu__bstream *a = g->adopt[i];
    if (atomic_load(&a->error) == 0) continue;
    char detail[sizeof a->error_detail];
    mgpu__mutex_lock(&a->dev->lock);
    int err = a->error;
    if (err != 0) {
      memcpy(detail, a->error_detail, sizeof detail);
      a->error = 0;
    }
    mgpu__mutex_unlock(&a->dev->lock);
    if (err == 0) continue;
    mgpu__mutex_lock(&d->lock);
    if (s->error == 0) {
      s->error = err;
      /* The prefix leaves room for 300 bytes of the detail. */
      snprintf(s->error_detail, sizeof s->error_detail,
               "graph launch: %.300s", detail);
    }
    mgpu__mutex_unlock(&d->lock);
  }
  mgpu__mutex_unlock(&g->adopt_lock);
}

/* o, a part on its stream, just ended: where the stream's next operation
 * but event records is a part not yet begun whose first node waits for
 * nothing and only posts a signal (the start of a graph's next launch,
 * which the other devices' parts wait for), that post is made now, and
 * the part begins at its second node. Stream order holds: the records
 * between complete no work, and all that came before the part is done
 * (test graph.next_launch_waits_for_work_between). The other devices
 * begin the next launch while this worker ends o, completes the records
 * and takes the part: in a loop of launches of a 2-device graph, the
 * start came 0.4-1.4 us after o's last node without this (trace points,
 * 2026-11-27). */
static void post_next_start(mgpu__bdevice *d, op *o) {
  mgpu__graph_board *b = NULL;
  int sig = -1;
  uint64_t value = 0;
  mgpu__mutex_lock(&d->lock);
  op *next = o->next;
  while (next != NULL && next->kind == OP_RECORD) next = next->next;
  if (next != NULL && next->kind == OP_GRAPH && next->u.graph.next == 0 &&
      next->u.graph.graph->n > 0) {
    const mgpu__bgraph_node *first = &next->u.graph.graph->nodes[0];
    if (first->kind == MGPU__BG_NOP && first->nwaits == 0 &&
        first->signal >= 0) {
      b = next->u.graph.graph->board;
      sig = first->signal;
      value = 2 * next->u.graph.launch;
      next->u.graph.next = 1;
    }
  }
  mgpu__mutex_unlock(&d->lock);
  if (b != NULL) board_post(b, sig, value);
}

/* 1 when d was lost, after s failed for it; else 0. */
static int became_lost(mgpu__bdevice *d, mgpu__bstream *s) {
  if (!atomic_load_explicit(&d->lost, memory_order_acquire)) return 0;
  mgpu__mutex_lock(&d->lock);
  mgpu__host_stream_lost_locked(d, s);
  mgpu__mutex_unlock(&d->lock);
  return 1;
}

/* Runs o's nodes from the next one on, until the end or a node whose
 * wait is not over after a short spin: there the worker gives the stream
 * back (mgpu__host_worker_main), to come back to that node once it is
 * posted. On a lost device nothing waits and nothing but host callbacks
 * runs; its signals post the loss. */
void mgpu__host_graph_run(mgpu__bdevice *d, mgpu__bstream *s, op *o) {
  static const char *const names[] = {"graph nop", "graph copy",
                                      "graph memset", "graph kernel",
                                      "graph builtin", "graph callback"};
  host_graph *g = o->u.graph.graph;
  uint64_t posted = 2 * o->u.graph.launch;
  int lost = atomic_load_explicit(&d->lost, memory_order_acquire);
  uint64_t waited_since = 0; /* when the node's wait began, 0: none */
  o->u.graph.spun = 0;
  while (o->u.graph.next < g->n) {
    /* Read again at each node: the device may be lost while the part
     * waits; what runs after that point posts the loss, and the stream
     * fails as the worker's skip_op fails it for a part it takes lost. */
    if (!lost) lost = became_lost(d, s);
    const mgpu__bgraph_node *n = &g->nodes[o->u.graph.next];
    uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
    int sig;
    if (!lost && (sig = pending_wait(o)) >= 0) {
      counter_target w = {&g->board->signals[sig], posted};
      if (waited_since == 0) waited_since = mgpu__now_ns();
      /* The poster is a busy worker (mgpu__spin_until_busy). Past the
       * budget the part parks, unless every CPU is busy: the thread it
       * waits for likely waits for a CPU, which a spin that yields hands
       * it, where a park adds a wake-up (tens of microseconds) to every
       * edge. For NO_PARK_NS at most: the worker it holds may be the one
       * that would run what it waits for (another stream of its device). */
      if (!mgpu__spin_until_busy(&g->board->spins[sig], counter_reached,
                                 &w) &&
          (!mgpu__cpus_all_busy() ||
           mgpu__now_ns() - waited_since > NO_PARK_NS)) {
        o->u.graph.spun = 1;
        return;
      }
      continue; /* look at every wait of the node again */
    }
    waited_since = 0;
    for (int j = 0; !lost && j < n->nwaits; j++)
      if (atomic_load(&g->board->signals[n->waits[j]]) & 1)
        graph_wait_lost(d, s, n->node,
                        g->board->signal_device[n->waits[j]]);
    if (!lost || n->kind == MGPU__BG_CALLBACK) run_graph_node(d, s, n);
    if (t0 != 0 && n->node >= 0) { /* not the joins with the launch */
      mgpu__trace_arg a[] = {MGPU__TARG_I("node", n->node)};
      mgpu__trace_span(d->id, s->track, names[n->kind], t0, mgpu__now_ns(),
                       a, 1);
    }
    /* The part's span (all its slices, its last node's inside) before its
     * last post: the launching stream may be done once that is seen. */
    if (o->u.graph.next == g->n - 1 && mgpu__trace_enabled())
      mgpu__host_trace_op(s, o, o->u.graph.t0, mgpu__now_ns());
    if (n->signal >= 0) board_post(g->board, n->signal, posted + (lost != 0));
    o->u.graph.next++;
  }
  adopt_failures(d, s, g);
  if (!lost) post_next_start(d, o);
}

int mgpu__host_graph_create(mgpu__bdevice *d, const mgpu__bgraph_part *part,
                            void **out) {
  size_t blob_size = 0;
  for (int i = 0; i < part->n; i++)
    blob_size += (part->nodes[i].args_size + 15) / 16 * 16 +
                 (size_t)part->nodes[i].nwaits * sizeof(int);
  host_graph *g = mgpu__calloc(1, sizeof *g);
  if (g != NULL) {
    g->nodes = mgpu__calloc((size_t)part->n + 1, sizeof *g->nodes);
    g->blob = mgpu__malloc(blob_size + 1);
    g->adopt = mgpu__calloc((size_t)part->nadopt + 1, sizeof *g->adopt);
  }
  if (g == NULL || g->nodes == NULL || g->blob == NULL || g->adopt == NULL) {
    if (g != NULL) {
      mgpu__free(g->nodes);
      mgpu__free(g->blob);
      mgpu__free(g->adopt);
    }
    mgpu__free(g);
    return mgpu__host_op_nomem(d);
  }
  /* Arguments first (16-byte aligned), then the waits. */
  char *at = g->blob;
  for (int i = 0; i < part->n; i++) {
    g->nodes[i] = part->nodes[i];
    if (part->nodes[i].args_size > 0) {
      memcpy(at, part->nodes[i].args, part->nodes[i].args_size);
      g->nodes[i].args = at;
      at += (part->nodes[i].args_size + 15) / 16 * 16;
    }
  }
  for (int i = 0; i < part->n; i++) {
    size_t bytes = (size_t)part->nodes[i].nwaits * sizeof(int);
    if (bytes > 0) memcpy(at, part->nodes[i].waits, bytes);
    g->nodes[i].waits = (const int *)at;
    at += bytes;
  }
  for (int i = 0; i < part->nadopt; i++) g->adopt[i] = part->adopt[i];
  g->nadopt = part->nadopt;
  g->n = part->n;
  g->board = part->board;
  if (g->board != NULL) mgpu__graph_board_ref(g->board);
  mgpu__mutex_init(&g->adopt_lock, MGPU__LOCK_HOST_ADOPT);
  atomic_init(&g->refs, 1);
  *out = g;
  return 0;
}

int mgpu__host_graph_launch(mgpu__bdevice *d, void *graph, mgpu__bstream *s,
                            uint64_t launch) {
  op *o = mgpu__host_op_new(OP_GRAPH);
  if (o == NULL) return mgpu__host_op_nomem(d);
  host_graph *g = graph;
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  o->u.graph.graph = g;
  o->u.graph.launch = launch;
  mgpu__host_enqueue(s, o);
  return 0;
}

void mgpu__host_graph_cancel(mgpu__bdevice *d, void *graph,
                             uint64_t launch) {
  (void)d;
  host_graph *g = graph;
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].signal >= 0)
      board_post(g->board, g->nodes[i].signal, 2 * launch + 1);
  if (g->nadopt > 0) {
    mgpu__mutex_lock(&g->adopt_lock);
    g->adopt_off = 1;
    mgpu__mutex_unlock(&g->adopt_lock);
  }
}

void mgpu__host_graph_destroy(mgpu__bdevice *d, void *graph) {
  (void)d;
  mgpu__host_graph_unref(graph);
}
