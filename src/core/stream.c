/* Streams, events, callbacks and kernel launches: handle checks in front of
 * the backend's own queues.
 *
 * Every stream of a device, the user's and the internal spare ones, is on
 * the device's list (streams_lock), so that mgpu_device_synchronize and
 * mgpu_shutdown can reach all of them. Spare streams serve the synchronous
 * calls (mgpu_memcpy_htod ...), a few per device, lent one caller at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/capture.h"
#include "core/core-internal.h"
#include "mgpu/interop.h"
#include "util/fault.h"

static void list_add(mgpu__device *d, mgpu__stream *s) {
  mgpu__mutex_lock(&d->streams_lock);
  s->prev = NULL;
  s->next = d->streams;
  if (d->streams) d->streams->prev = s;
  d->streams = s;
  mgpu__mutex_unlock(&d->streams_lock);
}

static void list_remove(mgpu__device *d, mgpu__stream *s) {
  mgpu__mutex_lock(&d->streams_lock);
  while (s->syncs > 0) mgpu__cond_wait(&d->streams_cond, &d->streams_lock);
  if (s->prev) s->prev->next = s->next;
  else d->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  mgpu__mutex_unlock(&d->streams_lock);
}

static int stream_new(mgpu__device *d, mgpu__stream **out) {
  mgpu__stream *s = mgpu__calloc(1, sizeof *s);
  if (s == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a "
                       "stream", d->id);
  s->dev = d->id;
  int rc = d->ops->stream_create(d->bdev, &s->bstream);
  if (rc != 0) {
    mgpu__free(s);
    return rc;
  }
  list_add(d, s);
  *out = s;
  return 0;
}

static void stream_free(mgpu__device *d, mgpu__stream *s) {
  list_remove(d, s);
  d->ops->stream_destroy(d->bdev, s->bstream);
  mgpu__free(s->held_detail);
  mgpu__free(s);
}

/* ---- errors kept by internal waits ---- */

/* Keeps err (detail: its text) for s's next report, unless one is kept
 * already (the earlier one is reported first; the later is dropped, as a
 * stream reports its first failure). */
static void held_keep(mgpu__device *d, mgpu__stream *s, int err,
                      const char *detail) {
  size_t n = strlen(detail) + 1;
  char *copy = mgpu__malloc(n);
  if (copy != NULL) memcpy(copy, detail, n);
  mgpu__mutex_lock(&d->streams_lock);
  if (atomic_load_explicit(&s->held_err, memory_order_relaxed) == 0) {
    s->held_detail = copy;
    copy = NULL;
    atomic_store_explicit(&s->held_err, err, memory_order_relaxed);
  }
  mgpu__mutex_unlock(&d->streams_lock);
  mgpu__free(copy);
}

/* What a report of s returns, given rc from the backend: an error kept
 * for s comes first (its detail becomes the thread's), and a later error
 * in rc is kept in its place for the next report. */
static int held_report(mgpu__device *d, mgpu__stream *s, int rc) {
  if (atomic_load_explicit(&s->held_err, memory_order_relaxed) == 0)
    return rc;
  char later[512] = "";
  if (rc != 0 && rc != MGPU_EAGAIN)
    snprintf(later, sizeof later, "%s", mgpu_error_detail());
  mgpu__mutex_lock(&d->streams_lock);
  int err = atomic_load_explicit(&s->held_err, memory_order_relaxed);
  char *detail = s->held_detail;
  atomic_store_explicit(&s->held_err, 0, memory_order_relaxed);
  s->held_detail = NULL;
  mgpu__mutex_unlock(&d->streams_lock);
  if (err == 0) return rc; /* another report took it */
  if (rc != 0 && rc != MGPU_EAGAIN) held_keep(d, s, rc, later);
  mgpu__error(err, "%s", detail != NULL ? detail : "an operation queued "
              "earlier on the stream failed");
  mgpu__free(detail);
  return err;
}

void mgpu__stream_wait_keep(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  int rc = d->ops->stream_synchronize(d->bdev, s->bstream);
  if (rc != 0) held_keep(d, s, rc, mgpu_error_detail());
}

