/* Streams, events, copies and host callbacks of OpenCL devices.
 *
 * A stream is an in-order command queue. Every command queued on it keeps
 * its event as the stream's last one (s->last, under s->lock); as the queue
 * is in order, the last event completes after everything before it, and an
 * error of earlier work shows in its status (OpenCL fails the commands
 * after a failed one). query and synchronize read it, and clear it once
 * they reported an error.
 *
 * Events are markers. OpenCL implementations differ in how well they order
 * a command after an event of another queue (PoCL 3.1's "basic" device
 * deadlocks or runs it early), and a completion callback may run at once
 * in the thread that registers it, with the implementation's locks held.
 * So no command here depends on another queue's event directly, and no
 * callback of the implementation runs mgpu's code: a stream waits for an
 * event of another queue with a barrier on a user event of its own, and the
 * event's completion callback only hands the user event to the relay
 * thread, which completes it. Host callbacks are the same pattern on one
 * queue: a marker whose completion hands fn to the relay thread, which runs
 * fn and then completes the user event that a barrier behind the marker
 * waits for, so later work waits for fn. The relay thread runs while a
 * device is open (relay_start / relay_stop, from open and close).
 *
 * Commands that others wait for from the host (records, callbacks) are
 * flushed at once, so that they run even if nobody synchronizes the queue.
 */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

#include "opencl-internal.h"

void mgpu__ocl_enqueue_begin(mgpu__bstream *s) { pthread_mutex_lock(&s->lock); }

void mgpu__ocl_enqueue_end(mgpu__bstream *s, cl_int err, cl_event ev) {
  if (err == CL_SUCCESS && ev != NULL) {
    if (s->busy) mgpu__ocl_busy_queued(s, ev);
    /* Released while it may still be pending, as a bare burst leaves its
     * events to the implementation: whoever drops the last reference of a
     * completed event frees it. */
    if (s->last != NULL) clReleaseEvent(s->last);
    s->last = ev;
  } else if (ev != NULL) {
    clReleaseEvent(ev);
  }
  pthread_mutex_unlock(&s->lock);
}

/* ---- copy times (s->lock held) ---- */

/* Hands the completed copies to the metrics (every one when all is set,
 * after the queue was finished), and drops failed ones. */
static void copies_harvest_locked(mgpu__bstream *s) {
  mgpu__ocl_timed_copy **pp = &s->copies;
  while (*pp != NULL) {
    mgpu__ocl_timed_copy *c = *pp;
    cl_int st = CL_COMPLETE;
    if (clGetEventInfo(c->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st,
                       &st, NULL) != CL_SUCCESS)
      st = -1;
    if (st > CL_COMPLETE) { /* still queued or running */
      pp = &c->next;
      continue;
    }
    cl_ulong t0 = 0, t1 = 0;
    if (st == CL_COMPLETE &&
        clGetEventProfilingInfo(c->ev, CL_PROFILING_COMMAND_START, sizeof t0,
                                &t0, NULL) == CL_SUCCESS &&
        clGetEventProfilingInfo(c->ev, CL_PROFILING_COMMAND_END, sizeof t1,
                                &t1, NULL) == CL_SUCCESS)
      mgpu__ocl_env->obs->copy_ran(s->d->id, c->path, c->bytes,
                                   t1 > t0 ? t1 - t0 : 0);
    *pp = c->next;
    clReleaseEvent(c->ev);
    mgpu__free(c);
    s->ncopies--;
  }
}

void mgpu__ocl_copy_timed(mgpu__bstream *s, cl_event ev, int path,
                          size_t bytes) {
  /* Without profiling the copy has no times: nothing to keep. */
  if (!s->profiling || path < 0 || path >= MGPU_METRIC_PATHS || ev == NULL)
    return;
  /* A stream that is never synchronized keeps a bounded list. */
  if (s->ncopies >= 256) copies_harvest_locked(s);
  mgpu__ocl_timed_copy *c = mgpu__malloc(sizeof *c);
  if (c == NULL) return; /* the copy is not counted, nothing else */
  clRetainEvent(ev);
  c->ev = ev;
  c->path = path;
  c->bytes = bytes;
  c->next = s->copies;
  s->copies = c;
  s->ncopies++;
}

