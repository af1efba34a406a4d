/* Internal interface of the core, shared by every layer of libmgpu.
 *
 * Handles: every public handle (buffer, stream, event, communicator,
 * barrier, channel, pool, distribution, work) is an encoded slot number plus
 * a generation, never a pointer. Looking a handle up checks the generation,
 * so a freed handle is reported as MGPU_EFREED and never dereferenced, even
 * when its slot was reused, and takes a use of it that a destroy waits for.
 * Layers resolve handles to the internal structs below with mgpu__buf_get
 * and friends, which also write the error detail, and give them back with
 * the matching put (mgpu__buf_put...) when the call is done with them.
 */
#ifndef MGPU_CORE_INTERNAL_H
#define MGPU_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "mgpu/error.h"
#include "obs/flight.h"
#include "obs/obs.h"
#include "obs/trace.h"
#include "util/log.h"
#include "util/thread.h"

/* ---- configuration (config.c) ---- */

/* Copies *in (or the defaults for NULL), fills every field left at its
 * initializer from the environment and then the defaults. */
int mgpu__config_resolve(const mgpu_config *in, mgpu_config *out);

/* The value of the environment variable name from the one table of
 * variables (config.c): the environment's, else the table's text default,
 * else NULL (an empty value is unset). A name not in the table is a bug:
 * an assertion in debug builds, NULL otherwise. */
const char *mgpu__env(const char *name);

/* Counts the mgpu_init calls: state kept per thread from an earlier one
 * (the current device) is stale when this has moved. */
unsigned mgpu__init_epoch(void);

/* Marks device dev lost (why: the reason the details give), as a GPU's
 * sticky error would: the test call for lost devices. MGPU_ENOTSUP for a
 * backend that cannot. */
int mgpu__device_lose(int dev, const char *why);
/* 1 when device dev is lost (mgpu_device_status says MGPU_DEVICE_LOST). */
int mgpu__device_is_lost(int dev);
/* The core found device dev lost (the test call, a backend call that
 * returned MGPU_EDEVLOST, new work refused for it): runs the device-lost
 * hooks, once per device and mgpu_init. Any thread, any locks held. */
void mgpu__device_lost_seen(int dev);

/* The backend table a device uses: real's, with a fault site in front of
 * every fallible entry (backend_fault.c). One per backend. */
const mgpu__backend_ops *mgpu__backend_fault_wrap(
    const mgpu__backend_ops *real);

/* Parses "512M", "2G", "1048576". Returns 0 or MGPU_EINVAL. */
int mgpu__parse_size(const char *s, size_t *out);

/* One entry of MGPU_DEVICES. */
typedef struct mgpu__devspec_entry {
  mgpu_backend_kind backend;
  int all;         /* "cuda": every GPU */
  int ordinal;     /* "cuda:1" */
  int count;       /* "host:4" */
  int split;       /* "cuda:0/4": 4 */
  int local;       /* "local": one device picked by the launcher's local
                      rank, which is in ordinal */
  int local_size;  /* ranks on the node as the launcher says, 0 unknown */
} mgpu__devspec_entry;

/* Parses MGPU_DEVICES into at most max entries; the detail names a bad
 * token. */
int mgpu__parse_devices(const char *spec, mgpu__devspec_entry *out, int max,
                        int *n);

/* ---- devices (init.c, device.c) ---- */

typedef struct mgpu__work_item mgpu__work_item;