static int stream_create_in(mgpu_stream **out, int dev) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL output pointer for a "
                       "stream", dev);
  mgpu__stream *s;
  rc = stream_new(d, &s);
  if (rc != 0) return rc;
  s->handle = mgpu__handle_new(MGPU__H_STREAM, s);
  if (s->handle == 0) {
    stream_free(d, s);
    return mgpu__error(MGPU_ENOMEM, "device %d: no stream handles left", dev);
  }
  *out = (mgpu_stream *)s->handle;
  return 0;
}

int mgpu_stream_create(mgpu_stream **out, int dev) {
  int rc = mgpu__lib_enter("mgpu_stream_create");
  if (rc != 0) return rc;
  rc = stream_create_in(out, dev);
  mgpu__lib_leave();
  return rc;
}

/* Calls that cannot be recorded refuse a capturing stream here, before
 * they change anything (core/capture.h). */
static int refuse_capturing(mgpu__stream **s, const char *call) {
  if (mgpu__stream_capture(*s) == NULL) return 0;
  int dev = (*s)->dev;
  mgpu__stream_put(*s);
  *s = NULL;
  return mgpu__error(MGPU_ENOTSUP, "%s: the stream of device %d is capturing "
                     "a graph, and this call cannot be recorded in one",
                     call, dev);
}

int mgpu__stream_get(mgpu_stream *h, mgpu__stream **out) {
  int rc = mgpu__stream_get_capturing(h, out);
  if (rc == 0) rc = refuse_capturing(out, "stream call");
  return rc;
}

void mgpu__stream_put(mgpu__stream *s) {
  if (s != NULL) mgpu__handle_put(s->handle);
}

static int stream_destroy_in(mgpu_stream *h) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "stream: mgpu_init has not been called");
  /* Later calls fail; the calls inside (a synchronize) finish first. */
  mgpu__stream *s = mgpu__handle_hold((uintptr_t)h, MGPU__H_STREAM);
  if (s != NULL) {
    int capturing = mgpu__stream_capture(s) != NULL, dev = s->dev;
    mgpu__stream_put(s);
    if (capturing)
      return mgpu__error(MGPU_EBUSY, "mgpu_stream_destroy: the stream of "
                         "device %d is capturing a graph: end the capture "
                         "first", dev);
  }
  s = mgpu__handle_release((uintptr_t)h, MGPU__H_STREAM, "stream", &err);
  if (s == NULL) return err;
  mgpu__device *d = mgpu__device_get(s->dev);
  int rc = held_report(d, s, d->ops->stream_synchronize(d->bdev, s->bstream));
  stream_free(d, s);
  return rc;
}

int mgpu_stream_destroy(mgpu_stream *h) {
  int rc = mgpu__lib_enter("mgpu_stream_destroy");
  if (rc != 0) return rc;
  rc = stream_destroy_in(h);
  mgpu__lib_leave();
  return rc;
}

/* While tracing, the time a thread blocked in a wait is a span on it. */
static void trace_wait(const char *name, int dev, uint64_t t0) {
  mgpu__trace_arg a[] = {MGPU__TARG_I("device", dev)};
  mgpu__trace_thread_span(name, t0, mgpu__now_ns(), a, 1);
}

int mgpu_stream_synchronize(mgpu_stream *h) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc == 0) rc = refuse_capturing(&s, "mgpu_stream_synchronize");
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  rc = held_report(d, s, d->ops->stream_synchronize(d->bdev, s->bstream));
  if (t0 != 0) trace_wait("wait stream", s->dev, t0);
  mgpu__stream_put(s);
  return rc;
}

int mgpu_stream_query(mgpu_stream *h) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc == 0) rc = refuse_capturing(&s, "mgpu_stream_query");
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  rc = held_report(d, s, d->ops->stream_query(d->bdev, s->bstream));
  mgpu__stream_put(s);
  return rc;
}

int mgpu__stream_claim(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  return d->ops->claim != NULL &&
         d->ops->claim->stream_claim(d->bdev, s->bstream);
}

void mgpu__stream_release(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  d->ops->claim->stream_release(d->bdev, s->bstream);
}

int mgpu__stream_lock_idle(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  return d->ops->claim != NULL &&
         d->ops->claim->stream_lock_idle(d->bdev, s->bstream);
}

