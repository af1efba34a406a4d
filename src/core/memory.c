/* Buffers: device, pinned and unified memory that knows its device, the
 * memory budget of each device, and the stream-ordered mempool.
 *
 * Device and unified memory count against the device's budget (MGPU_HOST_MEM
 * on host devices, total/split on a split GPU); a request that does not fit
 * fails with MGPU_ENOMEM before anything is taken, so earlier allocations are
 * never disturbed. Pinned host memory is the host's, not the device's, and is
 * not counted.
 *
 * The core's mempool (for backends without one of their own): a block freed
 * on stream S goes to a per-size-class free list of the device at once, but
 * only allocations on S may take it until the work queued before the free is
 * done (a stream callback then marks it ready for every stream). Blocks stay
 * counted as in use while cached; mgpu_mempool_trim and a failing allocation
 * give them back.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "mgpu/module.h"
#include "util/fault.h"

/* A cached block. A block freed with mgpu_free_async is listed at once but
 * not `ready` until the work queued before the free is done; until then only
 * an allocation on the same stream may take it (its uses are ordered after
 * the free), as cudaMallocAsync does. A block taken before it is ready is
 * marked `taken`, and the stream callback frees the record. All fields but
 * ptr and size are guarded by the device's mempool_lock. */
typedef struct mgpu__mempool_block {
  mgpu__device *dev;
  void *ptr;
  size_t size;
  const mgpu__stream *freed_on; /* NULL once ready */
  int ready, taken;
  struct mgpu__mempool_block *next;
} mempool_block;

#define POOL_MIN_SHIFT 8 /* 256 bytes */

static const char *kind_name(mgpu_mem_kind k) {
  switch (k) {
    case MGPU_MEM_DEVICE: return "device";
    case MGPU_MEM_PINNED: return "pinned";
    case MGPU_MEM_UNIFIED: return "unified";
  }
  return "?";
}

static int counts_against_budget(mgpu_mem_kind kind) {
  return kind != MGPU_MEM_PINNED;
}

/* Reserves size bytes of the budget. */
static int reserve(mgpu__device *d, size_t size, mgpu_mem_kind kind) {
  if (!counts_against_budget(kind)) return 0;
  uint64_t cur = d->mem_in_use;
  for (;;) {
    if (d->budget != 0 && (cur + size > d->budget || cur + size < cur))
      return mgpu__error(MGPU_ENOMEM, "device %d: cannot allocate %zu bytes of "
                         "%s memory: %llu of its %zu-byte budget in use", d->id,
                         size, kind_name(kind), (unsigned long long)cur,
                         d->budget);
    if (atomic_compare_exchange_weak(&d->mem_in_use, &cur, cur + size)) break;
  }
  mgpu__obs_mem(d->id, (int64_t)size);
  return 0;
}

static void unreserve(mgpu__device *d, size_t size, mgpu_mem_kind kind) {
  if (!counts_against_budget(kind)) return;
  atomic_fetch_sub(&d->mem_in_use, size);
  mgpu__obs_mem(d->id, -(int64_t)size);
}

static int new_handle(mgpu__buf *b, mgpu_buffer **out) {
  b->handle = mgpu__handle_new(MGPU__H_BUFFER, b);
  if (b->handle == 0)
    return mgpu__error(MGPU_ENOMEM, "device %d: no buffer handles left", b->dev);
  *out = (mgpu_buffer *)b->handle;
  return 0;
}

/* An allocation or free as a span on the calling thread. */
static void trace_mem(const char *name, int dev, size_t bytes, uint64_t t0) {
  if (!mgpu__trace_enabled() || t0 == 0) return;
  mgpu__trace_arg a[] = {MGPU__TARG_I("bytes", bytes), MGPU__TARG_I("device", dev)};
  mgpu__trace_thread_span(name, t0, mgpu__now_ns(), a, 2);
}

