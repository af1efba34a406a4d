/* Streams, events, copies and host callbacks of OpenCL devices.
 *
 * A stream is an in-order command queue. Every command queued on it keeps
 * its event as the stream's last one (s->last, under s->lock); as the queue
 * is in order, the last event completes after everything before it, and an
 * error of earlier work shows in its status (OpenCL fails the commands
 * after a failed one). query and synchronize read it, and clear it once
 * they reported an error.
 *
 * Events are markers. A stream waits for an event of its own context with a
 * barrier on it; for an event of another platform (another context) with a
 * user event of its own context that a callback on the source event
 * completes. Host callbacks are the same pattern on one queue: a marker
 * whose completion callback runs fn and then completes a user event that a
 * barrier behind it waits for, so later work waits for fn.
 *
 * Commands that others wait for from the host (records, callbacks) are
 * flushed at once, so that they run even if nobody synchronizes the queue.
 */
#include <stdio.h>
#include <stdlib.h>

#include "opencl-internal.h"

void mgpu__ocl_enqueue_begin(mgpu__bstream *s) { pthread_mutex_lock(&s->lock); }

void mgpu__ocl_enqueue_end(mgpu__bstream *s, cl_int err, cl_event ev) {
  if (err == CL_SUCCESS && ev != NULL) {
    if (s->last != NULL) clReleaseEvent(s->last);
    s->last = ev;
  } else if (ev != NULL) {
    clReleaseEvent(ev);
  }
  pthread_mutex_unlock(&s->lock);
}

/* A reference to s's last event, or NULL. */
static cl_event last_event(mgpu__bstream *s) {
  pthread_mutex_lock(&s->lock);
  cl_event ev = s->last;
  if (ev != NULL) clRetainEvent(ev);
  pthread_mutex_unlock(&s->lock);
  return ev;
}

/* Drops s's last event if it is still ev (its error was reported). */
static void forget_last(mgpu__bstream *s, cl_event ev) {
  pthread_mutex_lock(&s->lock);
  if (s->last == ev) {
    clReleaseEvent(s->last);
    s->last = NULL;
  }
  pthread_mutex_unlock(&s->lock);
}

/* The execution status of ev (CL_COMPLETE, a negative error, or pending). */
static cl_int status_of(cl_event ev) {
  cl_int st = CL_COMPLETE;
  cl_int err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS,
                              sizeof st, &st, NULL);
  return err != CL_SUCCESS ? err : st;
}

static int lost_rc(mgpu__bdevice *d) {
  char why[160];
  if (!mgpu__ocl_lost(d, why, sizeof why)) return 0;
  return mgpu__ocl_env->set_error(MGPU_EDEVLOST, "opencl device %d was lost "
                                  "(%s): work queued on it may not have run",
                                  d->id, why);
}

/* ---- streams ---- */

int mgpu__ocl_stream_create(mgpu__bdevice *d, mgpu__bstream **out) {
  *out = NULL;
  mgpu__bstream *s = calloc(1, sizeof *s);
  if (s == NULL)
    return mgpu__ocl_env->set_error(MGPU_ENOMEM, "device %d: out of host "
                                    "memory for a stream", d->id);
  cl_queue_properties props[] = {CL_QUEUE_PROPERTIES,
                                 CL_QUEUE_PROFILING_ENABLE, 0};
  cl_int err = CL_SUCCESS;
  s->q = clCreateCommandQueueWithProperties(d->phys->ctx, d->phys->dev, props,
                                            &err);
  if (err != CL_SUCCESS) {
    free(s);
    return mgpu__ocl_fail(d, err, "clCreateCommandQueueWithProperties");
  }
  s->d = d;
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return 0;
}