void mgpu__stream_unlock_idle(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  d->ops->claim->stream_unlock_idle(d->bdev, s->bstream);
}

int mgpu_stream_device(const mgpu_stream *h) {
  mgpu__stream *s;
  if (mgpu__stream_get_capturing((mgpu_stream *)h, &s) != 0) return -1;
  int dev = s->dev;
  mgpu__stream_put(s);
  return dev;
}

void *mgpu_stream_native(const mgpu_stream *h) {
  mgpu__stream *s;
  if (mgpu__stream_get_capturing((mgpu_stream *)h, &s) != 0) return NULL;
  void *native = mgpu__device_get(s->dev)->ops->stream_native(s->bstream);
  mgpu__stream_put(s);
  return native;
}

int mgpu_stream_order_native(mgpu_stream *h, void *native) {
  mgpu__stream *s;
  int rc = mgpu__stream_get(h, &s);
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  if (d->ops->stream_order_native == NULL)
    rc = mgpu__error(MGPU_ENOTSUP, "mgpu_stream_order_native: device %d (%s) "
                     "has no foreign streams to order: wait for the stream on "
                     "the host", s->dev, d->ops->name);
  else if (native == NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_stream_order_native: NULL foreign "
                     "stream for a stream of device %d (0 is ambiguous: the "
                     "legacy default stream is 1)", s->dev);
  else
    rc = d->ops->stream_order_native(d->bdev, s->bstream, native);
  mgpu__stream_put(s);
  return rc;
}

/* Waits for the work queued on every stream of dev. refuse (the public
 * call): a stream of dev capturing a graph is MGPU_ENOTSUP (as CUDA
 * refuses a synchronize during a capture), and the first error of a
 * stream is returned; else (a drain) a capturing stream is waited on like
 * the others (what it recorded since the capture began is not queued
 * work), and each stream's error is kept for its own next report. */
static int device_synchronize_in(int dev, int refuse) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  /* Streams created meanwhile join the head of the list and are not waited
   * for. The list lock is not held across a wait (stream creation, and a
   * callback waiting for a thread that creates a stream, would wait for
   * it): the stream waited on is pinned instead (syncs), which keeps it
   * and its link to the next on the list. */
  mgpu__mutex_lock(&d->streams_lock);
  if (refuse && atomic_load(&mgpu__captures_active) > 0)
    for (mgpu__stream *c = d->streams; c != NULL; c = c->next)
      if (mgpu__stream_capture(c) != NULL) {
        mgpu__mutex_unlock(&d->streams_lock);
        return mgpu__error(MGPU_ENOTSUP, "mgpu_device_synchronize: a stream "
                           "of device %d is capturing a graph", dev);
      }
  mgpu__stream *s = d->streams;
  if (s != NULL) s->syncs++;
  while (s != NULL) {
    mgpu__mutex_unlock(&d->streams_lock);
    /* A drain keeps each stream's error for the stream's own report. */
    int r = d->ops->stream_synchronize(d->bdev, s->bstream);
    if (!refuse && r != 0) held_keep(d, s, r, mgpu_error_detail());
    else if (refuse) r = held_report(d, s, r);
    if (refuse && rc == 0) rc = r;
    mgpu__mutex_lock(&d->streams_lock);
    mgpu__stream *next = s->next;
    if (next != NULL) next->syncs++;
    if (--s->syncs == 0) mgpu__cond_broadcast(&d->streams_cond);
    s = next;
  }
  mgpu__mutex_unlock(&d->streams_lock);
  if (t0 != 0) trace_wait("wait device", dev, t0);
  return rc;
}

int mgpu_device_synchronize(int dev) {
  int rc = mgpu__lib_enter("mgpu_device_synchronize");
  if (rc != 0) return rc;
  rc = device_synchronize_in(dev, 1);
  mgpu__lib_leave();
  return rc;
}

int mgpu__device_drain(int dev) { return device_synchronize_in(dev, 0); }

/* ---- spare streams ---- */