static int alloc_kind_in(mgpu_buffer **out, int dev, size_t size,
                         mgpu_mem_kind kind) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL output pointer for a "
                       "%zu-byte %s buffer", dev, size, kind_name(kind));
  *out = NULL;
  if (size == 0)
    return mgpu__error(MGPU_EINVAL, "device %d: %s buffer of size 0", dev,
                       kind_name(kind));
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  mgpu__buf *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory", dev);
  rc = reserve(d, size, kind);
  if (rc != 0 && counts_against_budget(kind)) {
    mgpu_mempool_trim(dev); /* cached mempool blocks count against the budget */
    rc = reserve(d, size, kind);
  }
  if (rc != 0) goto fail_struct;
  rc = d->ops->mem_alloc(d->bdev, kind, size, &b->ptr);
  if (rc != 0) goto fail_reserve;
  b->dev = dev;
  b->kind = kind;
  b->size = b->alloc_size = size;
  rc = new_handle(b, out);
  if (rc != 0) goto fail_mem;
  trace_mem("alloc", dev, size, t0);
  return 0;
fail_mem:
  d->ops->mem_free(d->bdev, kind, b->ptr);
fail_reserve:
  unreserve(d, size, kind);
fail_struct:
  mgpu__free(b);
  return rc;
}

static int alloc_kind(mgpu_buffer **out, int dev, size_t size,
                      mgpu_mem_kind kind) {
  int rc = mgpu__lib_enter("mgpu_malloc");
  if (rc != 0) return rc;
  rc = alloc_kind_in(out, dev, size, kind);
  mgpu__lib_leave();
  return rc;
}

int mgpu_malloc(mgpu_buffer **buf, int dev, size_t size) {
  return alloc_kind(buf, dev, size, MGPU_MEM_DEVICE);
}
int mgpu_malloc_host(mgpu_buffer **buf, int dev, size_t size) {
  return alloc_kind(buf, dev, size, MGPU_MEM_PINNED);
}
int mgpu_malloc_unified(mgpu_buffer **buf, int dev, size_t size) {
  return alloc_kind(buf, dev, size, MGPU_MEM_UNIFIED);
}

int mgpu__buf_get(const mgpu_buffer *h, const char *what, mgpu__buf **out) {
  int err = 0;
  *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "%s: mgpu_init has not been called", what);
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_BUFFER, what, &err);
  return *out != NULL ? 0 : err;
}

void mgpu__buf_put(mgpu__buf *b) {
  if (b != NULL) mgpu__handle_put(b->handle);
}

static int wrap_in(mgpu_buffer **out, int dev, mgpu_mem_kind kind, void *ptr,
                   size_t size, unsigned flags, mgpu_buffer_release_fn release,
                   void *arg) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_wrap: NULL output for a "
                       "buffer of device %d", dev);
  *out = NULL;
  if (ptr == NULL || size == 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_wrap: device %d: memory %p "
                       "of %zu bytes", dev, ptr, size);
  if (kind != MGPU_MEM_DEVICE && kind != MGPU_MEM_PINNED &&
      kind != MGPU_MEM_UNIFIED)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_wrap: device %d: unknown "
                       "memory kind %d", dev, (int)kind);
  if ((flags & ~(unsigned)MGPU_BUFFER_READONLY) != 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_wrap: device %d: unknown "
                       "flags 0x%x", dev, flags);
  mgpu__buf *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory", dev);
  b->dev = dev;
  b->kind = kind;
  b->ptr = ptr;
  b->size = b->alloc_size = size;
  b->wrapped = 1;
  b->readonly = (flags & MGPU_BUFFER_READONLY) != 0;
  b->release = release;
  b->release_arg = arg;
  rc = new_handle(b, out);
  if (rc != 0) mgpu__free(b);
  return rc;
}

int mgpu_buffer_wrap(mgpu_buffer **out, int dev, mgpu_mem_kind kind,
                     void *ptr, size_t size, unsigned flags,
                     mgpu_buffer_release_fn release, void *arg) {
  int rc = mgpu__lib_enter("mgpu_buffer_wrap");
  if (rc != 0) return rc;
  rc = wrap_in(out, dev, kind, ptr, size, flags, release, arg);
  mgpu__lib_leave();
  return rc;
}

int mgpu_buffer_is_readonly(const mgpu_buffer *h) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "mgpu_buffer_is_readonly", &b);
  if (rc != 0) return rc;
  rc = b->readonly;
  mgpu__buf_put(b);
  return rc;
}