typedef struct mgpu__device {
  /* Set once by mgpu_init before any other thread can see the device,
   * read-only afterwards. */
  int id;
  const mgpu__backend_ops *ops;
  mgpu__bdevice *bdev; /* the backend's device */
  mgpu__device_spec spec;
  size_t budget;             /* bytes; 0: no budget of mgpu's own */

  /* Memory counted against the budget: an atomic, updated by any thread.
   * (The mgpu_metrics gauge and its peak are obs's, src/obs/.) */
  _Atomic uint64_t mem_in_use;

  /* The device's host thread and its queue. queue_lock guards queue_head,
   * queue_tail and stopping; the host thread is the only consumer. */
  mgpu__thread host_thread;
  mgpu__mutex queue_lock;
  mgpu__cond queue_cond;
  mgpu__work_item *queue_head, *queue_tail;
  int stopping;
  /* The device whose host thread this device's host thread waits for (in
   * mgpu_run_on_device or mgpu_work_wait), or -1: written by this host
   * thread when it starts a wait and by the thread that completes the work
   * it waits for, read by any host thread checking for a cycle (device.c). */
  _Atomic int waits_for;
  /* 1 while the queue holds work or stopping is set: written under
   * queue_lock, read without it by the host thread's spin. */
  _Atomic int queue_ready;
  /* Spin budgets (util/thread.h): the host thread's watch for work, and
   * callers' watch for their result. */
  mgpu__spin host_spin, caller_spin;
  /* The fast lane (device.c): one mgpu_run_on_device from a thread that is
   * no host thread hands its function over here instead of through the
   * queue, when the queue is empty. Three cache lines, each written by one
   * side only, so that a round trip moves two lines (the request to the
   * host thread, the answer back), as a two-thread ping-pong does:
   *  - lane: owner (LANE_FREE, taken by a caller's CAS, LANE_CLOSED once
   *    the host thread stopped) and the callers' spin budget; callers only
   *    (the host thread closes it once);
   *  - req: written by the caller that owns the lane: fn, arg, detail,
   *    its CPU, then posted (a count, +1 per request); caller_parked, 1
   *    while that caller sleeps on queue_cond (under queue_lock);
   *  - ans: written by the host thread: result, its CPU, then done (the
   *    count of the request answered); host_parked, 1 while it sleeps on
   *    queue_cond (under queue_lock).
   * Each side signals queue_cond only when the other sleeps. */
  struct {
    _Alignas(64) _Atomic int owner;
    mgpu__spin spin; /* the caller's watch for its answer */
  } lane;
  struct {
    _Alignas(64) _Atomic unsigned posted;
    _Atomic int caller_parked;
    _Atomic int caller_cpu; /* mgpu__cpu_now, -1: none yet */
    mgpu_device_fn fn;
    void *arg;
    char *detail; /* the caller's buffer for the detail of a failure */
  } req;
  struct {
    _Alignas(64) _Atomic unsigned done;
    _Atomic int host_parked;
    _Atomic int host_cpu; /* mgpu__cpu_now, -1: none yet */
    int result;
  } ans;
  char lane_end_pad[64]; /* what follows lives on other lines */
  /* 1 once the device-lost hooks ran for this device (device.c): an
   * exchange, so that of two threads finding the loss one runs them. */
  _Atomic int lost_seen;

  /* Every stream of the device, for mgpu_device_synchronize and shutdown.
   * streams_lock guards the list; it is never held across a wait for a
   * stream (streams_cond: a stream's syncs fell to 0). */
  mgpu__mutex streams_lock;
  mgpu__cond streams_cond;
  struct mgpu__stream *streams;

  /* Internal streams lent to synchronous calls (mgpu_memcpy_htod ...).
   * spare_lock guards spare_streams and spare_count. */
  mgpu__mutex spare_lock;
  struct mgpu__stream *spare_streams[8];
  int spare_count;

  /* The core's stream-ordered memory pool, the mempool (used when the
   * backend has none).
   * mempool_lock guards the free lists. */
  mgpu__mutex mempool_lock;
  struct mgpu__mempool_block *mempool_free[64]; /* by power-of-two size class */
  uint64_t mempool_cached_bytes;
} mgpu__device;

/* 1 when the CPU reads and writes d's memory of kind directly (its
 * backend's caps). */
static inline int mgpu__device_host_visible(const mgpu__device *d,
                                            mgpu_mem_kind kind) {
  return (d->ops->caps.host_visible >> kind) & 1u;
}

/* 1 when k has the variant that runs on a backend of the given caps. */
static inline int mgpu__kernel_has_variant(const mgpu_kernel *k,
                                           mgpu__kernel_variant v) {
  switch (v) {
    case MGPU__KERNEL_HOST_FN: return k->host_fn != NULL;
    case MGPU__KERNEL_CUDA_FN: return k->cuda_fn != NULL;
    case MGPU__KERNEL_OPENCL_SRC: return k->opencl_src != NULL;
  }
  return 0;
}

