/* Graphs built node by node (mgpu/graph.h), and the one place that turns a
 * node back into the stream call it stands for (mgpu__gnode_issue).
 *
 * Each add checks its arguments as the stream call would (handles, ranges,
 * read-only buffers, devices) so that a launch finds little left to refuse;
 * a launch checks the handles again, since they may have been freed since.
 */
#include <stdlib.h>
#include <string.h>

#include "graph/graph-internal.h"
#include "mgpu/copy.h"
#include "util/fault.h"

mgpu__graph *mgpu__graph_new(void) {
  return mgpu__calloc(1, sizeof(mgpu__graph));
}

void mgpu__gnode_clear(mgpu__gnode *n) {
  if (n->op.kind == MGPU__GOP_CALL) mgpu__graph_call_unref(n->op.call);
  mgpu__free(n->args);
  mgpu__free(n->deps);
  memset(n, 0, sizeof *n);
}

void mgpu__graph_free(mgpu__graph *g) {
  if (g == NULL) return;
  for (int i = 0; i < g->n; i++) mgpu__gnode_clear(&g->nodes[i]);
  mgpu__free(g->nodes);
  mgpu__free(g);
}

int mgpu__gnode_set_args(mgpu__gnode *n, const void *args, size_t size) {
  void *copy = NULL;
  if (size > 0) {
    copy = mgpu__malloc(size);
    if (copy == NULL)
      return mgpu__error(MGPU_ENOMEM, "graph: out of host memory for %zu "
                         "bytes of kernel arguments", size);
    memcpy(copy, args, size);
  }
  mgpu__free(n->args);
  n->args = copy;
  n->op.args = copy;
  n->op.args_size = size;
  return 0;
}

int mgpu__graph_grow(void **items, int *cap, int need, size_t size,
                     int first, const char *what) {
  if (need <= *cap) return 0;
  int grown = *cap ? *cap * 2 : first;
  while (grown < need) grown *= 2;
  void *p = mgpu__realloc(*items, (size_t)grown * size);
  if (p == NULL)
    return mgpu__error(MGPU_ENOMEM, "graph: out of host memory for %d %s",
                       grown, what);
  *items = p;
  *cap = grown;
  return 0;
}

static int deps_reserve(mgpu__gnode *n, int want) {
  return mgpu__graph_grow((void **)&n->deps, &n->deps_cap, want,
                          sizeof *n->deps, 4, "edges");
}

int mgpu__gnode_copy(mgpu__gnode *dst, const mgpu__gnode *src) {
  memset(dst, 0, sizeof *dst);
  dst->op = src->op;
  dst->op.args = NULL;
  int rc = mgpu__gnode_set_args(dst, src->op.args, src->op.args_size);
  if (rc == 0) rc = deps_reserve(dst, src->ndeps);
  if (rc != 0) {
    dst->op.kind = MGPU__GOP_EMPTY; /* the call's reference was not taken */
    mgpu__gnode_clear(dst);
    return rc;
  }
  if (src->ndeps > 0)
    memcpy(dst->deps, src->deps, (size_t)src->ndeps * sizeof *dst->deps);
  dst->ndeps = src->ndeps;
  dst->nown = src->nown;
  if (dst->op.kind == MGPU__GOP_CALL) mgpu__graph_call_ref(dst->op.call);
  return 0;
}

/* Adds the edge from -> to (nothing when already there). */
int mgpu__graph_edge_add(mgpu__graph *g, int from, int to) {
  mgpu__gnode *n = &g->nodes[to];
  for (int i = 0; i < n->ndeps; i++)
    if (n->deps[i] == from) return 0;
  int rc = deps_reserve(n, n->ndeps + 1);
  if (rc == 0) n->deps[n->ndeps++] = from;
  return rc;
}

