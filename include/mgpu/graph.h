/* mgpu graphs: a multi-device step recorded once and replayed.
 *
 * A graph is a set of nodes (kernels, copies, fills, host functions, event
 * records and waits), each on one device, with dependency edges between
 * them, possibly across devices. It is built node by node
 * (mgpu_graph_add_...) or captured from streams
 * (mgpu_stream_begin_capture ... mgpu_stream_end_capture), instantiated
 * (mgpu_graph_instantiate) and launched any number of times on a stream
 * (mgpu_graph_launch). docs/graphs.md describes the model.
 *
 * Nodes name buffers, streams' devices and events by their handles; a
 * launch looks each up, so a buffer freed since the graph was built makes
 * the launch fail with MGPU_EFREED naming the node, before any of its work
 * is queued.
 *
 * Graphs and executable graphs are handles: a stale or destroyed one is
 * MGPU_EFREED, a NULL or foreign one MGPU_EBADHANDLE. A graph is not
 * thread-safe while it is built: one thread adds nodes at a time.
 */
#ifndef MGPU_GRAPH_H
#define MGPU_GRAPH_H

#include <stddef.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgpu_graph mgpu_graph;
typedef struct mgpu_graph_exec mgpu_graph_exec;

/* A node of a graph: its index, 0 for the first node added, then 1, 2... */
typedef int mgpu_graph_node;

/* An empty graph; the caller owns it until mgpu_graph_destroy. */
MGPU_EXTERN int mgpu_graph_create(mgpu_graph **graph);
/* Frees the graph. Executable graphs made from it stay valid (they hold a
 * copy). */
MGPU_EXTERN int mgpu_graph_destroy(mgpu_graph *graph);
/* The number of nodes, or a negative code. */
MGPU_EXTERN int mgpu_graph_node_count(const mgpu_graph *graph);

/* Each add takes the nodes the new one depends on (deps, ndeps; NULL and 0
 * for none; each must be a node of this graph) and writes the new node's
 * index to *node (node may be NULL). The arguments are checked as the
 * matching stream call checks them (buffer ranges, devices, read-only
 * buffers); a failed add leaves the graph as it was. */

/* A kernel on device dev (mgpu_launch; args, args_size bytes, is copied). */
MGPU_EXTERN int mgpu_graph_add_kernel(mgpu_graph *graph, int dev,
                                      const mgpu_graph_node *deps, int ndeps,
                                      const mgpu_kernel *kernel,
                                      mgpu_dim3 grid, mgpu_dim3 block,
                                      const void *args, size_t args_size,
                                      mgpu_graph_node *node);
/* A copy between buffers (mgpu_memcpy_async: any devices, the direct or the
 * staged path), run in the order of the source buffer's device. */
MGPU_EXTERN int mgpu_graph_add_copy(mgpu_graph *graph,
                                    const mgpu_graph_node *deps, int ndeps,
                                    mgpu_buffer *dst, size_t dst_offset,
                                    const mgpu_buffer *src, size_t src_offset,
                                    size_t size, mgpu_graph_node *node);
/* size bytes of dst set to the byte value (mgpu_memset_async). */
MGPU_EXTERN int mgpu_graph_add_memset(mgpu_graph *graph,
                                      const mgpu_graph_node *deps, int ndeps,
                                      mgpu_buffer *dst, size_t offset,
                                      int value, size_t size,
                                      mgpu_graph_node *node);
/* count elements of dtype set to *value (mgpu_fill). */
MGPU_EXTERN int mgpu_graph_add_fill(mgpu_graph *graph,
                                    const mgpu_graph_node *deps, int ndeps,
                                    mgpu_buffer *buf, size_t offset,
                                    size_t count, mgpu_dtype dtype,
                                    const void *value, mgpu_graph_node *node);
/* fn(arg) on a host thread, in the order of device dev (as
 * mgpu_stream_add_callback: fn must not call mgpu). */
MGPU_EXTERN int mgpu_graph_add_host(mgpu_graph *graph, int dev,
                                    const mgpu_graph_node *deps, int ndeps,
                                    void (*fn)(void *arg), void *arg,
                                    mgpu_graph_node *node);
/* Records event (of its own device) once the node's dependencies are done:
 * work outside the graph may wait for it. */
MGPU_EXTERN int mgpu_graph_add_event_record(mgpu_graph *graph,
                                            const mgpu_graph_node *deps,
                                            int ndeps, mgpu_event *event,
                                            mgpu_graph_node *node);
/* Waits, in the order of device dev, for event's last record made before
 * the launch (work outside the graph). */
MGPU_EXTERN int mgpu_graph_add_event_wait(mgpu_graph *graph, int dev,
                                          const mgpu_graph_node *deps,
                                          int ndeps, mgpu_event *event,
                                          mgpu_graph_node *node);
/* A node that does nothing on device dev: a join point. */
MGPU_EXTERN int mgpu_graph_add_empty(mgpu_graph *graph, int dev,
                                     const mgpu_graph_node *deps, int ndeps,
                                     mgpu_graph_node *node);
/* Adds the edge from -> to (to runs after from). A cycle is found by
 * mgpu_graph_instantiate. */
MGPU_EXTERN int mgpu_graph_add_dependency(mgpu_graph *graph,
                                          mgpu_graph_node from,
                                          mgpu_graph_node to);

