/* The fault seam around backend calls. The core never calls a backend's
 * table directly: each device holds a copy of it whose fallible entries
 * first count one site of kind MGPU__FAULT_BACKEND named after the operation
 * ("memcpy_async", "launch", ...) and fail with MGPU_EBACKEND when a rule of
 * MGPU_FAULT (or mgpu__fault_set) says so, as a driver error would (or with
 * MGPU_EDEVLOST, the device lost, for a rule ending in "=devlost"), and
 * otherwise call through. A call for a lost device is refused, and a call
 * that returns MGPU_EDEVLOST for a device its backend now reports lost (a
 * CUDA sticky error) runs the core's device-lost hooks. The entries that
 * cannot fail (close, frees, queries, the native handle) are the backend's
 * own.
 *
 * There is one wrapped table per backend kind, so that two devices of the
 * same backend still share one table pointer (the core compares them). The
 * tables are filled on first use under wrap_lock and never change after. */
#include <stdio.h>

#include "core/internal.h"
#include "util/fault.h"

/* The fallible operations: name, parameters, arguments, and the device the
 * call is for (a mgpu__bdevice *, or NULL), which a lost device refuses. */
#define MGPU__FAULT_OPS(XX)                                                  \
  XX(open, (const mgpu__device_spec *spec, mgpu__bdevice **out),             \
     (spec, out), NULL)                                                            \
  XX(mem_alloc, (mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,          \
                 void **ptr), (d, kind, size, ptr), d)                          \
  XX(stream_create, (mgpu__bdevice *d, mgpu__bstream **s), (d, s), d)           \
  XX(event_create, (mgpu__bdevice *d, mgpu__bevent **e), (d, e), d)             \
  XX(event_record, (mgpu__bdevice *d, mgpu__bevent *e, mgpu__bstream *s),    \
     (d, e, s), d)                                                              \
  XX(event_record_claimed, (mgpu__bdevice *d, mgpu__bevent *e,               \
                            mgpu__bstream *s), (d, e, s), d)                    \
  XX(stream_wait_event, (mgpu__bdevice *d, mgpu__bstream *s,                 \
                         mgpu__bdevice *ed, mgpu__bevent *e), (d, s, ed, e), d) \
  XX(memcpy_async, (mgpu__bdevice *d, mgpu__bstream *s, void *dst,           \
                    const void *src, size_t size, mgpu__copy_kind kind),     \
     (d, s, dst, src, size, kind), d)                                           \
  XX(memset_async, (mgpu__bdevice *d, mgpu__bstream *s, void *dst,           \
                    int value, size_t size), (d, s, dst, value, size), d)       \
  XX(launch, (mgpu__bdevice *d, mgpu__bstream *s, const mgpu_kernel *k,      \
              mgpu_dim3 grid, mgpu_dim3 block, const void *args,             \
              size_t args_size), (d, s, k, grid, block, args, args_size), d)    \
  XX(builtin, (mgpu__bdevice *d, mgpu__bstream *s, const mgpu__builtin *b),  \
     (d, s, b), d)                                                              \
  XX(stream_order_native, (mgpu__bdevice *d, mgpu__bstream *s,              \
                           void *native), (d, s, native), d)                    \
  XX(host_callback, (mgpu__bdevice *d, mgpu__bstream *s,                     \
                     void (*fn)(void *arg), void *arg), (d, s, fn, arg), d)     \
  XX(peer_enable, (mgpu__bdevice *d, mgpu__bdevice *peer), (d, peer), d)        \
  XX(memcpy_peer_async, (mgpu__bdevice *dd, void *dst, mgpu__bdevice *sd,    \
                         const void *src, size_t size,                       \
                         mgpu__bdevice *s_dev, mgpu__bstream *s),            \
     (dd, dst, sd, src, size, s_dev, s), s_dev)                                     \
  XX(pool_alloc_async, (mgpu__bdevice *d, mgpu__bstream *s, size_t size,     \
                        void **ptr), (d, s, size, ptr), d)                      \
  XX(pool_free_async, (mgpu__bdevice *d, mgpu__bstream *s, void *ptr),       \
     (d, s, ptr), d)                                                            \
  XX(coll_comm_create, (mgpu__bdevice **devs, int n, void **comm),           \
     (devs, n, comm), NULL)                                                        \
  XX(coll_group_start, (void), (), NULL)                                           \
  XX(coll_group_end, (void), (), NULL)                                             \
  XX(coll_run, (void *comm, int rank, const mgpu__coll_args *args,           \
                mgpu__bstream *s), (comm, rank, args, s), NULL)                 \
  XX(graph_create, (mgpu__bdevice *d, const struct mgpu__bgraph_part *part,  \
                    void **graph), (d, part, graph), d)                         \
  XX(graph_launch, (mgpu__bdevice *d, void *graph, mgpu__bstream *s,         \
                    uint64_t launch), (d, graph, s, launch), d)

/* The waits: a driver that reports an error from a synchronize has still
 * waited (the error is a sticky one of earlier work), and callers rely on
 * that to free what the work used. Their injected failure comes after the
 * real wait. */
#define MGPU__FAULT_WAITS(XX)                                                \
  XX(stream_synchronize, (mgpu__bdevice *d, mgpu__bstream *s), (d, s), d)       \
  XX(event_synchronize, (mgpu__bdevice *d, mgpu__bevent *e), (d, e), d)

enum { KIND_HOST, KIND_CUDA, KIND_OPENCL, NKINDS };

static mgpu__mutex wrap_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_BACKEND_WRAP);
static const mgpu__backend_ops *real_ops[NKINDS]; /* guarded by wrap_lock */
static mgpu__backend_ops wrapped_ops[NKINDS];     /* filled once, then read */