int mgpu__graph_append(mgpu__graph *g, const mgpu__graph_op *op,
                       const int *deps, int ndeps, int *node) {
  int rc = mgpu__graph_grow((void **)&g->nodes, &g->cap, g->n + 1,
                            sizeof *g->nodes, 16, "nodes");
  if (rc != 0) return rc;
  mgpu__gnode *n = &g->nodes[g->n];
  memset(n, 0, sizeof *n);
  n->op = *op;
  n->op.args = NULL;
  rc = mgpu__gnode_set_args(n, op->args, op->args_size);
  for (int i = 0; rc == 0 && i < ndeps; i++) {
    int dup = 0;
    for (int j = 0; j < n->ndeps; j++) dup |= n->deps[j] == deps[i];
    if (dup) continue;
    rc = deps_reserve(n, n->ndeps + 1);
    if (rc == 0) n->deps[n->ndeps++] = deps[i];
  }
  if (rc == 0 && n->op.kind == MGPU__GOP_CALL) mgpu__graph_call_ref(n->op.call);
  if (rc != 0) {
    n->op.kind = MGPU__GOP_EMPTY; /* the call's reference was not taken */
    mgpu__gnode_clear(n);
    return rc;
  }
  if (node != NULL) *node = g->n;
  g->n++;
  return 0;
}

int mgpu__graph_publish(mgpu__graph *g, mgpu_graph **out) {
  g->handle = mgpu__handle_new(MGPU__H_GRAPH, g);
  if (g->handle == 0) {
    mgpu__graph_free(g);
    return mgpu__error(MGPU_ENOMEM, "graph: no graph handles left");
  }
  *out = (mgpu_graph *)g->handle;
  return 0;
}

/* ---- the public building calls ---- */

static int graph_get(const mgpu_graph *h, mgpu__graph **out) {
  int err = 0;
  *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_GRAPH, "graph", &err);
  return *out != NULL ? 0 : err;
}

static void graph_put(mgpu__graph *g) {
  if (g != NULL) mgpu__handle_put(g->handle);
}

int mgpu_graph_create(mgpu_graph **out) {
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_graph_create: NULL output pointer");
  mgpu__graph *g = mgpu__graph_new();
  if (g == NULL)
    return mgpu__error(MGPU_ENOMEM, "mgpu_graph_create: out of host memory");
  return mgpu__graph_publish(g, out);
}

int mgpu_graph_destroy(mgpu_graph *h) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "graph: mgpu_init has not been called");
  mgpu__graph *g =
      mgpu__handle_release((uintptr_t)h, MGPU__H_GRAPH, "graph", &err);
  if (g == NULL) return err;
  mgpu__graph_free(g);
  return 0;
}

int mgpu_graph_node_count(const mgpu_graph *h) {
  mgpu__graph *g;
  int rc = graph_get(h, &g);
  if (rc != 0) return rc;
  rc = g->n;
  graph_put(g);
  return rc;
}

/* A buffer operand of a node: live, [offset, offset + size) in range,
 * writable when written; *dev its device. */
static int operand(const mgpu_buffer *h, const char *what, size_t offset,
                   size_t size, int written, int *dev) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, what, &b);
  if (rc != 0) return rc;
  rc = mgpu__buf_check_range(b, what, offset, size);
  if (rc == 0 && written) rc = mgpu__buf_check_writable(b, what);
  if (dev != NULL) *dev = b->dev;
  mgpu__buf_put(b);
  return rc;
}

static int check_dev(int dev, const char *what) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0)
    return mgpu__error(rc, "%s: device %d is not open (%d devices)", what,
                       dev, mgpu__ndevices());
  return 0;
}

/* Checks the graph and the dependencies, then appends. */
static int add(mgpu_graph *h, const mgpu_graph_node *deps, int ndeps,
               const mgpu__graph_op *op, const char *what,
               mgpu_graph_node *node) {
  mgpu__graph *g;
  int rc = graph_get(h, &g);
  if (rc != 0) return rc;
  if (ndeps < 0 || (ndeps > 0 && deps == NULL))
    rc = mgpu__error(MGPU_EINVAL, "%s: %d dependencies at %p", what, ndeps,
                     (const void *)deps);
  char nodes[48];
  for (int i = 0; rc == 0 && i < ndeps; i++)
    if (deps[i] < 0 || deps[i] >= g->n)
      rc = mgpu__error(MGPU_EINVAL, "%s: dependency %d is node %d, and the "
                       "graph has %s", what, i, deps[i],
                       mgpu__graph_nodes_text(g->n, nodes, sizeof nodes));
  if (rc == 0) rc = mgpu__graph_append(g, op, deps, ndeps, node);
  graph_put(g);
  return rc;
}

