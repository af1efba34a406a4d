/* What the OpenCL devices tell the recording floor: busy time (busy_ns)
 * and, while a trace is recorded, each command's own execution time as a
 * span.
 *
 * A queue with profiling (every one by default) gives every command's
 * event its CL_PROFILING_COMMAND_START and _END on the device's clock.
 * MGPU_OPENCL_BUSY=0 makes plain queues (stream.c): busy time is then not
 * counted at all (no interval is opened, no status asked per command), and
 * only streams made while a trace is recorded have profiling and spans.
 *
 * Busy time is counted per interval, as the CUDA plugin does: the first
 * command queued on an idle stream opens one (its event is kept as
 * busy_first), and the interval closes when the stream is found idle: a
 * command is queued after the stream's last one completed (one status
 * query of that event per command), or a synchronize or query saw the last
 * one complete. END(last) - START(first) then goes to the device's
 * busy_ns. An in-order queue runs one command at a time, so idle gaps are
 * never counted; a stream waiting for another stream's event (a barrier on
 * a user event) counts as busy while it waits. No event but the stream's
 * last and the interval's first is kept: a burst of launches costs the
 * implementation no more than the launches themselves, and no event is
 * read or freed per launch when the stream is synchronized.
 *
 * While a trace is recorded, each kernel, copy and fill queued on a stream
 * also keeps its event on the stream's list (mgpu__ocl_op_timed, between
 * enqueue_begin and enqueue_end) with the span's name and arguments. When
 * the stream is found idle (synchronize, query, destroy) the completed
 * events are read, and each becomes a span.
 *
 * The device's clock is mapped onto the host's (mgpu__now_ns) as the CUDA
 * plugin does: one more marker queued on the idle queue and waited for,
 * and the host clock read when it completed, give the offset:
 * host = device + (now - END(marker)). The offset is kept, so a list cut
 * short on a stream that is never synchronized (more than MAX_PENDING
 * entries) maps what completed with the last one.
 *
 * Entries are reused through the stream's spare list. Lists, the interval
 * and the offset are guarded by the stream's lock.
 */
#include <stdio.h>
#include <stdlib.h>

#include "obs/trace.h"
#include "opencl-internal.h"

/* Entries a stream keeps before it reads the completed ones anyway. */
#define MAX_PENDING 1024

struct mgpu__ocl_span {
  cl_event ev;
  uint64_t seq; /* s->span_seq when it was queued */
  mgpu__trace_tag *tag; /* the span, NULL when only busy time is counted */
  mgpu__ocl_span *next;
};

/* s->lock held. */
static void span_put(mgpu__bstream *s, mgpu__ocl_span *sp) {
  if (sp->ev != NULL) clReleaseEvent(sp->ev);
  sp->ev = NULL;
  mgpu__free(sp->tag);
  sp->tag = NULL;
  sp->next = s->spare_spans;
  s->spare_spans = sp;
}

/* A tag named name with bytes as its argument, for a command queued where
 * the core set no tag of its own (or NULL). */
static mgpu__trace_tag *tag_for(const char *name, size_t bytes) {
  mgpu__trace_tag *tag = mgpu__ocl_env->obs->tag_copy();
  if (tag != NULL) return tag;
  tag = mgpu__calloc(1, sizeof *tag);
  if (tag == NULL) return NULL;
  snprintf(tag->name, sizeof tag->name, "%s", name);
  if (bytes > 0) {
    tag->args[0] = (mgpu__trace_arg){"bytes", NULL, (int64_t)bytes};
    tag->nargs = 1;
  }
  return tag;
}

/* The device time of ev's start and end, ev complete; 0 when it has none
 * (no profiling). */
static int times_of(cl_event ev, cl_ulong *t0, cl_ulong *t1) {
  return clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof *t0,
                                 t0, NULL) == CL_SUCCESS &&
         clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof *t1, t1,
                                 NULL) == CL_SUCCESS &&
         *t1 >= *t0;
}

/* Measures the offset from the device's clock to the host's with a marker
 * on s's queue, which the caller found idle. s->lock held. */
static void clock_sync(mgpu__bstream *s) {
  cl_event marker = NULL;
  if (clEnqueueMarkerWithWaitList(s->q, 0, NULL, &marker) != CL_SUCCESS)
    return;
  cl_ulong end = 0;
  if (clWaitForEvents(1, &marker) == CL_SUCCESS &&
      clGetEventProfilingInfo(marker, CL_PROFILING_COMMAND_END, sizeof end,
                              &end, NULL) == CL_SUCCESS) {
    s->clock_offset = (int64_t)(mgpu__ocl_env->obs->now_ns() - end);
    s->clock_known = 1;
  }
  clReleaseEvent(marker);
}

/* Reads every completed entry and drops failed ones; idle: the caller
 * found the queue idle, so the clock may be measured; entries numbered up
 * to done completed without error (the caller saw a later command do so,
 * and the queue is in order), so their status need not be asked. s->lock
 * held. */
