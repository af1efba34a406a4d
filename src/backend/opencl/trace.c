/* What the OpenCL devices tell the recording floor: each command's own
 * execution time, as busy time (busy_ns) and as trace spans.
 *
 * Every queue has profiling on, so every command's event carries its
 * CL_PROFILING_COMMAND_START and _END on the device's clock. Each kernel,
 * copy and fill queued on a stream keeps its event on the stream's list
 * (mgpu__ocl_op_timed, between enqueue_begin and enqueue_end), with the
 * span's name and arguments while a trace is recorded. When the stream is
 * found idle (synchronize, query, destroy) the completed events are read:
 * END - START of each goes to the device's busy_ns (an in-order queue runs
 * one command at a time, so the sum is the time the queue was busy, idle
 * gaps never counted), and each tagged one becomes a span.
 *
 * The device's clock is mapped onto the host's (mgpu__now_ns) as the CUDA
 * plugin does: one more marker queued on the idle queue and waited for,
 * and the host clock read when it completed, give the offset:
 * host = device + (now - END(marker)). The offset is kept, so a list cut
 * short on a stream that is never synchronized (more than MAX_PENDING
 * entries) maps what completed with the last one.
 *
 * Entries are reused through the stream's spare list. Lists and the offset
 * are guarded by the stream's lock.
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
  int tagged = 0;
  for (mgpu__ocl_span *sp = s->spans; idle && sp != NULL && !tagged;
       sp = sp->next)
    tagged = sp->tag != NULL;
  if (tagged) clock_sync(s);
  uint64_t busy = 0;
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
    if (st == CL_COMPLETE && times_of(sp->ev, &t0, &t1)) {
      busy += t1 - t0;
      if (sp->tag != NULL && s->clock_known)
        obs->span_tag(s->d->id, s->track, sp->tag,
                      (uint64_t)((int64_t)t0 + s->clock_offset),
                      (uint64_t)((int64_t)t1 + s->clock_offset));
    }
    *pp = sp->next;
    if (s->spans_tail == sp) s->spans_tail = NULL;
    s->nspans--;
    span_put(s, sp);
  }
  if (busy > 0)
    mgpu__ocl_env->metric_add(s->d->id, MGPU__BMETRIC_BUSY_NS, busy);
}

void mgpu__ocl_op_timed(mgpu__bstream *s, cl_event ev, const char *name,
                        size_t bytes) {
  if (ev == NULL) return;
  if (s->nspans >= MAX_PENDING) harvest_locked(s, 0, 0);
  mgpu__ocl_span *sp = s->spare_spans;
  if (sp != NULL)
    s->spare_spans = sp->next;
  else if ((sp = mgpu__calloc(1, sizeof *sp)) == NULL)
    return; /* the command is not timed, nothing else */
  sp->tag = mgpu__ocl_env->obs->trace_enabled() ? tag_for(name, bytes) : NULL;
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

void mgpu__ocl_trace_harvest(mgpu__bstream *s, int idle, uint64_t done) {
  pthread_mutex_lock(&s->lock);
  harvest_locked(s, idle, done);
  pthread_mutex_unlock(&s->lock);
}

void mgpu__ocl_trace_stream_free(mgpu__bstream *s) {
  harvest_locked(s, 1, 0); /* finished, but commands may have failed */
  while (s->spare_spans != NULL) {
    mgpu__ocl_span *sp = s->spare_spans;
    s->spare_spans = sp->next;
    mgpu__free(sp);
  }
}