void mgpu__ocl_stream_destroy(mgpu__bdevice *d, mgpu__bstream *s) {
  (void)d;
  if (s == NULL) return;
  (void)clFinish(s->q);
  if (s->last != NULL) clReleaseEvent(s->last);
  clReleaseCommandQueue(s->q);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int mgpu__ocl_stream_synchronize(mgpu__bdevice *d, mgpu__bstream *s) {
  cl_event ev = last_event(s);
  cl_int err = clFinish(s->q);
  int rc = 0;
  if (err != CL_SUCCESS) {
    rc = mgpu__ocl_fail(d, err, "work on the stream failed (clFinish)");
  } else if (ev != NULL && (err = status_of(ev)) < 0) {
    forget_last(s, ev);
    rc = mgpu__ocl_fail(d, err, "work on the stream failed");
  }
  if (ev != NULL) clReleaseEvent(ev);
  if (rc == 0) rc = lost_rc(d);
  return rc;
}

int mgpu__ocl_stream_query(mgpu__bdevice *d, mgpu__bstream *s) {
  cl_event ev = last_event(s);
  if (ev == NULL) return lost_rc(d);
  (void)clFlush(s->q);
  cl_int st = status_of(ev);
  int rc = 0;
  if (st < 0) {
    forget_last(s, ev);
    rc = mgpu__ocl_fail(d, st, "work on the stream failed");
  } else if (st != CL_COMPLETE) {
    rc = MGPU_EAGAIN;
  }
  clReleaseEvent(ev);
  if (rc == 0) rc = lost_rc(d);
  return rc;
}

void *mgpu__ocl_stream_native(mgpu__bstream *s) { return (void *)s->q; }

/* ---- events ---- */

int mgpu__ocl_event_create(mgpu__bdevice *d, mgpu__bevent **out) {
  *out = NULL;
  mgpu__bevent *e = calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__ocl_env->set_error(MGPU_ENOMEM, "device %d: out of host "
                                    "memory for an event", d->id);
  pthread_mutex_init(&e->lock, NULL);
  *out = e;
  return 0;
}

void mgpu__ocl_event_destroy(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  if (e == NULL) return;
  if (e->ev != NULL) clReleaseEvent(e->ev);
  pthread_mutex_destroy(&e->lock);
  free(e);
}

/* A reference to e's marker, or NULL when never recorded. */
static cl_event event_get(mgpu__bevent *e) {
  pthread_mutex_lock(&e->lock);
  cl_event ev = e->ev;
  if (ev != NULL) clRetainEvent(ev);
  pthread_mutex_unlock(&e->lock);
  return ev;
}

int mgpu__ocl_event_record(mgpu__bdevice *d, mgpu__bevent *e,
                           mgpu__bstream *s) {
  cl_event ev = NULL;
  mgpu__ocl_enqueue_begin(s);
  cl_int err = clEnqueueMarkerWithWaitList(s->q, 0, NULL, &ev);
  if (err == CL_SUCCESS) clRetainEvent(ev); /* one for e, one for s->last */
  mgpu__ocl_enqueue_end(s, err, ev);
  if (err != CL_SUCCESS)
    return mgpu__ocl_fail(d, err, "clEnqueueMarkerWithWaitList");
  (void)clFlush(s->q);
  pthread_mutex_lock(&e->lock);
  cl_event old = e->ev;
  e->ev = ev;
  pthread_mutex_unlock(&e->lock);
  if (old != NULL) clReleaseEvent(old);
  return 0;
}

int mgpu__ocl_event_synchronize(mgpu__bdevice *d, mgpu__bevent *e) {
  cl_event ev = event_get(e);
  if (ev == NULL) return 0; /* never recorded: nothing to wait for */
  cl_int err = clWaitForEvents(1, &ev);
  cl_int st = status_of(ev);
  clReleaseEvent(ev);
  if (st < 0 || err != CL_SUCCESS)
    return mgpu__ocl_fail(d, st < 0 ? st : err, "work before the event failed "
                          "(clWaitForEvents)");
  return 0;
}

int mgpu__ocl_event_query(mgpu__bdevice *d, mgpu__bevent *e) {
  cl_event ev = event_get(e);
  if (ev == NULL) return 0;
  cl_int st = status_of(ev);
  clReleaseEvent(ev);
  if (st < 0)
    return mgpu__ocl_fail(d, st, "work before the event failed");
  return st == CL_COMPLETE ? 0 : MGPU_EAGAIN;
}

int mgpu__ocl_event_elapsed_ms(mgpu__bdevice *d, mgpu__bevent *start,
                               mgpu__bevent *end, float *ms) {
  cl_event a = event_get(start), b = event_get(end);
  int rc = 0;
  if (a == NULL || b == NULL) {
    rc = mgpu__ocl_env->set_error(MGPU_EINVAL, "device %d: elapsed time "
                                  "between events of which one was never "
                                  "recorded", d->id);
  } else if (status_of(a) != CL_COMPLETE || status_of(b) != CL_COMPLETE) {
    rc = mgpu__ocl_env->set_error(MGPU_EAGAIN, "device %d: elapsed time "
                                  "between events not both complete", d->id);
  } else {
    cl_ulong ta = 0, tb = 0;
    cl_int err = clGetEventProfilingInfo(a, CL_PROFILING_COMMAND_END,
                                         sizeof ta, &ta, NULL);
    if (err == CL_SUCCESS)
      err = clGetEventProfilingInfo(b, CL_PROFILING_COMMAND_END, sizeof tb,
                                    &tb, NULL);
    if (err != CL_SUCCESS)
      rc = mgpu__ocl_fail(d, err, "clGetEventProfilingInfo");
    else
      *ms = (float)(((double)tb - (double)ta) / 1e6);
  }
  if (a != NULL) clReleaseEvent(a);
  if (b != NULL) clReleaseEvent(b);
  return rc;
}

/* Completes a user event of another context when the source event does,
 * with the source's error if it failed. */
static void CL_CALLBACK complete_user(cl_event src, cl_int status, void *p) {
  (void)src;
  cl_event user = p;
  clSetUserEventStatus(user, status < 0 ? status : CL_COMPLETE);
  clReleaseEvent(user);
}

int mgpu__ocl_stream_wait_event(mgpu__bdevice *d, mgpu__bstream *s,
                                mgpu__bdevice *ed, mgpu__bevent *e) {
  cl_event ev = event_get(e);
  if (ev == NULL) return 0;
  cl_event wait = ev, user = NULL;
  cl_int err = CL_SUCCESS;
  if (ed->phys->ctx != d->phys->ctx) {
    user = clCreateUserEvent(d->phys->ctx, &err);
    if (err == CL_SUCCESS) wait = user;
  }
  cl_event bar = NULL;
  if (err == CL_SUCCESS) {
    mgpu__ocl_enqueue_begin(s);
    err = clEnqueueBarrierWithWaitList(s->q, 1, &wait, &bar);
    mgpu__ocl_enqueue_end(s, err, bar);
  }
  if (err == CL_SUCCESS && user != NULL) {
    clRetainEvent(user); /* the callback's reference */
    err = clSetEventCallback(ev, CL_COMPLETE, complete_user, user);
    if (err != CL_SUCCESS) {
      /* The barrier is queued: let it pass rather than block the stream
       * for good, and report the failure. */
      clSetUserEventStatus(user, CL_COMPLETE);
      clReleaseEvent(user);
    }
  }
  if (user != NULL) clReleaseEvent(user);
  clReleaseEvent(ev);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "waiting for an event of device %d", ed->id);
    return mgpu__ocl_fail(d, err, what);
  }
  return 0;
}

