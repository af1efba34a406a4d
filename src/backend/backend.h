/* The backend interface: the only place where mgpu meets a vendor API.
 *
 * A backend is a const table of functions: a core table, optional
 * sub-tables and capability fields (below). The core never asks which
 * backend it talks to; it calls through the table and reads the
 * capabilities. The host backend is linked into libmgpu; the CUDA and
 * OpenCL backends are plugins (libmgpu-cuda.so, libmgpu-opencl.so) that
 * export one entry symbol named after the ABI they serve,
 * MGPU__PLUGIN_ENTRY, of type mgpu__plugin_entry_fn. The core opens a
 * plugin with dlopen (plugin.c), refuses it with one log line if it serves
 * another ABI, and hands its entry the environment below: the seams of the
 * core a plugin reaches only through it (allocator, error setter, logger,
 * metrics, configuration, trace), since a plugin links nothing of libmgpu.
 * backend/plugin-seam.h spells them for plugin code as the core spells its
 * own (mgpu__calloc, mgpu__error).
 *
 * Threading: every function may be called from any thread unless it says
 * otherwise. make_current is called once on each device's host thread and on
 * user threads by mgpu_set_device.
 */
#ifndef MGPU_BACKEND_H
#define MGPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ipc.h"
#include "mgpu/core.h"

#define MGPU__BACKEND_ABI 8
/* The plugin's entry is named after the ABI it serves
 * (mgpu_backend_plugin_v8): MGPU__PLUGIN_ENTRY_FN is the identifier a plugin
 * defines, MGPU__PLUGIN_ENTRY the name the loader looks up. A plugin of
 * another ABI exports another name, which the loader finds and names. */
#define MGPU__PLUGIN_ENTRY_OF(abi) MGPU__PLUGIN_ENTRY_OF_(abi)
#define MGPU__PLUGIN_ENTRY_OF_(abi) mgpu_backend_plugin_v##abi
#define MGPU__PLUGIN_ENTRY_FN MGPU__PLUGIN_ENTRY_OF(MGPU__BACKEND_ABI)
#define MGPU__STRINGIFY(x) MGPU__STRINGIFY_(x)
#define MGPU__STRINGIFY_(x) #x
#define MGPU__PLUGIN_ENTRY MGPU__STRINGIFY(MGPU__PLUGIN_ENTRY_FN)
/* The prefix of every ABI's entry name. */
#define MGPU__PLUGIN_ENTRY_PREFIX "mgpu_backend_plugin_v"

/* Each backend defines these structs for itself; the core only holds
 * pointers. */
typedef struct mgpu__bdevice mgpu__bdevice;
typedef struct mgpu__bstream mgpu__bstream;
typedef struct mgpu__bevent mgpu__bevent;

/* Metrics a backend records itself (the core records the rest). */
typedef enum mgpu__bmetric {
  MGPU__BMETRIC_BUSY_NS = 0
} mgpu__bmetric;

/* The recording floor (src/obs/trace.h, obs.h) as a table, for a backend
 * built as a plugin: it cannot link libmgpu's internal symbols. (The types
 * stay incomplete here: backend.h is also read by the plugin's C++.) */
struct mgpu__trace_tag;
struct mgpu__bgraph_part;
typedef struct mgpu__obs_api {
  /* Nonzero while a trace is recorded (mgpu__trace_enabled). */
  int (*trace_enabled)(void);
  struct mgpu__trace_tag *(*tag_copy)(void);
  void (*span_tag)(int dev, uint32_t track, const struct mgpu__trace_tag *tag,
                   uint64_t start_ns, uint64_t end_ns);
  uint32_t (*track_new)(int dev, const char *name);
  /* The copy path the copy layer set for the calling thread, or -1. */
  int (*path)(void);
  void (*copy_ran)(int dev, int path, uint64_t bytes, uint64_t ns);
  uint64_t (*now_ns)(void);
} mgpu__obs_api;

