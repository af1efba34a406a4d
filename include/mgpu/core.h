/* mgpu core: initialization, devices, memory, streams, events, kernels and
 * copies.
 *
 * Conventions (see docs/API.md):
 * - Every fallible call returns 0 or a negative MGPU_E... code; the calling
 *   thread's mgpu_error_detail() then names the device, buffer, offset or size.
 * - Handles are opaque. A handle used after it was freed or destroyed is
 *   reported as MGPU_EFREED, never dereferenced.
 * - An asynchronous failure is reported by the next synchronize or query on the
 *   stream or event it belongs to.
 * - Nothing here needs a vendor header: CUDA streams and pointers cross the API
 *   as void *.
 */
#ifndef MGPU_CORE_H
#define MGPU_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/visibility.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most devices one process can open. */
#define MGPU_MAX_DEVICES 64

/* ------------------------------------------------------------------------ */
/* Configuration and life cycle                                             */
/* ------------------------------------------------------------------------ */

typedef enum mgpu_log_level {
  MGPU_LOG_NONE = 0, /* the default: the library prints nothing */
  MGPU_LOG_WARN = 1,
  MGPU_LOG_INFO = 2,
  MGPU_LOG_DEBUG = 3
} mgpu_log_level;

/* Bounds of the staged copy's chunk and depth (MGPU_STAGING_CHUNK and
 * _DEPTH, the fields below, mgpu_staging_set): smaller chunks cut a copy
 * into too many pieces, larger ones pin too much memory. */
#define MGPU_STAGING_CHUNK_MIN ((size_t)4 << 10)
#define MGPU_STAGING_CHUNK_MAX ((size_t)64 << 20)
#define MGPU_STAGING_DEPTH_MAX 64

/* Every environment variable is also a field here. A field left at its
 * initializer value (NULL, 0 or -1) is taken from the environment variable
 * named beside it, and from the default when that is unset too. Environment
 * variables are read once, by mgpu_init. */