/* Checks the graph (no cycle: MGPU_EINVAL naming a node on it; handles
 * still live) and makes an executable graph of it, which owns a stream per
 * device used and the events that join them. The caller owns *exec until
 * mgpu_graph_exec_destroy. */
MGPU_EXTERN int mgpu_graph_instantiate(mgpu_graph *graph,
                                       mgpu_graph_exec **exec);
/* Queues one run of every node after the work queued so far on stream;
 * work queued on stream later waits for the whole run. Launches of one
 * executable graph run one after another, also from different streams.
 * The nodes of stream's device run on stream itself: their asynchronous
 * failures surface at its next synchronize. The nodes of other devices run
 * on the graph's own streams; on host devices the end of the launch moves
 * their first failure onto stream too (detail "graph launch: ..." naming
 * the device). Elsewhere their failures are returned by
 * mgpu_graph_exec_synchronize, by mgpu_graph_exec_destroy, or by a later
 * launch that finds them (before it queues anything). A failure while the
 * launch queues its nodes (a backend error) leaves the nodes queued before
 * it to run. Refused before anything is queued: a handle a node names
 * freed or destroyed since (buffers, events, a recorded collective's
 * communicator, a recorded channel: MGPU_EFREED naming the node), a lost
 * device of the graph (MGPU_EDEVLOST). A stream that is capturing is
 * MGPU_ENOTSUP; a graph holding recorded collectives launched inside
 * mgpu_group_begin/end is MGPU_EINVAL. */
MGPU_EXTERN int mgpu_graph_launch(mgpu_graph_exec *exec, mgpu_stream *stream);
/* Replace a kernel node's arguments for the launches that follow (args is
 * copied; args_size may differ from before). Launches already queued keep
 * the arguments they were queued with. */
MGPU_EXTERN int mgpu_graph_exec_update_kernel(mgpu_graph_exec *exec,
                                              mgpu_graph_node node,
                                              const void *args,
                                              size_t args_size);
/* Replace a copy node's buffers and range for the launches that follow
 * (checked as mgpu_graph_add_copy; the source must stay on the node's
 * device). */
MGPU_EXTERN int mgpu_graph_exec_update_copy(mgpu_graph_exec *exec,
                                            mgpu_graph_node node,
                                            mgpu_buffer *dst,
                                            size_t dst_offset,
                                            const mgpu_buffer *src,
                                            size_t src_offset, size_t size);
/* Waits for every launch queued so far and returns the first failure of
 * a node (on any device) since the last report, naming its device. */
MGPU_EXTERN int mgpu_graph_exec_synchronize(mgpu_graph_exec *exec);
/* Waits for the graph's own streams (the launches queued so far; work
 * queued on a caller's stream stays that stream's), then frees the
 * executable graph with its streams and events. Returns a node failure
 * found on its streams, the graph freed all the same. */
MGPU_EXTERN int mgpu_graph_exec_destroy(mgpu_graph_exec *exec);

/* ---- capture ---- */

/* From now on the work queued on stream is recorded instead of run:
 * kernels (mgpu_launch and the built-in kernels), copies
 * (mgpu_memcpy_async, _htod_async, _dtoh_async), mgpu_memset_async, host
 * callbacks, event records and waits, and so stream barriers
 * (mgpu_stream_barrier_wait is records and waits), a group of
 * collectives whose ranks' streams all capture (every rank of each
 * communicator in the group, none spanning processes; replayed as a group
 * of their own), and channel sends and receives (the j-th receive of a
 * channel follows its j-th send; a recorded receive leaves *size as it
 * was). A stream that waits on an event
 * recorded in the capture joins it (its later work is recorded too, after
 * the event's point), as on CUDA; it must rejoin the origin stream (an
 * event recorded on it that the origin waits for) before
 * mgpu_stream_end_capture. Calls that cannot be recorded on a capturing
 * stream (2-D copies, the stream-ordered pool) fail with MGPU_ENOTSUP and
 * queue nothing; a group of collectives that could not replay (ranks
 * missing or disagreeing, streams not all capturing) fails its
 * mgpu_group_end with MGPU_EINVAL or MGPU_EMISMATCH; a
 * synchronize or query of a capturing stream, of a device with one, or of
 * an event recorded in a capture, is MGPU_ENOTSUP naming the call. A
 * stream already capturing is MGPU_EINVAL. */
MGPU_EXTERN int mgpu_stream_begin_capture(mgpu_stream *stream);
/* Ends the capture begun on stream and returns the graph (owned by the
 * caller) in *graph. Its nodes are numbered (mgpu_graph_node, for
 * mgpu_graph_exec_update_kernel and _update_copy) in the order their calls
 * were recorded, over every stream of the capture, from 0: one node per
 * kernel, copy, memset, host callback, channel send or receive, wait for
 * an event recorded outside the capture, and rank of a recorded
 * collective; event records and waits inside the capture (and so stream
 * barriers) are edges, not nodes. Every stream that joined leaves the
 * capture. A joined
 * stream whose work does not lead back into the origin stream makes it
 * fail with MGPU_EINVAL naming that stream's device (and the graph is
 * dropped), as does a stream that is not the origin of a capture. */
MGPU_EXTERN int mgpu_stream_end_capture(mgpu_stream *stream,
                                        mgpu_graph **graph);
/* 1 while stream records into a capture (as origin or joined), 0 when
 * not, or a negative code. */
MGPU_EXTERN int mgpu_stream_is_capturing(mgpu_stream *stream);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_GRAPH_H */