int mgpu__spare_get(int dev, mgpu__stream **out) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&d->spare_lock);
  mgpu__stream *s = d->spare_count > 0 ? d->spare_streams[--d->spare_count]
                                       : NULL;
  mgpu__mutex_unlock(&d->spare_lock);
  if (s != NULL) {
    *out = s;
    return 0;
  }
  return stream_new(d, out);
}

void mgpu__spare_put(mgpu__stream *s) {
  mgpu__device *d = mgpu__device_get(s->dev);
  mgpu__mutex_lock(&d->spare_lock);
  if (d->spare_count < (int)(sizeof d->spare_streams /
                             sizeof d->spare_streams[0])) {
    d->spare_streams[d->spare_count++] = s;
    s = NULL;
  }
  mgpu__mutex_unlock(&d->spare_lock);
  if (s != NULL) stream_free(d, s);
}

void mgpu__spare_drain(mgpu__device *d) {
  mgpu__mutex_lock(&d->spare_lock);
  while (d->spare_count > 0) {
    mgpu__stream *s = d->spare_streams[--d->spare_count];
    mgpu__mutex_unlock(&d->spare_lock);
    stream_free(d, s);
    mgpu__mutex_lock(&d->spare_lock);
  }
  mgpu__mutex_unlock(&d->spare_lock);
}

/* ---- events ---- */

static int event_create_in(mgpu_event **out, int dev) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL output pointer for an "
                       "event", dev);
  mgpu__event *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for an "
                       "event", dev);
  e->dev = dev;
  rc = d->ops->event_create(d->bdev, &e->bevent);
  if (rc != 0) goto fail_free;
  e->handle = mgpu__handle_new(MGPU__H_EVENT, e);
  if (e->handle == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "device %d: no event handles left", dev);
    goto fail_destroy;
  }
  *out = (mgpu_event *)e->handle;
  return 0;
fail_destroy:
  d->ops->event_destroy(d->bdev, e->bevent);
fail_free:
  mgpu__free(e);
  return rc;
}

int mgpu_event_create(mgpu_event **out, int dev) {
  int rc = mgpu__lib_enter("mgpu_event_create");
  if (rc != 0) return rc;
  rc = event_create_in(out, dev);
  mgpu__lib_leave();
  return rc;
}

int mgpu__event_get(mgpu_event *h, mgpu__event **out) {
  int err = 0;
  *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "event: mgpu_init has not been called");
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_EVENT, "event", &err);
  return *out != NULL ? 0 : err;
}

void mgpu__event_put(mgpu__event *e) {
  if (e != NULL) mgpu__handle_put(e->handle);
}

static void event_free(mgpu__event *e) {
  mgpu__device *d = mgpu__device_get(e->dev);
  d->ops->event_destroy(d->bdev, e->bevent);
  mgpu__free(e);
}

static int event_destroy_in(mgpu_event *h) {
  int err = 0;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "event: mgpu_init has not been called");
  mgpu__event *e =
      mgpu__handle_release((uintptr_t)h, MGPU__H_EVENT, "event", &err);
  if (e == NULL) return err;
  event_free(e);
  return 0;
}

int mgpu_event_destroy(mgpu_event *h) {
  int rc = mgpu__lib_enter("mgpu_event_destroy");
  if (rc != 0) return rc;
  rc = event_destroy_in(h);
  mgpu__lib_leave();
  return rc;
}

/* Looks up an event and a stream (which may be capturing); on success both
 * are held. */
static int event_stream_get(mgpu_event *eh, mgpu_stream *sh, mgpu__event **e,
                            mgpu__stream **s) {
  int rc = mgpu__event_get(eh, e);
  if (rc != 0) return rc;
  rc = mgpu__stream_get_capturing(sh, s);
  if (rc != 0) mgpu__event_put(*e);
  return rc;
}

static void event_stream_put(mgpu__event *e, mgpu__stream *s) {
  mgpu__stream_put(s);
  mgpu__event_put(e);
}

/* An event last recorded in a capture that has ended marks a point of a
 * graph, not work that was queued (CUDA's event record in a capture is a
 * node, too): waiting for it, or asking about it, would pass at once
 * whatever the graph's launches did, so it is refused until the event is
 * recorded again outside a capture. */
static int capture_ended(mgpu__event *e) {
  return atomic_load_explicit(&e->capture_ended, memory_order_relaxed);
}

