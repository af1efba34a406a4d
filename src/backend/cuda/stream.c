/* Streams, events, copies, launches and host callbacks of CUDA devices.
 *
 * Streams are non-blocking CUDA streams (cuGreenCtxStreamCreate in a split
 * device's green context), so that work on the user's legacy default stream
 * does not serialize with mgpu's. Errors of asynchronous work come back from
 * the next cudaStreamSynchronize / cudaStreamQuery / cudaEventSynchronize,
 * which is where the core reports them.
 *
 * Busy time: each stream keeps one open interval [busy_start, busy_end].
 * The first op on an idle stream records busy_start; every op then
 * re-records busy_end after itself. When an op is queued and busy_end has
 * already completed, the stream went idle in between: the interval is
 * closed, its elapsed time added to the device's BUSY_NS, and a new one
 * starts. A continuously busy stream costs one event query and one record
 * per op; idle gaps are never counted. (A stream waiting for another
 * device's event counts as busy while it waits.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

/* ---- busy time (s->lock held) ---- */

static void busy_close(mgpu__bstream *s) {
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, s->busy_start, s->busy_end) == cudaSuccess) {
    if (ms > 0.0f)
      mgpu__cuda_env->metric_add(s->d->id, MGPU__BMETRIC_BUSY_NS,
                                 (uint64_t)((double)ms * 1e6));
  } else {
    (void)cudaGetLastError();
  }
  s->busy_open = 0;
}

/* Before an op: closes a finished interval, opens one if none is open. */
static void busy_before(mgpu__bstream *s) {
  if (!mgpu__cuda_busy_time) return;
  if (s->busy_open) {
    cudaError_t q = cudaEventQuery(s->busy_end);
    if (q == cudaSuccess)
      busy_close(s);
    else if (q != cudaErrorNotReady) /* not left for the next call to read */
      (void)cudaGetLastError();
  }
  if (!s->busy_open) {
    if (cudaEventRecord(s->busy_start, s->s) == cudaSuccess)
      s->busy_open = 1;
    else
      (void)cudaGetLastError();
  }
}

static void busy_after(mgpu__bstream *s) {
  if (s->busy_open && cudaEventRecord(s->busy_end, s->s) != cudaSuccess) {
    (void)cudaGetLastError();
    s->busy_open = 0;
  }
}

/* After the stream was found idle (synchronize, query). */
static void busy_harvest(mgpu__bstream *s) {
  pthread_mutex_lock(&s->lock);
  if (s->busy_open && cudaEventQuery(s->busy_end) == cudaSuccess) busy_close(s);
  pthread_mutex_unlock(&s->lock);
}

/* ---- streams ---- */

cudaError_t mgpu__cuda_native_stream_create(mgpu__bdevice *d,
                                            cudaStream_t *out,
                                            const char **what) {
  if (d->green == NULL) {
    *what = "cudaStreamCreateWithFlags";
    return cudaStreamCreateWithFlags(out, cudaStreamNonBlocking);
  }
  CUstream cs = NULL;
  *what = "cuGreenCtxStreamCreate";
  CUresult r = mgpu__cuda_drv.green_ctx_stream_create(
      &cs, d->green, CU_STREAM_NON_BLOCKING, 0);
  /* The runtime's code for what the caller tells apart: exhausted memory
   * (MGPU_ENOMEM) and the errors that lose the device. */
  switch (r) {
    case CUDA_SUCCESS:
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return cudaErrorIllegalAddress;
    case CUDA_ERROR_LAUNCH_FAILED:
      return cudaErrorLaunchFailure;
    case CUDA_ERROR_ECC_UNCORRECTABLE:
      return cudaErrorECCUncorrectable;
    case CUDA_ERROR_DEINITIALIZED:
      return cudaErrorCudartUnloading;
    default:
      return cudaErrorUnknown;
  }
  *out = (cudaStream_t)cs;
  return cudaSuccess;
}