/* What the core hands to a backend. */
typedef struct mgpu__backend_env {
  int abi; /* MGPU__BACKEND_ABI */
  /* Logs at level (mgpu_log_level) if MGPU_LOG asks for it. */
  void (*log)(int level, const char *fmt, ...);
  /* Sets the calling thread's error detail and returns code. */
  int (*set_error)(int code, const char *fmt, ...)
      __attribute__((format(printf, 2, 3)));
  /* Adds value to a metric of device dev (the mgpu device id). */
  void (*metric_add)(int dev, mgpu__bmetric metric, uint64_t value);
  /* Resolved: every field filled, except staging_chunk, which stays 0 when
   * neither the caller nor MGPU_STAGING_CHUNK set it (the copy layer then
   * picks a size per pair of devices). */
  const mgpu_config *config;
  /* The NUMA node of a PCI bus id, or -1 (the platform's one NUMA reader,
   * src/util/numa.c). */
  int (*numa_node_of_bus_id)(const char *bus_id);
  const mgpu__obs_api *obs;
  /* Names what a thread the plugin starts runs for the core
   * (mgpu__thread_role_set), so that a call the core refuses from such a
   * thread (mgpu_shutdown from a stream callback) is refused there too. */
  void (*thread_role_set)(const char *role);
  /* The allocation seam (util/fault.h: mgpu__malloc, mgpu__calloc, ...):
   * every host allocation of a plugin goes through these, so that each is
   * a fault site of kind alloc (MGPU_FAULT=alloc:N reaches the plugins).
   * They behave as the C calls they name; memory from any of them is
   * released with free_fn (NULL does nothing); aligned_alloc_fn takes any
   * size (it rounds up to the alignment). */
  void *(*malloc_fn)(size_t size);
  void *(*calloc_fn)(size_t count, size_t size);
  void *(*realloc_fn)(void *ptr, size_t size);
  void *(*aligned_alloc_fn)(size_t align, size_t size);
  void (*free_fn)(void *ptr);
} mgpu__backend_env;

/* What a device is opened as. */
typedef struct mgpu__device_spec {
  int id;          /* mgpu device id */
  int ordinal;     /* backend's physical device index */
  int split_index; /* 0 .. split_count-1 */
  int split_count; /* 1 for a whole device */
} mgpu__device_spec;

typedef enum mgpu__copy_kind {
  MGPU__COPY_H2D = 0,
  MGPU__COPY_D2H = 1,
  MGPU__COPY_D2D = 2, /* within one physical device */
  MGPU__COPY_H2H = 3
} mgpu__copy_kind;

typedef enum mgpu__builtin_kind {
  MGPU__BUILTIN_FILL = 0,       /* dst[i] = value */
  MGPU__BUILTIN_SCALE = 1,      /* dst[i] *= alpha */
  MGPU__BUILTIN_AXPY = 2,       /* dst[i] += alpha * a[i] */
  MGPU__BUILTIN_ELEMENTWISE = 3 /* dst[i] = a[i] op b[i] */
} mgpu__builtin_kind;

/* A built-in kernel request, checked by the core before it reaches a backend:
 * pointers are device pointers of the stream's device, ranges in bounds. */
typedef struct mgpu__builtin {
  mgpu__builtin_kind kind;
  mgpu_dtype dtype;
  mgpu_op op;
  size_t count;
  void *dst;
  const void *a;
  const void *b;
  double alpha;
  union {
    float f32;
    double f64;
    int32_t i32;
    int64_t i64;
    uint16_t bits16; /* FLOAT16 / BFLOAT16, already converted */
  } value;
} mgpu__builtin;

typedef enum mgpu__coll_kind {
  MGPU__COLL_ALLREDUCE = 0,
  MGPU__COLL_REDUCE = 1,
  MGPU__COLL_BROADCAST = 2,
  MGPU__COLL_ALLGATHER = 3,
  MGPU__COLL_REDUCE_SCATTER = 4
} mgpu__coll_kind;

/* One rank's part of a collective, checked by the core. count is the
 * per-rank element count as NCCL defines it for each kind. */
typedef struct mgpu__coll_args {
  mgpu__coll_kind kind;
  const void *send;
  void *recv;
  size_t count;
  mgpu_dtype dtype;
  mgpu_op op;
  int root;
} mgpu__coll_args;

