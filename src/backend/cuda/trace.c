/* What the CUDA devices tell the recording floor: the GPU's own execution
 * times of each operation, and NVTX ranges.
 *
 * Each operation queued on a stream is wrapped (mgpu__cuda_op_begin/end):
 * an NVTX range named like its span is pushed around the enqueue, so Nsight
 * Systems shows mgpu's names on its own rows; and, while a trace is
 * recorded (or, for copies, while busy timing is on, for the time per copy
 * path), a pair of CUDA events is recorded around the operation on the
 * stream. The pairs wait on the stream's list until the stream is found
 * idle (synchronize, query, destroy); then one more event recorded on the
 * idle stream, and the host clock read when it completed, map every pair
 * onto the host clock: t = now - elapsed(event, reference). The spans are
 * the GPU's execution times, not the enqueue times.
 *
 * Event pairs are reused through the stream's spare list. Lists are
 * guarded by the stream's lock.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "cuda-internal.h"
#include "obs/trace.h"

struct mgpu__cuda_span {
  cudaEvent_t start, end;
  mgpu__trace_tag *tag; /* the span, NULL when only the copy is timed */
  int path;             /* mgpu_metric_path of a copy, or -1 */
  size_t bytes;
  mgpu__cuda_span *next;
};

static int tracing(void) { return mgpu__cuda_env->obs->trace_enabled(); }

/* s->lock held. */
static mgpu__cuda_span *span_get(mgpu__bstream *s) {
  mgpu__cuda_span *sp = s->spare_spans;
  if (sp != NULL) {
    s->spare_spans = sp->next;
    return sp;
  }
  sp = mgpu__calloc(1, sizeof *sp);
  if (sp == NULL) return NULL;
  if (cudaEventCreate(&sp->start) != cudaSuccess) {
    (void)cudaGetLastError();
    mgpu__free(sp);
    return NULL;
  }
  if (cudaEventCreate(&sp->end) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaEventDestroy(sp->start);
    mgpu__free(sp);
    return NULL;
  }
  return sp;
}

/* s->lock held. */
static void span_put(mgpu__bstream *s, mgpu__cuda_span *sp) {
  mgpu__free(sp->tag);
  sp->tag = NULL;
  sp->next = s->spare_spans;
  s->spare_spans = sp;
}

mgpu__cuda_span *mgpu__cuda_op_begin(mgpu__bstream *s, const char *name,
                                     int path, size_t bytes) {
  int trace = tracing();
  mgpu__trace_tag *tag = trace ? mgpu__cuda_env->obs->tag_copy() : NULL;
  nvtxRangePushA(tag != NULL ? tag->name : name);
  if (!trace && !(path >= 0 && mgpu__cuda_busy_time)) return NULL;
  if (trace && tag == NULL && (tag = mgpu__calloc(1, sizeof *tag)) != NULL) {
    snprintf(tag->name, sizeof tag->name, "%s", name);
    if (bytes > 0) {
      tag->args[0] = (mgpu__trace_arg){"bytes", NULL, (int64_t)bytes};
      tag->nargs = 1;
    }
  }
  mgpu__cuda_span *sp = span_get(s);
  if (sp == NULL) {
    mgpu__free(tag);
    return NULL;
  }
  sp->tag = tag;
  sp->path = path;
  sp->bytes = bytes;
  if (cudaEventRecord(sp->start, s->s) != cudaSuccess) {
    (void)cudaGetLastError();
    span_put(s, sp);
    return NULL;
  }
  return sp;
}

void mgpu__cuda_op_end(mgpu__bstream *s, mgpu__cuda_span *sp, int queued) {
  nvtxRangePop();
  if (sp == NULL) return;
  if (!queued || cudaEventRecord(sp->end, s->s) != cudaSuccess) {
    (void)cudaGetLastError();
    span_put(s, sp);
    return;
  }
  sp->next = NULL;
  if (s->spans_tail != NULL) s->spans_tail->next = sp;
  else s->spans = sp;
  s->spans_tail = sp;
}

/* Milliseconds from a to the reference, or -1. */
static double ms_before(cudaEvent_t a, cudaEvent_t ref) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, ref) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return ms;
}

void mgpu__cuda_trace_harvest(mgpu__bstream *s) {
  const mgpu__obs_api *obs = mgpu__cuda_env->obs;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(s->d, &sc);
  pthread_mutex_lock(&s->lock);
  mgpu__cuda_span *list = s->spans;
  s->spans = s->spans_tail = NULL;
  /* The reference: recorded on the idle stream, completed at once. */
  int have_ref = list != NULL && s->clock_ref != NULL &&
                 cudaEventRecord(s->clock_ref, s->s) == cudaSuccess &&
                 cudaEventSynchronize(s->clock_ref) == cudaSuccess;
  uint64_t now = obs->now_ns();
  if (list != NULL && !have_ref) (void)cudaGetLastError();
  while (list != NULL) {
    mgpu__cuda_span *sp = list;
    list = sp->next;
    double a = have_ref ? ms_before(sp->start, s->clock_ref) : -1;
    double b = have_ref ? ms_before(sp->end, s->clock_ref) : -1;
    if (a >= 0 && b >= 0 && a >= b) {
      uint64_t t0 = now - (uint64_t)(a * 1e6), t1 = now - (uint64_t)(b * 1e6);
      if (sp->path >= 0) obs->copy_ran(s->d->id, sp->path, sp->bytes, t1 - t0);
      if (sp->tag != NULL) obs->span_tag(s->d->id, s->track, sp->tag, t0, t1);
    }
    span_put(s, sp);
  }
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
}

void mgpu__cuda_trace_stream_free(mgpu__bstream *s) {
  while (s->spans != NULL) {
    mgpu__cuda_span *sp = s->spans;
    s->spans = sp->next;
    span_put(s, sp);
  }
  while (s->spare_spans != NULL) {
    mgpu__cuda_span *sp = s->spare_spans;
    s->spare_spans = sp->next;
    cudaEventDestroy(sp->start);
    cudaEventDestroy(sp->end);
    mgpu__free(sp);
  }
  if (s->clock_ref != NULL) cudaEventDestroy(s->clock_ref);
  (void)cudaGetLastError();
}