int mgpu__cuda_stream_create(mgpu__bdevice *d, mgpu__bstream **out) {
  *out = NULL;
  mgpu__bstream *s = mgpu__calloc(1, sizeof *s);
  if (s == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory for a stream", d->id);
  s->d = d;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  const char *what;
  cudaError_t err = mgpu__cuda_native_stream_create(d, &s->s, &what);
  if (err == cudaSuccess) {
    what = "cudaEventCreate";
    err = cudaEventCreate(&s->busy_start);
    if (err == cudaSuccess) {
      err = cudaEventCreate(&s->busy_end);
      if (err != cudaSuccess) cudaEventDestroy(s->busy_start);
    }
    if (err != cudaSuccess) cudaStreamDestroy(s->s);
  }
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    mgpu__free(s);
    return mgpu__cuda_fail(d->id, err, what);
  }
  pthread_mutex_init(&s->lock, NULL);
  s->track = mgpu__cuda_env->obs->track_new(d->id, NULL);
  mgpu__cuda_enter(d, &sc);
  if (cudaEventCreate(&s->clock_ref) != cudaSuccess) {
    (void)cudaGetLastError();
    s->clock_ref = NULL; /* no spans from this stream */
  }
  mgpu__cuda_leave(&sc);
  *out = s;
  return 0;
}

void mgpu__cuda_stream_destroy(mgpu__bdevice *d, mgpu__bstream *s) {
  if (s == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  (void)cudaStreamSynchronize(s->s);
  busy_harvest(s);
  mgpu__cuda_trace_harvest(s);
  mgpu__cuda_trace_stream_free(s);
  cudaEventDestroy(s->busy_start);
  cudaEventDestroy(s->busy_end);
  cudaStreamDestroy(s->s);
  (void)cudaGetLastError();
  mgpu__cuda_leave(&sc);
  pthread_mutex_destroy(&s->lock);
  mgpu__free(s);
}

/* A wait's failure: a sticky error (the device lost) is reported by the
 * first wait on the stream only; later waits have nothing left to wait for
 * (new work is refused), so a stream of a lost device can still be
 * destroyed without an error, as on the host backend. */
static int wait_failed(mgpu__bdevice *d, mgpu__bstream *s, cudaError_t err,
                       const char *what) {
  int rc = mgpu__cuda_fail(d->id, err, what);
  if (rc == MGPU_EDEVLOST &&
      __atomic_exchange_n(&s->loss_reported, 1, __ATOMIC_ACQ_REL))
    return 0;
  return rc;
}

int mgpu__cuda_stream_synchronize(mgpu__bdevice *d, mgpu__bstream *s) {
  cudaError_t err = cudaStreamSynchronize(s->s);
  if (err != cudaSuccess)
    return wait_failed(d, s, err, "work on the stream failed "
                       "(cudaStreamSynchronize)");
  busy_harvest(s);
  mgpu__cuda_trace_harvest(s);
  return 0;
}

int mgpu__cuda_stream_query(mgpu__bdevice *d, mgpu__bstream *s) {
  cudaError_t err = cudaStreamQuery(s->s);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return MGPU_EAGAIN;
  }
  if (err != cudaSuccess)
    return wait_failed(d, s, err, "work on the stream failed "
                       "(cudaStreamQuery)");
  busy_harvest(s);
  mgpu__cuda_trace_harvest(s);
  return 0;
}

void *mgpu__cuda_stream_native(mgpu__bstream *s) { return (void *)s->s; }

/* An event of d's context (a green one for a split device), recorded on s
 * and waited on by the foreign stream; the wait holds on to the recorded
 * work, so the event may go at once. */
int mgpu__cuda_stream_order_native(mgpu__bdevice *d, mgpu__bstream *s,
                                   void *native) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err == cudaSuccess) {
    pthread_mutex_lock(&s->lock);
    err = cudaEventRecord(ev, s->s);
    pthread_mutex_unlock(&s->lock);
    if (err == cudaSuccess)
      err = cudaStreamWaitEvent((cudaStream_t)native, ev, 0);
    cudaEventDestroy(ev);
  }
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "ordering a foreign stream after an "
                           "mgpu stream (cudaEventRecord, cudaStreamWaitEvent)");
  return 0;
}