/* ---- The table ----
 *
 * A backend is a core table of the slots every backend fills, optional
 * sub-tables (NULL where the backend lacks the ability) and capability
 * fields (what differs between backends, so that no layer above
 * src/backend/ asks which backend it talks to; the kind is for names only).
 *
 * Each list below is the one statement of its slots, one line per slot:
 *   X(group, seam, return type, name, (parameters), (arguments), device)
 * It declares the table's members here and builds the fault seam's wrappers
 * in src/core/backend_fault.c, so that a new slot cannot be left out of
 * either. seam says what that seam does with the slot: FAIL, a fallible
 * call it may fail instead of making (MGPU_FAULT); WAIT, a wait it may fail
 * after the real wait; PLAIN, called as it is (it cannot fail, or frees).
 * device is the parameter naming the device the call is for (a lost device
 * refuses FAIL calls), or NULL. */

/* The core table: what every backend fills. */
#define MGPU__BACKEND_CORE_SLOTS(X)                                           \
  /* Number of physical devices present. 0 devices is not an error; a       \
   * missing driver is MGPU_EBACKEND or MGPU_ENODEV with a detail naming the \
   * cause. */                                                                \
  X(core, PLAIN, int, probe, (int *count), (count), NULL)                     \
  X(core, FAIL, int, open, (const mgpu__device_spec *spec,                    \
                            mgpu__bdevice **out), (spec, out), NULL)          \
  /* Called after every stream and event of the device was destroyed. */     \
  X(core, PLAIN, void, close, (mgpu__bdevice *d), (d), d)                     \
  /* Fills what the backend knows; the core fills id-level fields. */        \
  X(core, PLAIN, int, props, (mgpu__bdevice *d, mgpu_device_props *p),        \
    (d, p), d)                                                                \
  /* Makes the device current on the calling thread (cudaSetDevice). */     \
  X(core, PLAIN, int, make_current, (mgpu__bdevice *d), (d), d)               \
  X(core, FAIL, int, mem_alloc, (mgpu__bdevice *d, mgpu_mem_kind kind,        \
                                 size_t size, void **ptr),                    \
    (d, kind, size, ptr), d)                                                  \
  X(core, PLAIN, void, mem_free, (mgpu__bdevice *d, mgpu_mem_kind kind,       \
                                  void *ptr), (d, kind, ptr), d)              \
  /* Optional: frees memory of mem_alloc after its device was closed (an     \
   * exported buffer outliving mgpu_shutdown). Called on any thread,         \
   * possibly after the backend's plugin was unloaded, so only a backend     \
   * built into the library sets it; NULL: such memory is kept until the     \
   * process ends. */                                                         \
  X(core, PLAIN, void, mem_free_detached, (mgpu_mem_kind kind, void *ptr),    \
    (kind, ptr), NULL)                                                        \
  /* Physical free and total memory (the core applies split budgets). */     \
  X(core, PLAIN, int, mem_info, (mgpu__bdevice *d, size_t *free_bytes,        \
                                 size_t *total_bytes),                        \
    (d, free_bytes, total_bytes), d)                                          \
  X(core, FAIL, int, stream_create, (mgpu__bdevice *d, mgpu__bstream **s),    \
    (d, s), d)                                                                \
  X(core, PLAIN, void, stream_destroy, (mgpu__bdevice *d, mgpu__bstream *s),  \
    (d, s), d)                                                                \
  /* Waits; returns (and clears) the stream's first asynchronous error. */   \
  X(core, WAIT, int, stream_synchronize,                                      \
    (mgpu__bdevice *d, mgpu__bstream *s), (d, s), d)                          \
  /* 0 done, MGPU_EAGAIN pending, or the asynchronous error. */              \
  X(core, PLAIN, int, stream_query, (mgpu__bdevice *d, mgpu__bstream *s),     \
    (d, s), d)                                                                \
  X(core, PLAIN, void *, stream_native, (mgpu__bstream *s), (s), NULL)        \
  /* Optional: work that native, a stream of the backend's own kind that     \
   * another library made (a cudaStream_t; 1 and 2 the legacy and            \
   * per-thread default streams), queues from now on waits for the work      \
   * queued on s so far, without blocking the host. NULL: the backend has    \
   * no such streams. */                                                      \
  X(core, FAIL, int, stream_order_native,                                     \
    (mgpu__bdevice *d, mgpu__bstream *s, void *native), (d, s, native), d)    \
  X(core, FAIL, int, event_create, (mgpu__bdevice *d, mgpu__bevent **e),      \
    (d, e), d)                                                                \
  X(core, PLAIN, void, event_destroy, (mgpu__bdevice *d, mgpu__bevent *e),    \
    (d, e), d)                                                                \
  X(core, FAIL, int, event_record,                                            \
    (mgpu__bdevice *d, mgpu__bevent *e, mgpu__bstream *s), (d, e, s), d)      \
  X(core, WAIT, int, event_synchronize, (mgpu__bdevice *d, mgpu__bevent *e),  \
    (d, e), d)                                                                \
  X(core, PLAIN, int, event_query, (mgpu__bdevice *d, mgpu__bevent *e),       \
    (d, e), d)                                                                \
  X(core, PLAIN, int, event_elapsed_ms, (mgpu__bdevice *d,                    \
                                         mgpu__bevent *start,                 \
                                         mgpu__bevent *end, float *ms),       \
    (d, start, end, ms), d)                                                   \
  /* s (of d) waits for e (of ed, same backend, maybe another device). */    \
  X(core, FAIL, int, stream_wait_event, (mgpu__bdevice *d, mgpu__bstream *s,  \
                                         mgpu__bdevice *ed, mgpu__bevent *e), \
    (d, s, ed, e), d)                                                         \
  /* Asynchronous copy on s. For H2D/D2H the host side may be pageable. */   \
  X(core, FAIL, int, memcpy_async, (mgpu__bdevice *d, mgpu__bstream *s,       \
                                    void *dst, const void *src, size_t size,  \
                                    mgpu__copy_kind kind),                    \
    (d, s, dst, src, size, kind), d)                                          \
  X(core, FAIL, int, memset_async, (mgpu__bdevice *d, mgpu__bstream *s,       \
                                    void *dst, int value, size_t size),       \
    (d, s, dst, value, size), d)                                              \
  /* Pitched copy on s (as cudaMemcpy2DAsync): height rows of width bytes,   \
   * rows dpitch / spitch bytes apart; either side may also be a peer's      \
   * memory this device reaches directly. */                                  \
  X(core, PLAIN, int, memcpy2d_async,                                         \
    (mgpu__bdevice *d, mgpu__bstream *s, void *dst, size_t dpitch,            \
     const void *src, size_t spitch, size_t width, size_t height,             \
     mgpu__copy_kind kind),                                                   \
    (d, s, dst, dpitch, src, spitch, width, height, kind), d)                 \
  /* args (args_size bytes) must be copied before returning. */              \
  X(core, FAIL, int, launch, (mgpu__bdevice *d, mgpu__bstream *s,             \
                              const mgpu_kernel *k, mgpu_dim3 grid,           \
                              mgpu_dim3 block, const void *args,              \
                              size_t args_size),                              \
    (d, s, k, grid, block, args, args_size), d)                               \
  X(core, FAIL, int, builtin, (mgpu__bdevice *d, mgpu__bstream *s,            \
                               const mgpu__builtin *b), (d, s, b), d)         \
  /* fn(arg) runs once earlier work on s is done; later work waits for it.   \
   * fn must not call the backend. */                                         \
  X(core, FAIL, int, host_callback, (mgpu__bdevice *d, mgpu__bstream *s,      \
                                     void (*fn)(void *arg), void *arg),       \
    (d, s, fn, arg), d)                                                       \
  /* Peer access between two devices of this backend. */                      \
  X(core, PLAIN, int, peer_can_access,                                        \
    (mgpu__bdevice *d, mgpu__bdevice *peer, int *yes), (d, peer, yes), d)     \
  X(core, FAIL, int, peer_enable, (mgpu__bdevice *d, mgpu__bdevice *peer),    \
    (d, peer), d)                                                             \
  X(core, PLAIN, int, peer_disable, (mgpu__bdevice *d, mgpu__bdevice *peer),  \
    (d, peer), d)                                                             \
  /* Direct copy from src (on sd) to dst (on dd), ordered on s, which        \
   * belongs to dd or sd (the one named by s_dev). */                        \
  X(core, FAIL, int, memcpy_peer_async,                                       \
    (mgpu__bdevice *dd, void *dst, mgpu__bdevice *sd, const void *src,        \
     size_t size, mgpu__bdevice *s_dev, mgpu__bstream *s),                    \
    (dd, dst, sd, src, size, s_dev, s), s_dev)

