/* The graph layer's shared state: graphs (nodes and edges), executable
 * graphs and captures.
 *
 * A node is one stream call (core/capture.h's mgpu__graph_op) on one
 * device plus the nodes it waits for. A graph is built by one thread at a
 * time (mgpu/graph.h); the capture recorder builds its graph under
 * capture_lock (capture.c). An executable graph (exec.c) holds its own copy
 * of the nodes, the order it issues them in, a stream per device and the
 * events that carry edges between devices; exec->lock serializes its
 * launches and updates.
 */
#ifndef MGPU_GRAPH_INTERNAL_H
#define MGPU_GRAPH_INTERNAL_H

#include <stdio.h>

#include "core/capture.h"
#include "core/core-internal.h"
#include "mgpu/graph.h"

typedef struct mgpu__gnode {
  mgpu__graph_op op; /* op.args points at args below */
  void *args;        /* the node's own copy of a kernel's arguments */
  int *deps;         /* nodes this one waits for, no repeats */
  int ndeps, deps_cap;
  /* A recorded call's member in an executable graph: deps[0 .. nown) are
   * its own, the rest what the other members wait for (merged, so that the
   * members can be issued together; the call meets its ranks by itself,
   * so a replay waits only for the own ones). */
  int nown;
} mgpu__gnode;

/* How many of n's edges a replay waits for (mgpu__gnode.nown). */
static inline int mgpu__gnode_waited(const mgpu__gnode *n) {
  return n->op.kind == MGPU__GOP_CALL ? n->nown : n->ndeps;
}

typedef struct mgpu__graph {
  uintptr_t handle;
  mgpu__gnode *nodes;
  int n, cap;
} mgpu__graph;

/* Makes room for need items of size bytes in *items (capacity *cap,
 * doubled from first): 0, or MGPU_ENOMEM with the detail naming what. */
int mgpu__graph_grow(void **items, int *cap, int need, size_t size,
                     int first, const char *what);

/* A graph not yet on the handle table (capture builds one). */
mgpu__graph *mgpu__graph_new(void);
void mgpu__graph_free(mgpu__graph *g);
/* Appends a node for op after deps (a copy of op's arguments is kept);
 * *node: its index. 0 or MGPU_ENOMEM, the graph unchanged on failure. */
int mgpu__graph_append(mgpu__graph *g, const mgpu__graph_op *op,
                       const int *deps, int ndeps, int *node);
/* Adds the edge from -> to (nothing when already there): 0 or
 * MGPU_ENOMEM. */
int mgpu__graph_edge_add(mgpu__graph *g, int from, int to);
/* Gives g a handle; on failure frees it. */
int mgpu__graph_publish(mgpu__graph *g, mgpu_graph **out);
/* Copies node src into dst (arguments and edges included). */
int mgpu__gnode_copy(mgpu__gnode *dst, const mgpu__gnode *src);
void mgpu__gnode_clear(mgpu__gnode *n);
/* Replaces a node's kernel arguments by a copy of args. */
int mgpu__gnode_set_args(mgpu__gnode *n, const void *args, size_t size);

/* The checks of a copy node (add and update); *src_dev: the source's
 * device, where the copy runs. */
int mgpu__graph_check_copy(const char *what, mgpu_buffer *dst,
                           size_t dst_offset, const mgpu_buffer *src,
                           size_t src_offset, size_t size, int *src_dev);

/* The parts of an executable graph on backends with graph slots
 * (parts.c): one per device, each run as one operation per launch. */
typedef struct mgpu__parts mgpu__parts;
/* Cuts nodes (issued in order) into parts. *out NULL (and 0) when some
 * node or device cannot be part of one: the graph is then issued node by
 * node. */
int mgpu__parts_build(const mgpu__gnode *nodes, int n, const int *order,
                      mgpu__parts **out);
/* The part node of o (a node of a device with graph slots): 0, or -1
 * when a part cannot run it in place. */
struct mgpu__bgraph_node;
int mgpu__parts_convert(const mgpu__graph_op *o, struct mgpu__bgraph_node *n);
/* Queues a backend part of device dev (holding kernels kernel nodes, for
 * the metrics) as launch number launch on stream. */
int mgpu__parts_queue(int dev, void *part, int kernels, mgpu_stream *stream,
                      uint64_t launch);
/* Queues device dev's part of launch number launch on stream. */
int mgpu__parts_launch(mgpu__parts *p, int dev, mgpu_stream *stream,
                       uint64_t launch);