int mgpu_graph_add_kernel(mgpu_graph *graph, int dev,
                          const mgpu_graph_node *deps, int ndeps,
                          const mgpu_kernel *kernel, mgpu_dim3 grid,
                          mgpu_dim3 block, const void *args, size_t args_size,
                          mgpu_graph_node *node) {
  const char *what = "mgpu_graph_add_kernel";
  int rc = check_dev(dev, what);
  if (rc != 0) return rc;
  if (kernel == NULL)
    return mgpu__error(MGPU_EINVAL, "%s: NULL kernel for device %d", what,
                       dev);
  const char *name = kernel->name ? kernel->name : "(unnamed)";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 ||
      block.y == 0 || block.z == 0)
    return mgpu__error(MGPU_EINVAL, "%s: kernel %s on device %d with grid "
                       "%ux%ux%u and block %ux%ux%u (no dimension may be 0)",
                       what, name, dev, grid.x, grid.y, grid.z, block.x,
                       block.y, block.z);
  if (args_size > 0 && args == NULL)
    return mgpu__error(MGPU_EINVAL, "%s: kernel %s given %zu bytes of "
                       "arguments at NULL", what, name, args_size);
  mgpu__graph_op op = {.kind = MGPU__GOP_KERNEL, .dev = dev, .kernel = kernel,
                       .grid = grid, .block = block, .args = args,
                       .args_size = args_size};
  return add(graph, deps, ndeps, &op, what, node);
}

int mgpu__graph_check_copy(const char *what, mgpu_buffer *dst, size_t dst_offset,
                      const mgpu_buffer *src, size_t src_offset, size_t size,
                      int *src_dev) {
  int ddev;
  int rc = operand(dst, "copy dst", dst_offset, size, 1, &ddev);
  if (rc == 0) rc = operand(src, "copy src", src_offset, size, 0, src_dev);
  if (rc == 0 && size == 0)
    rc = mgpu__error(MGPU_EINVAL, "%s: a copy of 0 bytes from device %d to "
                     "device %d", what, *src_dev, ddev);
  if (rc == 0 && (const mgpu_buffer *)dst == src &&
      dst_offset < src_offset + size && src_offset < dst_offset + size)
    rc = mgpu__error(MGPU_EOVERLAP, "%s: source [%zu, %zu) and destination "
                     "[%zu, %zu) overlap in one buffer of device %d", what,
                     src_offset, src_offset + size, dst_offset,
                     dst_offset + size, ddev);
  return rc;
}

int mgpu_graph_add_copy(mgpu_graph *graph, const mgpu_graph_node *deps,
                        int ndeps, mgpu_buffer *dst, size_t dst_offset,
                        const mgpu_buffer *src, size_t src_offset, size_t size,
                        mgpu_graph_node *node) {
  int dev = -1;
  int rc = mgpu__graph_check_copy("mgpu_graph_add_copy", dst, dst_offset, src, src_offset,
                      size, &dev);
  if (rc != 0) return rc;
  mgpu__graph_op op = {.kind = MGPU__GOP_COPY, .dev = dev, .dst = dst,
                       .dst_offset = dst_offset, .a = src,
                       .a_offset = src_offset, .size = size};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_copy", node);
}

