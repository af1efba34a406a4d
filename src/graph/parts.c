/* One part per device: an executable graph replayed with one operation per
 * device and launch, on backends with graph slots (backend/graph.h).
 *
 * The part of a device holds its nodes in the graph's issue order with
 * pointers resolved (buffer + offset); an edge from a node of another
 * device becomes a signal on the board that every part shares, and so do
 * the joins of a launch with its caller's stream (a head part there posts
 * the start every part waits for first; each part posts its end, which a
 * tail part there waits for). A graph is
 * cut into parts only when every node can be run in place by its device's
 * backend: a kernel with the variant that backend runs, a copy between
 * memories the devices reach directly (same device or direct peer path),
 * memset, the built-in kernels, host functions and empty nodes. Anything
 * else (event nodes, a staged copy, a device without graph slots, a part
 * its backend refuses with MGPU_ENOTSUP) leaves the graph to be issued in
 * segments (segments.c).
 *
 * A backend may keep to parts without a board: it refuses (MGPU_ENOTSUP)
 * a part whose nodes wait for or post to other devices' nodes, a head or
 * tail of the joins, a caller's part (which posts the start and waits for
 * the ends), and a tail that adopts other streams. Its parts then meet the
 * launch through the events of exec.c's issue, which order them after the
 * caller's earlier work and the caller's later work after them, so that
 * the wait for the start and the post of the end that such a part still
 * holds (as its first and last node, node -1) are met by that order: the
 * backend drops them (the CUDA plugin, src/backend/cuda/graph.c).
 *
 * Pointers are resolved when the parts are made (at instantiate and after
 * an update); a launch checks first that every handle is still live, and a
 * buffer never moves, so they stay right.
 */
#include <string.h>

#include "backend/graph.h"
#include "graph/graph-internal.h"
#include "mgpu/copy.h"
#include "util/fault.h"

struct mgpu__parts {
  mgpu__graph_board *board;       /* one reference of it */
  void *part[MGPU_MAX_DEVICES];    /* the backend's, by device */
  int kernels[MGPU_MAX_DEVICES];   /* kernel nodes per part, for metrics */
  int *signal_of;                  /* by node: its signal, or -1 */
  int devs[MGPU_MAX_DEVICES], ndevs; /* the devices with a part */
  /* The executable graph's nodes and issue order (exec.c keeps them, and
   * makes the parts again when an update changes them), for the parts
   * made at a first launch from a device. */
  const mgpu__gnode *nodes;
  const int *order;
  int n;
  /* The joins of a launch with its caller's stream, as signals: start,
   * which every part waits for first, and each part's end. From a stream
   * of a device of the graph, that device's part runs on the caller's
   * stream itself in a form of its own (caller): it posts start first and
   * waits for the other parts' ends last, taking over their failures, so
   * a launch is one operation per device. From a stream of another
   * device, a head there posts start and a tail there waits for every
   * end. Made by caller's device at its first launch. */
  int start_signal;
  int end_signal[MGPU_MAX_DEVICES];
  void *caller[MGPU_MAX_DEVICES];
  void *head[MGPU_MAX_DEVICES], *tail[MGPU_MAX_DEVICES];
  int joins_made[MGPU_MAX_DEVICES]; /* 1 made, -1 the device cannot */
};

/* The memory of buffer h at offset, on a device with graph slots. */
static int resolve(const mgpu_buffer *h, size_t offset, void **ptr) {
  mgpu__buf *b;
  if (h == NULL || mgpu__buf_get(h, "buffer", &b) != 0) return -1;
  mgpu__device *d = mgpu__device_get(b->dev);
  *ptr = (char *)b->ptr + offset;
  int ok = d != NULL && d->ops->graph != NULL;
  mgpu__buf_put(b);
  return ok ? 0 : -1;
}

