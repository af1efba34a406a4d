/* A device's part of an mgpu graph as one CUDA graph (backend/graph.h).
 *
 * create captures the part's nodes on a private stream of the device's
 * context (a green context's for a split device) with the same calls the
 * plugin issues for that work alone (cudaLaunchKernel, the built-in
 * kernels, cudaMemcpyAsync and cudaMemsetAsync, cudaLaunchHostFunc), in the
 * part's order, and instantiates what was captured: a linear chain of CUDA
 * graph nodes. A launch is then one cudaGraphLaunch on the launching
 * stream. Captured kernel nodes hold their own copy of the arguments, and
 * the graph holds its host functions' (a CUDA user object), so nothing of
 * the part is kept but the executable graph.
 *
 * The plugin has no board (its waits would have to be met by other
 * backends' posts): it refuses with MGPU_ENOTSUP a part whose nodes wait
 * for or post to another device's nodes, the head and tail of a launch's
 * joins, and a tail that would adopt other streams' failures. The graph
 * layer then replays such a graph in segments (src/graph/segments.c):
 * runs of a device's nodes with no edge to another device inside, each a
 * part here, joined by cudaEventRecord and cudaStreamWaitEvent queued in
 * an order where each wait follows its record. It joins the parts it
 * accepts to the caller's stream with events (src/graph/parts.c), which
 * meet the wait for the launch's start and the post of its end that a
 * part holds as its first and last node: they are dropped here. A capture
 * or instantiation CUDA refuses (a copy from pageable memory, a memset of
 * memory a memset node cannot take) is MGPU_ENOTSUP too, so the graph
 * still runs (that segment node by node); a sticky error or exhausted
 * memory fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/graph.h"
#include "cuda-internal.h"

typedef struct cuda_graph {
  cudaGraphExec_t exec;
} cuda_graph;

/* 1 when part has a host function node. */
static int has_callback(const mgpu__bgraph_part *part) {
  for (int i = 0; i < part->n; i++)
    if (part->nodes[i].node >= 0 && part->nodes[i].kind == MGPU__BG_CALLBACK)
      return 1;
  return 0;
}

/* MGPU_ENOTSUP with why in the detail (and the log): the graph layer
 * issues the part node by node instead. */
static int refuse(const mgpu__bdevice *d, const char *why, int node) {
  char what[32] = "graph part";
  if (node >= 0) snprintf(what, sizeof what, "graph node %d", node);
  mgpu__cuda_env->log(MGPU_LOG_DEBUG, "cuda: device %d: replayed node by "
                      "node: %s %s", d->id, what, why);
  return mgpu__error(MGPU_ENOTSUP, "device %d: %s %s", d->id, what, why);
}

/* 1 when CUDA knows ptr (device, pinned or managed memory), which a
 * captured copy needs: pageable host memory is copied synchronously by
 * the runtime and cannot be part of a graph. */
static int registered(const void *ptr) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return a.type != cudaMemoryTypeUnregistered;
}

/* 0 when every node of part can be captured as it is, else MGPU_ENOTSUP
 * naming the first that cannot. */
static int part_check(const mgpu__bdevice *d, const mgpu__bgraph_part *part) {
  int real = 0;
  if (part->nadopt > 0)
    return refuse(d, "(a launch's tail) would take over other streams' "
                  "failures", -1);
  for (int i = 0; i < part->n; i++) {
    const mgpu__bgraph_node *n = &part->nodes[i];
    if (n->node < 0) continue; /* a join with the launch: met by events */
    real++;
    if (n->nwaits > 0 || n->signal >= 0)
      return refuse(d, "waits for or is waited on by another device's node",
                    n->node);
    if (n->kind == MGPU__BG_LAUNCH && n->kernel->cuda_fn == NULL)
      return refuse(d, "is a kernel without a CUDA variant", n->node);
    if (n->kind == MGPU__BG_COPY && n->size > 0 &&
        (!registered(n->dst) || !registered(n->src)))
      return refuse(d, "copies to or from pageable host memory", n->node);
  }
  if (real == 0)
    return refuse(d, "(a launch's head or tail) joins the launch with "
                  "signals", -1);
  return 0;
}