typedef struct mgpu_config {
  size_t size;              /* sizeof(mgpu_config): lets the struct grow.
                               A program built against an older header
                               passes its smaller size: its fields are
                               read, later ones take their defaults. A size
                               that does not end at a field (or exceeds this
                               library's struct) is MGPU_EINVAL. */
  const char *devices;      /* MGPU_DEVICES: "host:4", "cuda", "cuda:1",
                               "cuda:0/4", "local" (one device per
                               process: GPU local rank mod GPUs, the local
                               rank from the launcher's environment; one
                               host device without a GPU),
                               comma-separated. Default: every GPU if there
                               is one, else "host:4" */
  size_t host_mem;          /* MGPU_HOST_MEM: memory budget of each host
                               device in bytes. Default 1 GiB */
  int log_level;            /* MGPU_LOG: none|warn|info|debug. -1: env */
  int host_workers;         /* MGPU_HOST_WORKERS: stream worker threads per
                               host device. Default 2. 0: env */
  int host_peer;            /* MGPU_HOST_PEER: 1 lets host devices copy
                               directly between each other, 0 ("none") makes
                               them refuse, so copies go host-staged. -1: env,
                               default 1 */
  size_t staging_chunk;     /* MGPU_STAGING_CHUNK: bytes per chunk of a
                               host-staged copy. 0: env, else chosen per
                               pair: 8 MiB between GPUs, 1 MiB between host
                               devices (docs/copy.md) */
  int staging_depth;        /* MGPU_STAGING_DEPTH: bounce buffers per staged
                               copy (2 to 64). 0: env, default 3 */
  const char *plugin_path;  /* MGPU_PLUGIN_PATH: folders (':'-separated)
                               searched first for libmgpu-cuda.so. NULL: env,
                               then only the default places */
  int cuda_green;           /* MGPU_CUDA_GREEN: 1 gives each logical device
                               of a split GPU a green-context SM partition
                               where the driver has them, 0 plain streams.
                               -1: env, default 1 */
  int cuda_busy;            /* MGPU_CUDA_BUSY: 1 times each CUDA operation
                               with events for the busy_ns metric (about
                               1 us per launch), 0 does not. -1: env,
                               default 1 */
  const char *trace;        /* MGPU_TRACE: record a trace from mgpu_init to
                               mgpu_shutdown into this file (Chrome
                               trace-event JSON, docs/trace.md). NULL: env,
                               default none */
  const char *metrics;      /* MGPU_METRICS: "stderr", or a file, to print
                               mgpu_metrics_print's table (JSON for a name
                               ending in .json) at mgpu_shutdown. NULL: env,
                               default none */
  int timeout_ms;           /* MGPU_TIMEOUT: how long, in milliseconds, a
                               call waits for another party (collectives'
                               ranks, barriers, channel room and messages)
                               before it returns MGPU_ETIMEDOUT naming who did
                               not come (docs/faults.md). A call's own timeout
                               of 0 means this one. 0: env, default 30000 */
  const char *fault;        /* MGPU_FAULT: failures to inject, for testing
                               (docs/faults.md): "alloc:17",
                               "backend:memcpy_async:3", "thread:2",
                               "seed:S@p:0.01", "device:2@after:100",
                               comma-separated. NULL: env, default none */
  int cuda_ipc_legacy;      /* MGPU_CUDA_IPC_LEGACY: 1 shares CUDA store
                               objects through legacy cudaIpc handles even
                               where the driver exports cuMem POSIX
                               descriptors (the fallback, for drivers
                               without them and for testing it), 0 uses
                               the descriptors where offered. -1: env,
                               default 0 */
  int reserved;             /* unused, never read. Before opencl_busy the
                               struct ended after cuda_ipc_legacy, padded
                               to 8 bytes where pointers are 8: a program
                               built then passes that size, whose padding
                               is not a value; this field is that padding,
                               so that such a size still ends before
                               opencl_busy, which takes its default */
  int opencl_busy;          /* MGPU_OPENCL_BUSY: 1 makes every OpenCL
                               command queue with profiling on, for the
                               busy_ns metric, the copy times per path and
                               mgpu_event_elapsed_ms; 0 makes plain queues
                               (cheaper launches), counts no busy time, and
                               times no copies or events, but on streams
                               made while a trace is recorded, which keep
                               profiling for their spans (docs/opencl.md).
                               -1: env, default 1 */
} mgpu_config;

#define MGPU_CONFIG_INITIALIZER                                              \
  { .size = sizeof(mgpu_config), .devices = NULL, .host_mem = 0,            \
    .log_level = -1, .host_workers = 0, .host_peer = -1,                    \
    .staging_chunk = 0, .staging_depth = 0, .plugin_path = NULL,            \
    .cuda_green = -1, .cuda_busy = -1, .trace = NULL, .metrics = NULL,     \
    .timeout_ms = 0, .fault = NULL, .cuda_ipc_legacy = -1,                 \
    .reserved = 0, .opencl_busy = -1 }

/* Opens the devices the configuration names. NULL: everything from the
 * environment. Returns MGPU_EALREADY if already initialized; after
 * mgpu_shutdown() it may be called again. A bad device spec returns
 * MGPU_EINVAL with a detail naming the bad token.
 *
 * fork: a child forked after mgpu_init has none of the library's threads, so
 * mgpu cannot work there. In such a child every mgpu call that needs the
 * library (mgpu_init and mgpu_shutdown included) returns MGPU_EFORK with a
 * detail naming the parent, instead of waiting on threads that do not
 * exist; the child's copies of buffers and handles are left alone. Fork
 * before mgpu_init, or exec, to use mgpu in a second process. */
MGPU_EXTERN int mgpu_init(const mgpu_config *config);