/* NULL when not initialized or out of range; sets no error. */
mgpu__device *mgpu__device_get(int id);
/* The same, setting MGPU_ENOINIT / MGPU_ENODEV with a detail naming id. */
int mgpu__device_check(int id, mgpu__device **out);
/* The gate mgpu_shutdown closes (init.c): a call that uses the device table
 * without holding a handle enters first (MGPU_ENOINIT once shutdown has
 * begun) and leaves when done; shutdown waits for the calls inside. Nested
 * enters on one thread pass. */
int mgpu__lib_enter(const char *what);
void mgpu__lib_leave(void);
/* Marks the calling thread as one the library joins at shutdown (what
 * names it): mgpu_shutdown called on it is refused, it would wait for
 * itself. */
void mgpu__thread_owned_by(const char *what);
/* mgpu__lib_enter, then mgpu__device_check; leaves again on failure. */
int mgpu__device_enter(int id, mgpu__device **out);
int mgpu__ndevices(void);
/* The device whose host thread is calling, or -1. */
int mgpu__current_host_thread_device(void);
/* The resolved configuration (valid while initialized). */
const mgpu_config *mgpu__config(void);
/* Per-call timeouts in milliseconds: 0 is MGPU_TIMEOUT (mgpu_config's
 * timeout_ms), -1 forever. mgpu__timeout_ms resolves 0 to that value;
 * mgpu__deadline gives the mgpu__now_ns time the wait ends, 0 for never. */
int mgpu__timeout_ms(int timeout_ms);
uint64_t mgpu__deadline(int timeout_ms);
/* Starts and stops a device's host thread (device.c). */
int mgpu__device_thread_start(mgpu__device *d);
void mgpu__device_thread_stop(mgpu__device *d);

/* ---- handles (handle.c) ---- */

/* Every kind of public handle, one line each: the enum name, the word the
 * error details use, and what happened to a stale one. Adding a kind of
 * handle is one line here; its layer then calls mgpu__handle_new, _get and
 * _put, and _close and _retire (or _release) to destroy, with its MGPU__H_
 * value. At most 255 kinds. */
#define MGPU__HANDLE_TYPES(XX)                        \
  XX(BUFFER, "buffer", "freed")                       \
  XX(STREAM, "stream", "destroyed")                   \
  XX(EVENT, "event", "destroyed")                     \
  XX(COMM, "communicator", "destroyed")               \
  XX(BARRIER, "barrier", "destroyed")                 \
  XX(STREAM_BARRIER, "stream barrier", "destroyed")   \
  XX(CHANNEL, "channel", "destroyed")                 \
  XX(POOL, "task pool", "destroyed")                  \
  XX(DIST, "distribution", "destroyed")               \
  XX(WORK, "work handle", "waited")                   \
  XX(LIBRARY, "device table", "shut down")            \
  XX(GRAPH, "graph", "destroyed")                     \
  XX(GRAPH_EXEC, "executable graph", "destroyed")

typedef enum mgpu__htype {
  MGPU__H_NONE = 0,
#define MGPU__HTYPE_ENUM(name, word, gone) MGPU__H_##name,
  MGPU__HANDLE_TYPES(MGPU__HTYPE_ENUM)
#undef MGPU__HTYPE_ENUM
  MGPU__H_COUNT
} mgpu__htype;

/* Stores obj and returns its new handle (0 when out of slots). */
uintptr_t mgpu__handle_new(mgpu__htype type, void *obj);
/* The one lookup of every public handle: the object of a live handle of the
 * type, with a use taken that the caller gives back with mgpu__handle_put
 * (the object cannot be freed in between); or NULL with the code in *err
 * (MGPU_EBADHANDLE for NULL or not a handle of the type, MGPU_EFREED for a
 * destroyed or closing one) and the detail written; what names the argument
 * ("dst", "comm"). No lock: a load and a compare-and-swap. */
void *mgpu__handle_get(uintptr_t h, mgpu__htype type, const char *what,
                       int *err);