/* Sub-table claim: lets the calling thread run work in a stream's place.
 * Offered where the device's memory is the caller's (the host backend).
 * stream_claim returns 1 when s has nothing queued or running, and then
 * holds s as if a worker ran an operation of it: work queued meanwhile
 * waits, and synchronize waits for the claim. stream_release ends the claim
 * (and hands what was queued meanwhile to the workers). 0: s is busy,
 * nothing changed. */
#define MGPU__BACKEND_CLAIM_SLOTS(X)                                          \
  X(claim, PLAIN, int, stream_claim, (mgpu__bdevice *d, mgpu__bstream *s),    \
    (d, s), d)                                                                \
  X(claim, PLAIN, void, stream_release, (mgpu__bdevice *d, mgpu__bstream *s), \
    (d, s), d)                                                                \
  /* For work of a microsecond or so: when s has nothing queued or running   \
   * and d's lock is free at once, returns 1 with d's lock held, which keeps \
   * every stream of d as it is (nothing is queued, run or synchronized)     \
   * until stream_unlock_idle; the caller runs its work in s's place         \
   * meanwhile. Cheaper than a claim and its release (one lock instead of    \
   * two, no counts); never waits, so a caller may hold several devices'     \
   * locks this way. 0: nothing held. */                                      \
  X(claim, PLAIN, int, stream_lock_idle, (mgpu__bdevice *d,                   \
                                          mgpu__bstream *s), (d, s), d)       \
  X(claim, PLAIN, void, stream_unlock_idle, (mgpu__bdevice *d,                \
                                             mgpu__bstream *s), (d, s), d)