int mgpu__buffer_set_readonly(mgpu_buffer *h) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "set read-only", &b);
  if (rc != 0) return rc;
  b->readonly = 1;
  mgpu__buf_put(b);
  return 0;
}

int mgpu__buffer_set_owned(mgpu_buffer *h, int owned) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "set owned", &b);
  if (rc != 0) return rc;
  atomic_store(&b->owned, owned != 0);
  mgpu__buf_put(b);
  return 0;
}

int mgpu__buf_check_writable(const mgpu__buf *b, const char *what) {
  if (!b->readonly) return 0;
  return mgpu__error(MGPU_EREADONLY, "%s: buffer %p of device %d is "
                     "read-only (%zu bytes of wrapped or shared memory): it "
                     "cannot be written", what, (void *)b->handle, b->dev,
                     b->size);
}

int mgpu__buf_check_range(const mgpu__buf *b, const char *what, size_t offset,
                          size_t size) {
  if ((offset > b->size || size > b->size - offset) && offset + size < offset)
    return mgpu__error(MGPU_ERANGE, "%s: %zu bytes at offset %zu run past the "
                       "end of the %zu-byte buffer of device %d", what, size,
                       offset, b->size, b->dev);
  if (offset > b->size || size > b->size - offset)
    return mgpu__error(MGPU_ERANGE, "%s: bytes [%zu, %zu) are outside the "
                       "%zu-byte buffer of device %d", what, offset,
                       offset + size, b->size, b->dev);
  return 0;
}

static void mempool_list(mgpu__device *d, mempool_block *blk);

static void buf_release_memory(mgpu__device *d, mgpu__buf *b) {
  if (b->wrapped) {
    if (b->release != NULL) b->release(b->ptr, b->size, b->release_arg);
    mgpu__free(b);
    return;
  }
  d->ops->mem_free(d->bdev, b->kind, b->ptr);
  unreserve(d, b->alloc_size, b->kind);
  mgpu__free(b);
}

/* Closes the buffer's handle (later calls on it are MGPU_EFREED) and waits
 * for the calls already inside it to leave. */
static int buf_close(mgpu_buffer *h, const char *what, mgpu__buf **out) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "%s: mgpu_init has not been called", what);
  *out = mgpu__handle_close((uintptr_t)h, MGPU__H_BUFFER, what, &err);
  if (*out == NULL) return err;
  mgpu__handle_retire((uintptr_t)h);
  return 0;
}

static int free_buffer(mgpu__buf *b);

static int free_in(mgpu_buffer *h) {
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  mgpu__buf *b;
  if (mgpu_is_initialized() && mgpu__buf_get(h, "mgpu_free", &b) == 0) {
    int owned = atomic_load(&b->owned), dev = b->dev;
    mgpu__buf_put(b);
    if (owned)
      return mgpu__error(MGPU_EINVAL, "mgpu_free: buffer %p of device %d "
                         "belongs to a store object: mgpu_store_release "
                         "frees it", (void *)h, dev);
  }
  int rc = buf_close(h, "mgpu_free", &b);
  if (rc != 0) return rc;
  int dev = b->dev;
  size_t bytes = b->size;
  rc = free_buffer(b);
  if (rc == 0) trace_mem("free", dev, bytes, t0);
  return rc;
}

/* Gives a buffer whose handle is gone back to its mempool or the system. The
 * work queued on its device before was synchronized. */
static int buf_release(mgpu__buf *b) {
  mgpu__device *d = mgpu__device_get(b->dev);
  int rc = 0;
  if (b->pooled) {
    /* Synchronized: the block can go straight back to its mempool. */
    if (d->ops->mempool != NULL) {
      mgpu__stream *s;
      rc = mgpu__spare_get(b->dev, &s);
      if (rc == 0) {
        rc = d->ops->mempool->free_async(d->bdev, s->bstream, b->ptr);
        if (rc == 0) rc = d->ops->stream_synchronize(d->bdev, s->bstream);
        mgpu__spare_put(s);
      }
      unreserve(d, b->alloc_size, b->kind);
      mgpu__free(b);
      return rc;
    }
    mempool_block *blk = mgpu__calloc(1, sizeof *blk);
    if (blk != NULL) {
      blk->dev = d;
      blk->ptr = b->ptr;
      blk->size = b->alloc_size;
      blk->ready = 1;
      mempool_list(d, blk);
      mgpu__free(b);
      return 0;
    }
  }
  buf_release_memory(d, b);
  return 0;
}

