/* The host backend's queues: each device's ready list of streams that have
 * work, and the operations queued on a stream (allocated here, freed by
 * the worker that ran them). */
#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/log.h"

/* Puts s on d's ready list and wakes a worker; d->lock held. */
void mgpu__host_ready_push(mgpu__bdevice *d, mgpu__bstream *s) {
  s->queued = 1;
  s->ready_next = NULL;
  if (d->ready_tail) d->ready_tail->ready_next = s;
  else d->ready_head = s;
  d->ready_tail = s;
  int ready = atomic_fetch_add_explicit(&d->nready, 1, memory_order_release);
  /* More streams ready than workers awake to take them: wake one. */
  if (ready + 1 > d->watching) mgpu__cond_signal(&d->work);
}

/* Queues op on s. The op is owned by the stream from here on. */
void mgpu__host_enqueue(mgpu__bstream *s, op *o) {
  mgpu__bdevice *d = s->dev;
  o->next = NULL;
  mgpu__mutex_lock(&d->lock);
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  mgpu__host_count_queued(s);
  if (!s->queued && !s->running && !s->parked) mgpu__host_ready_push(d, s);
  mgpu__mutex_unlock(&d->lock);
}

op *mgpu__host_op_new(op_kind kind) {
  op *o = mgpu__calloc(1, sizeof *o);
  if (o == NULL) return NULL;
  o->kind = kind;
  if (mgpu__trace_enabled()) o->tag = mgpu__trace_tag_copy();
  return o;
}

int mgpu__host_op_nomem(mgpu__bdevice *d) {
  return mgpu__error(MGPU_ENOMEM, "host device %d: out of host memory "
                     "for a stream operation", d->id);
}