/* Waits for all work, frees every buffer, stream, event, communicator,
 * barrier, stream barrier, channel and task pool still open, stops the
 * device threads. Safe to call when not initialized (returns 0). Calls made
 * meanwhile on other threads are either waited for (those already inside)
 * or refused (MGPU_ENOINIT, or MGPU_EFREED for a handle shutdown closed);
 * nothing is freed under a caller. Every handle of the old session is
 * MGPU_EFREED afterwards, also after a new mgpu_init; work handles stay
 * valid and must still be waited. Called from a thread of the library (a
 * function run by mgpu_run_on_device, a stream callback, a task of a pool)
 * or from inside another mgpu call it returns MGPU_EBUSY naming the thread
 * and changes nothing: it would wait for itself. */
MGPU_EXTERN int mgpu_shutdown(void);

/* 1 between a successful mgpu_init and mgpu_shutdown, else 0. */
MGPU_EXTERN int mgpu_is_initialized(void);

/* MGPU_TIMEOUT in milliseconds as the last mgpu_init resolved it (before the
 * first, its default, 30000): how long a call whose own timeout is 0 waits
 * for another party. Lets a caller that waits in slices (to stay responsive
 * to signals, say) keep the same overall limit. Never fails. */
MGPU_EXTERN int mgpu_timeout_ms(void);

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum mgpu_backend_kind {
  MGPU_BACKEND_HOST = 0,
  MGPU_BACKEND_CUDA = 1,
  MGPU_BACKEND_OPENCL = 2 /* the OpenCL plugin (docs/opencl.md) */
} mgpu_backend_kind;

typedef struct mgpu_device_props {
  size_t size;             /* sizeof(mgpu_device_props), set by the caller */
  char name[96];           /* "host device 2", "NVIDIA H100 80GB HBM3 [1/4]" */
  char backend[16];        /* "host", "cuda", "opencl" */
  mgpu_backend_kind backend_kind;
  int ordinal;             /* backend's physical device index */
  int split_index;         /* index among the logical devices of one GPU */
  int split_count;         /* logical devices cut from this GPU (1: whole) */
  size_t total_mem;        /* bytes: the budget of a host or split device */
  size_t free_mem;         /* bytes not in use */
  int cc_major, cc_minor;  /* compute capability; 0.0 on host devices */
  int multiprocessors;     /* SMs (or the SM partition); worker threads on
                              host devices */
  int numa_node;           /* the NUMA node (where a host device is placed,
                              the node of a GPU's PCI bus); -1 when unknown */
  int peer_capable;        /* 1 if direct peer copies to some other open
                              device are possible */
  char pci_bus_id[32];     /* "0000:19:00.0", "" on host devices */
  char uuid[40];           /* stable id across processes, "" if none */
} mgpu_device_props;

/* Number of open devices, or a negative code. */
MGPU_EXTERN int mgpu_device_count(void);

/* Fills *props (props->size must be set, e.g. to sizeof *props). */
MGPU_EXTERN int mgpu_device_get_props(int dev, mgpu_device_props *props);

/* Whether a device still works. A device is lost when a GPU reports a
 * sticky error (its context is poisoned until the process ends) or, for
 * testing, when MGPU_FAULT=device:N@after:K says so. A lost device fails its
 * queued work (synchronizing returns MGPU_EDEVLOST) and refuses later work
 * with MGPU_EDEVLOST naming it; the other devices go on. Freeing its buffers,
 * streams and events still works. */
typedef enum mgpu_device_state {
  MGPU_DEVICE_OK = 0,
  MGPU_DEVICE_LOST = 1
} mgpu_device_state;
MGPU_EXTERN int mgpu_device_status(int dev, mgpu_device_state *state);

/* The calling thread's current device. A thread that never called
 * mgpu_set_device is on device 0, as in CUDA, and so is every thread again
 * after mgpu_shutdown and a new mgpu_init (which may open fewer devices). Inside mgpu_run_on_device the
 * current device is the target device, and the caller's is restored after. */
MGPU_EXTERN int mgpu_set_device(int dev);
MGPU_EXTERN int mgpu_get_device(int *dev);

/* Waits until all work on every stream of the device has finished. Returns
 * the first asynchronous error of those streams, if any (and clears every
 * stream's). MGPU_ENOTSUP while a stream of the device captures a graph,
 * waiting for nothing. */