/* Exports' references (mgpu__buf_ref). refs_lock guards every buffer's
 * exports, freed, detached and detached_free, and the list of freed buffers
 * whose memory waits for their exports (linked through next_freed), which
 * mgpu_shutdown detaches. */
static mgpu__mutex refs_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_MEM_REFS);
typedef struct freed_entry {
  mgpu__buf *b;
  struct freed_entry *next;
} freed_entry;
static freed_entry *freed_exported;

void mgpu__buf_ref(mgpu__buf *b) {
  mgpu__mutex_lock(&refs_lock);
  b->exports++;
  mgpu__mutex_unlock(&refs_lock);
}

/* Detaches b from its device (closing now): b->refs_lock held. */
static void detach_locked(mgpu__buf *b, mgpu__device *d) {
  b->freed = b->detached = 1;
  b->detached_free = d != NULL ? d->ops->mem_free_detached : NULL;
}

/* With its handle gone, 1 when exports still hold b: the last deleter
 * releases it (detached: without the device, which mgpu_shutdown closes). */
static int defer_while_exported(mgpu__buf *b, int detach) {
  int held = 0;
  mgpu__mutex_lock(&refs_lock);
  if (b->exports > 0) {
    held = 1;
    if (detach) {
      detach_locked(b, mgpu__device_get(b->dev));
    } else {
      freed_entry *e = mgpu__malloc(sizeof *e);
      if (e != NULL) {
        b->freed = 1;
        e->b = b;
        e->next = freed_exported;
        freed_exported = e;
      } else {
        /* Cannot list it for shutdown: keep it for good (never freed). */
        detach_locked(b, NULL);
      }
    }
  }
  mgpu__mutex_unlock(&refs_lock);
  return held;
}

void mgpu__buf_unref(mgpu__buf *b) {
  mgpu__mutex_lock(&refs_lock);
  int last = --b->exports == 0 && b->freed;
  if (last && !b->detached) {
    for (freed_entry **l = &freed_exported; *l != NULL; l = &(*l)->next) {
      if ((*l)->b != b) continue;
      freed_entry *e = *l;
      *l = e->next;
      mgpu__free(e);
      break;
    }
  }
  mgpu__mutex_unlock(&refs_lock);
  if (!last) return;
  if (b->detached) {
    /* Wrapped memory goes back to its owner; mgpu's own needs no device. */
    if (b->wrapped && b->release != NULL)
      b->release(b->ptr, b->size, b->release_arg);
    else if (!b->wrapped && b->detached_free != NULL)
      b->detached_free(b->kind, b->ptr);
    mgpu__free(b);
    return;
  }
  buf_release(b);
}

/* Shutdown: buffers freed while exported lose their device now. */
static void detach_freed_exported(void) {
  mgpu__mutex_lock(&refs_lock);
  while (freed_exported != NULL) {
    freed_entry *e = freed_exported;
    freed_exported = e->next;
    detach_locked(e->b, mgpu__device_get(e->b->dev));
    mgpu__free(e);
  }
  mgpu__mutex_unlock(&refs_lock);
}

/* mgpu_free once the handle is closed: waits for the work queued on the
 * device, then gives the memory back, or leaves it to the last export. */
static int free_buffer(mgpu__buf *b) {
  /* As cudaFree does: work already queued may still use the memory (also
   * while a stream captures a graph; a launch of a graph that recorded the
   * buffer then finds it freed), on a stream of any device: a copy to or
   * from another device runs on either device's stream, and pinned or
   * unified memory is used from every device. */
  for (int dev = 0; dev < mgpu__ndevices(); dev++) mgpu__device_drain(dev);
  if (defer_while_exported(b, 0)) return 0;
  return buf_release(b);
}

int mgpu_free(mgpu_buffer *h) {
  int rc = mgpu__lib_enter("mgpu_free");
  if (rc != 0) return rc;
  rc = free_in(h);
  mgpu__lib_leave();
  return rc;
}