static void harvest_locked(mgpu__bstream *s, int idle, uint64_t done) {
  const mgpu__obs_api *obs = mgpu__ocl_env->obs;
  if (idle && s->spans != NULL) clock_sync(s);
  mgpu__ocl_span **pp = &s->spans;
  while (*pp != NULL) {
    mgpu__ocl_span *sp = *pp;
    cl_int st = CL_COMPLETE;
    if (sp->seq > done && clGetEventInfo(sp->ev, CL_EVENT_COMMAND_EXECUTION_STATUS,
                                sizeof st, &st, NULL) != CL_SUCCESS)
      st = -1; /* dropped, not counted */
    /* Still queued or running: so is every later entry (an in-order
     * queue completes its commands in order), which saves asking each of
     * them, once per launch, when a burst outruns the device. */
    if (st > CL_COMPLETE) break;
    cl_ulong t0 = 0, t1 = 0;
    if (st == CL_COMPLETE && s->clock_known && times_of(sp->ev, &t0, &t1))
      obs->span_tag(s->d->id, s->track, sp->tag,
                    (uint64_t)((int64_t)t0 + s->clock_offset),
                    (uint64_t)((int64_t)t1 + s->clock_offset));
    *pp = sp->next;
    if (s->spans_tail == sp) s->spans_tail = NULL;
    s->nspans--;
    span_put(s, sp);
  }
}

/* ---- busy time (s->lock held) ---- */

/* Closes the open interval at end, a completed command (a failed one
 * closes it uncounted). */
static void busy_close(mgpu__bstream *s, cl_event end) {
  cl_ulong t0 = 0, t1 = 0, unused = 0;
  if (clGetEventProfilingInfo(s->busy_first, CL_PROFILING_COMMAND_START,
                              sizeof t0, &t0, NULL) == CL_SUCCESS &&
      times_of(end, &unused, &t1) && t1 > t0)
    mgpu__ocl_env->metric_add(s->d->id, MGPU__BMETRIC_BUSY_NS, t1 - t0);
  clReleaseEvent(s->busy_first);
  s->busy_first = NULL;
}

void mgpu__ocl_busy_queued(mgpu__bstream *s, cl_event ev) {
  cl_int st = CL_COMPLETE;
  if (s->busy_first != NULL && s->last != NULL &&
      clGetEventInfo(s->last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st,
                     &st, NULL) == CL_SUCCESS && st <= CL_COMPLETE)
    busy_close(s, s->last); /* the stream went idle before ev */
  if (s->busy_first == NULL) {
    clRetainEvent(ev);
    s->busy_first = ev;
  }
}

void mgpu__ocl_busy_drop(mgpu__bstream *s) {
  if (s->busy_first != NULL) clReleaseEvent(s->busy_first);
  s->busy_first = NULL;
}

void mgpu__ocl_op_timed(mgpu__bstream *s, cl_event ev, const char *name,
                        size_t bytes) {
  if (!s->profiling || ev == NULL || !mgpu__ocl_env->obs->trace_enabled())
    return;
  if (s->nspans >= MAX_PENDING) harvest_locked(s, 0, 0);
  mgpu__ocl_span *sp = s->spare_spans;
  if (sp != NULL)
    s->spare_spans = sp->next;
  else if ((sp = mgpu__calloc(1, sizeof *sp)) == NULL)
    return; /* the command is not timed, nothing else */
  sp->tag = tag_for(name, bytes);
  if (sp->tag == NULL) { /* not traced, nothing else */
    sp->next = s->spare_spans;
    s->spare_spans = sp;
    return;
  }
  clRetainEvent(ev);
  sp->ev = ev;
  sp->seq = ++s->span_seq;
  sp->next = NULL;
  if (s->spans_tail != NULL)
    s->spans_tail->next = sp;
  else
    s->spans = sp;
  s->spans_tail = sp;
  s->nspans++;
}

void mgpu__ocl_trace_harvest(mgpu__bstream *s, cl_event seen,
                             uint64_t done) {
  pthread_mutex_lock(&s->lock);
  harvest_locked(s, seen != NULL, done);
  /* Nothing queued after seen: the stream is idle. */
  if (seen != NULL && s->last == seen && s->busy_first != NULL)
    busy_close(s, seen);
  pthread_mutex_unlock(&s->lock);
}

void mgpu__ocl_trace_stream_free(mgpu__bstream *s) {
  harvest_locked(s, 1, 0); /* finished, but commands may have failed */
  cl_int st = CL_COMPLETE;
  if (s->busy_first != NULL && s->last != NULL &&
      clGetEventInfo(s->last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st,
                     &st, NULL) == CL_SUCCESS && st == CL_COMPLETE)
    busy_close(s, s->last);
  mgpu__ocl_busy_drop(s);
  while (s->spare_spans != NULL) {
    mgpu__ocl_span *sp = s->spare_spans;
    s->spare_spans = sp->next;
    mgpu__free(sp);
  }
}