MGPU_EXTERN int mgpu_device_synchronize(int dev);

/* A function run on a device's own host thread, with that device current.
 * Its return value is handed back to the caller, and with a negative one
 * the host thread's error detail (mgpu_error_detail). */
typedef int (*mgpu_device_fn)(int dev, void *arg);

/* Runs fn(dev, arg) on the device's host thread and returns its result once
 * it has run. Called from that same host thread (fn calling back for its own
 * device), fn runs inline instead of deadlocking. Called from another
 * device's host thread whose wait would close a cycle (fn on device 0 runs
 * something on device 1 whose function runs something on device 0), it
 * returns MGPU_EDEADLK naming the devices of the cycle instead of hanging,
 * and fn is not run. */
MGPU_EXTERN int mgpu_run_on_device(int dev, mgpu_device_fn fn, void *arg);

typedef struct mgpu_work mgpu_work;

/* Queues fn on the device's host thread and returns at once; *work is the
 * handle to wait on. Every handle must be waited on exactly once; it stays
 * valid across mgpu_shutdown (which runs the queued work first). */
MGPU_EXTERN int mgpu_run_on_device_async(int dev, mgpu_device_fn fn, void *arg,
                                         mgpu_work **work);

/* Waits for the work, frees the handle and returns fn's result. A second
 * wait (even one racing the first) is MGPU_EFREED. From a device's host
 * thread, a wait that would close a cycle of host threads waiting for each
 * other returns MGPU_EDEADLK at once instead: the handle is spent all the
 * same, and the work still runs (its result is dropped). */
MGPU_EXTERN int mgpu_work_wait(mgpu_work *work);

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum mgpu_mem_kind {
  MGPU_MEM_DEVICE = 0,  /* device memory */
  MGPU_MEM_PINNED = 1,  /* page-locked host memory, associated with a device */
  MGPU_MEM_UNIFIED = 2  /* visible from the host and every device */
} mgpu_mem_kind;

typedef struct mgpu_buffer mgpu_buffer;

/* Allocate size bytes on device dev. The buffer is owned by the caller until
 * mgpu_free. A host device over its budget (MGPU_HOST_MEM) returns
 * MGPU_ENOMEM and leaves earlier allocations intact. size 0 is MGPU_EINVAL. */
MGPU_EXTERN int mgpu_malloc(mgpu_buffer **buf, int dev, size_t size);
MGPU_EXTERN int mgpu_malloc_host(mgpu_buffer **buf, int dev, size_t size);
MGPU_EXTERN int mgpu_malloc_unified(mgpu_buffer **buf, int dev, size_t size);

/* Frees a buffer after the work already queued has finished (as cudaFree
 * does), on every device's streams (a copy between devices runs on a
 * stream of either one), also while a stream captures a graph
 * (what the capture recorded is not queued work; a launch of a graph that
 * recorded the buffer is MGPU_EFREED). An asynchronous error of that work
 * is not the free's: it stays for its stream's next synchronize, query,
 * destroy or mgpu_device_synchronize. A second free returns MGPU_EFREED, and so does any
 * call that starts on the buffer once the free has begun. Calls already
 * inside the buffer on other threads follow one rule, so that every wait
 * ends and no free waits for a party that may never come (the thread that
 * frees may be the one that would come):
 * - a call waiting for another party with nothing moved yet (a collective's
 *   rank waiting for the other ranks, a channel send waiting for room, a
 *   receive waiting for a message) gives up: it returns MGPU_EFREED, its
 *   outputs untouched, and a collective's rank leaves the operation as if
 *   it had not called (the other ranks meet its next call);
 * - any other call inside the buffer (a copy, a collective whose work is
 *   being issued, a send copying its message, a rank's earlier collective
 *   in a group whose later call already joined the next operation, which
 *   cannot leave) finishes first: the free waits for it.
 * A thread must not free a buffer it still has in a pending call of its
 * own (an open group). A buffer exported with mgpu_buffer_dlpack
 * (mgpu/interop.h) loses its handle at once, and its memory is released by
 * the last export's deleter. */