/* ---- events ---- */

int mgpu__cuda_event_create(mgpu__bdevice *d, mgpu__bevent **out) {
  *out = NULL;
  mgpu__bevent *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory for an event", d->id);
  /* Created in d->ctx: an event must share its context with the streams
   * that record it (a green context for a split device). */
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaError_t err = cudaEventCreate(&e->e);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    mgpu__free(e);
    return mgpu__cuda_fail(d->id, err, "cudaEventCreate");
  }
  *out = e;
  return 0;
}

void mgpu__cuda_event_destroy(mgpu__bdevice *d, mgpu__bevent *e) {
  if (e == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaEventDestroy(e->e);
  (void)cudaGetLastError();
  mgpu__cuda_leave(&sc);
  mgpu__free(e);
}

int mgpu__cuda_event_record(mgpu__bdevice *d, mgpu__bevent *e,
                            mgpu__bstream *s) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  cudaError_t err = cudaEventRecord(e->e, s->s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err, "cudaEventRecord");
  return 0;
}

int mgpu__cuda_event_synchronize(mgpu__bdevice *d, mgpu__bevent *e) {
  cudaError_t err = cudaEventSynchronize(e->e);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "work before the event failed "
                           "(cudaEventSynchronize)");
  return 0;
}

int mgpu__cuda_event_query(mgpu__bdevice *d, mgpu__bevent *e) {
  cudaError_t err = cudaEventQuery(e->e);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return MGPU_EAGAIN;
  }
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "work before the event failed "
                           "(cudaEventQuery)");
  return 0;
}

int mgpu__cuda_event_elapsed_ms(mgpu__bdevice *d, mgpu__bevent *start,
                                mgpu__bevent *end, float *ms) {
  cudaError_t err = cudaEventElapsedTime(ms, start->e, end->e);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "cudaEventElapsedTime");
  return 0;
}

int mgpu__cuda_stream_wait_event(mgpu__bdevice *d, mgpu__bstream *s,
                                 mgpu__bdevice *ed, mgpu__bevent *e) {
  /* cudaStreamWaitEvent accepts an event of another device or context. */
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  cudaError_t err = cudaStreamWaitEvent(s->s, e->e, 0);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "cudaStreamWaitEvent on an event of device %d",
             ed->id);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

/* ---- work ---- */

int mgpu__cuda_memcpy2d_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                              size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height,
                              mgpu__copy_kind kind) {
  (void)kind; /* cudaMemcpyDefault reads the pointers' kinds */
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  cudaError_t err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                      cudaMemcpyDefault, s->s);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "pitched copy of %zu x %zu bytes "
             "(cudaMemcpy2DAsync)", height, width);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

int mgpu__cuda_memcpy_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                            const void *src, size_t size,
                            mgpu__copy_kind kind) {
  /* cudaMemcpyDefault lets the runtime read the pointers' kinds, which also
   * covers unified and pinned memory given as "host" or "device". Pageable
   * host memory is handled by the runtime: an H2D copy is staged before the
   * call returns (the source may be reused at once), a D2H copy completes
   * before the call returns. */
  enum cudaMemcpyKind ck = cudaMemcpyDefault;
  static const int kind_path[] = {MGPU_METRIC_PATH_H2D, MGPU_METRIC_PATH_D2H,
                                  MGPU_METRIC_PATH_D2D, -1};
  static const char *const path_span[] = {"copy.h2d", "copy.d2h", "copy.d2d",
                                          "copy.peer", "copy.staged"};
  int path = mgpu__cuda_env->obs->path();
  if (path < 0) path = (unsigned)kind < 4 ? kind_path[kind] : -1;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(
      s, path >= 0 && path < MGPU_METRIC_PATHS ? path_span[path] : "copy.h2h",
      path, size);
  cudaError_t err = cudaMemcpyAsync(dst, src, size, ck, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    static const char *names[] = {"host-to-device", "device-to-host",
                                  "device-to-device", "host-to-host"};
    char what[96];
    snprintf(what, sizeof what, "%s copy of %zu bytes (cudaMemcpyAsync)",
             (unsigned)kind < 4 ? names[kind] : "", size);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

int mgpu__cuda_memset_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                            int value, size_t size) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, "memset", -1, size);
  cudaError_t err = cudaMemsetAsync(dst, value, size, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err, "cudaMemsetAsync");
  return 0;
}