void *mgpu_buffer_ptr(const mgpu_buffer *h) {
  mgpu__buf *b;
  if (mgpu__buf_get(h, "mgpu_buffer_ptr", &b) != 0) return NULL;
  void *v = b->ptr;
  mgpu__buf_put(b);
  return v;
}

size_t mgpu_buffer_size(const mgpu_buffer *h) {
  mgpu__buf *b;
  if (mgpu__buf_get(h, "mgpu_buffer_size", &b) != 0) return 0;
  size_t v = b->size;
  mgpu__buf_put(b);
  return v;
}

int mgpu_buffer_device(const mgpu_buffer *h) {
  mgpu__buf *b;
  if (mgpu__buf_get(h, "mgpu_buffer_device", &b) != 0) return -1;
  int v = b->dev;
  mgpu__buf_put(b);
  return v;
}

int mgpu_buffer_kind(const mgpu_buffer *h) {
  mgpu__buf *b;
  if (mgpu__buf_get(h, "mgpu_buffer_kind", &b) != 0) return -1;
  int v = (int)b->kind;
  mgpu__buf_put(b);
  return v;
}

/* The accessors above in one lookup, for modules (mgpu/module.h). */
int mgpu_module_buffer_view(const mgpu_buffer *h, mgpu_buffer_view *view) {
  if (view == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_module_buffer_view: NULL view");
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "mgpu_module_buffer_view", &b);
  if (rc != 0) return rc;
  view->handle = h;
  view->ptr = b->ptr;
  view->size = b->size;
  view->device = b->dev;
  view->kind = (int)b->kind;
  view->readonly = b->readonly;
  mgpu__buf_put(b);
  return 0;
}

/* ---- the stream-ordered mempool ---- */

static int size_class(size_t size, size_t *rounded) {
  int cls = 0;
  while (((size_t)1 << (cls + POOL_MIN_SHIFT)) < size) cls++;
  *rounded = (size_t)1 << (cls + POOL_MIN_SHIFT);
  return cls;
}

/* Gives b (its size set) a block of its size class from d's mempool: one
 * freed on s or ready, else new memory (the mempool trimmed once if the
 * device is full). On failure nothing stays reserved. */
static int mempool_take(mgpu__device *d, mgpu__stream *s, mgpu__buf *b) {
  int cls = size_class(b->size, &b->alloc_size);
  mgpu__mutex_lock(&d->mempool_lock);
  mempool_block **link = &d->mempool_free[cls], *blk;
  while ((blk = *link) != NULL && !blk->ready && blk->freed_on != s)
    link = &blk->next;
  if (blk != NULL) {
    *link = blk->next;
    d->mempool_cached_bytes -= blk->size;
    mgpu__obs_mempool_cached(d->id, -(int64_t)blk->size);
    b->ptr = blk->ptr;
    if (blk->ready) mgpu__free(blk);
    else blk->taken = 1; /* its callback frees the record */
  }
  mgpu__mutex_unlock(&d->mempool_lock);
  if (blk != NULL) return 0;
  int rc = reserve(d, b->alloc_size, MGPU_MEM_DEVICE);
  if (rc != 0) {
    mgpu_mempool_trim(s->dev);
    rc = reserve(d, b->alloc_size, MGPU_MEM_DEVICE);
  }
  if (rc != 0) return rc;
  rc = d->ops->mem_alloc(d->bdev, MGPU_MEM_DEVICE, b->alloc_size, &b->ptr);
  if (rc != 0) unreserve(d, b->alloc_size, MGPU_MEM_DEVICE);
  return rc;
}