/* The part node of built-in kernel node o; -1: half types or a dead handle. */
static int convert_builtin(const mgpu__graph_op *o, mgpu__bgraph_node *n) {
  void *dst = NULL, *src = NULL, *b = NULL;
  size_t es = mgpu_dtype_size(o->dtype);
  if (es == 0 || es == 2 || resolve(o->dst, o->dst_offset, &dst) != 0 ||
      (o->a != NULL && resolve(o->a, o->a_offset, &src) != 0) ||
      (o->b != NULL && resolve(o->b, o->b_offset, &b) != 0))
    return -1;
  n->kind = MGPU__BG_BUILTIN;
  n->builtin = (mgpu__builtin){.dtype = o->dtype, .op = o->op,
                               .count = o->size, .dst = dst, .a = src,
                               .b = b, .alpha = o->alpha};
  n->builtin.kind = o->kind == MGPU__GOP_FILL    ? MGPU__BUILTIN_FILL
                    : o->kind == MGPU__GOP_SCALE ? MGPU__BUILTIN_SCALE
                    : o->kind == MGPU__GOP_AXPY  ? MGPU__BUILTIN_AXPY
                                                 : MGPU__BUILTIN_ELEMENTWISE;
  if (o->kind == MGPU__GOP_FILL) memcpy(&n->builtin.value, o->fill, es);
  return 0;
}

/* 1 when kernel k has the variant that device dev's backend runs. */
static int kernel_runs_on(const mgpu_kernel *k, int dev) {
  mgpu__device *d = mgpu__device_get(dev);
  if (d == NULL) return 0;
  switch (d->ops->caps.kernel_variant) {
    case MGPU__KERNEL_HOST_FN: return k->host_fn != NULL;
    case MGPU__KERNEL_CUDA_FN: return k->cuda_fn != NULL;
    default: return 0;
  }
}

int mgpu__parts_convert(const mgpu__graph_op *o, mgpu__bgraph_node *n) {
  void *dst = NULL, *src = NULL;
  switch (o->kind) {
    case MGPU__GOP_EMPTY:
      n->kind = MGPU__BG_NOP;
      return 0;
    case MGPU__GOP_KERNEL:
      if (!kernel_runs_on(o->kernel, o->dev)) return -1;
      n->kind = MGPU__BG_LAUNCH;
      n->kernel = o->kernel;
      n->grid = o->grid;
      n->block = o->block;
      n->args = o->args;
      n->args_size = o->args_size;
      return 0;
    case MGPU__GOP_COPY: {
      mgpu_copy_path path;
      int sdev = mgpu_buffer_device(o->a), ddev = mgpu_buffer_device(o->dst);
      if (resolve(o->dst, o->dst_offset, &dst) != 0 ||
          resolve(o->a, o->a_offset, &src) != 0 ||
          (sdev != ddev && (mgpu_copy_path_get(sdev, ddev, &path) != 0 ||
                            path == MGPU_PATH_STAGED)))
        return -1;
      break;
    }
    case MGPU__GOP_HTOD:
      if (resolve(o->dst, o->dst_offset, &dst) != 0) return -1;
      src = o->host;
      break;
    case MGPU__GOP_DTOH:
      if (resolve(o->a, o->a_offset, &src) != 0) return -1;
      dst = o->host;
      break;
    case MGPU__GOP_MEMSET:
      if (resolve(o->dst, o->dst_offset, &dst) != 0) return -1;
      n->kind = MGPU__BG_MEMSET;
      n->dst = dst;
      n->value = o->value;
      n->size = o->size;
      return 0;
    case MGPU__GOP_FILL:
    case MGPU__GOP_SCALE:
    case MGPU__GOP_AXPY:
    case MGPU__GOP_ELEMENTWISE:
      return convert_builtin(o, n);
    case MGPU__GOP_HOST:
      n->kind = MGPU__BG_CALLBACK;
      n->fn = o->fn;
      n->arg = o->arg;
      return 0;
    default:
      return -1;
  }
  n->kind = MGPU__BG_COPY;
  n->dst = dst;
  n->src = src;
  n->size = o->size;
  return 0;
}

static void board_release(mgpu__graph_board *b) {
  mgpu__free((void *)b->signals);
  mgpu__free(b->signal_device);
  mgpu__free(b->spins);
  mgpu__mutex_destroy(&b->lock);
  mgpu__free(b);
}