/* Sub-table mempool: a stream-ordered allocator (cudaMallocAsync). NULL:
 * the core's own mempool over mem_alloc and host_callback. */
#define MGPU__BACKEND_MEMPOOL_SLOTS(X)                                        \
  X(mempool, FAIL, int, alloc_async, (mgpu__bdevice *d, mgpu__bstream *s,     \
                                      size_t size, void **ptr),               \
    (d, s, size, ptr), d)                                                     \
  X(mempool, FAIL, int, free_async, (mgpu__bdevice *d, mgpu__bstream *s,      \
                                     void *ptr), (d, s, ptr), d)              \
  X(mempool, PLAIN, int, trim, (mgpu__bdevice *d), (d), d)

/* Sub-table ipc: memory other processes map (backend/ipc.h), for the store.
 * NULL: this backend cannot share memory between processes.
 * Export side: alloc makes exportable memory it never maps, described in
 * *out (a descriptor owned by *alloc until free); export_fd gives a new
 * descriptor to send (read-only where the kind allows when writable is 0),
 * or -1 for kinds without one.
 * Import side: import maps a description, reference-counted by its key (the
 * caller keeps and closes m->fd); protect makes a mapping read-only;
 * unimport drops a reference. */
#define MGPU__BACKEND_IPC_SLOTS(X)                                            \
  X(ipc, PLAIN, int, alloc, (mgpu__bdevice *d, size_t size,                   \
                             mgpu__ipc_mem *out, void **alloc),               \
    (d, size, out, alloc), d)                                                 \
  X(ipc, PLAIN, void, free, (mgpu__bdevice *d, void *alloc), (d, alloc), d)   \
  X(ipc, PLAIN, int, export_fd, (mgpu__bdevice *d, void *alloc,               \
                                 int writable), (d, alloc, writable), d)      \
  X(ipc, PLAIN, int, import, (mgpu__bdevice *d, const mgpu__ipc_mem *m,       \
                              int writable, void **ptr),                      \
    (d, m, writable, ptr), d)                                                 \
  X(ipc, PLAIN, int, protect, (mgpu__bdevice *d, void *ptr), (d, ptr), d)     \
  X(ipc, PLAIN, void, unimport, (mgpu__bdevice *d, void *ptr), (d, ptr), d)

