/* The host backend's streams: creation, synchronize (which waits for the
 * operations queued at its call, not for the queue to run dry), query, and
 * the claims by which a caller runs an operation on its own thread. */
#include <stdatomic.h>
#include <string.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/log.h"

int mgpu__host_stream_create(mgpu__bdevice *d, mgpu__bstream **out) {
  mgpu__bstream *s = mgpu__calloc(1, sizeof *s);
  if (s == NULL) return mgpu__host_op_nomem(d);
  s->dev = d;
  s->track = mgpu__trace_track_new(d->id, NULL);
  *out = s;
  return 0;
}

void mgpu__host_count_queued(mgpu__bstream *s) {
  atomic_store_explicit(
      &s->nqueued, atomic_load_explicit(&s->nqueued, memory_order_relaxed) + 1,
      memory_order_release);
}

int mgpu__host_stream_synchronize(mgpu__bdevice *d, mgpu__bstream *s) {
  /* A stream whose work is done, without an error to hand over, is seen
   * without the device's lock: the caller's queued operations are in
   * nqueued (its own stores, or ordered before the call), and nfinished
   * is raised after each one ran (acquire: what it wrote is seen). */
  uint64_t target = atomic_load_explicit(&s->nqueued, memory_order_acquire);
  if (atomic_load_explicit(&s->nfinished, memory_order_acquire) >= target &&
      atomic_load_explicit(&s->error, memory_order_relaxed) == 0 &&
      atomic_load_explicit(&s->lost_from, memory_order_relaxed) == 0)
    return 0;
  mgpu__mutex_lock(&d->lock);
  target = s->nqueued;
  if (s->nfinished < target) {
    /* Watch first: work that ends soon is seen without a wake-up. */
    counter_target t = {&s->nfinished, target};
    mgpu__mutex_unlock(&d->lock);
    mgpu__spin_until(&d->sync_spin, counter_reached, &t);
    mgpu__mutex_lock(&d->lock);
  }
  s->syncs++;
  while (s->nfinished < target) {
    if (s->sync_at == 0 || target < s->sync_at) s->sync_at = target;
    mgpu__cond_wait(&d->idle, &d->lock);
  }
  s->syncs--;
  int err = s->error;
  /* The common case, no error, copies nothing and writes no more lines. */
  if (err == 0 &&
      atomic_load_explicit(&s->lost_from, memory_order_relaxed) == 0) {
    mgpu__mutex_unlock(&d->lock);
    return 0;
  }
  char detail[sizeof s->error_detail];
  memcpy(detail, s->error_detail, sizeof detail);
  s->error = 0;
  atomic_store_explicit(&s->lost_from, 0, memory_order_relaxed);
  mgpu__mutex_unlock(&d->lock);
  if (err != 0) return mgpu__error(err, "%s", detail);
  return err;
}

void mgpu__host_stream_destroy(mgpu__bdevice *d, mgpu__bstream *s) {
  /* Runs dry first, whatever was queued last: s is freed. */
  mgpu__mutex_lock(&d->lock);
  s->syncs++; /* heard of by whoever finishes its work */
  while (s->head != NULL || s->running) mgpu__cond_wait(&d->idle, &d->lock);
  s->syncs--;
  mgpu__mutex_unlock(&d->lock);
  mgpu__free(s);
}

int mgpu__host_stream_query(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  int busy = s->head != NULL || s->running;
  int rc = busy ? MGPU_EAGAIN : s->error;
  /* Cleared only when set: error is an atomic that synchronize reads
   * without the lock, and a store to it is a locked instruction. */
  if (!busy && rc != 0) s->error = 0;
  if (!busy && atomic_load_explicit(&s->lost_from, memory_order_relaxed))
    atomic_store_explicit(&s->lost_from, 0, memory_order_relaxed);
  mgpu__mutex_unlock(&d->lock);
  return rc;
}

/* A claim is an operation run by the calling thread instead of a worker:
 * `running` keeps mgpu__host_enqueue from putting s on the ready list, and
 * the claim counts as one queued operation, so synchronize waits for its
 * release. */
int mgpu__host_stream_claim(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  int idle = s->head == NULL && !s->running && !s->queued && !s->parked;
  if (idle) {
    s->running = 1;
    mgpu__host_count_queued(s);
  }
  mgpu__mutex_unlock(&d->lock);
  return idle;
}

void mgpu__host_stream_release(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  s->running = 0;
  s->nfinished++;
  mgpu__host_sync_wake(d, s);
  if (s->head != NULL) mgpu__host_ready_push(d, s);
  mgpu__mutex_unlock(&d->lock);
}

int mgpu__host_stream_lock_idle(mgpu__bdevice *d, mgpu__bstream *s) {
  if (!mgpu__mutex_trylock(&d->lock)) return 0;
  if (s->head == NULL && !s->running && !s->queued && !s->parked) return 1;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

void mgpu__host_stream_unlock_idle(mgpu__bdevice *d, mgpu__bstream *s) {
  (void)s;
  mgpu__mutex_unlock(&d->lock);
}

void *mgpu__host_stream_native(mgpu__bstream *s) {
  (void)s;
  return NULL;
}