void mgpu__parts_free(mgpu__parts *p) {
  if (p == NULL) return;
  for (int d = 0; d < MGPU_MAX_DEVICES; d++) {
    mgpu__device *dev = mgpu__device_get(d);
    void *own[4] = {p->part[d], p->caller[d], p->head[d], p->tail[d]};
    for (int k = 0; k < 4; k++)
      if (own[k] != NULL && dev != NULL)
        dev->ops->graph->destroy(dev->bdev, own[k]);
  }
  if (p->board != NULL) mgpu__graph_board_unref(p->board);
  mgpu__free(p->signal_of);
  mgpu__free(p);
}

/* Makes device dev's part into *out: its nodes in issue order, after a
 * wait for the launch's start and before the post of its end; or, as the
 * caller's part (caller: run on the launching stream itself), after the
 * post of the start and before a wait for the other parts' ends, taking
 * over their streams' failures (adopt). 0, 1 when a node cannot be part
 * of one, or a negative code. */
static int part_make(mgpu__parts *p, int dev, int caller,
                     struct mgpu__bstream *const *adopt, int nadopt,
                     void **out) {
  const mgpu__gnode *nodes = p->nodes;
  int total = 0, m = 0, w = 0, rc = 0;
  for (int i = 0; i < p->n; i++) total += nodes[i].ndeps;
  mgpu__bgraph_node *buf = mgpu__calloc((size_t)p->n + 3, sizeof *buf);
  int *waits =
      mgpu__calloc((size_t)total + MGPU_MAX_DEVICES + 2, sizeof *waits);
  if (buf == NULL || waits == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "graph: out of host memory for the part "
                     "of device %d (%d nodes)", dev, p->n);
    goto out;
  }
  buf[m++] = (mgpu__bgraph_node){.kind = MGPU__BG_NOP, .node = -1,
                                 .waits = waits, .nwaits = !caller,
                                 .signal = caller ? p->start_signal : -1};
  if (!caller) waits[w++] = p->start_signal;
  for (int k = 0; k < p->n && rc == 0; k++) {
    const mgpu__gnode *g = &nodes[p->order[k]];
    if (g->op.dev != dev) continue;
    mgpu__bgraph_node *b = &buf[m++];
    if (mgpu__parts_convert(&g->op, b) != 0) rc = 1;
    if (b->kind == MGPU__BG_LAUNCH && !caller) p->kernels[dev]++;
    b->node = p->order[k];
    b->signal = p->signal_of[p->order[k]];
    b->waits = &waits[w];
    for (int j = 0; j < g->ndeps; j++)
      if (nodes[g->deps[j]].op.dev != dev)
        waits[w++] = p->signal_of[g->deps[j]];
    b->nwaits = (int)(&waits[w] - b->waits);
  }
  mgpu__bgraph_node *end = &buf[m++];
  *end = (mgpu__bgraph_node){.kind = MGPU__BG_NOP, .node = -1,
                             .waits = &waits[w],
                             .signal = caller ? -1 : p->end_signal[dev]};
  for (int k = 0; caller && k < p->ndevs; k++)
    if (p->devs[k] != dev) waits[w++] = p->end_signal[p->devs[k]];
  end->nwaits = (int)(&waits[w] - end->waits);
  if (rc == 0) {
    mgpu__device *d = mgpu__device_get(dev);
    mgpu__bgraph_part part = {buf, m, p->board, adopt, nadopt};
    rc = d->ops->graph->create(d->bdev, &part, out);
  }
out:
  mgpu__free(waits);
  mgpu__free(buf);
  return rc;
}

/* Numbers the signals: one per node that a node of another device waits
 * for (p->signal_of), each with its device on p's board. */