/* The mgpu id of a backend device, for details; -1 before init completes. */
static int bdevice_id(mgpu__bdevice *b) {
  for (int i = 0; i < mgpu__ndevices(); i++) {
    mgpu__device *d = mgpu__device_get(i);
    if (d != NULL && d->bdev == b) return i;
  }
  return -1;
}

/* hit: what mgpu__fault_hit said. A rule ending in "=devlost" fails the call
 * as a driver's sticky error would: the call's device is lost from here on
 * (a call for no device fails as any injected failure does). */
static int injected(int kind, const char *op, mgpu__bdevice *dev, int hit) {
  if (hit == MGPU__FAULT_LOSE && dev != NULL &&
      real_ops[kind]->lose != NULL) {
    char why[64];
    snprintf(why, sizeof why, "MGPU_FAULT backend:%s=devlost", op);
    real_ops[kind]->lose(dev, why);
    int id = bdevice_id(dev);
    mgpu__device_lost_seen(id);
    return mgpu__error(MGPU_EDEVLOST, "%s device %d was lost in %s (%s)",
                       real_ops[kind]->name, id, op, why);
  }
  return mgpu__error(MGPU_EBACKEND, "%s backend: %s failed (a failure injected "
                     "by MGPU_FAULT)", real_ops[kind]->name, op);
}

/* A backend call for dev returned rc: MGPU_EDEVLOST from a device the
 * backend now reports lost (a CUDA sticky error) tells the layers above. A
 * wait that failed because it waited for another, lost device leaves dev
 * alone: the backend does not report dev lost. */
static int seen(int kind, mgpu__bdevice *dev, int rc) {
  if (rc == MGPU_EDEVLOST && dev != NULL && real_ops[kind]->lost != NULL &&
      real_ops[kind]->lost(dev, NULL, 0))
    mgpu__device_lost_seen(bdevice_id(dev));
  return rc;
}

/* New work for a lost device is refused before it reaches the backend. */
static int refuse_lost(int kind, mgpu__bdevice *dev, const char *op) {
  char why[96];
  if (dev == NULL || real_ops[kind]->lost == NULL ||
      !real_ops[kind]->lost(dev, why, sizeof why))
    return 0;
  int id = bdevice_id(dev);
  mgpu__device_lost_seen(id);
  return mgpu__error(MGPU_EDEVLOST, "%s device %d was lost (%s): %s refused",
                     real_ops[kind]->name, id, why, op);
}

/* One wrapper per operation and per backend kind, calling that kind's
 * table. */
#define MGPU__FAULT_WRAP_KIND(kind, prefix, op, params, args, dev)          \
  static int prefix##_##op params {                                          \
    int lost_rc_ = refuse_lost(kind, dev, #op);                              \
    if (lost_rc_ != 0) return lost_rc_;                                      \
    int hit_ = mgpu__fault_hit(MGPU__FAULT_BACKEND, #op);                    \
    if (hit_) return injected(kind, #op, dev, hit_);                         \
    return seen(kind, dev, real_ops[kind]->op args);                         \
  }
#define MGPU__FAULT_WRAP(op, params, args, dev)                              \
  MGPU__FAULT_WRAP_KIND(KIND_HOST, host, op, params, args, dev)              \
  MGPU__FAULT_WRAP_KIND(KIND_CUDA, cuda, op, params, args, dev)              \
  MGPU__FAULT_WRAP_KIND(KIND_OPENCL, opencl, op, params, args, dev)
MGPU__FAULT_OPS(MGPU__FAULT_WRAP)

#define MGPU__FAULT_WAIT_KIND(kind, prefix, op, params, args, dev)          \
  static int prefix##_##op params {                                          \
    int rc = seen(kind, dev, real_ops[kind]->op args);                       \
    int hit_ = mgpu__fault_hit(MGPU__FAULT_BACKEND, #op);                    \
    if (hit_ && rc == 0) rc = injected(kind, #op, dev, hit_);                \
    return rc;                                                               \
  }
#define MGPU__FAULT_WAIT(op, params, args, dev)                              \
  MGPU__FAULT_WAIT_KIND(KIND_HOST, host, op, params, args, dev)              \
  MGPU__FAULT_WAIT_KIND(KIND_CUDA, cuda, op, params, args, dev)              \
  MGPU__FAULT_WAIT_KIND(KIND_OPENCL, opencl, op, params, args, dev)
MGPU__FAULT_WAITS(MGPU__FAULT_WAIT)

/* An optional entry the backend leaves NULL stays NULL. */
#define MGPU__FAULT_SET(op, params, args, dev)                               \
  if (real->op != NULL)                                                      \
    w->op = kind == KIND_HOST   ? host_##op                                  \
            : kind == KIND_CUDA ? cuda_##op                                  \
                                : opencl_##op;

const mgpu__backend_ops *mgpu__backend_fault_wrap(
    const mgpu__backend_ops *real) {
  int kind = real->kind == MGPU_BACKEND_HOST   ? KIND_HOST
             : real->kind == MGPU_BACKEND_CUDA ? KIND_CUDA
                                               : KIND_OPENCL;
  mgpu__mutex_lock(&wrap_lock);
  if (real_ops[kind] != real) {
    /* First use, or a plugin loaded again after a shutdown. No device of
     * this kind is open now, so nobody reads the table meanwhile. */
    real_ops[kind] = real;
    mgpu__backend_ops *w = &wrapped_ops[kind];
    *w = *real;
    MGPU__FAULT_OPS(MGPU__FAULT_SET)
    MGPU__FAULT_WAITS(MGPU__FAULT_SET)
  }
  mgpu__mutex_unlock(&wrap_lock);
  return &wrapped_ops[kind];
}
