/* The host backend's events: a record takes a new sequence number at call
 * time and queues the operation that completes it; a wait captures the
 * latest number and parks its stream on the event until that record is
 * done (host-internal.h: records complete out of order). */
#include <stdatomic.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/log.h"

int mgpu__host_event_create(mgpu__bdevice *d, mgpu__bevent **out) {
  mgpu__bevent *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL) return mgpu__host_op_nomem(d);
  e->dev = d;
  mgpu__mutex_init(&e->lock, MGPU__LOCK_HOST_EVENT);
  mgpu__cond_init(&e->done);
  *out = e;
  return 0;
}

void mgpu__host_event_destroy(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  /* A pending record completes first, and a queued wait passes: their
   * operations still point at the event. */
  mgpu__mutex_lock(&e->lock);
  while (e->pending != NULL || e->recording > 0 || e->ops > 0)
    mgpu__cond_wait(&e->done, &e->lock);
  mgpu__mutex_unlock(&e->lock);
  mgpu__cond_destroy(&e->done);
  mgpu__mutex_destroy(&e->lock);
  mgpu__free(e);
}

int mgpu__host_event_record(mgpu__bdevice *d, mgpu__bevent *e,
                            mgpu__bstream *s) {
  op *o = mgpu__host_op_new(OP_RECORD);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.event.event = e;
  mgpu__mutex_lock(&e->lock);
  o->u.event.seq = ++e->recorded;
  o->u.event.pending_next = NULL;
  if (e->pending_tail != NULL) e->pending_tail->u.event.pending_next = o;
  else e->pending = o;
  e->pending_tail = o;
  e->ops++;
  e->recording++;
  mgpu__mutex_unlock(&e->lock);
  /* Queued outside the event's lock (a device's lock comes first), so a
   * wait meanwhile holds back until it is (recording). */
  mgpu__host_enqueue(s, o);
  mgpu__mutex_lock(&e->lock);
  if (--e->recording == 0) mgpu__cond_broadcast(&e->done);
  mgpu__mutex_unlock(&e->lock);
  return 0;
}

int mgpu__host_event_done(const mgpu__bevent *e, uint64_t seq) {
  if (seq <= atomic_load_explicit(&e->completed, memory_order_relaxed))
    return 1;
  for (const op *p = e->pending; p != NULL && p->u.event.seq <= seq;
       p = p->u.event.pending_next)
    if (p->u.event.seq == seq) return 0;
  return 1;
}

int mgpu__host_event_synchronize(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  mgpu__mutex_lock(&e->lock);
  while (e->recording > 0) mgpu__cond_wait(&e->done, &e->lock);
  uint64_t target = e->recorded;
  while (!mgpu__host_event_done(e, target))
    mgpu__cond_wait(&e->done, &e->lock);
  int lost_by = e->lost_by;
  mgpu__mutex_unlock(&e->lock);
  if (atomic_load_explicit(&e->dev->lost, memory_order_acquire))
    return mgpu__error(MGPU_EDEVLOST, "host device %d was lost (%s): the "
                       "work before the event may not have run",
                       e->dev->id, e->dev->lost_why);
  if (lost_by != 0)
    return mgpu__error(MGPU_EDEVLOST, "host device %d: the work before "
                       "the event depended on host device %d, which was "
                       "lost", e->dev->id, lost_by - 1);
  return 0;
}

int mgpu__host_event_query(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  mgpu__mutex_lock(&e->lock);
  int rc = mgpu__host_event_done(e, e->recorded) ? 0 : MGPU_EAGAIN;
  mgpu__mutex_unlock(&e->lock);
  return rc;
}

int mgpu__host_event_elapsed_ms(mgpu__bdevice *d, mgpu__bevent *a,
                                mgpu__bevent *b, float *ms) {
  uint64_t ta = 0, tb = 0;
  int pending = 0, never = 0;
  mgpu__mutex_lock(&a->lock);
  pending |= !mgpu__host_event_done(a, a->recorded);
  never |= a->recorded == 0;
  ta = a->time_ns;
  mgpu__mutex_unlock(&a->lock);
  mgpu__mutex_lock(&b->lock);
  pending |= !mgpu__host_event_done(b, b->recorded);
  never |= b->recorded == 0;
  tb = b->time_ns;
  mgpu__mutex_unlock(&b->lock);
  if (never)
    return mgpu__error(MGPU_EINVAL, "device %d: elapsed time of an event "
                       "that was never recorded", d->id);
  if (pending)
    return mgpu__error(MGPU_EAGAIN, "device %d: elapsed time asked before "
                       "both events completed", d->id);
  *ms = (float)((double)((int64_t)tb - (int64_t)ta) / 1e6);
  return 0;
}

int mgpu__host_stream_wait_event(mgpu__bdevice *d, mgpu__bstream *s,
                                 mgpu__bdevice *ed, mgpu__bevent *e) {
  (void)ed;
  mgpu__mutex_lock(&e->lock);
  while (e->recording > 0) mgpu__cond_wait(&e->done, &e->lock);
  uint64_t seq = e->recorded;
  int done = mgpu__host_event_done(e, seq);
  mgpu__mutex_unlock(&e->lock);
  /* Nothing to wait for; while tracing the wait is queued all the same,
   * so that its arrow is drawn in order on the worker. */
  if (done && !mgpu__trace_enabled()) return 0;
  op *o = mgpu__host_op_new(OP_WAIT);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.event.event = e;
  o->u.event.seq = seq;
  mgpu__mutex_lock(&e->lock);
  e->ops++;
  mgpu__mutex_unlock(&e->lock);
  mgpu__host_enqueue(s, o);
  return 0;
}