/* Sub-table coll: a collective provider (NCCL on CUDA). NULL: the core runs
 * its own ring. comm_create gets one device per rank (whole GPUs,
 * distinct); run is called once per rank, between group_start and group_end
 * when one thread issues for several ranks. */
#define MGPU__BACKEND_COLL_SLOTS(X)                                           \
  X(coll, FAIL, int, comm_create, (mgpu__bdevice **devs, int n,               \
                                   void **comm), (devs, n, comm), NULL)       \
  X(coll, PLAIN, void, comm_destroy, (void *comm), (comm), NULL)              \
  /* Optional: aborts every rank of comm together and frees it, without      \
   * waiting for work in flight (kernels waiting for each other end). NULL:  \
   * comm_destroy is used after the devices are synchronized. */             \
  X(coll, PLAIN, void, comm_abort, (void *comm), (comm), NULL)                \
  X(coll, FAIL, int, group_start, (void), (), NULL)                           \
  X(coll, FAIL, int, group_end, (void), (), NULL)                             \
  X(coll, FAIL, int, run, (void *comm, int rank, const mgpu__coll_args *args, \
                           mgpu__bstream *s), (comm, rank, args, s), NULL)

/* Sub-table loss: a device that stops working. lose marks d lost (why: a
 * short reason for the details); from then on its queued work fails instead
 * of running and synchronizes return MGPU_EDEVLOST. lost returns 1 and
 * copies the reason while d is lost, else 0. The core's fault seam refuses
 * new work for a lost device. A backend that finds a device lost by itself
 * (a CUDA sticky error) marks it and returns MGPU_EDEVLOST from that call:
 * the seam then tells the layers above. NULL: devices of this backend are
 * never lost. */
#define MGPU__BACKEND_LOSS_SLOTS(X)                                           \
  X(loss, PLAIN, void, lose, (mgpu__bdevice *d, const char *why), (d, why),   \
    d)                                                                        \
  X(loss, PLAIN, int, lost, (mgpu__bdevice *d, char *why, size_t why_size),   \
    (d, why, why_size), d)

/* Sub-table graph: a device's part of a graph run as one operation of a
 * stream (backend/graph.h). create copies the part's nodes and kernel
 * arguments (not the memory they point to, nor the board); launch queues
 * one run of it on s, numbered launch (each launch of a graph greater than
 * the last); destroy drops the part once the runs queued are done with it.
 * A node's failure fails s as the same work issued alone would. NULL: the
 * graph layer issues the nodes one by one. */
#define MGPU__BACKEND_GRAPH_SLOTS(X)                                          \
  X(graph, FAIL, int, create, (mgpu__bdevice *d,                              \
                               const struct mgpu__bgraph_part *part,          \
                               void **graph), (d, part, graph), d)            \
  X(graph, FAIL, int, launch, (mgpu__bdevice *d, void *graph,                 \
                               mgpu__bstream *s, uint64_t launch),            \
    (d, graph, s, launch), d)                                                 \
  /* A launch that failed before this part was queued: posts the part's      \
   * signals of that launch as failed, so that the parts already queued do   \
   * not wait for ever. With launch 0, a part already queued (the launch     \
   * failed after it): it takes over no failures from then on, and its       \
   * signals, posted as 1, stay at any later launch's value. */              \
  X(graph, PLAIN, void, cancel, (mgpu__bdevice *d, void *graph,               \
                                 uint64_t launch), (d, graph, launch), d)     \
  X(graph, PLAIN, void, destroy, (mgpu__bdevice *d, void *graph),             \
    (d, graph), d)

/* The sub-tables: member of mgpu__backend_ops, type, slot list. */
#define MGPU__BACKEND_SUBTABLES(X)                                            \
  X(claim, mgpu__backend_claim_ops, MGPU__BACKEND_CLAIM_SLOTS)                \
  X(mempool, mgpu__backend_mempool_ops, MGPU__BACKEND_MEMPOOL_SLOTS)          \
  X(ipc, mgpu__backend_ipc_ops, MGPU__BACKEND_IPC_SLOTS)                      \
  X(coll, mgpu__backend_coll_ops, MGPU__BACKEND_COLL_SLOTS)                   \
  X(loss, mgpu__backend_loss_ops, MGPU__BACKEND_LOSS_SLOTS)                   \
  X(graph, mgpu__backend_graph_ops, MGPU__BACKEND_GRAPH_SLOTS)

