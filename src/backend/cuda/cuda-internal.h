/* Shared state of the CUDA backend plugin (libmgpu-cuda.so).
 *
 * The plugin is written on the CUDA runtime API, so that the user's own
 * cudaXxx calls and <<<>>> launches inside mgpu_run_on_device meet the same
 * devices and contexts. A few driver API entry points (current context, green
 * contexts) are fetched at run time with cudaGetDriverEntryPointByVersion, so
 * the plugin never links libcuda and still loads where a driver lacks them.
 *
 * Contexts: every mgpu device binds one CUDA context, d->ctx: the GPU's
 * primary context for a whole GPU or a plain split, a green context (an SM
 * partition) for a split where the driver offers them. Memory always lives
 * in the primary context, which green contexts of the same GPU share. Calls
 * made from arbitrary threads bind d->ctx for their duration and restore the
 * caller's context after (cuda_enter / cuda_leave), so that mgpu never
 * changes the current device of a user thread behind its back; only
 * make_current (device host threads, mgpu_set_device) changes it for good.
 */
#ifndef MGPU_CUDA_INTERNAL_H
#define MGPU_CUDA_INTERNAL_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "backend/backend.h"
#include "mgpu/error.h"
#include "mgpu/metrics.h"

/* The environment handed over by the core at load (allocator, error
 * setter, logger, metrics). Set by the entry function, read-only afterwards;
 * plugin code reaches its allocator and error setter through
 * plugin-seam.h's mgpu__calloc, mgpu__free, mgpu__error. */
extern const mgpu__backend_env *mgpu__cuda_env;
#define MGPU__PLUGIN_ENV mgpu__cuda_env
#include "backend/plugin-seam.h"

/* Driver entry points. Required ones are checked at probe; the green
 * context ones may be NULL (older drivers), then splits use plain streams. */
typedef struct mgpu__cuda_driver {
  CUresult (*ctx_get_current)(CUcontext *ctx);
  CUresult (*ctx_set_current)(CUcontext ctx);
  CUresult (*get_error_name)(CUresult err, const char **name);
  /* Green contexts (CUDA 12.4 and later drivers). */
  CUresult (*device_get_dev_resource)(CUdevice dev, CUdevResource *res,
                                      CUdevResourceType type);
  CUresult (*sm_resource_split_by_count)(CUdevResource *result,
                                         unsigned *nb_groups,
                                         const CUdevResource *input,
                                         CUdevResource *remaining,
                                         unsigned use_flags,
                                         unsigned min_count);
  CUresult (*resource_generate_desc)(CUdevResourceDesc *desc,
                                     CUdevResource *res, unsigned n);
  CUresult (*green_ctx_create)(CUgreenCtx *g, CUdevResourceDesc desc,
                               CUdevice dev, unsigned flags);
  CUresult (*green_ctx_destroy)(CUgreenCtx g);
  CUresult (*ctx_from_green_ctx)(CUcontext *ctx, CUgreenCtx g);
  CUresult (*green_ctx_stream_create)(CUstream *s, CUgreenCtx g,
                                      unsigned flags, int priority);
} mgpu__cuda_driver;

extern mgpu__cuda_driver mgpu__cuda_drv;

/* 1 (the default): streams record busy time with events (stream.c).
 * MGPU_CUDA_BUSY=0 turns it off, to measure what it costs. */
extern int mgpu__cuda_busy_time;

struct mgpu__bdevice {
  /* Set by open, read-only until close. */
  int id;              /* mgpu device id */
  int ordinal;         /* CUDA device index */
  int split_index, split_count;
  CUcontext primary;   /* the GPU's primary context */
  CUcontext ctx;       /* what work of this device runs in */
  CUgreenCtx green;    /* NULL unless an SM partition was made */
  int sm_count;        /* SMs of the device or of its partition */
  cudaMemPool_t mempool; /* this device's stream-ordered mempool */
  struct cudaDeviceProp prop;
  char pci_bus_id[32];
  int numa_node;
  /* 1 once a sticky error poisoned the device's context (every later CUDA
   * call on it fails) or the core lost it on purpose (the lose slot; CUDA
   * calls would still work). The plugin's calls do not test it: the core
   * reads it through the lost slot and refuses new work for the device.
   * Accessed with __atomic builtins (this header is also C++); lost_why is
   * written before lost is set, under cuda.c's lost_lock. */
  int lost;
  char lost_why[160];
};