static int parts_signals(mgpu__parts *p, const mgpu__gnode *nodes, int n) {
  int nsignals = 0;
  for (int i = 0; i < n; i++) p->signal_of[i] = -1;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < nodes[i].ndeps; j++) {
      int d = nodes[i].deps[j];
      if (nodes[d].op.dev != nodes[i].op.dev && p->signal_of[d] < 0)
        p->signal_of[d] = nsignals++;
    }
  p->start_signal = nsignals++;
  for (int i = 0; i < n; i++) {
    int dev = nodes[i].op.dev, seen = 0;
    for (int k = 0; k < p->ndevs; k++) seen |= p->devs[k] == dev;
    if (!seen) {
      p->devs[p->ndevs++] = dev;
      p->end_signal[dev] = nsignals++;
    }
  }
  p->board->signals = mgpu__calloc((size_t)nsignals + 1, sizeof(uint64_t));
  p->board->signal_device = mgpu__calloc((size_t)nsignals + 1, sizeof(int));
  p->board->spins = mgpu__calloc((size_t)nsignals + 1, sizeof(mgpu__spin));
  if (p->board->signals == NULL || p->board->signal_device == NULL ||
      p->board->spins == NULL)
    return mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                       "memory for %d signals", nsignals);
  p->board->nsignals = nsignals;
  for (int i = 0; i < n; i++)
    if (p->signal_of[i] >= 0)
      p->board->signal_device[p->signal_of[i]] = nodes[i].op.dev;
  p->board->signal_device[p->start_signal] = -1; /* the caller's */
  for (int k = 0; k < p->ndevs; k++)
    p->board->signal_device[p->end_signal[p->devs[k]]] = p->devs[k];
  return 0;
}

int mgpu__parts_build(const mgpu__gnode *nodes, int n, const int *order,
                      mgpu__parts **out) {
  *out = NULL;
  for (int i = 0; i < n; i++) {
    mgpu__device *d = mgpu__device_get(nodes[i].op.dev);
    if (d == NULL || d->ops->graph == NULL) return 0;
  }
  mgpu__parts *p = mgpu__calloc(1, sizeof *p);
  int rc = 0;
  if (p != NULL) {
    p->signal_of = mgpu__calloc((size_t)n + 1, sizeof *p->signal_of);
    p->board = mgpu__calloc(1, sizeof *p->board);
  }
  if (p != NULL && p->board != NULL) {
    mgpu__mutex_init(&p->board->lock, MGPU__LOCK_GRAPH_BOARD);
    atomic_init(&p->board->refs, 1);
    p->board->release = board_release;
  }
  if (p == NULL || p->signal_of == NULL || p->board == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_graph_instantiate: out of host "
                     "memory for %d nodes", n);
    goto out;
  }
  p->nodes = nodes;
  p->order = order;
  p->n = n;
  if ((rc = parts_signals(p, nodes, n)) != 0) goto out;
  for (int k = 0; k < p->ndevs && rc == 0; k++)
    rc = part_make(p, p->devs[k], 0, NULL, 0, &p->part[p->devs[k]]);
  /* A node no part can hold, or a part its backend cannot make as it is
   * (MGPU_ENOTSUP: its waits for other devices, say): node by node. */
  if (rc > 0 || rc == MGPU_ENOTSUP) rc = 0;
  else if (rc == 0) {
    *out = p;
    p = NULL;
  }
out:
  mgpu__parts_free(p);
  return rc;
}

void mgpu__parts_cancel(mgpu__parts *p, int dev, uint64_t launch) {
  mgpu__device *d = mgpu__device_get(dev);
  d->ops->graph->cancel(d->bdev, p->part[dev], launch);
}

/* Queues part (one of device dev's, holding kernels kernel nodes) of
 * launch number launch on s. */
static int part_queue(int dev, void *part, int kernels, mgpu__stream *s,
                      uint64_t launch) {
  mgpu__device *d = mgpu__device_get(dev);
  int pushed = 0;
  if (mgpu__trace_enabled()) {
    mgpu__trace_arg a[] = {MGPU__TARG_I("launch", launch)};
    pushed = mgpu__trace_tag_push("graph launch", a, 1);
  }
  int rc = d->ops->graph->launch(d->bdev, part, s->bstream, launch);
  mgpu__trace_tag_pop(pushed);
  if (rc == 0 && kernels > 0)
    mgpu__metric_add(dev, MGPU__M_kernels_launched, (uint64_t)kernels);
  return rc;
}

int mgpu__parts_queue(int dev, void *part, int kernels, mgpu_stream *stream,
                      uint64_t launch) {
  mgpu__stream *s;
  int rc = mgpu__stream_get(stream, &s);
  if (rc != 0) return rc;
  rc = part_queue(dev, part, kernels, s, launch);
  mgpu__stream_put(s);
  return rc;
}