/* Queues node n on the capturing stream cs, as the plugin queues that
 * work alone (stream.c); what names the call for a failure. */
static cudaError_t capture_node(const mgpu__bgraph_node *n, cudaStream_t cs,
                                mgpu__cuda_callback *call,
                                const char **what) {
  switch (n->kind) {
    case MGPU__BG_NOP:
      return cudaSuccess;
    case MGPU__BG_COPY:
      *what = "cudaMemcpyAsync";
      return n->size == 0 ? cudaSuccess
                          : cudaMemcpyAsync(n->dst, n->src, n->size,
                                            cudaMemcpyDefault, cs);
    case MGPU__BG_MEMSET:
      *what = "cudaMemsetAsync";
      return n->size == 0 ? cudaSuccess
                          : cudaMemsetAsync(n->dst, n->value, n->size, cs);
    case MGPU__BG_LAUNCH: {
      /* The kernel takes the argument struct by value as its one
       * parameter; the captured node keeps a copy of it. */
      void *params[1] = {(void *)n->args};
      dim3 g = {n->grid.x, n->grid.y, n->grid.z};
      dim3 b = {n->block.x, n->block.y, n->block.z};
      *what = "cudaLaunchKernel";
      return cudaLaunchKernel(n->kernel->cuda_fn, g, b,
                              n->args_size > 0 ? params : NULL, 0, cs);
    }
    case MGPU__BG_BUILTIN:
      *what = "a built-in kernel";
      return mgpu__cuda_builtin_launch(&n->builtin, cs);
    case MGPU__BG_CALLBACK:
      *what = "cudaLaunchHostFunc";
      call->fn = n->fn;
      call->arg = n->arg;
      return cudaLaunchHostFunc(cs, mgpu__cuda_callback_named, call);
  }
  *what = "an unknown node";
  return cudaErrorInvalidValue;
}

/* Hands calls (a host function node's argument, by node) to graph: a
 * user object that CUDA frees with libc's free once graph, every
 * executable made from it and their runs are gone (a run still in flight
 * when the part is destroyed reads it). On failure calls is freed. */
static cudaError_t calls_to_graph(cudaGraph_t graph, mgpu__cuda_callback *calls,
                                  const char **what) {
  cudaUserObject_t o;
  *what = "cudaUserObjectCreate";
  /* free, not a function of this plugin: the destructor may run on a
   * thread of the driver after the plugin is unloaded (calls came from
   * mgpu__calloc, which is calloc behind its fault site). */
  cudaError_t err = cudaUserObjectCreate(&o, calls, free, 1,
                                         cudaUserObjectNoDestructorSync);
  if (err != cudaSuccess) {
    mgpu__free(calls);
    return err;
  }
  *what = "cudaGraphRetainUserObject";
  err = cudaGraphRetainUserObject(graph, o, 1, cudaGraphUserObjectMove);
  if (err != cudaSuccess) cudaUserObjectRelease(o, 1); /* frees calls */
  return err;
}

/* Captures part's nodes on a private stream and instantiates them into
 * *exec (d's context current). calls (NULL: part has no host function)
 * goes to the graph, or is freed. *node: the node that failed, or -1. */