/* ---- copies ---- */

int mgpu__ocl_memcpy_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                           const void *src, size_t size,
                           mgpu__copy_kind kind) {
  if (size == 0) return 0;
  cl_event ev = NULL;
  mgpu__ocl_enqueue_begin(s);
  cl_int err = clEnqueueSVMMemcpy(s->q, CL_FALSE, dst, src, size, 0, NULL,
                                  &ev);
  mgpu__ocl_enqueue_end(s, err, ev);
  if (err != CL_SUCCESS) {
    static const char *names[] = {"host-to-device", "device-to-host",
                                  "device-to-device", "host-to-host"};
    char what[96];
    snprintf(what, sizeof what, "%s copy of %zu bytes (clEnqueueSVMMemcpy)",
             (unsigned)kind < 4 ? names[kind] : "", size);
    return mgpu__ocl_fail(d, err, what);
  }
  return 0;
}

int mgpu__ocl_memcpy2d_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                             size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t height,
                             mgpu__copy_kind kind) {
  if (width == 0 || height == 0) return 0;
  if (dpitch == width && spitch == width)
    return mgpu__ocl_memcpy_async(d, s, dst, src, width * height, kind);
  /* SVM has no rectangular copy: one copy per row, in order on the queue;
   * the last row's event stands for all of them. */
  cl_event ev = NULL;
  cl_int err = CL_SUCCESS;
  mgpu__ocl_enqueue_begin(s);
  for (size_t r = 0; r < height && err == CL_SUCCESS; r++)
    err = clEnqueueSVMMemcpy(s->q, CL_FALSE, (char *)dst + r * dpitch,
                             (const char *)src + r * spitch, width, 0, NULL,
                             r + 1 == height ? &ev : NULL);
  mgpu__ocl_enqueue_end(s, err, ev);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "pitched copy of %zu x %zu bytes "
             "(clEnqueueSVMMemcpy)", height, width);
    return mgpu__ocl_fail(d, err, what);
  }
  return 0;
}