/* A stream and its busy-time interval (see stream.c). lock guards the
 * interval fields and orders enqueues on the stream against them. */
typedef struct mgpu__cuda_span mgpu__cuda_span;

struct mgpu__bstream {
  cudaStream_t s;
  mgpu__bdevice *d;
  pthread_mutex_t lock;
  cudaEvent_t busy_start, busy_end;
  int busy_open; /* busy_start recorded, busy_end marks the latest op */
  /* Set at creation: the stream's track in the trace, and the event that
   * maps its timings onto the host clock (NULL if it could not be made). */
  uint32_t track;
  cudaEvent_t clock_ref;
  /* Timed operations not yet harvested, and spare event pairs (lock). */
  mgpu__cuda_span *spans, *spans_tail, *spare_spans;
  /* Set (atomically, by whichever thread's wait saw it first) once a wait
   * on the stream has reported its GPU's sticky error: CUDA returns that
   * error from every later call, the stream reports it once, as a host
   * stream reports a loss. */
  int loss_reported;
};

/* trace.c: wraps one operation queued on s (s->lock held): an NVTX range
 * named name (or the layer's tag) around the enqueue, and while tracing
 * (or for a copy of path >= 0 while busy timing is on) events around the
 * operation. queued: the operation was queued. */
mgpu__cuda_span *mgpu__cuda_op_begin(mgpu__bstream *s, const char *name,
                                     int path, size_t bytes);
void mgpu__cuda_op_end(mgpu__bstream *s, mgpu__cuda_span *sp, int queued);
/* After s was found idle: maps the timed operations onto the host clock
 * and hands them to the floor (spans, copy time per path). */
void mgpu__cuda_trace_harvest(mgpu__bstream *s);
/* Frees the stream's event pairs (s is being destroyed, idle). */
void mgpu__cuda_trace_stream_free(mgpu__bstream *s);

struct mgpu__bevent {
  cudaEvent_t e;
};

/* Binding a device's context around a call from any thread. */
typedef struct mgpu__cuda_scope {
  CUcontext saved;
  int changed;
} mgpu__cuda_scope;

static inline void mgpu__cuda_enter_ctx(CUcontext ctx, mgpu__cuda_scope *sc) {
  sc->changed = 0;
  if (mgpu__cuda_drv.ctx_get_current(&sc->saved) != CUDA_SUCCESS)
    sc->saved = NULL;
  if (sc->saved != ctx) {
    mgpu__cuda_drv.ctx_set_current(ctx);
    sc->changed = 1;
  }
}

static inline void mgpu__cuda_enter(mgpu__bdevice *d, mgpu__cuda_scope *sc) {
  mgpu__cuda_enter_ctx(d->ctx, sc);
}

static inline void mgpu__cuda_leave(mgpu__cuda_scope *sc) {
  if (sc->changed) mgpu__cuda_drv.ctx_set_current(sc->saved);
}

/* Sets the thread's detail to "device N: what: cudaErrorX (text)" and
 * returns the mgpu code that fits the CUDA error. Clears a non-sticky
 * error from cudaGetLastError so it is not reported twice. */
int mgpu__cuda_fail(int dev, cudaError_t err, const char *what);
/* Built-in kernels (kernels.cu): queues b on s. */
cudaError_t mgpu__cuda_builtin_launch(const mgpu__builtin *b, cudaStream_t s);

/* Streams, events, copies, launches (stream.c), peers and mempools
 * (memory.c), NCCL (nccl.c): the table slots. */
/* The core table's slots: mgpu__cuda_<slot>, declared from backend.h's list
 * so that each signature is written once (a slot this backend leaves NULL
 * is declared and not defined). */