/* mgpu_malloc_async on a stream looked up by the caller. */
static int malloc_async_on(mgpu_buffer **out, size_t size, mgpu__stream *s) {
  int rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  if (out == NULL || size == 0)
    return mgpu__error(MGPU_EINVAL, "device %d: mgpu_malloc_async of %zu bytes "
                       "with %s", s->dev, size,
                       out == NULL ? "a NULL output pointer" : "size 0");
  *out = NULL;
  if ((size >> 60) != 0)
    return mgpu__error(MGPU_ENOMEM, "device %d: %zu bytes is more than any "
                       "device holds", s->dev, size);
  mgpu__buf *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory", s->dev);
  b->dev = s->dev;
  b->kind = MGPU_MEM_DEVICE;
  b->size = size;
  b->pooled = 1;
  if (d->ops->mempool != NULL) {
    b->alloc_size = size;
    rc = reserve(d, size, MGPU_MEM_DEVICE);
    if (rc != 0) goto fail_struct;
    rc = d->ops->mempool->alloc_async(d->bdev, s->bstream, size, &b->ptr);
    if (rc != 0) goto fail_reserve;
  } else if ((rc = mempool_take(d, s, b)) != 0) {
    goto fail_struct;
  }
  rc = new_handle(b, out);
  if (rc != 0) {
    /* The block has not been used yet: back to the system. */
    if (d->ops->mempool != NULL)
      d->ops->mempool->free_async(d->bdev, s->bstream, b->ptr);
    else
      d->ops->mem_free(d->bdev, MGPU_MEM_DEVICE, b->ptr);
    goto fail_reserve;
  }
  return 0;
fail_reserve:
  unreserve(d, b->alloc_size, MGPU_MEM_DEVICE);
fail_struct:
  mgpu__free(b);
  return rc;
}

int mgpu_malloc_async(mgpu_buffer **out, size_t size, mgpu_stream *stream) {
  mgpu__stream *s;
  int rc = mgpu__stream_get(stream, &s);
  if (rc != 0) return rc;
  rc = malloc_async_on(out, size, s);
  mgpu__stream_put(s);
  return rc;
}

/* Runs on a stream worker once the work before the free is done: the block
 * (allocated by mgpu_free_async) goes on its size class's free list. */
static void mempool_return_cb(void *arg) {
  mempool_block *blk = arg;
  mgpu__device *d = blk->dev;
  mgpu__mutex_lock(&d->mempool_lock);
  if (blk->taken) {
    mgpu__mutex_unlock(&d->mempool_lock);
    mgpu__free(blk);
    return;
  }
  blk->ready = 1;
  blk->freed_on = NULL;
  mgpu__mutex_unlock(&d->mempool_lock);
}

/* Lists a freed block in its size class (ready, or pending on a stream). */
static void mempool_list(mgpu__device *d, mempool_block *blk) {
  int cls = 0;
  while (((size_t)1 << (cls + POOL_MIN_SHIFT)) < blk->size) cls++;
  mgpu__mutex_lock(&d->mempool_lock);
  blk->next = d->mempool_free[cls];
  d->mempool_free[cls] = blk;
  d->mempool_cached_bytes += blk->size;
  mgpu__obs_mempool_cached(d->id, (int64_t)blk->size);
  mgpu__mutex_unlock(&d->mempool_lock);
}

/* Queues the free of b (its handle closed, not exported) on s: into the
 * device's mempool once s gets there, or to the backend's own pool. Puts s
 * and frees b. */
static int free_async_queue(mgpu__buf *b, mgpu__stream *s) {
  int rc, dev = b->dev;
  mgpu__device *d = mgpu__device_get(b->dev);
  if (d->ops->mempool == NULL) {
    mempool_block *blk = mgpu__calloc(1, sizeof *blk);
    if (blk == NULL) {
      /* The handle is gone already: give the memory back synchronously. */
      mgpu__stream_wait_keep(s);
      buf_release_memory(d, b);
      mgpu__stream_put(s);
      return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for "
                         "mgpu_free_async's record; freed synchronously",
                         dev);
    }
    blk->dev = d;
    blk->ptr = b->ptr;
    blk->size = b->alloc_size;
    blk->freed_on = s;
    /* Listed before the callback is queued, so the callback always finds
     * it listed or taken. */
    mempool_list(d, blk);
    rc = d->ops->host_callback(d->bdev, s->bstream, mempool_return_cb, blk);
    if (rc != 0) {
      /* Not queued: synchronize instead, then the block is ready. */
      mgpu__stream_wait_keep(s);
      mempool_return_cb(blk);
    }
  } else {
    rc = d->ops->mempool->free_async(d->bdev, s->bstream, b->ptr);
    if (rc != 0) {
      mgpu__stream_wait_keep(s);
      rc = d->ops->mempool->free_async(d->bdev, s->bstream, b->ptr);
    }
    unreserve(d, b->alloc_size, b->kind);
  }
  mgpu__stream_put(s);
  mgpu__free(b);
  return rc;
}

