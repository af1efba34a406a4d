/* Internal interface of the core, shared by every layer of libmgpu.
 *
 * Handles: every public handle (buffer, stream, event) is an encoded slot
 * number plus a generation, never a pointer. Looking a handle up checks the
 * generation, so a freed handle is reported as MGPU_EFREED and never
 * dereferenced, even when its slot was reused. Layers resolve handles to the
 * internal structs below with mgpu__buf_get and friends, which also write the
 * error detail.
 */
#ifndef MGPU_CORE_INTERNAL_H
#define MGPU_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "mgpu/error.h"
#include "mgpu/metrics.h"
#include "util/thread.h"

/* ---- errors and logging (error.c, log.c) ---- */

/* Writes the thread's detail ("device 2: ...") and returns code. */
int mgpu__error(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int mgpu__verror(int code, const char *fmt, va_list ap);
void mgpu__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mgpu__log_set_level(int level);
int mgpu__log_level(void);

/* ---- configuration (config.c) ---- */

/* Copies *in (or the defaults for NULL), fills every field left at its
 * initializer from the environment and then the defaults. */
int mgpu__config_resolve(const mgpu_config *in, mgpu_config *out);

/* The pid of the process that called mgpu_init, when this process is a child
 * forked from it after mgpu_init (every call then fails with MGPU_EFORK);
 * 0 otherwise. */
int mgpu__forked_from(void);
/* Counts the successful mgpu_init calls: state kept per thread from an
 * earlier one (the current device) is stale when this has moved. */
unsigned mgpu__init_epoch(void);

/* The backend table a device uses: real's, with a fault site in front of
 * every fallible entry (backend_fault.c). One per backend kind. */
const mgpu__backend_ops *mgpu__backend_fault_wrap(
    const mgpu__backend_ops *real);
/* MGPU_EFORK with its detail, for an entry point that checks by itself (one
 * whose handles are not in the handle table). */
int mgpu__fork_error(const char *what);
/* Parses "512M", "2G", "1048576". Returns 0 or MGPU_EINVAL. */
int mgpu__parse_size(const char *s, size_t *out);

/* One entry of MGPU_DEVICES. */
typedef struct mgpu__devspec_entry {
  mgpu_backend_kind backend;
  int all;         /* "cuda": every GPU */
  int ordinal;     /* "cuda:1" */
  int count;       /* "host:4" */
  int split;       /* "cuda:0/4": 4 */
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
  mgpu__bdevice *b;
  mgpu__device_spec spec;
  size_t budget;             /* bytes; 0: no budget of mgpu's own */

  /* Memory accounting: atomics, updated by any thread. */
  _Atomic uint64_t mem_in_use;
  _Atomic uint64_t mem_peak;
  /* Counters of mgpu_metrics, indexed by enum mgpu__metric. */
  _Atomic uint64_t counters[32];

  /* The device's host thread and its queue. queue_lock guards queue_head,
   * queue_tail and stopping; the host thread is the only consumer. */
  mgpu__thread host_thread;
  mgpu__mutex queue_lock;
  mgpu__cond queue_cond;
  mgpu__work_item *queue_head, *queue_tail;
  int stopping;

  /* Every stream of the device, for mgpu_device_synchronize and shutdown.
   * streams_lock guards the list. */
  mgpu__mutex streams_lock;
  struct mgpu__stream *streams;

  /* Internal streams lent to synchronous calls (mgpu_memcpy_htod ...).
   * spare_lock guards spare_streams and spare_count. */
  mgpu__mutex spare_lock;
  struct mgpu__stream *spare_streams[8];
  int spare_count;

  /* The core's stream-ordered pool (used when the backend has none).
   * pool_lock guards the free lists. */
  mgpu__mutex pool_lock;
  struct mgpu__pool_block *pool_free[64]; /* by power-of-two size class */
  uint64_t pool_cached_bytes;
} mgpu__device;

/* NULL when not initialized or out of range; sets no error. */
mgpu__device *mgpu__device_get(int id);
/* The same, setting MGPU_ENOINIT / MGPU_ENODEV with a detail naming id. */
int mgpu__device_check(int id, mgpu__device **out);
int mgpu__ndevices(void);
/* The device whose host thread is calling, or -1. */
int mgpu__current_host_thread_device(void);
/* The resolved configuration (valid while initialized). */
const mgpu_config *mgpu__config(void);
/* Starts and stops a device's host thread (device.c). */
int mgpu__device_thread_start(mgpu__device *d);
void mgpu__device_thread_stop(mgpu__device *d);

/* ---- metrics (metrics.c) ---- */

enum mgpu__metric {
#define MGPU__METRIC_ENUM(name, doc) MGPU__M_##name,
  MGPU_METRICS_MAP(MGPU__METRIC_ENUM)
#undef MGPU__METRIC_ENUM
  MGPU__M_COUNT
};

void mgpu__metric_add(int dev, enum mgpu__metric m, uint64_t value);

/* ---- handles (handle.c) ---- */

typedef enum mgpu__htype {
  MGPU__H_BUFFER = 1,
  MGPU__H_STREAM = 2,
  MGPU__H_EVENT = 3,
  /* The coll and chan layers' objects (src/coll/handles.c). */
  MGPU__H_COMM = 4,
  MGPU__H_BARRIER = 5,
  MGPU__H_STREAM_BARRIER = 6,
  MGPU__H_CHANNEL = 7
} mgpu__htype;

/* Stores obj and returns its new handle (0 when out of slots). */
uintptr_t mgpu__handle_new(mgpu__htype type, void *obj);
/* The object of a live handle, or NULL with MGPU_EBADHANDLE / MGPU_EFREED in
 * *err. */
void *mgpu__handle_get(uintptr_t h, mgpu__htype type, int *err);
/* Retires the handle; later lookups give MGPU_EFREED. Returns the object,
 * or NULL with *err set. */
void *mgpu__handle_release(uintptr_t h, mgpu__htype type, int *err);
/* Calls fn on every live object of the type (used by shutdown). */
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
} mgpu__buf;