#define MGPU__CUDA_SLOT(group, seam, ret, name, params, args, dev)             \
  ret mgpu__cuda_##name params;
MGPU__BACKEND_CORE_SLOTS(MGPU__CUDA_SLOT)
#undef MGPU__CUDA_SLOT

/* A non-blocking stream of d's context (a green context's for a split
 * device), for the plugin's own use; what names the call for a failure. */
cudaError_t mgpu__cuda_native_stream_create(mgpu__bdevice *d,
                                            cudaStream_t *out,
                                            const char **what);

/* A host function and its argument, run by mgpu__cuda_callback_named
 * (stream.c) on a thread of the CUDA driver, which the core cannot tell
 * from the program's own: the thread is named for the core while fn runs,
 * so that mgpu_shutdown from fn (it would wait for the stream that thread
 * is running, for ever) is refused there. Stream callbacks and the host
 * nodes of graphs both go through it. */
typedef struct mgpu__cuda_callback {
  void (*fn)(void *arg);
  void *arg;
} mgpu__cuda_callback;
void mgpu__cuda_callback_named(void *call);

/* Graphs (graph.c): the graph slots of the table, and one run of a part's
 * executable graph on s (stream.c, beside the other work). */
int mgpu__cuda_graph_create(mgpu__bdevice *d,
                            const struct mgpu__bgraph_part *part,
                            void **graph);
int mgpu__cuda_graph_launch(mgpu__bdevice *d, void *graph, mgpu__bstream *s,
                            uint64_t launch);
void mgpu__cuda_graph_cancel(mgpu__bdevice *d, void *graph, uint64_t launch);
void mgpu__cuda_graph_destroy(mgpu__bdevice *d, void *graph);
int mgpu__cuda_graph_run(mgpu__bdevice *d, mgpu__bstream *s,
                         cudaGraphExec_t exec);

int mgpu__cuda_mempool_alloc_async(mgpu__bdevice *d, mgpu__bstream *s,
                                size_t size, void **ptr);
int mgpu__cuda_mempool_free_async(mgpu__bdevice *d, mgpu__bstream *s, void *ptr);
int mgpu__cuda_mempool_trim(mgpu__bdevice *d);

/* Memory other processes map (ipc.c): the ipc slots of the table. */
int mgpu__cuda_ipc_alloc(mgpu__bdevice *d, size_t size, mgpu__ipc_mem *out,
                         void **alloc);
void mgpu__cuda_ipc_free(mgpu__bdevice *d, void *alloc);
int mgpu__cuda_ipc_export_fd(mgpu__bdevice *d, void *alloc, int writable);
int mgpu__cuda_ipc_import(mgpu__bdevice *d, const mgpu__ipc_mem *m,
                          int writable, void **ptr);
int mgpu__cuda_ipc_protect(mgpu__bdevice *d, void *ptr);
void mgpu__cuda_ipc_unimport(mgpu__bdevice *d, void *ptr);

/* SM partition of a split device (green.c): sets d->green, d->ctx and
 * d->sm_count, or leaves d on the primary context and says why in the
 * log. Never fails the open. */
void mgpu__cuda_green_open(mgpu__bdevice *d);
void mgpu__cuda_green_close(mgpu__bdevice *d);

/* NCCL (nccl.c, built when nccl.h is found): 1 when libnccl was opened and
 * the slots may be used. */
int mgpu__cuda_nccl_load(void);
int mgpu__cuda_coll_comm_create(mgpu__bdevice **devs, int n, void **comm);
void mgpu__cuda_coll_comm_destroy(void *comm);
void mgpu__cuda_coll_comm_abort(void *comm);
int mgpu__cuda_coll_group_start(void);
int mgpu__cuda_coll_group_end(void);
int mgpu__cuda_coll_run(void *comm, int rank, const mgpu__coll_args *args,
                        mgpu__bstream *s);

#endif /* MGPU_CUDA_INTERNAL_H */