MGPU_EXTERN int mgpu_free(mgpu_buffer *buf);

/* What mgpu_free of a wrapped buffer calls (after the work queued on its
 * device has finished): the memory is the caller's to free or unmap. */
typedef void (*mgpu_buffer_release_fn)(void *ptr, size_t size, void *arg);

/* Flags of mgpu_buffer_wrap. */
#define MGPU_BUFFER_READONLY 1u /* every write into it is MGPU_EREADONLY */

/* A buffer of device dev over size bytes at ptr that mgpu did not allocate
 * (memory mapped from another process, imported through DLPack, ...): a
 * device address on GPUs, a host address on host devices. Every mgpu call
 * accepts it like a buffer of its own; with MGPU_BUFFER_READONLY each call
 * that would write into it (copies, memset, kernels, collectives, channel
 * receives) fails with MGPU_EREADONLY and touches nothing. It does not count
 * against the device's budget. mgpu_free (or mgpu_shutdown) calls
 * release(ptr, size, arg) when release is not NULL; the memory must stay
 * valid until then. */
MGPU_EXTERN int mgpu_buffer_wrap(mgpu_buffer **buf, int dev,
                                 mgpu_mem_kind kind, void *ptr, size_t size,
                                 unsigned flags,
                                 mgpu_buffer_release_fn release, void *arg);

/* 1 for a read-only buffer, 0 for a writable one, or a negative code. */
MGPU_EXTERN int mgpu_buffer_is_readonly(const mgpu_buffer *buf);

/* Accessors. On an invalid or freed handle they return NULL, 0 or -1 and set
 * the thread's error detail. */
MGPU_EXTERN void *mgpu_buffer_ptr(const mgpu_buffer *buf);
MGPU_EXTERN size_t mgpu_buffer_size(const mgpu_buffer *buf);
MGPU_EXTERN int mgpu_buffer_device(const mgpu_buffer *buf);
MGPU_EXTERN int mgpu_buffer_kind(const mgpu_buffer *buf);

/* ------------------------------------------------------------------------ */
/* Streams and events                                                       */
/* ------------------------------------------------------------------------ */

typedef struct mgpu_stream mgpu_stream;
typedef struct mgpu_event mgpu_event;

/* In-order queue of work on one device. Several streams of one device run
 * concurrently. */
MGPU_EXTERN int mgpu_stream_create(mgpu_stream **stream, int dev);
/* Waits for the stream's work, then destroys it. Calls that start on the
 * stream from then on are MGPU_EFREED (a second destroy too); calls already
 * inside it on other threads finish first. */
MGPU_EXTERN int mgpu_stream_destroy(mgpu_stream *stream);
/* Waits for all work queued so far; returns the stream's first asynchronous
 * error (and clears it): one reported once, by this call, mgpu_stream_query,
 * mgpu_stream_destroy or mgpu_device_synchronize, whichever comes first;
 * waits inside other calls (mgpu_free, mgpu_comm_destroy) keep it for
 * them. */
MGPU_EXTERN int mgpu_stream_synchronize(mgpu_stream *stream);
/* 0 when all work queued so far is done, MGPU_EAGAIN while some is pending,
 * or the stream's asynchronous error. */
MGPU_EXTERN int mgpu_stream_query(mgpu_stream *stream);
MGPU_EXTERN int mgpu_stream_device(const mgpu_stream *stream);
/* The backend's own stream (a cudaStream_t on CUDA devices, NULL on host). */
MGPU_EXTERN void *mgpu_stream_native(const mgpu_stream *stream);

/* Events mark a point in a stream. A stream may wait on an event of any
 * device of the same backend. */
MGPU_EXTERN int mgpu_event_create(mgpu_event **event, int dev);
/* Destroys the event. Calls that start on it from then on are MGPU_EFREED (a
 * second destroy too); calls already inside it on other threads (a
 * synchronize) finish first. */