/* mgpu__handle_get without a detail: NULL when h is not open. */
void *mgpu__handle_hold(uintptr_t h, mgpu__htype type);
/* Gives back the use a successful mgpu__handle_get took (h 0: nothing). */
void mgpu__handle_put(uintptr_t h);
/* First half of a destroy: later lookups (and a second close) give
 * MGPU_EFREED; the calls inside go on. Returns the object, or NULL with
 * *err and the detail set as mgpu__handle_get. The caller must hold no use
 * of h, wakes whatever the calls inside may wait on, then retires. */
void *mgpu__handle_close(uintptr_t h, mgpu__htype type, const char *what,
                         int *err);
/* Second half: waits until every call inside has put the handle back, then
 * frees the slot. After it the object may be freed. */
void mgpu__handle_retire(uintptr_t h);
/* Close and retire: for objects whose calls never wait on anything. */
void *mgpu__handle_release(uintptr_t h, mgpu__htype type, const char *what,
                           int *err);
/* Pins: uses for a batch of handles looked up together and given back
 * together, by one thread (one atomic exchange per batch instead of two
 * atomic operations per handle; a destroy waits for a pin as for a use).
 * mgpu__handle_pin records the k handles (any value, 0 and stale ones
 * included) and returns a mark for mgpu__handle_unpin, or -1 when the
 * thread has no room left or the process is a child forked after
 * mgpu_init (then look them up with mgpu__handle_get). Each
 * pinned handle is then checked with mgpu__handle_pinned (the object, or
 * NULL with *err and the detail of mgpu__handle_get); its object stays valid
 * until mgpu__handle_unpin(mark) gives back every pin taken since mark. */
int mgpu__handle_pin(const uintptr_t *h, int k);
void *mgpu__handle_pinned(uintptr_t h, mgpu__htype type, const char *what,
                          int *err);
void mgpu__handle_unpin(int mark);
/* Lending: a thread that acts for the holders of some handles (the thread
 * that issues a collective for every rank, while the other ranks' threads
 * hold their handles and wait for it) lends them to itself with
 * mgpu__handle_lend (h[0 .. k), at most MGPU__LEND_MAX, until
 * mgpu__handle_lend_end). Its lookups of a lent handle then succeed while
 * the handle is closing (a free has begun and waits for the holders), so a
 * call the holders are inside runs to its end instead of failing half-way.
 * Lookups of a handle not lent, and of a lent one that is gone, fail as
 * usual. */
#define MGPU__LEND_MAX (4 * MGPU_MAX_DEVICES)
void mgpu__handle_lend(const uintptr_t *h, int k);
void mgpu__handle_lend_end(void);
/* 1 when a free or destroy of h has begun (or h is gone; 0 for h 0): a
 * call holding h and waiting for another party gives up (MGPU_EFREED)
 * instead of keeping the free waiting. */
int mgpu__handle_closing(uintptr_t h);
/* How many calls hold h now, pins included (tests and diagnostics; -1: not
 * a handle). */
int mgpu__handle_users(uintptr_t h, mgpu__htype type);
/* Closes every live object of the type and calls fn on it, which must free
 * it and retire its handle (used by shutdown; one pass over the table). */
void mgpu__handle_foreach(mgpu__htype type, void (*fn)(void *obj, void *arg),
                          void *arg);

/* ---- buffers, streams, events (memory.c, stream.c) ---- */

typedef struct mgpu__buf {
  uintptr_t handle;
  int dev;
  mgpu_mem_kind kind;
  void *ptr;
  size_t size;       /* the size the user asked for */
  size_t alloc_size; /* what was taken (pool blocks round up) */
  int pooled;        /* 1: from a stream-ordered pool */
  /* Exports (mgpu_buffer_dlpack) alive, and what became of the handle
   * while they were: freed (mgpu_free, the memory waits for the last
   * export) or detached (mgpu_shutdown closed the device; the memory is
   * released with detached_free, or kept when that is NULL). Guarded by
   * the core's buffer reference lock (memory.c). */
  int exports;
  int freed, detached;
  void (*detached_free)(mgpu_mem_kind kind, void *ptr);
  /* Wrapped memory (mgpu_buffer_wrap): the core did not allocate it and
   * does not free it; release (may be NULL) is called instead. */
  int wrapped;
  _Atomic int readonly; /* writes refused with MGPU_EREADONLY */
  /* Freed only by the object that owns it (a store object's buffer:
   * mgpu__buffer_set_owned); mgpu_free refuses it meanwhile. */
  _Atomic int owned;
  mgpu_buffer_release_fn release;
  void *release_arg;
} mgpu__buf;