int mgpu__ocl_memset_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                           int value, size_t size) {
  if (size == 0) return 0;
  unsigned char pattern = (unsigned char)value;
  cl_event ev = NULL;
  mgpu__ocl_enqueue_begin(s);
  cl_int err = clEnqueueSVMMemFill(s->q, dst, &pattern, 1, size, 0, NULL, &ev);
  mgpu__ocl_enqueue_end(s, err, ev);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "fill of %zu bytes (clEnqueueSVMMemFill)",
             size);
    return mgpu__ocl_fail(d, err, what);
  }
  return 0;
}

/* ---- host callbacks ---- */

typedef struct callback_rec {
  void (*fn)(void *arg);
  void *arg;
  cl_event gate; /* the user event the barrier behind the marker waits for */
} callback_rec;

/* Runs even when earlier work failed (a callback frees what the work used);
 * the failure then passes on to the gate, so later work sees it. */
static void CL_CALLBACK run_callback(cl_event marker, cl_int status,
                                     void *p) {
  (void)marker;
  callback_rec *rec = p;
  rec->fn(rec->arg);
  clSetUserEventStatus(rec->gate, status < 0 ? status : CL_COMPLETE);
  clReleaseEvent(rec->gate);
  free(rec);
}

int mgpu__ocl_host_callback(mgpu__bdevice *d, mgpu__bstream *s,
                            void (*fn)(void *arg), void *arg) {
  callback_rec *rec = calloc(1, sizeof *rec);
  if (rec == NULL)
    return mgpu__ocl_env->set_error(MGPU_ENOMEM, "device %d: out of host "
                                    "memory for a stream callback", d->id);
  rec->fn = fn;
  rec->arg = arg;
  cl_int err = CL_SUCCESS;
  rec->gate = clCreateUserEvent(d->phys->ctx, &err);
  if (err != CL_SUCCESS) {
    free(rec);
    return mgpu__ocl_fail(d, err, "clCreateUserEvent for a stream callback");
  }
  cl_event marker = NULL, bar = NULL;
  mgpu__ocl_enqueue_begin(s);
  err = clEnqueueMarkerWithWaitList(s->q, 0, NULL, &marker);
  if (err == CL_SUCCESS) {
    err = clEnqueueBarrierWithWaitList(s->q, 1, &rec->gate, &bar);
    if (err != CL_SUCCESS) clSetUserEventStatus(rec->gate, CL_COMPLETE);
  }
  /* Registered last: once it is, fn runs whatever happens, so nothing may
   * fail after it. */
  if (err == CL_SUCCESS)
    err = clSetEventCallback(marker, CL_COMPLETE, run_callback, rec);
  if (err != CL_SUCCESS && bar != NULL)
    clSetUserEventStatus(rec->gate, CL_COMPLETE);
  mgpu__ocl_enqueue_end(s, err, bar);
  if (marker != NULL) clReleaseEvent(marker);
  if (err != CL_SUCCESS) {
    clReleaseEvent(rec->gate);
    free(rec);
    return mgpu__ocl_fail(d, err, "queueing a stream callback");
  }
  (void)clFlush(s->q);
  return 0;
}