/* Launches from a stream of device sdev join it through the board
 * instead of events (on that stream, sdev's own part in a form that posts
 * the start and waits for the other parts' ends, or, where sdev has no
 * part, a head part before the parts and a tail part after): 1 when they
 * can (made at the first such launch; streams by device: the graph's own,
 * whose failures the launch's end moves to the caller's stream), 0 when
 * sdev cannot hold parts, or a negative code. */
int mgpu__parts_joins(mgpu__parts *p, int sdev, mgpu_stream *const *streams);
/* Queues launch number launch through sdev's joins: on stream, and each
 * other device's part on on[dev] (*tailed: what waits for the ends on
 * stream was queued). The caller checked that no device of the graph is
 * lost. */
int mgpu__parts_run(mgpu__parts *p, int sdev, mgpu_stream *stream,
                    mgpu_stream *const *on, uint64_t launch, int *tailed);
/* The launch failed after what waits for the ends on its stream was
 * queued: that adopts nothing from then on (freeing the graph would not
 * wait for it), and the joins of sdev are made again at its next launch. */
void mgpu__parts_drop_tail(mgpu__parts *p, int sdev);
/* Posts launch number launch's start at once, where the caller's device
 * holds no head (the parts then wait for events on their streams): no part
 * of that launch is queued yet, so none waits for it. */
void mgpu__parts_start(mgpu__parts *p, uint64_t launch);
/* Launch number launch failed before device dev's part was queued: posts
 * its signals as failed, so the parts queued do not wait for ever. */
void mgpu__parts_cancel(mgpu__parts *p, int dev, uint64_t launch);
/* Frees the parts (each backend part lives on until its queued runs are
 * done). */
void mgpu__parts_free(mgpu__parts *p);

/* The tail of a launch from a stream of device dev (streams by device,
 * devs the graph's devices): queued on that stream after it waited for
 * every other device's part, it takes over their parts' failures, so that
 * the launching stream reports them. *out NULL (and 0) when dev or a
 * device of the graph lacks graph slots or is another backend's: the
 * failures then stay on the graph's streams. */
int mgpu__parts_tail_make(int dev, mgpu_stream *const *streams,
                          const int *devs, int ndevs, void **out);
int mgpu__parts_tail_launch(int dev, void *tail, mgpu_stream *stream,
                            uint64_t launch);
/* A launch failed after its tail was queued (the launch's end is not
 * recorded, so freeing the graph would not wait for it): the tail adopts
 * nothing from then on; the caller drops it and makes another. */
void mgpu__parts_tail_cancel(int dev, void *tail);
void mgpu__parts_tail_free(int dev, void *tail);

/* The segments of an executable graph whose devices cannot each run one
 * part (segments.c): runs of a device's nodes cut at edges between
 * devices, issued in an order that queues every wait after its record. */
typedef struct mgpu__segs mgpu__segs;
/* Cuts nodes (issued in order) into segments; with_parts: a segment of
 * two nodes or more is one backend part where its backend can make it,
 * else every segment is issued node by node. 0 or a negative code. */
int mgpu__segs_build(const mgpu__gnode *nodes, int n, const int *order,
                     int with_parts, mgpu__segs **out);
/* Queues launch number launch: each segment on on[its device], each of
 * its nodes after waiting for done[u] of each node u of another device
 * that the node waits for, and done[v] recorded after each node v that
 * has one. */
int mgpu__segs_issue(const mgpu__segs *s, const mgpu__gnode *nodes,
                     mgpu_stream *const *on, mgpu_event *const *done,
                     uint64_t launch);
/* Frees the segments (each backend part lives on until its queued runs
 * are done). */
void mgpu__segs_free(mgpu__segs *s);

/* Issues one node's call on stream (the public call it records). */
int mgpu__gnode_issue(const mgpu__gnode *n, mgpu_stream *stream);

/* "nodes 0 to N-1", or "no nodes", for a detail naming a node out of a
 * graph of n nodes. */
static inline const char *mgpu__graph_nodes_text(int n, char *buf,
                                                 size_t size) {
  if (n <= 0) return "no nodes";
  snprintf(buf, size, "nodes 0 to %d", n - 1);
  return buf;
}

/* For tests: how many sets of parts an update of h retired and its
 * launches still hold (freed once the launches that used them are done),
 * or a negative code. */
int mgpu__graph_exec_retired(mgpu_graph_exec *h);

#endif /* MGPU_GRAPH_INTERNAL_H */