typedef struct mgpu__stream {
  uintptr_t handle; /* 0 for internal streams */
  int dev;
  mgpu__bstream *bstream; /* the backend's stream */
  /* Links in the device's stream list (device streams_lock). */
  struct mgpu__stream *prev, *next;
  /* mgpu_device_synchronize calls waiting on it (streams_lock): the stream
   * stays on the list until they are done. */
  int syncs;
  /* The capture the stream records into, or NULL (core/capture.h): written
   * by the graph layer under its capture lock, read by the entry points. */
  _Atomic(void *) capture;
  /* An asynchronous error of the stream's work that an internal wait
   * (mgpu__stream_wait_keep: mgpu_free, a communicator's destroy, an
   * abandoned copy) took from the backend, kept for the stream's next
   * synchronize, query, destroy or device synchronize, which reports it
   * once; 0: none. Written under the device's streams_lock; held_err is
   * read without it first. held_detail: its detail (allocated, or NULL). */
  _Atomic int held_err;
  char *held_detail;
} mgpu__stream;

typedef struct mgpu__event {
  uintptr_t handle;
  int dev;
  mgpu__bevent *bevent; /* the backend's event */
  /* 1 when the event was last recorded inside a graph capture that has
   * ended (set by the graph layer, cleared by a record outside a capture):
   * it stands for a point of a graph, not for work that was queued. */
  _Atomic int capture_ended;
} mgpu__event;

/* Resolve public handles. what names the argument in the detail ("dst").
 * Each successful get holds a use of the handle (a destroy waits for it) that
 * the matching put gives back. */
int mgpu__buf_get(const mgpu_buffer *h, const char *what, mgpu__buf **out);
int mgpu__stream_get(mgpu_stream *h, mgpu__stream **out);
int mgpu__event_get(mgpu_event *h, mgpu__event **out);
void mgpu__buf_put(mgpu__buf *b);
void mgpu__stream_put(mgpu__stream *s); /* internal streams (handle 0) too */
void mgpu__event_put(mgpu__event *e);
/* MGPU_EREADONLY with a detail naming what would have written, when the
 * buffer is read-only; else 0. Every call that writes into a buffer asks. */
int mgpu__buf_check_writable(const mgpu__buf *b, const char *what);
/* Makes a buffer read-only from now on (a store object once sealed). */
int mgpu__buffer_set_readonly(mgpu_buffer *h);
/* Marks a buffer as another object's (owned 1: mgpu_free refuses it with
 * MGPU_EINVAL naming it) or gives it back (0) before that object frees it. */
int mgpu__buffer_set_owned(mgpu_buffer *h, int owned);
/* Checks that [offset, offset+size) lies in the buffer. */
int mgpu__buf_check_range(const mgpu__buf *b, const char *what, size_t offset,
                          size_t size);

/* An export's reference on a buffer's memory: taken by mgpu_buffer_dlpack,
 * dropped by its deleter on any thread, also after mgpu_shutdown. The last
 * drop of a freed buffer releases its memory. */
void mgpu__buf_ref(mgpu__buf *b);
void mgpu__buf_unref(mgpu__buf *b);
/* Runs work on the calling thread in the stream's place: mgpu__stream_claim
 * returns 1 when the stream was idle and is now held (work queued on it
 * waits, synchronize waits) until mgpu__stream_release; 0 when it is busy or
 * its backend cannot lend it. The caller must touch only memory the host can
 * reach (the backend lends streams only where device memory is host
 * memory). */
int mgpu__stream_claim(mgpu__stream *s);
void mgpu__stream_release(mgpu__stream *s);
/* For work of a microsecond or so, cheaper than a claim: 1 when s was idle
 * and its device's lock free, which the caller then holds (nothing on the
 * device moves) until mgpu__stream_unlock_idle; 0 otherwise (nothing held;
 * never waits, so several may be held at once). */