MGPU_EXTERN int mgpu_event_destroy(mgpu_event *event);
MGPU_EXTERN int mgpu_event_record(mgpu_event *event, mgpu_stream *stream);
/* Work queued on stream after this call waits until event completes. */
MGPU_EXTERN int mgpu_stream_wait_event(mgpu_stream *stream, mgpu_event *event);
MGPU_EXTERN int mgpu_event_synchronize(mgpu_event *event);
/* 0 when complete (or never recorded), MGPU_EAGAIN when pending. */
MGPU_EXTERN int mgpu_event_query(mgpu_event *event);
/* Milliseconds between two completed events. MGPU_ENOTSUP, with a detail
 * naming the device, for events of an OpenCL device recorded on a stream
 * made without profiling (MGPU_OPENCL_BUSY=0, docs/opencl.md). */
MGPU_EXTERN int mgpu_event_elapsed_ms(mgpu_event *start, mgpu_event *end,
                                      float *ms);

/* Runs fn(arg) on a host thread once the work queued before it on the
 * stream is done; later work waits for it. fn must not call mgpu. */
MGPU_EXTERN int mgpu_stream_add_callback(mgpu_stream *stream,
                                         void (*fn)(void *arg), void *arg);

/* ------------------------------------------------------------------------ */
/* Kernels                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct mgpu_dim3 {
  unsigned x, y, z;
} mgpu_dim3;

#define MGPU_DIM3(X, Y, Z) ((mgpu_dim3){(X), (Y), (Z)})

/* What a host kernel variant learns about the block it runs. */
typedef struct mgpu_kernel_ctx {
  mgpu_dim3 block_idx;
  mgpu_dim3 grid_dim;
  mgpu_dim3 block_dim;
  int device;
} mgpu_kernel_ctx;

/* One kernel, up to three variants. All take the same argument struct: the
 * host variant as a pointer, the CUDA variant by value as its single
 * parameter,
 *     __global__ void vecadd(struct vecadd_args a);
 * cuda_fn is that __global__ function's address (its host stub), as void *.
 * opencl_src is OpenCL C source text holding a __kernel function called
 * name that takes the struct by value as its single parameter, with device
 * pointers declared as ulong and cast in the kernel; it is built once per
 * device and cached by the addresses of this struct, its text and its name
 * (nothing is copied: they must stay valid while the kernel is launched;
 * docs/opencl.md). A device runs the variant that fits it; a missing one is
 * MGPU_ENOTSUP. Fill it with designated initializers
 * ({.name = "k", .host_fn = k_host}): the struct may grow, and positional
 * code then draws -Wmissing-field-initializers. */
typedef struct mgpu_kernel {
  const char *name;
  void (*host_fn)(const mgpu_kernel_ctx *ctx, const void *args);
  const void *cuda_fn;
  const char *opencl_src;
} mgpu_kernel;

/* Queues a launch of grid blocks of block threads. args (args_size bytes) is
 * copied, so the caller may reuse it at once. On a host device the blocks run
 * on the device's worker threads in stream order; block_dim is only passed
 * through to the kernel. */
MGPU_EXTERN int mgpu_launch(mgpu_stream *stream, const mgpu_kernel *kernel,
                            mgpu_dim3 grid, mgpu_dim3 block, const void *args,
                            size_t args_size);

/* Called from inside a host kernel variant: the launch fails with code (a
 * negative MGPU_E... code) and detail (copied). The blocks after the calling
 * one do not run, and the stream's next synchronize returns code with a
 * detail naming the device, the kernel, the block and detail; as on a GPU,
 * an asynchronous failure surfaces at the next synchronize. The first
 * failure of a launch is the one kept. Returns 0, or MGPU_EINVAL outside a
 * host kernel or for a code that is not negative. */
MGPU_EXTERN int mgpu_kernel_fail(const mgpu_kernel_ctx *ctx, int code,
                                 const char *detail);

/* ------------------------------------------------------------------------ */
/* Built-in kernels, implemented for every backend                          */
/* ------------------------------------------------------------------------ */