int mgpu__parts_launch(mgpu__parts *p, int dev, mgpu_stream *stream,
                       uint64_t launch) {
  return mgpu__parts_queue(dev, p->part[dev], p->kernels[dev], stream,
                           launch);
}

int mgpu__parts_tail_make(int dev, mgpu_stream *const *streams,
                          const int *devs, int ndevs, void **out) {
  *out = NULL;
  mgpu__device *d = mgpu__device_get(dev);
  if (d == NULL || d->ops->graph == NULL) return 0;
  struct mgpu__bstream *adopt[MGPU_MAX_DEVICES];
  int nadopt = 0, rc = 0;
  for (int i = 0; rc == 0 && i < ndevs; i++) {
    mgpu__device *o = mgpu__device_get(devs[i]);
    mgpu__stream *s;
    if (devs[i] == dev) continue;
    if (o == NULL || o->ops != d->ops) return 0; /* another backend's */
    if ((rc = mgpu__stream_get(streams[devs[i]], &s)) != 0) break;
    adopt[nadopt++] = s->bstream; /* the executable graph keeps s */
    mgpu__stream_put(s);
  }
  if (rc != 0 || nadopt == 0) return rc;
  mgpu__bgraph_part part = {.nodes = NULL, .n = 0, .board = NULL,
                            .adopt = adopt, .nadopt = nadopt};
  rc = d->ops->graph->create(d->bdev, &part, out);
  return rc == MGPU_ENOTSUP ? 0 : rc; /* failures stay on their streams */
}

int mgpu__parts_tail_launch(int dev, void *tail, mgpu_stream *stream,
                            uint64_t launch) {
  mgpu__stream *s;
  int rc = mgpu__stream_get(stream, &s);
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(dev);
  rc = d->ops->graph->launch(d->bdev, tail, s->bstream, launch);
  mgpu__stream_put(s);
  return rc;
}

void mgpu__parts_tail_cancel(int dev, void *tail) {
  mgpu__device *d = mgpu__device_get(dev);
  d->ops->graph->cancel(d->bdev, tail, 0);
}

void mgpu__parts_tail_free(int dev, void *tail) {
  mgpu__device *d = mgpu__device_get(dev);
  if (tail != NULL && d != NULL) d->ops->graph->destroy(d->bdev, tail);
}

static int has_part(const mgpu__parts *p, int dev) {
  for (int k = 0; k < p->ndevs; k++)
    if (p->devs[k] == dev) return 1;
  return 0;
}

/* The head and tail of launches from a stream of device sdev, in one
 * launch-side part: that device's part as its caller's (see struct
 * mgpu__parts) when sdev has a part, else a head and a tail (part_make
 * says how). */
static int joins_make(mgpu__parts *p, mgpu__device *d, int sdev,
                      struct mgpu__bstream *const *adopt, int nadopt) {
  if (has_part(p, sdev))
    return part_make(p, sdev, 1, adopt, nadopt, &p->caller[sdev]);
  int ends[MGPU_MAX_DEVICES];
  for (int k = 0; k < p->ndevs; k++) ends[k] = p->end_signal[p->devs[k]];
  mgpu__bgraph_node head = {.kind = MGPU__BG_NOP, .node = -1,
                            .signal = p->start_signal};
  mgpu__bgraph_node tail = {.kind = MGPU__BG_NOP, .node = -1, .waits = ends,
                            .nwaits = p->ndevs, .signal = -1};
  mgpu__bgraph_part hp = {&head, 1, p->board, NULL, 0};
  mgpu__bgraph_part tp = {&tail, 1, p->board, adopt, nadopt};
  void *h = NULL, *t = NULL;
  int rc = d->ops->graph->create(d->bdev, &hp, &h);
  if (rc == 0) rc = d->ops->graph->create(d->bdev, &tp, &t);
  if (rc != 0) {
    if (h != NULL) d->ops->graph->destroy(d->bdev, h);
    return rc;
  }
  p->head[sdev] = h;
  p->tail[sdev] = t;
  return 0;
}

/* The joins of launches from a stream of device sdev: 1 when made, 0 when
 * sdev cannot hold them (no graph slots, or another backend than the
 * parts'), or a negative code. */