typedef struct mgpu__stream {
  uintptr_t handle; /* 0 for internal streams */
  int dev;
  mgpu__bstream *b;
  /* Links in the device's stream list (device streams_lock). */
  struct mgpu__stream *prev, *next;
} mgpu__stream;

typedef struct mgpu__event {
  uintptr_t handle;
  int dev;
  mgpu__bevent *b;
} mgpu__event;

/* Resolve public handles. what names the argument in the detail ("dst"). */
int mgpu__buf_get(const mgpu_buffer *h, const char *what, mgpu__buf **out);
int mgpu__stream_get(mgpu_stream *h, mgpu__stream **out);
int mgpu__event_get(mgpu_event *h, mgpu__event **out);
/* Checks that [offset, offset+size) lies in the buffer. */
int mgpu__buf_check_range(const mgpu__buf *b, const char *what, size_t offset,
                          size_t size);

/* Borrow an internal stream of the device for a synchronous call; give it
 * back with mgpu__spare_put (after synchronizing it). */
int mgpu__spare_get(int dev, mgpu__stream **out);
void mgpu__spare_put(mgpu__stream *s);
void mgpu__spare_drain(mgpu__device *d);

/* Frees every buffer, stream and event still open (shutdown). */
void mgpu__memory_release_all(void);
void mgpu__streams_release_all(void);
void mgpu__pool_release(mgpu__device *d);

/* ---- copies across devices (copy/peer.c) ---- */

/* Copies size bytes between two device buffers of different devices of one
 * backend, ordered on s (which belongs to dst->dev or src->dev): it starts
 * after the work queued on s before it, and work queued on s after it (or
 * waiting on an event recorded on s after it) sees the data. Ranges and
 * overlap are already checked. Counts its metrics. */
int mgpu__copy_between_devices(mgpu__buf *dst, size_t dst_offset,
                               const mgpu__buf *src, size_t src_offset,
                               size_t size, mgpu__stream *s);
/* Called by mgpu_shutdown before the devices close. */
void mgpu__copy_shutdown(void);

/* ---- topology (topo/) ---- */

/* Pins the calling thread (a device host thread, started before mgpu_init
 * returns) near device d. */
void mgpu__topo_bind_current_thread(mgpu__device *d);

#endif /* MGPU_CORE_INTERNAL_H */