int mgpu_graph_add_memset(mgpu_graph *graph, const mgpu_graph_node *deps,
                          int ndeps, mgpu_buffer *dst, size_t offset,
                          int value, size_t size, mgpu_graph_node *node) {
  int dev = -1;
  int rc = operand(dst, "memset dst", offset, size, 1, &dev);
  if (rc != 0) return rc;
  mgpu__graph_op op = {.kind = MGPU__GOP_MEMSET, .dev = dev, .dst = dst,
                       .dst_offset = offset, .value = value, .size = size};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_memset", node);
}

int mgpu_graph_add_fill(mgpu_graph *graph, const mgpu_graph_node *deps,
                        int ndeps, mgpu_buffer *buf, size_t offset,
                        size_t count, mgpu_dtype dtype, const void *value,
                        mgpu_graph_node *node) {
  const char *what = "mgpu_graph_add_fill";
  size_t es = mgpu_dtype_size(dtype);
  if (es == 0)
    return mgpu__error(MGPU_EINVAL, "%s: unknown type %d", what, (int)dtype);
  if (value == NULL)
    return mgpu__error(MGPU_EINVAL, "%s: NULL value for %zu %s elements",
                       what, count, mgpu_dtype_name(dtype));
  if (count != 0 && es > SIZE_MAX / count)
    return mgpu__error(MGPU_ERANGE, "%s: %zu elements overflow", what, count);
  int dev = -1;
  int rc = operand(buf, "mgpu_fill dst", offset, count * es, 1, &dev);
  if (rc != 0) return rc;
  if (offset % es != 0)
    return mgpu__error(MGPU_EINVAL, "%s: offset %zu in the buffer of device "
                       "%d is not a multiple of the %zu-byte element", what,
                       offset, dev, es);
  const mgpu__backend_ops *ops = mgpu__device_get(dev)->ops;
  if (es == 2 && !ops->caps.graph_fill_16bit)
    return mgpu__error(MGPU_ENOTSUP, "%s: %s on device %d (%s) is not "
                       "supported in a graph", what, mgpu_dtype_name(dtype),
                       dev, ops->name);
  mgpu__graph_op op = {.kind = MGPU__GOP_FILL, .dev = dev, .dst = buf,
                       .dst_offset = offset, .size = count, .dtype = dtype};
  memcpy(op.fill, value, es == 2 ? sizeof(double) : es);
  return add(graph, deps, ndeps, &op, what, node);
}

int mgpu_graph_add_host(mgpu_graph *graph, int dev,
                        const mgpu_graph_node *deps, int ndeps,
                        void (*fn)(void *arg), void *arg,
                        mgpu_graph_node *node) {
  int rc = check_dev(dev, "mgpu_graph_add_host");
  if (rc != 0) return rc;
  if (fn == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_graph_add_host: NULL function for "
                       "device %d", dev);
  mgpu__graph_op op = {.kind = MGPU__GOP_HOST, .dev = dev, .fn = fn,
                       .arg = arg};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_host", node);
}

/* The device of a live event, or a code. */
static int event_dev(mgpu_event *h, int *dev) {
  mgpu__event *e;
  int rc = mgpu__event_get(h, &e);
  if (rc != 0) return rc;
  *dev = e->dev;
  mgpu__event_put(e);
  return 0;
}

int mgpu_graph_add_event_record(mgpu_graph *graph, const mgpu_graph_node *deps,
                                int ndeps, mgpu_event *event,
                                mgpu_graph_node *node) {
  int dev;
  int rc = event_dev(event, &dev);
  if (rc != 0) return rc;
  mgpu__graph_op op = {.kind = MGPU__GOP_EVENT_RECORD, .dev = dev,
                       .event = event};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_event_record", node);
}

int mgpu_graph_add_event_wait(mgpu_graph *graph, int dev,
                              const mgpu_graph_node *deps, int ndeps,
                              mgpu_event *event, mgpu_graph_node *node) {
  int edev;
  int rc = check_dev(dev, "mgpu_graph_add_event_wait");
  if (rc == 0) rc = event_dev(event, &edev);
  if (rc != 0) return rc;
  if (mgpu__device_get(dev)->ops != mgpu__device_get(edev)->ops)
    return mgpu__error(MGPU_ENOTSUP, "mgpu_graph_add_event_wait: device %d "
                       "cannot wait on an event of device %d: different "
                       "backends", dev, edev);
  mgpu__graph_op op = {.kind = MGPU__GOP_EVENT_WAIT, .dev = dev,
                       .event = event};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_event_wait", node);
}