typedef enum mgpu_dtype {
  MGPU_FLOAT32 = 0,
  MGPU_FLOAT64 = 1,
  MGPU_INT32 = 2,
  MGPU_INT64 = 3,
  MGPU_FLOAT16 = 4, /* IEEE half; computed in float, rounded per step */
  MGPU_BFLOAT16 = 5 /* bfloat16; the same */
} mgpu_dtype;

typedef enum mgpu_op {
  MGPU_SUM = 0,
  MGPU_PROD = 1,
  MGPU_MIN = 2,
  MGPU_MAX = 3
} mgpu_op;

/* Size in bytes of one element, or 0 for an unknown type. */
MGPU_EXTERN size_t mgpu_dtype_size(mgpu_dtype dtype);
MGPU_EXTERN const char *mgpu_dtype_name(mgpu_dtype dtype);
MGPU_EXTERN const char *mgpu_op_name(mgpu_op op);

/* buf[offset .. offset + count*size) = value. value points to one element of
 * dtype (a double for MGPU_FLOAT16/BFLOAT16). */
MGPU_EXTERN int mgpu_fill(mgpu_stream *stream, mgpu_buffer *buf, size_t offset,
                          size_t count, mgpu_dtype dtype, const void *value);
/* x *= alpha (alpha as a double). For scale and axpy the result is taken in
 * double; an integer result outside its type's range saturates to the
 * type's minimum or maximum, and NaN gives 0 (as CUDA's conversions do). */
MGPU_EXTERN int mgpu_scale(mgpu_stream *stream, mgpu_buffer *x, size_t offset,
                           size_t count, mgpu_dtype dtype, double alpha);
/* y += alpha * x. */
MGPU_EXTERN int mgpu_axpy(mgpu_stream *stream, mgpu_buffer *y, size_t y_offset,
                          const mgpu_buffer *x, size_t x_offset, size_t count,
                          mgpu_dtype dtype, double alpha);
/* dst[i] = a[i] op b[i]. All three on the stream's device (dst may be a or
 * b). Offsets are in bytes, each a multiple of the element size. */
MGPU_EXTERN int mgpu_elementwise(mgpu_stream *stream, mgpu_buffer *dst,
                                 size_t dst_offset, const mgpu_buffer *a,
                                 size_t a_offset, const mgpu_buffer *b,
                                 size_t b_offset, size_t count,
                                 mgpu_dtype dtype, mgpu_op op);

/* ------------------------------------------------------------------------ */
/* Stream-ordered mempool                                                   */
/* ------------------------------------------------------------------------ */

/* Allocates from the device's mempool (its cache of freed device memory) in
 * the stream's order: the memory may be used by work queued on stream after
 * this call. Freed blocks return to the mempool (not to the system) once the
 * work queued before mgpu_free_async is done, and are reused by later
 * allocations. */
MGPU_EXTERN int mgpu_malloc_async(mgpu_buffer **buf, size_t size,
                                  mgpu_stream *stream);
/* Frees a buffer in the stream's order (its memory returns to the mempool
 * once the work queued before it is done). As mgpu_free, a second free and
 * later calls are MGPU_EFREED and calls already inside the buffer finish
 * first. */
MGPU_EXTERN int mgpu_free_async(mgpu_buffer *buf, mgpu_stream *stream);

/* Returns the device's mempool blocks that no queued work still uses to the
 * system (the backend's own stream-ordered pool too: cudaMemPoolTrimTo on
 * CUDA); blocks still pending on a stream stay. Nothing is owned by the
 * caller. 0, or MGPU_ENODEV for a device that does not exist (the detail
 * names it), MGPU_ENOINIT before mgpu_init, or the backend's error. */
MGPU_EXTERN int mgpu_mempool_trim(int dev);
/* Deprecated: the former name of mgpu_mempool_trim ("pool" names the task
 * pool, mgpu/sched.h), kept as an alias that calls it; use
 * mgpu_mempool_trim. */
MGPU_EXTERN int mgpu_pool_trim(int dev);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_CORE_H */