static int free_async_in(mgpu_buffer *h, mgpu_stream *stream) {
  mgpu__buf *b;
  mgpu__stream *s;
  int rc = mgpu__buf_get(h, "mgpu_free_async", &b);
  if (rc != 0) return rc;
  int dev = b->dev, pooled = b->pooled;
  mgpu__buf_put(b);
  rc = mgpu__stream_get(stream, &s);
  if (rc != 0) return rc;
  if (s->dev != dev || !pooled) {
    mgpu__stream_put(s);
    if (!pooled) return free_in(h);
    return mgpu__error(MGPU_EWRONGDEV, "mgpu_free_async: buffer of device %d "
                       "freed on a stream of device %d", dev, s->dev);
  }
  /* The stream's use is held to the end: free_async_queue queues its
   * callback. */
  rc = buf_close(h, "mgpu_free_async", &b);
  if (rc != 0) {
    mgpu__stream_put(s);
    return rc;
  }
  mgpu__mutex_lock(&refs_lock);
  int exported = b->exports > 0;
  mgpu__mutex_unlock(&refs_lock);
  if (exported) { /* an exported block waits for its exports */
    mgpu__stream_put(s);
    return free_buffer(b);
  }
  return free_async_queue(b, s);
}

int mgpu_free_async(mgpu_buffer *h, mgpu_stream *stream) {
  int rc = mgpu__lib_enter("mgpu_free_async");
  if (rc != 0) return rc;
  rc = free_async_in(h, stream);
  mgpu__lib_leave();
  return rc;
}

static int mempool_trim_in(int dev) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (d->ops->mempool != NULL) {
    rc = d->ops->mempool->trim(d->bdev);
    if (rc != 0) return rc;
  }
  /* Only ready blocks go: a pending one may still be used by its stream. */
  mempool_block *ready = NULL;
  mgpu__mutex_lock(&d->mempool_lock);
  for (int c = 0; c < 64; c++) {
    mempool_block **link = &d->mempool_free[c], *blk;
    while ((blk = *link) != NULL) {
      if (!blk->ready) {
        link = &blk->next;
        continue;
      }
      *link = blk->next;
      d->mempool_cached_bytes -= blk->size;
      mgpu__obs_mempool_cached(d->id, -(int64_t)blk->size);
      blk->next = ready;
      ready = blk;
    }
  }
  mgpu__mutex_unlock(&d->mempool_lock);
  {
    while (ready != NULL) {
      mempool_block *blk = ready;
      ready = blk->next;
      d->ops->mem_free(d->bdev, MGPU_MEM_DEVICE, blk->ptr);
      unreserve(d, blk->size, MGPU_MEM_DEVICE);
      mgpu__free(blk);
    }
  }
  return 0;
}

int mgpu_mempool_trim(int dev) {
  int rc = mgpu__lib_enter("mgpu_mempool_trim");
  if (rc != 0) return rc;
  rc = mempool_trim_in(dev);
  mgpu__lib_leave();
  return rc;
}

/* The former name, kept for callers built against it. */
int mgpu_pool_trim(int dev) { return mgpu_mempool_trim(dev); }

void mgpu__mempool_release(mgpu__device *d) { mgpu_mempool_trim(d->id); }

static void release_buffer(void *obj, void *arg) {
  (void)arg;
  mgpu__buf *b = obj;
  mgpu__handle_retire(b->handle);
  if (defer_while_exported(b, 1)) return;
  mgpu__device *d = mgpu__device_get(b->dev);
  if (b->pooled && d->ops->mempool != NULL) {
    unreserve(d, b->alloc_size, b->kind);
    mgpu__free(b); /* the backend's mempool is destroyed with the device */
    return;
  }
  buf_release_memory(d, b);
}

void mgpu__memory_release_all(void) {
  detach_freed_exported();
  mgpu__handle_foreach(MGPU__H_BUFFER, release_buffer, NULL);
}