int mgpu_graph_add_empty(mgpu_graph *graph, int dev,
                         const mgpu_graph_node *deps, int ndeps,
                         mgpu_graph_node *node) {
  int rc = check_dev(dev, "mgpu_graph_add_empty");
  if (rc != 0) return rc;
  mgpu__graph_op op = {.kind = MGPU__GOP_EMPTY, .dev = dev};
  return add(graph, deps, ndeps, &op, "mgpu_graph_add_empty", node);
}

int mgpu_graph_add_dependency(mgpu_graph *h, mgpu_graph_node from,
                              mgpu_graph_node to) {
  mgpu__graph *g;
  int rc = graph_get(h, &g);
  if (rc != 0) return rc;
  char nodes[48];
  if (from < 0 || from >= g->n || to < 0 || to >= g->n)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_graph_add_dependency: edge %d -> %d, "
                     "and the graph has %s", from, to,
                     mgpu__graph_nodes_text(g->n, nodes, sizeof nodes));
  else if (from == to)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_graph_add_dependency: node %d cannot "
                     "depend on itself", from);
  else
    rc = mgpu__graph_edge_add(g, from, to);
  graph_put(g);
  return rc;
}

/* ---- replay ---- */

int mgpu__gnode_issue(const mgpu__gnode *n, mgpu_stream *st) {
  const mgpu__graph_op *o = &n->op;
  switch (o->kind) {
    case MGPU__GOP_EMPTY:
      return 0;
    case MGPU__GOP_KERNEL:
      return mgpu_launch(st, o->kernel, o->grid, o->block, o->args,
                         o->args_size);
    case MGPU__GOP_COPY:
      return mgpu_memcpy_async(o->dst, o->dst_offset, o->a, o->a_offset,
                               o->size, st);
    case MGPU__GOP_HTOD:
      return mgpu_memcpy_htod_async(o->dst, o->dst_offset, o->host, o->size,
                                    st);
    case MGPU__GOP_DTOH:
      return mgpu_memcpy_dtoh_async(o->host, o->a, o->a_offset, o->size, st);
    case MGPU__GOP_MEMSET:
      return mgpu_memset_async(o->dst, o->dst_offset, o->value, o->size, st);
    case MGPU__GOP_FILL:
      return mgpu_fill(st, o->dst, o->dst_offset, o->size, o->dtype, o->fill);
    case MGPU__GOP_SCALE:
      return mgpu_scale(st, o->dst, o->dst_offset, o->size, o->dtype,
                        o->alpha);
    case MGPU__GOP_AXPY:
      return mgpu_axpy(st, o->dst, o->dst_offset, o->a, o->a_offset, o->size,
                       o->dtype, o->alpha);
    case MGPU__GOP_ELEMENTWISE:
      return mgpu_elementwise(st, o->dst, o->dst_offset, o->a, o->a_offset,
                              o->b, o->b_offset, o->size, o->dtype, o->op);
    case MGPU__GOP_HOST:
      return mgpu_stream_add_callback(st, o->fn, o->arg);
    case MGPU__GOP_EVENT_RECORD:
      return mgpu_event_record(o->event, st);
    case MGPU__GOP_EVENT_WAIT:
      return mgpu_stream_wait_event(st, o->event);
    case MGPU__GOP_CALL: /* its members go together (segments.c) */
      if (o->call->nmembers == 1) return o->call->issue(o->call, &st);
      return mgpu__error(MGPU_EINVAL, "graph: member %d of a recorded %s "
                         "issued alone", o->member, o->call->name);
  }
  return mgpu__error(MGPU_EINVAL, "graph: node of unknown kind %d",
                     (int)o->kind);
}