int mgpu__parts_joins(mgpu__parts *p, int sdev, mgpu_stream *const *streams) {
  if (p->joins_made[sdev] != 0) return p->joins_made[sdev] > 0;
  mgpu__device *d = mgpu__device_get(sdev);
  int same = d != NULL && d->ops->graph != NULL;
  for (int k = 0; same && k < p->ndevs; k++) {
    mgpu__device *o = mgpu__device_get(p->devs[k]);
    same = o != NULL && o->ops == d->ops; /* the board is one backend's */
  }
  if (!same) {
    p->joins_made[sdev] = -1;
    return 0;
  }
  struct mgpu__bstream *adopt[MGPU_MAX_DEVICES];
  int nadopt = 0, rc = 0;
  for (int k = 0; k < p->ndevs; k++) {
    int dev = p->devs[k];
    if (dev == sdev) continue;
    mgpu__stream *s;
    if ((rc = mgpu__stream_get(streams[dev], &s)) != 0) return rc;
    adopt[nadopt++] = s->bstream; /* the executable graph keeps s */
    mgpu__stream_put(s);
  }
  rc = joins_make(p, d, sdev, adopt, nadopt);
  /* rc > 0 cannot happen (the caller's part was made of the same nodes);
   * MGPU_ENOTSUP: a backend that joins a launch through events. */
  if (rc > 0 || rc == MGPU_ENOTSUP) {
    p->joins_made[sdev] = -1;
    return 0;
  }
  if (rc == 0) p->joins_made[sdev] = 1;
  return rc == 0 ? 1 : rc;
}

/* Queues launch number launch from stream s of device sdev through its
 * joins; *tailed: the launch-side part that waits for the ends (the
 * caller's part, or the tail) was queued. */
static int joined_run(mgpu__parts *p, int sdev, mgpu__stream *s,
                      mgpu_stream *const *on, uint64_t launch, int *tailed) {
  mgpu__device *d = mgpu__device_get(sdev);
  void *own = p->caller[sdev];
  int rc = own != NULL ? part_queue(sdev, own, p->kernels[sdev], s, launch)
                       : d->ops->graph->launch(d->bdev, p->head[sdev],
                                               s->bstream, launch);
  *tailed = rc == 0 && own != NULL;
  for (int i = 0; rc == 0 && i < p->ndevs; i++) {
    if (p->devs[i] == sdev && own != NULL) continue;
    rc = mgpu__parts_launch(p, p->devs[i], on[p->devs[i]], launch);
    for (int j = i; rc != 0 && j < p->ndevs; j++) /* it and the rest */
      if (p->devs[j] != sdev || own == NULL)
        mgpu__parts_cancel(p, p->devs[j], launch);
  }
  if (rc == 0 && own == NULL) {
    rc = d->ops->graph->launch(d->bdev, p->tail[sdev], s->bstream, launch);
    *tailed = rc == 0;
  }
  return rc;
}

int mgpu__parts_run(mgpu__parts *p, int sdev, mgpu_stream *stream,
                    mgpu_stream *const *on, uint64_t launch, int *tailed) {
  mgpu__stream *s;
  *tailed = 0;
  int rc = mgpu__stream_get(stream, &s);
  if (rc != 0) return rc;
  rc = joined_run(p, sdev, s, on, launch, tailed);
  mgpu__stream_put(s);
  return rc;
}

void mgpu__parts_drop_tail(mgpu__parts *p, int sdev) {
  mgpu__device *d = mgpu__device_get(sdev);
  void *own[3] = {p->caller[sdev], p->tail[sdev], p->head[sdev]};
  for (int k = 0; k < 2; k++)
    if (own[k] != NULL) d->ops->graph->cancel(d->bdev, own[k], 0);
  for (int k = 0; k < 3; k++)
    if (own[k] != NULL) d->ops->graph->destroy(d->bdev, own[k]);
  p->caller[sdev] = p->tail[sdev] = p->head[sdev] = NULL;
  p->joins_made[sdev] = 0;
}

void mgpu__parts_start(mgpu__parts *p, uint64_t launch) {
  atomic_store_explicit(&p->board->signals[p->start_signal], 2 * launch,
                        memory_order_release);
}