static int capture_ended_error(const char *what, mgpu_event *eh,
                               const mgpu__event *e) {
  return mgpu__error(MGPU_EINVAL, "%s: event %#lx of device %d was last "
                     "recorded in a graph capture that has ended: it stands "
                     "for a point of the graph, not for queued work (record "
                     "it again outside a capture, or in the graph to wait "
                     "for a launch)", what, (unsigned long)(uintptr_t)eh,
                     e->dev);
}

int mgpu_event_record(mgpu_event *eh, mgpu_stream *sh) {
  mgpu__event *e;
  mgpu__stream *s;
  int rc = event_stream_get(eh, sh, &e, &s);
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  if (e->dev != s->dev)
    rc = mgpu__error(MGPU_EWRONGDEV, "event of device %d recorded on a "
                     "stream of device %d", e->dev, s->dev);
  else if (mgpu__stream_capture(s) != NULL)
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_EVENT_RECORD, .dev = s->dev, .event = eh});
  else {
    mgpu__capture_forget(e);
    atomic_store_explicit(&e->capture_ended, 0, memory_order_relaxed);
    mgpu__flight_record(s->dev, "event_record", 0, (uintptr_t)sh);
    rc = d->ops->event_record(d->bdev, e->bevent, s->bstream);
  }
  event_stream_put(e, s);
  return rc;
}

int mgpu_stream_wait_event(mgpu_stream *sh, mgpu_event *eh) {
  mgpu__event *e;
  mgpu__stream *s;
  int rc = event_stream_get(eh, sh, &e, &s);
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(s->dev), *ed = mgpu__device_get(e->dev);
  if (d->ops != ed->ops)
    rc = mgpu__error(MGPU_ENOTSUP, "a stream of device %d (%s) cannot wait "
                     "on an event of device %d (%s): different backends",
                     s->dev, d->ops->name, e->dev, ed->ops->name);
  else if (capture_ended(e) && !mgpu__capture_marked(e))
    rc = capture_ended_error("mgpu_stream_wait_event", eh, e);
  else if (mgpu__stream_capture(s) != NULL)
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_EVENT_WAIT, .dev = s->dev, .event = eh});
  else if ((rc = mgpu__capture_join(s, e)) == 0) {
    mgpu__flight_record(s->dev, "stream_wait_event", 0, (uintptr_t)sh);
    rc = d->ops->stream_wait_event(d->bdev, s->bstream, ed->bdev, e->bevent);
  } else if (rc == 1)
    rc = 0; /* s joined the capture e was recorded in */
  event_stream_put(e, s);
  return rc;
}

int mgpu_event_synchronize(mgpu_event *h) {
  mgpu__event *e;
  int rc = mgpu__event_get(h, &e);
  if (rc != 0) return rc;
  if (mgpu__capture_marked(e)) {
    rc = mgpu__error(MGPU_ENOTSUP, "mgpu_event_synchronize: the event of "
                     "device %d was recorded in a graph capture in progress",
                     e->dev);
    mgpu__event_put(e);
    return rc;
  }
  if (capture_ended(e)) {
    rc = capture_ended_error("mgpu_event_synchronize", h, e);
    mgpu__event_put(e);
    return rc;
  }
  mgpu__device *d = mgpu__device_get(e->dev);
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  rc = d->ops->event_synchronize(d->bdev, e->bevent);
  if (t0 != 0) trace_wait("wait event", e->dev, t0);
  mgpu__event_put(e);
  return rc;
}

int mgpu_event_query(mgpu_event *h) {
  mgpu__event *e;
  int rc = mgpu__event_get(h, &e);
  if (rc != 0) return rc;
  mgpu__device *d = mgpu__device_get(e->dev);
  if (mgpu__capture_marked(e))
    rc = mgpu__error(MGPU_ENOTSUP, "mgpu_event_query: the event of device %d "
                     "was recorded in a graph capture in progress", e->dev);
  else if (capture_ended(e))
    rc = capture_ended_error("mgpu_event_query", h, e);
  else
    rc = d->ops->event_query(d->bdev, e->bevent);
  mgpu__event_put(e);
  return rc;
}