int mgpu__cuda_launch(mgpu__bdevice *d, mgpu__bstream *s,
                      const mgpu_kernel *k, mgpu_dim3 grid, mgpu_dim3 block,
                      const void *args, size_t args_size) {
  if (k->cuda_fn == NULL)
    return mgpu__error(MGPU_ENOTSUP, "device %d: kernel '%s' "
                       "has no CUDA variant", d->id,
                       k->name ? k->name : "?");
  /* The kernel takes the argument struct by value as its one parameter;
   * cudaLaunchKernel copies it before returning. */
  void *params[1] = {(void *)args};
  dim3 g = {grid.x, grid.y, grid.z};
  dim3 b = {block.x, block.y, block.z};
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  char name[40]; /* a span name's length (obs/trace.h) */
  snprintf(name, sizeof name, "kernel %s", k->name ? k->name : "?");
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, name, -1, 0);
  cudaError_t err = cudaLaunchKernel(k->cuda_fn, g, b,
                                     args_size > 0 ? params : NULL, 0, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    char what[160];
    snprintf(what, sizeof what, "launch of kernel '%s' (grid %ux%ux%u, block "
             "%ux%ux%u)", k->name ? k->name : "?", grid.x, grid.y, grid.z,
             block.x, block.y, block.z);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

int mgpu__cuda_builtin(mgpu__bdevice *d, mgpu__bstream *s,
                       const mgpu__builtin *b) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, "kernel builtin", -1, 0);
  cudaError_t err = mgpu__cuda_builtin_launch(b, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    static const char *kinds[] = {"fill", "scale", "axpy", "elementwise"};
    char what[96];
    snprintf(what, sizeof what, "built-in %s of %zu elements",
             (unsigned)b->kind < 4 ? kinds[b->kind] : "kernel", b->count);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

/* One run of a device's part of an mgpu graph (graph.c): one operation of
 * s, busy time and trace span as for a launch. */
int mgpu__cuda_graph_run(mgpu__bdevice *d, mgpu__bstream *s,
                         cudaGraphExec_t exec) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  busy_before(s);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, "graph launch", -1, 0);
  cudaError_t err = cudaGraphLaunch(exec, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  if (err == cudaSuccess) busy_after(s);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "graph launch (cudaGraphLaunch)");
  return 0;
}

void mgpu__cuda_callback_named(void *p) {
  const mgpu__cuda_callback *call = p;
  mgpu__cuda_env->thread_role_set("the CUDA driver's callback thread (a "
                                  "stream callback)");
  call->fn(call->arg);
  mgpu__cuda_env->thread_role_set(NULL);
}

/* A stream callback's call runs once, and goes with it. */
static void callback_run(void *p) {
  mgpu__cuda_callback call = *(mgpu__cuda_callback *)p;
  mgpu__free(p);
  mgpu__cuda_callback_named(&call);
}

int mgpu__cuda_host_callback(mgpu__bdevice *d, mgpu__bstream *s,
                             void (*fn)(void *arg), void *arg) {
  mgpu__cuda_callback *call = mgpu__malloc(sizeof *call);
  if (call == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a "
                       "stream callback", d->id);
  call->fn = fn;
  call->arg = arg;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  pthread_mutex_lock(&s->lock);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, "callback", -1, 0);
  cudaError_t err = cudaLaunchHostFunc(s->s, callback_run, call);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    mgpu__free(call);
    return mgpu__cuda_fail(d->id, err, "cudaLaunchHostFunc");
  }
  return 0;
}