/* Reads the times of what completed (copies, spans, the busy interval;
 * seen and done as for mgpu__ocl_trace_harvest). A queue without
 * profiling has none: the stream's lock is not even taken. */
static void times_harvest(mgpu__bstream *s, cl_event seen, uint64_t done) {
  if (!s->profiling) return;
  pthread_mutex_lock(&s->lock);
  copies_harvest_locked(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__ocl_trace_harvest(s, seen, done);
}

/* A reference to s's last event, or NULL; *seq: the number of the newest
 * timed entry queued before it (trace.c). */
static cl_event last_event(mgpu__bstream *s, uint64_t *seq) {
  pthread_mutex_lock(&s->lock);
  cl_event ev = s->last;
  if (ev != NULL) clRetainEvent(ev);
  *seq = s->span_seq;
  pthread_mutex_unlock(&s->lock);
  return ev;
}

/* Drops s's last event if it is still ev (its error was reported), and
 * the busy interval it ended. */
static void forget_last(mgpu__bstream *s, cl_event ev) {
  pthread_mutex_lock(&s->lock);
  if (s->last == ev) {
    clReleaseEvent(s->last);
    s->last = NULL;
    mgpu__ocl_busy_drop(s);
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
  return mgpu__error(MGPU_EDEVLOST, "opencl device %d was lost "
                     "(%s): work queued on it may not have run",
                     d->id, why);
}

/* ---- streams ---- */

/* Streams have profiling on for busy time (MGPU_OPENCL_BUSY=1, the
 * default). With MGPU_OPENCL_BUSY=0 a queue is plain, as a bare one: PoCL
 * spends 5 to 20% more on a burst of launches on a profiling queue. A
 * stream made while a trace is recorded (MGPU_TRACE from mgpu_init on: all
 * of them) has profiling anyway, so that its commands become spans; busy
 * time still is not counted, as MGPU_CUDA_BUSY=0 leaves the CUDA plugin's
 * spans and drops its busy time. */
int mgpu__ocl_stream_create(mgpu__bdevice *d, mgpu__bstream **out) {
  *out = NULL;
  mgpu__bstream *s = mgpu__calloc(1, sizeof *s);
  if (s == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory for an OpenCL command queue", d->id);
  const mgpu_config *cfg = mgpu__ocl_env->config;
  s->busy = cfg->opencl_busy != 0;
  s->profiling = s->busy || cfg->trace != NULL ||
                 mgpu__ocl_env->obs->trace_enabled();
  cl_queue_properties props[] = {CL_QUEUE_PROPERTIES,
                                 CL_QUEUE_PROFILING_ENABLE, 0};
  cl_int err = CL_SUCCESS;
  s->q = clCreateCommandQueueWithProperties(
      d->phys->ctx, d->sub != NULL ? d->sub : d->phys->dev,
      s->profiling ? props : NULL, &err);
  if (err != CL_SUCCESS) {
    mgpu__free(s);
    return mgpu__ocl_fail(d, err, "clCreateCommandQueueWithProperties");
  }
  s->d = d;
  s->track = mgpu__ocl_env->obs->track_new(d->id, NULL);
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return 0;
}

void mgpu__ocl_stream_destroy(mgpu__bdevice *d, mgpu__bstream *s) {
  (void)d;
  if (s == NULL) return;
  (void)clFinish(s->q);
  copies_harvest_locked(s); /* finished: every copy is done */
  mgpu__ocl_trace_stream_free(s);
  mgpu__ocl_stream_kernels_free(s);
  if (s->last != NULL) clReleaseEvent(s->last);
  clReleaseCommandQueue(s->q);
  pthread_mutex_destroy(&s->lock);
  mgpu__free(s);
}

int mgpu__ocl_stream_synchronize(mgpu__bdevice *d, mgpu__bstream *s) {
  uint64_t seq = 0;
  cl_event ev = last_event(s, &seq);
  cl_int err = clFinish(s->q);
  int rc = 0;
  if (err != CL_SUCCESS) {
    rc = mgpu__ocl_fail(d, err, "work on the stream failed (clFinish)");
  } else if (ev != NULL && (err = status_of(ev)) < 0) {
    forget_last(s, ev);
    rc = mgpu__ocl_fail(d, err, "work on the stream failed");
  }
  /* Without an error every command queued before ev completed. */
  times_harvest(s, rc == 0 ? ev : NULL, rc == 0 && ev != NULL ? seq : 0);
  if (ev != NULL) clReleaseEvent(ev);
  if (rc == 0) rc = lost_rc(d);
  return rc;
}

int mgpu__ocl_stream_query(mgpu__bdevice *d, mgpu__bstream *s) {
  uint64_t seq = 0;
  cl_event ev = last_event(s, &seq);
  if (ev == NULL) return lost_rc(d);
  (void)clFlush(s->q);
  cl_int st = status_of(ev);
  int rc = 0;
  if (st < 0) {
    forget_last(s, ev);
    rc = mgpu__ocl_fail(d, st, "work on the stream failed");
  } else if (st != CL_COMPLETE) {
    rc = MGPU_EAGAIN;
  } else {
    times_harvest(s, ev, seq); /* ev and all before it are done */
  }
  clReleaseEvent(ev);
  if (rc == 0) rc = lost_rc(d);
  return rc;
}

void *mgpu__ocl_stream_native(mgpu__bstream *s) { return (void *)s->q; }

/* ---- the relay thread ---- */

/* One hand-off: when src completes, the relay thread runs fn (if any) and
 * then completes gate with src's status. */
typedef struct relay {
  void (*fn)(void *arg);
  void *arg;
  cl_event gate;
  cl_int status;
  struct relay *next;
} relay;

/* relay_lock guards everything below; it is taken last (a leaf). */
static pthread_mutex_t relay_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t relay_cond = PTHREAD_COND_INITIALIZER;
static relay *relay_head, *relay_tail; /* handed over, not yet run */
static int relay_pending; /* registered and not yet run */
static int relay_users;   /* open devices */
static int relay_stopping;
static pthread_t relay_thread;

static void *relay_main(void *unused) {
  (void)unused;
  mgpu__ocl_env->thread_role_set("the OpenCL plugin's relay thread (a "
                                 "stream callback)");
  pthread_mutex_lock(&relay_lock);
  for (;;) {
    relay *r = relay_head;
    if (r == NULL) {
      if (relay_stopping && relay_pending == 0) break;
      pthread_cond_wait(&relay_cond, &relay_lock);
      continue;
    }
    relay_head = r->next;
    if (relay_head == NULL) relay_tail = NULL;
    pthread_mutex_unlock(&relay_lock);
    /* A callback runs even when earlier work failed (it frees what the
     * work used); the failure passes on to the gate. */
    if (r->fn != NULL) r->fn(r->arg);
    clSetUserEventStatus(r->gate, r->status < 0 ? r->status : CL_COMPLETE);
    clReleaseEvent(r->gate);
    mgpu__free(r);
    pthread_mutex_lock(&relay_lock);
    relay_pending--;
  }
  pthread_mutex_unlock(&relay_lock);
  return NULL;
}

/* The implementation's completion callback: hands r over, nothing more. */
static void CL_CALLBACK relay_notify(cl_event src, cl_int status, void *p) {
  (void)src;
  relay *r = p;
  r->status = status;
  pthread_mutex_lock(&relay_lock);
  if (relay_tail != NULL)
    relay_tail->next = r;
  else
    relay_head = r;
  relay_tail = r;
  pthread_cond_signal(&relay_cond);
  pthread_mutex_unlock(&relay_lock);
}

int mgpu__ocl_relay_start(void) {
  int rc = 0;
  pthread_mutex_lock(&relay_lock);
  if (relay_users == 0) {
    relay_stopping = 0;
    rc = pthread_create(&relay_thread, NULL, relay_main, NULL);
  }
  if (rc == 0) relay_users++;
  pthread_mutex_unlock(&relay_lock);
  return rc == 0 ? 0 : MGPU_ENOMEM;
}

void mgpu__ocl_relay_stop(void) {
  pthread_mutex_lock(&relay_lock);
  int last = --relay_users == 0;
  if (last) {
    /* Every queue was finished, so every registered callback comes: the
     * thread runs them all before it ends. */
    relay_stopping = 1;
    pthread_cond_signal(&relay_cond);
  }
  pthread_mutex_unlock(&relay_lock);
  if (last) pthread_join(relay_thread, NULL);
}

/* Queues on s a barrier that later work waits behind until src completed
 * and fn (when set) ran on the relay thread. src NULL: a marker queued on s
 * here is the source (a host callback). Returns a CL error code; on
 * failure fn will not run. */
static cl_int relay_queue(mgpu__bdevice *d, mgpu__bstream *s, cl_event src,
                          void (*fn)(void *arg), void *arg) {
  relay *r = mgpu__calloc(1, sizeof *r);
  if (r == NULL) return CL_OUT_OF_HOST_MEMORY;
  r->fn = fn;
  r->arg = arg;
  cl_int err = CL_SUCCESS;
  r->gate = clCreateUserEvent(d->phys->ctx, &err);
  if (err != CL_SUCCESS) {
    mgpu__free(r);
    return err;
  }
  cl_event marker = NULL, bar = NULL;
  mgpu__ocl_enqueue_begin(s);
  if (src == NULL) {
    err = clEnqueueMarkerWithWaitList(s->q, 0, NULL, &marker);
    src = marker;
  }
  if (err == CL_SUCCESS)
    err = clEnqueueBarrierWithWaitList(s->q, 1, &r->gate, &bar);
  if (err == CL_SUCCESS) {
    pthread_mutex_lock(&relay_lock);
    relay_pending++;
    pthread_mutex_unlock(&relay_lock);
    /* Registered last: once it is, r belongs to the relay. */
    err = clSetEventCallback(src, CL_COMPLETE, relay_notify, r);
    if (err != CL_SUCCESS) {
      pthread_mutex_lock(&relay_lock);
      relay_pending--;
      pthread_mutex_unlock(&relay_lock);
      /* The barrier is queued: let it pass rather than block the stream. */
      clSetUserEventStatus(r->gate, CL_COMPLETE);
    }
  }
  mgpu__ocl_enqueue_end(s, err, bar);
  if (marker != NULL) clReleaseEvent(marker);
  if (err != CL_SUCCESS) {
    clReleaseEvent(r->gate);
    mgpu__free(r);
    return err;
  }
  (void)clFlush(s->q);
  return CL_SUCCESS;
}

/* ---- events ---- */

int mgpu__ocl_event_create(mgpu__bdevice *d, mgpu__bevent **out) {
  *out = NULL;
  mgpu__bevent *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
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
  mgpu__free(e);
}

/* A reference to e's marker, or NULL when never recorded (below). */
static cl_event event_get(mgpu__bevent *e);

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
  e->q = s->q;
  e->timed = s->profiling;
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

/* A reference to e's marker, or NULL when never recorded; *timed: it was
 * recorded on a queue with profiling. */
static cl_event event_get_timed(mgpu__bevent *e, int *timed) {
  pthread_mutex_lock(&e->lock);
  cl_event ev = e->ev;
  if (ev != NULL) clRetainEvent(ev);
  *timed = e->timed;
  pthread_mutex_unlock(&e->lock);
  return ev;
}

static cl_event event_get(mgpu__bevent *e) {
  int timed;
  return event_get_timed(e, &timed);
}

/* Milliseconds from a's end to b's (both complete, both with times). */
static int markers_elapsed(mgpu__bdevice *d, cl_event a, cl_event b,
                           float *ms) {
  cl_ulong ta = 0, tb = 0;
  cl_int err = clGetEventProfilingInfo(a, CL_PROFILING_COMMAND_END, sizeof ta,
                                       &ta, NULL);
  if (err == CL_SUCCESS)
    err = clGetEventProfilingInfo(b, CL_PROFILING_COMMAND_END, sizeof tb, &tb,
                                  NULL);
  if (err != CL_SUCCESS) return mgpu__ocl_fail(d, err, "clGetEventProfilingInfo");
  *ms = (float)(((double)tb - (double)ta) / 1e6);
  return 0;
}

/* A marker has times only on a queue with profiling; without, the honest
 * answer is that there is no time to give, not a number. */
int mgpu__ocl_event_elapsed_ms(mgpu__bdevice *d, mgpu__bevent *start,
                               mgpu__bevent *end, float *ms) {
  int ta = 0, tb = 0;
  cl_event a = event_get_timed(start, &ta), b = event_get_timed(end, &tb);
  int rc = 0;
  if (a == NULL || b == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "device %d: elapsed time "
                     "between events of which one was never "
                     "recorded", d->id);
  } else if (!ta || !tb) {
    rc = mgpu__error(MGPU_ENOTSUP, "opencl device %d: elapsed time between "
                     "events recorded on a stream without profiling: "
                     "MGPU_OPENCL_BUSY=0 turned timing off on this device's "
                     "streams (and no trace was recorded when the stream "
                     "was made)", d->id);
  } else if (status_of(a) != CL_COMPLETE || status_of(b) != CL_COMPLETE) {
    rc = mgpu__error(MGPU_EAGAIN, "device %d: elapsed time "
                     "between events not both complete", d->id);
  } else {
    rc = markers_elapsed(d, a, b, ms);
  }
  if (a != NULL) clReleaseEvent(a);
  if (b != NULL) clReleaseEvent(b);
  return rc;
}

int mgpu__ocl_stream_wait_event(mgpu__bdevice *d, mgpu__bstream *s,
                                mgpu__bdevice *ed, mgpu__bevent *e) {
  pthread_mutex_lock(&e->lock);
  cl_event ev = e->ev;
  if (ev != NULL) clRetainEvent(ev);
  int same_queue = e->q == s->q;
  pthread_mutex_unlock(&e->lock);
  if (ev == NULL) return 0;
  if (same_queue) { /* in order already */
    clReleaseEvent(ev);
    return 0;
  }
  cl_int err = relay_queue(d, s, ev, NULL, NULL);
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
  /* The path the copy layer set, else the kind's (host to host: none). */
  static const int kind_path[] = {MGPU_METRIC_PATH_H2D, MGPU_METRIC_PATH_D2H,
                                  MGPU_METRIC_PATH_D2D, -1};
  int path = mgpu__ocl_env->obs->path();
  if (path < 0 && (unsigned)kind < 4) path = kind_path[kind];
  cl_event ev = NULL;
  mgpu__ocl_enqueue_begin(s);
  cl_int err = clEnqueueSVMMemcpy(s->q, CL_FALSE, dst, src, size, 0, NULL,
                                  &ev);
  if (err == CL_SUCCESS) {
    mgpu__ocl_copy_timed(s, ev, path, size);
    static const char *const path_span[] = {"copy.h2d", "copy.d2h",
                                            "copy.d2d", "copy.peer",
                                            "copy.staged"};
    mgpu__ocl_op_timed(s, ev, path >= 0 && path < 5 ? path_span[path]
                                                    : "copy.h2h", size);
  }
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
  if (err == CL_SUCCESS) mgpu__ocl_op_timed(s, ev, "memset", size);
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

int mgpu__ocl_host_callback(mgpu__bdevice *d, mgpu__bstream *s,
                            void (*fn)(void *arg), void *arg) {
  cl_int err = relay_queue(d, s, NULL, fn, arg);
  if (err != CL_SUCCESS)
    return mgpu__ocl_fail(d, err, "queueing a stream callback");
  return 0;
}