int mgpu_event_elapsed_ms(mgpu_event *start, mgpu_event *end, float *ms) {
  mgpu__event *a, *b;
  int rc = mgpu__event_get(start, &a);
  if (rc != 0) return rc;
  rc = mgpu__event_get(end, &b);
  if (rc != 0) {
    mgpu__event_put(a);
    return rc;
  }
  if (ms == NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_event_elapsed_ms: NULL output");
  else if (a->dev != b->dev)
    rc = mgpu__error(MGPU_EWRONGDEV, "elapsed time between events of device "
                     "%d and device %d", a->dev, b->dev);
  else {
    mgpu__device *d = mgpu__device_get(a->dev);
    rc = d->ops->event_elapsed_ms(d->bdev, a->bevent, b->bevent, ms);
  }
  mgpu__event_put(b);
  mgpu__event_put(a);
  return rc;
}

int mgpu_stream_add_callback(mgpu_stream *h, void (*fn)(void *), void *arg) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc != 0) return rc;
  if (fn == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "device %d: NULL stream callback", s->dev);
  } else if (mgpu__stream_capture(s) != NULL) {
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_HOST, .dev = s->dev, .fn = fn, .arg = arg});
  } else {
    mgpu__flight_record(s->dev, "stream_callback", 0, (uintptr_t)h);
    mgpu__device *d = mgpu__device_get(s->dev);
    rc = d->ops->host_callback(d->bdev, s->bstream, fn, arg);
  }
  mgpu__stream_put(s);
  return rc;
}

/* ---- kernels ---- */

static int launch_on(mgpu__stream *s, const mgpu_kernel *k, mgpu_dim3 grid,
                     mgpu_dim3 block, const void *args, size_t args_size) {
  int rc;
  mgpu__device *d = mgpu__device_get(s->dev);
  if (k == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL kernel", s->dev);
  const char *name = k->name ? k->name : "(unnamed)";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 ||
      block.y == 0 || block.z == 0)
    return mgpu__error(MGPU_EINVAL, "device %d: kernel %s launched with grid "
                       "%ux%ux%u and block %ux%ux%u (no dimension may be 0)",
                       s->dev, name, grid.x, grid.y, grid.z, block.x, block.y,
                       block.z);
  if (args_size > 0 && args == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: kernel %s given %zu bytes of "
                       "arguments at NULL", s->dev, name, args_size);
  if (!mgpu__kernel_has_variant(k, d->ops->caps.kernel_variant))
    return mgpu__error(MGPU_ENOTSUP, "device %d: kernel %s has no %s variant",
                       s->dev, name, d->ops->name);
  if (mgpu__stream_capture(s) != NULL)
    return mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_KERNEL, .dev = s->dev, .kernel = k, .grid = grid,
        .block = block, .args = args, .args_size = args_size});
  mgpu__flight_record(s->dev, "launch", args_size, s->handle);
  rc = d->ops->launch(d->bdev, s->bstream, k, grid, block, args, args_size);
  if (rc == 0) mgpu__metric_add(s->dev, MGPU__M_kernels_launched, 1);
  return rc;
}

int mgpu_launch(mgpu_stream *h, const mgpu_kernel *k, mgpu_dim3 grid,
                mgpu_dim3 block, const void *args, size_t args_size) {
  mgpu__stream *s;
  int rc = mgpu__stream_get_capturing(h, &s);
  if (rc != 0) return rc;
  rc = launch_on(s, k, grid, block, args, args_size);
  mgpu__stream_put(s);
  return rc;
}

/* ---- shutdown ---- */

static void release_event(void *obj, void *arg) {
  (void)arg;
  mgpu__event *e = obj;
  mgpu__handle_retire(e->handle);
  event_free(e);
}

static void release_stream(void *obj, void *arg) {
  (void)arg;
  mgpu__stream *s = obj;
  mgpu__handle_retire(s->handle);
  stream_free(mgpu__device_get(s->dev), s);
}

void mgpu__streams_release_all(void) {
  mgpu__handle_foreach(MGPU__H_EVENT, release_event, NULL);
  mgpu__handle_foreach(MGPU__H_STREAM, release_stream, NULL);
}