#define MGPU__BACKEND_SLOT_MEMBER(group, seam, ret, name, params, args, dev) \
  ret(*name) params;
#define MGPU__BACKEND_SUBTABLE_TYPE(member, type, slots)                      \
  typedef struct type {                                                       \
    slots(MGPU__BACKEND_SLOT_MEMBER)                                          \
  } type;
MGPU__BACKEND_SUBTABLES(MGPU__BACKEND_SUBTABLE_TYPE)

/* Where a device's memory (MGPU_MEM_DEVICE) lives. */
typedef enum mgpu__mem_model {
  /* The process's own memory: the CPU reads and writes it, the devices are
   * placed on NUMA nodes by id, their budget is MGPU_HOST_MEM, their peer
   * access is MGPU_HOST_PEER's, and their link is host memory. */
  MGPU__MEM_MODEL_HOST = 0,
  /* The device's own memory, reached through the backend's copies. */
  MGPU__MEM_MODEL_DEVICE = 1
} mgpu__mem_model;

/* Which member of mgpu_kernel runs on a backend's devices. */
typedef enum mgpu__kernel_variant {
  MGPU__KERNEL_HOST_FN = 0,    /* host_fn */
  MGPU__KERNEL_CUDA_FN = 1,    /* cuda_fn */
  MGPU__KERNEL_OPENCL_SRC = 2  /* opencl_src */
} mgpu__kernel_variant;

/* What differs between backends, asked instead of the backend's kind. */
typedef struct mgpu__backend_caps {
  mgpu__mem_model mem_model;
  /* Bit (1u << kind) set for each mgpu_mem_kind the CPU reads and writes
   * directly (a collective or copy may then complete on the calling
   * thread). */
  unsigned host_visible;
  /* 1: the splits of one physical device (one ordinal) address one memory,
   * so copies between them are copies within the device. */
  int splits_share_memory;
  mgpu__kernel_variant kernel_variant;
  /* DLPack device types (DLDeviceType, mgpu/dlpack.h) of this backend's
   * device and unified memory (kDLCPU where the CPU's), and the type whose
   * memory a device takes as its pinned memory (0: none). */
  int dlpack_device;
  int dlpack_unified;
  int dlpack_pinned;
  /* The staging chunk of copies from this backend's devices when neither
   * the caller nor MGPU_STAGING_CHUNK set one (docs/PERF.md). */
  size_t staging_chunk;
  /* 1: a graph may fill 16-bit types (float16, bfloat16) on its devices. */
  int graph_fill_16bit;
} mgpu__backend_caps;

typedef struct mgpu__backend_ops {
  const char *name;        /* "host", "cuda", "opencl" */
  mgpu_backend_kind kind;  /* for names and device properties only */
  mgpu__backend_caps caps;
  MGPU__BACKEND_CORE_SLOTS(MGPU__BACKEND_SLOT_MEMBER)
  /* The optional sub-tables, NULL where absent. */
  const mgpu__backend_claim_ops *claim;
  const mgpu__backend_mempool_ops *mempool;
  const mgpu__backend_ipc_ops *ipc;
  const mgpu__backend_coll_ops *coll;
  const mgpu__backend_loss_ops *loss;
  const mgpu__backend_graph_ops *graph;
} mgpu__backend_ops;

typedef const mgpu__backend_ops *(*mgpu__plugin_entry_fn)(
    const mgpu__backend_env *env);

/* The host backend, always built in. */
const mgpu__backend_ops *mgpu__host_backend(const mgpu__backend_env *env);

/* Loads the CUDA plugin; NULL with the error detail set when it cannot. */
const mgpu__backend_ops *mgpu__cuda_backend_load(const mgpu__backend_env *env);
void mgpu__cuda_backend_unload(void);

/* Loads the OpenCL plugin (libmgpu-opencl.so), the same way. */
const mgpu__backend_ops *mgpu__opencl_backend_load(
    const mgpu__backend_env *env);
void mgpu__opencl_backend_unload(void);

#endif /* MGPU_BACKEND_H */