static cudaError_t capture_part(mgpu__bdevice *d,
                                const mgpu__bgraph_part *part,
                                cudaGraphExec_t *exec,
                                mgpu__cuda_callback *calls, const char **what,
                                int *node) {
  cudaStream_t cs;
  cudaGraph_t graph = NULL;
  *node = -1;
  cudaError_t err = mgpu__cuda_native_stream_create(d, &cs, what);
  if (err != cudaSuccess) {
    mgpu__free(calls);
    return err;
  }
  *what = "cudaStreamBeginCapture";
  err = cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    for (int i = 0; err == cudaSuccess && i < part->n; i++) {
      if (part->nodes[i].node < 0) continue;
      err = capture_node(&part->nodes[i], cs,
                         calls != NULL ? &calls[i] : NULL, what);
      if (err != cudaSuccess) *node = part->nodes[i].node;
    }
    /* The capture ends whatever happened, so that the stream can go. */
    cudaError_t end = cudaStreamEndCapture(cs, &graph);
    if (err == cudaSuccess && end != cudaSuccess) {
      err = end;
      *what = "cudaStreamEndCapture";
    }
  }
  if (graph != NULL && calls != NULL) {
    const char *held_what = "";
    cudaError_t held = calls_to_graph(graph, calls, &held_what);
    if (err == cudaSuccess && held != cudaSuccess) {
      err = held;
      *what = held_what;
    }
  } else {
    mgpu__free(calls); /* no graph was made to run them */
  }
  if (err == cudaSuccess) {
    *what = "cudaGraphInstantiate";
    err = cudaGraphInstantiate(exec, graph, 0);
  }
  if (graph != NULL) cudaGraphDestroy(graph); /* the executable is apart */
  cudaStreamDestroy(cs);
  return err;
}

int mgpu__cuda_graph_create(mgpu__bdevice *d, const mgpu__bgraph_part *part,
                            void **out) {
  *out = NULL;
  cuda_graph *g = mgpu__calloc(1, sizeof *g);
  if (g == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a "
                       "graph part", d->id);
  /* In d's context from the first CUDA call on (the pointer checks too),
   * so that the caller's own context is left as it was. */
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  const char *what = "";
  int node = -1;
  cudaError_t err = cudaSuccess;
  int rc = part_check(d, part);
  mgpu__cuda_callback *calls = NULL;
  if (rc == 0 && has_callback(part) &&
      (calls = mgpu__calloc((size_t)part->n, sizeof *calls)) == NULL)
    rc = mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a "
                     "graph part", d->id);
  if (rc == 0) err = capture_part(d, part, &g->exec, calls, &what, &node);
  mgpu__cuda_leave(&sc);
  if (rc == 0 && err == cudaSuccess) {
    *out = g;
    return 0;
  }
  mgpu__free(g);
  if (rc != 0) return rc;
  char call[96];
  if (node >= 0)
    snprintf(call, sizeof call, "capturing graph node %d (%s)", node, what);
  else
    snprintf(call, sizeof call, "making a graph part (%s)", what);
  rc = mgpu__cuda_fail(d->id, err, call);
  if (rc == MGPU_EDEVLOST || rc == MGPU_ENOMEM) return rc;
  /* CUDA cannot hold this work in a graph: the part runs node by node. */
  char why[160];
  snprintf(why, sizeof why, "cannot be part of a CUDA graph: %s in %s",
           cudaGetErrorName(err), what);
  return refuse(d, why, node);
}

int mgpu__cuda_graph_launch(mgpu__bdevice *d, void *graph, mgpu__bstream *s,
                            uint64_t launch) {
  (void)launch; /* no signals: the launch is ordered by its stream */
  return mgpu__cuda_graph_run(d, s, ((cuda_graph *)graph)->exec);
}

/* Nothing to post: a part of this plugin holds no signals. */
void mgpu__cuda_graph_cancel(mgpu__bdevice *d, void *graph, uint64_t launch) {
  (void)d;
  (void)graph;
  (void)launch;
}

/* CUDA frees an executable graph still running once its runs are done,
 * and the host functions' arguments with it (calls_to_graph); the graph
 * layer destroys a part only after them but on its error paths. */
void mgpu__cuda_graph_destroy(mgpu__bdevice *d, void *graph) {
  cuda_graph *g = graph;
  if (g == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaGraphExecDestroy(g->exec);
  (void)cudaGetLastError();
  mgpu__cuda_leave(&sc);
  mgpu__free(g);
}