int mgpu__stream_lock_idle(mgpu__stream *s);
void mgpu__stream_unlock_idle(mgpu__stream *s);

/* Waits for the work queued on every stream of dev, as
 * mgpu_device_synchronize, but also while a stream of dev captures a graph
 * (the captured calls are not queued): for what frees memory or handles
 * that queued work may still use (mgpu_free, a communicator's destroy).
 * The streams' errors are kept for their own reports (held_err): 0, or
 * the code of a dev that is not open. */
int mgpu__device_drain(int dev);
/* Waits for the work queued on s; an asynchronous error the backend
 * reports is kept for the caller's next report of s (held_err), not lost
 * by a wait that is not the caller's. */
void mgpu__stream_wait_keep(mgpu__stream *s);
/* Borrow an internal stream of the device for a synchronous call; give it
 * back with mgpu__spare_put (after synchronizing it). */
int mgpu__spare_get(int dev, mgpu__stream **out);
void mgpu__spare_put(mgpu__stream *s);
void mgpu__spare_drain(mgpu__device *d);

/* Frees every buffer, stream and event still open (shutdown). */
void mgpu__memory_release_all(void);
void mgpu__streams_release_all(void);
void mgpu__mempool_release(mgpu__device *d);

/* ---- hooks (init.c) ---- */

/* The layers below the core that register hooks, in the order of
 * docs/ARCHITECTURE.md's table (the same as tools/check-layers.py's):
 * hooks run by layer, never by link or load order. */
typedef enum {
  MGPU__LAYER_COPY = 1,
  MGPU__LAYER_TOPO,
  MGPU__LAYER_WORK,   /* part, sched, coll, chan, graph: beside each other */
  MGPU__LAYER_MODULE, /* mpi, store */
} mgpu__layer;

/* A layer below the core that keeps state of its own across mgpu_init and
 * mgpu_shutdown registers a hook here, so the core never calls down into
 * it. Shutdown hooks run in mgpu_shutdown after every device was
 * synchronized and before streams, buffers and devices are released, the
 * lowest layer first (a layer is torn down before the layers it uses);
 * hooks of one layer run in the reverse order of registration. Register
 * from a constructor (MGPU__ON_SHUTDOWN) or before mgpu_init; registering
 * the same function twice is a no-op. */
typedef void (*mgpu__hook_fn)(void);
void mgpu__on_shutdown(mgpu__hook_fn fn, mgpu__layer layer);

/* Registers fn as a shutdown hook of `layer` when the library is loaded. */
#define MGPU__ON_SHUTDOWN(fn, layer)                                      \
  __attribute__((constructor)) static void mgpu__register_##fn(void) {     \
    mgpu__on_shutdown(fn, layer);                                         \
  }

/* A layer below the core whose calls wait for devices (coll's barriers and
 * rendezvous) hears of a lost device through a hook, so that its waiters
 * wake at once instead of at their next look. fn(dev) runs on the thread
 * that found the loss, which may hold locks of any layer (a collective's
 * issue, a backend's device lock): it takes only a leaf lock of its own and
 * never blocks. Hooks run the highest layer first, so a layer hears of the
 * loss after the layers it uses. Register from a constructor
 * (MGPU__ON_DEVICE_LOST); at most 8 hooks; registering the same function
 * twice is a no-op. */
typedef void (*mgpu__lost_hook_fn)(int dev);
void mgpu__on_device_lost(mgpu__lost_hook_fn fn, mgpu__layer layer);

#define MGPU__ON_DEVICE_LOST(fn, layer)                                   \
  __attribute__((constructor)) static void mgpu__register_lost_##fn(void) { \
    mgpu__on_device_lost(fn, layer);                                      \
  }

/* The NUMA node nearest device d (device.c): the backend's answer when it
 * has one, else the node of its PCI bus id, else for host devices
 * id % mgpu__numa_count(). -1 when unknown. Works before mgpu_init has
 * returned (each device's host thread asks while it starts). */
int mgpu__device_numa_node(mgpu__device *d);

#endif /* MGPU_CORE_INTERNAL_H */
