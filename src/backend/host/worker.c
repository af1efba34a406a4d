/* The host backend's workers: each device's threads take a stream off the
 * ready list, run its head operation and hand the stream back; an idle
 * worker watches the ready list briefly, then sleeps (host.c tells how).
 * Also here: how each kind of operation runs, is timed and traced, and
 * how a lost device skips its work. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/obs.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/thread.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* A copy whose destination is written once and not read soon (host to
 * device, device to device): non-temporal stores skip the read-for-ownership
 * of every destination line, a third less memory traffic. The staged path's
 * second half is such a copy, in chunks too small for memcpy to choose this
 * by itself. Ranges of two live buffers never overlap. */
static void copy_streaming(void *dst, const void *src, size_t size) {
#if defined(__SSE2__)
  char *d = dst;
  const char *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15);
  memcpy(d, s, head);
  d += head;
  s += head;
  size -= head;
  size_t blocks = size / 64;
  for (size_t i = 0; i < blocks; i++, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  _mm_sfence(); /* later readers, on any thread, see the data */
  memcpy(d, s, size % 64);
#else
  memcpy(dst, src, size);
#endif
}

void mgpu__host_sync_wake(mgpu__bdevice *d, mgpu__bstream *s) {
  if (s->syncs == 0 || s->sync_at == 0 || s->nfinished < s->sync_at) return;
  s->sync_at = 0; /* each waiter not done yet registers again */
  mgpu__cond_broadcast(&d->idle);
}

/* Puts the parked streams of list w (linked through wait_next, taken off
 * whatever they waited on) back on their devices' ready lists. */
void mgpu__host_unpark(mgpu__bstream *w) {
  while (w != NULL) {
    mgpu__bstream *next = w->wait_next;
    mgpu__mutex_lock(&w->dev->lock);
    w->parked = 0;
    if (!w->queued && !w->running && w->head) mgpu__host_ready_push(w->dev, w);
    mgpu__mutex_unlock(&w->dev->lock);
    w = next;
  }
}

static void complete_event(mgpu__bevent *e, uint64_t seq, mgpu__bstream *s) {
  int lost_by = atomic_load_explicit(&s->lost_from, memory_order_relaxed);
  if (lost_by == 0 && atomic_load_explicit(&s->dev->lost, memory_order_acquire))
    lost_by = s->dev->id + 1;
  mgpu__mutex_lock(&e->lock);
  /* Off the pending list (the op is e's pending record seq). */
  op **at = &e->pending;
  while (*at != NULL && (*at)->u.event.seq != seq)
    at = &(*at)->u.event.pending_next;
  if (*at != NULL) {
    op *done = *at;
    *at = done->u.event.pending_next;
    if (e->pending_tail == done) {
      e->pending_tail = NULL;
      for (op *p = e->pending; p != NULL; p = p->u.event.pending_next)
        e->pending_tail = p;
    }
  }
  atomic_store_explicit(&e->completed,
                        e->pending != NULL ? e->pending->u.event.seq - 1
                                           : e->recorded,
                        memory_order_release);
  if (seq > e->top) {
    e->top = seq;
    e->lost_by = lost_by;
    e->time_ns = mgpu__now_ns();
    /* The work before the record is the span that ended last. */
    uint64_t at = s->last_t1 == 0             ? e->time_ns
                  : s->last_t1 > s->last_t0 ? s->last_t1 - 1
                                            : s->last_t0;
    e->recorded_at = (mgpu__trace_point){s->dev->id, s->track, at};
  }
  e->ops--; /* after the unlock below, destroy may free e */
  mgpu__bstream *w = e->waiters;
  e->waiters = NULL;
  mgpu__cond_broadcast(&e->done);
  mgpu__mutex_unlock(&e->lock);
  mgpu__host_unpark(w);
}

/* The failure a host kernel reports with mgpu_kernel_fail, for the launch
 * the calling worker runs (NULL outside a launch). */
typedef struct launch_failure {
  int code;
  char detail[160];
} launch_failure;
static _Thread_local launch_failure *running_launch;

int mgpu_kernel_fail(const mgpu_kernel_ctx *ctx, int code, const char *detail) {
  (void)ctx;
  if (running_launch == NULL || code >= 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_kernel_fail: %s",
                       running_launch == NULL
                           ? "called outside a host kernel"
                           : "the code is not a negative MGPU_E... code");
  if (running_launch->code == 0) {
    running_launch->code = code;
    snprintf(running_launch->detail, sizeof running_launch->detail, "%s",
             detail != NULL ? detail : "");
  }
  return 0;
}

/* Runs every block, in order, until one reports a failure: that ends the
 * launch, and the stream's next synchronize returns it (a GPU kernel's
 * trap ends the same way). */
void mgpu__host_run_launch(mgpu__bdevice *d, mgpu__bstream *s,
                           const mgpu__host_kernel_run *l) {
  mgpu_kernel_ctx ctx;
  ctx.grid_dim = l->grid;
  ctx.block_dim = l->block;
  ctx.device = d->id;
  launch_failure failure = {0, ""};
  running_launch = &failure;
  for (unsigned z = 0; z < ctx.grid_dim.z && !failure.code; z++)
    for (unsigned y = 0; y < ctx.grid_dim.y && !failure.code; y++)
      for (unsigned x = 0; x < ctx.grid_dim.x && !failure.code; x++) {
        ctx.block_idx = MGPU_DIM3(x, y, z);
        l->fn(&ctx, l->args);
      }
  running_launch = NULL;
  if (failure.code == 0) return;
  mgpu__mutex_lock(&d->lock);
  if (s->error == 0) {
    s->error = failure.code;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d: kernel '%s' failed in block (%u, %u, %u): %s",
             d->id, l->name, ctx.block_idx.x, ctx.block_idx.y,
             ctx.block_idx.z, failure.detail);
  }
  mgpu__mutex_unlock(&d->lock);
}

/* A wait of stream s for event e ran: the arrow from where e was recorded
 * goes to s's next operation ("chan" for a channel's receive, tagged
 * chan.recv, else "event"). */
static void trace_wait(mgpu__bevent *e, mgpu__bstream *s, const char *tag) {
  mgpu__mutex_lock(&e->lock);
  mgpu__trace_point from = e->recorded_at;
  mgpu__mutex_unlock(&e->lock);
  if (from.ts == 0) return;
  s->arrow_from = from;
  s->arrow_name = tag != NULL && strncmp(tag, "chan.", 5) == 0 ? "chan" : "event";
}

static const char *const copy_span[MGPU_METRIC_PATHS] = {
    "copy.h2d", "copy.d2h", "copy.d2d", "copy.peer", "copy.staged"};

/* The span of an operation that ran from t0 to t1 on stream s, and the
 * arrow a wait before it left. */
void mgpu__host_trace_op(mgpu__bstream *s, const op *o, uint64_t t0,
                         uint64_t t1) {
  if (s->arrow_name != NULL) {
    mgpu__trace_flow(s->arrow_name, s->arrow_from,
                     (mgpu__trace_point){s->dev->id, s->track,
                                         t1 > t0 ? t0 + 1 : t0});
    s->arrow_name = NULL;
  }
  if (o->tag != NULL) {
    mgpu__trace_span_tag(s->dev->id, s->track, o->tag, t0, t1);
    return;
  }
  const char *name = "operation";
  mgpu__trace_arg arg[1];
  int nargs = 0;
  switch (o->kind) {
    case OP_COPY:
      name = o->u.copy.path >= 0 ? copy_span[o->u.copy.path] : "copy.h2h";
      arg[nargs++] = MGPU__TARG_I("bytes", o->u.copy.size);
      break;
    case OP_MEMSET:
      name = "memset";
      arg[nargs++] = MGPU__TARG_I("bytes", o->u.memset.size);
      break;
    case OP_LAUNCH: name = "kernel"; break;
    case OP_BUILTIN: name = "kernel builtin"; break;
    case OP_CALLBACK: name = "callback"; break;
    default: return;
  }
  mgpu__trace_span(s->dev->id, s->track, name, t0, t1, arg, nargs);
}

/* Stream s of device d waited for an event whose work depended on the lost
 * device lost_by - 1: the work after the wait reads what was never made, so
 * the stream fails with MGPU_EDEVLOST naming that device, and so do the
 * streams that wait for it in turn. */
static void wait_on_lost(mgpu__bdevice *d, mgpu__bstream *s, int lost_by) {
  mgpu__mutex_lock(&d->lock);
  if (s->error == 0) {
    s->error = MGPU_EDEVLOST;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d: the stream waited for work that depended on "
             "host device %d, which was lost: what ran after the wait is not "
             "valid", d->id, lost_by - 1);
  }
  atomic_store_explicit(&s->lost_from, lost_by, memory_order_relaxed);
  mgpu__mutex_unlock(&d->lock);
}

/* Runs o, the head of s (see mgpu__host_worker_main). */
static void run_op(mgpu__bdevice *d, mgpu__bstream *s, op *o) {
  uint64_t t0 = mgpu__now_ns();
  switch (o->kind) {
    case OP_COPY:
      if (o->u.copy.streaming)
        copy_streaming(o->u.copy.dst, o->u.copy.src, o->u.copy.size);
      else
        memmove(o->u.copy.dst, o->u.copy.src, o->u.copy.size);
      break;
    case OP_COPY2D:
      for (size_t r = 0; r < o->u.copy2d.height; r++)
        memmove(o->u.copy2d.dst + r * o->u.copy2d.dpitch,
                o->u.copy2d.src + r * o->u.copy2d.spitch, o->u.copy2d.width);
      break;
    case OP_MEMSET:
      memset(o->u.memset.dst, o->u.memset.value, o->u.memset.size);
      break;
    case OP_LAUNCH:
      mgpu__host_run_launch(d, s, &(mgpu__host_kernel_run){
          o->u.launch.fn, o->u.launch.grid, o->u.launch.block,
          o->u.launch.args, o->u.launch.name});
      break;
    case OP_BUILTIN:
      mgpu__host_builtin_run(&o->u.builtin);
      break;
    case OP_CALLBACK:
      o->u.callback.fn(o->u.callback.arg);
      break;
    case OP_GRAPH:
      if (o->u.graph.t0 == 0) o->u.graph.t0 = t0;
      mgpu__host_graph_run(d, s, o);
      break;
    case OP_RECORD:
      complete_event(o->u.event.event, o->u.event.seq, s);
      return;
    case OP_WAIT: {
      mgpu__bevent *e = o->u.event.event;
      if (mgpu__trace_enabled()) trace_wait(e, s, o->tag ? o->tag->name : NULL);
      mgpu__mutex_lock(&e->lock);
      int lost_by = e->lost_by;
      e->ops--;
      mgpu__cond_broadcast(&e->done);
      mgpu__mutex_unlock(&e->lock);
      if (lost_by != 0) wait_on_lost(d, s, lost_by);
      return;
    }
  }
  uint64_t t1 = mgpu__now_ns();
  s->last_t0 = t0;
  s->last_t1 = t1;
  mgpu__host_env->metric_add(d->id, MGPU__BMETRIC_BUSY_NS, t1 - t0);
  if (o->kind == OP_COPY && o->u.copy.path >= 0)
    mgpu__obs_copy_ran(d->id, o->u.copy.path, o->u.copy.size, t1 - t0);
  /* A graph part traces itself (mgpu__host_graph_run). */
  if (mgpu__trace_enabled() && o->kind != OP_GRAPH)
    mgpu__host_trace_op(s, o, t0, t1);
}

void mgpu__host_op_free(op *o) {
  if (o->kind == OP_LAUNCH) mgpu__free(o->u.launch.args);
  if (o->kind == OP_GRAPH) mgpu__host_graph_unref(o->u.graph.graph);
  mgpu__free(o->tag);
  mgpu__free(o);
}

/* With d->lock held: 1 if s must park on the event of its head wait. */
static int must_park(mgpu__bstream *s, op *o) {
  mgpu__bevent *e = o->u.event.event;
  int park = 0;
  mgpu__mutex_lock(&e->lock);
  if (!mgpu__host_event_done(e, o->u.event.seq)) {
    s->parked = 1;
    s->wait_next = e->waiters;
    e->waiters = s;
    park = 1;
  }
  mgpu__mutex_unlock(&e->lock);
  return park;
}

/* How long a wait goes on watching without parking while every CPU is
 * busy: the worker it holds may be the one that would run what it waits
 * for (another stream of its device). */
#define WATCH_BUSY_NS 1000000u

/* With d->lock held, s's head o a wait: 1 if s must park on its event. The
 * first time, the worker watches the event first (without the lock; s
 * counts as running meanwhile, so that no other worker takes it), as a
 * graph's part watches its signal: the record is often about to run on
 * another device's worker, and a park costs that worker a wake-up of this
 * stream's. Past the watch's budget it parks, unless every CPU is busy
 * (then it watches on, yielding, for up to WATCH_BUSY_NS). */
static int wait_must_park(mgpu__bdevice *d, mgpu__bstream *s, op *o) {
  counter_target t = {&o->u.event.event->completed, o->u.event.seq};
  if (o->u.event.watched || counter_reached(&t)) return must_park(s, o);
  o->u.event.watched = 1;
  s->running = 1;
  mgpu__mutex_unlock(&d->lock);
  uint64_t since = 0;
  int seen;
  while (!(seen = mgpu__spin_until(&o->u.event.event->spin, counter_reached,
                                   &t)) &&
         mgpu__cpus_all_busy()) {
    uint64_t now = mgpu__now_ns();
    if (since == 0) since = now;
    else if (now - since > WATCH_BUSY_NS) break;
  }
  mgpu__mutex_lock(&d->lock);
  s->running = 0;
  return !seen && must_park(s, o);
}

/* An idle worker watches its ready list before it sleeps. A pipeline
 * between devices (the staged copy, the collectives) hands a stream to
 * another device's worker once per chunk; waking a sleeping thread costs tens
 * of microseconds on a loaded machine, watching a little costs less. The
 * watch (mgpu__spin_until) adapts its length to how often it pays, and
 * pauses the CPU only while a core is left for others, yielding it
 * otherwise, so busy threads on the same core are not starved. */
static int work_ready(const void *p) {
  const mgpu__bdevice *d = p;
  return atomic_load_explicit(&d->nready, memory_order_acquire) > 0;
}

static int watch_for_work(mgpu__bdevice *d) {
  return mgpu__spin_until(&d->work_spin, work_ready, d);
}

/* d->lock held. */
void mgpu__host_lose_locked(mgpu__bdevice *d, const char *why) {
  if (atomic_load_explicit(&d->lost, memory_order_relaxed)) return;
  snprintf(d->lost_why, sizeof d->lost_why, "%s", why);
  atomic_store_explicit(&d->lost, 1, memory_order_release);
  mgpu__host_env->log(MGPU_LOG_WARN, "host device %d lost: %s", d->id, why);
}

/* d->lock held. Whether the worker must skip o instead of running it: the
 * device is lost, or o is the operation after which MGPU_FAULT loses it.
 * Events and waits always run; so do host callbacks. */
static int skip_op(mgpu__bdevice *d, mgpu__bstream *s, op *o) {
  if (o->kind == OP_RECORD || o->kind == OP_WAIT) return 0;
  if (!atomic_load_explicit(&d->lost, memory_order_relaxed) &&
      mgpu__fault_device_op(d->id)) {
    char why[64];
    snprintf(why, sizeof why, "MGPU_FAULT device:%d@after", d->id);
    mgpu__host_lose_locked(d, why);
  }
  if (!atomic_load_explicit(&d->lost, memory_order_relaxed)) return 0;
  mgpu__host_stream_lost_locked(d, s);
  /* A graph's part still posts its signals (and runs its callbacks). */
  return o->kind != OP_CALLBACK && o->kind != OP_GRAPH;
}

void mgpu__host_stream_lost_locked(mgpu__bdevice *d, mgpu__bstream *s) {
  if (s->error == 0) {
    s->error = MGPU_EDEVLOST;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d was lost (%s): work queued on the stream did "
             "not run", d->id, d->lost_why);
  }
  if (atomic_load_explicit(&s->lost_from, memory_order_relaxed) == 0)
    atomic_store_explicit(&s->lost_from, d->id + 1, memory_order_relaxed);
}

/* The stream at the head of d's ready list, taken off it; d->lock held. */
static mgpu__bstream *ready_pop(mgpu__bdevice *d) {
  mgpu__bstream *s = d->ready_head;
  if (s == NULL) return NULL;
  d->ready_head = s->ready_next;
  if (d->ready_head == NULL) d->ready_tail = NULL;
  atomic_fetch_sub_explicit(&d->nready, 1, memory_order_relaxed);
  s->queued = 0;
  return s;
}

/* s has more to run (d->lock held): the worker keeps it when no other
 * stream waits on the ready list, else puts it at the list's end. */
static void keep_or_push(mgpu__bdevice *d, mgpu__bstream *s,
                         mgpu__bstream **kept) {
  if (d->ready_head == NULL) *kept = s;
  else mgpu__host_ready_push(d, s);
}

void *mgpu__host_worker_main(void *arg) {
  mgpu__bdevice *d = arg;
  mgpu__trace_name_thread(d->id, "host worker");
  mgpu__thread_role_set("a host device's stream worker (a stream callback "
                        "or host kernel)");
  /* A stream whose next operation this worker runs without putting it on
   * the ready list (no other stream was waiting): handing it over there
   * would wake another worker, only for one of the two to find nothing. */
  mgpu__bstream *kept = NULL;
  mgpu__mutex_lock(&d->lock);
  for (;;) {
    mgpu__bstream *s = kept != NULL ? kept : ready_pop(d);
    kept = NULL;
    if (s == NULL) {
      if (d->stopping) break;
      d->watching++;
      mgpu__mutex_unlock(&d->lock);
      mgpu__cpu_busy(0);
      int found = watch_for_work(d);
      mgpu__mutex_lock(&d->lock);
      d->watching--;
      if (!found && d->ready_head == NULL && !d->stopping)
        mgpu__cond_wait(&d->work, &d->lock);
      continue;
    }
    op *o = s->head;
    if (o->kind == OP_WAIT && wait_must_park(d, s, o)) continue;
    if (o->kind == OP_GRAPH && mgpu__host_graph_must_park(s, o)) continue;
    int skip = skip_op(d, s, o);
    s->running = 1;
    mgpu__mutex_unlock(&d->lock);
    mgpu__cpu_busy(1);
    mgpu__cpu_spread();
    if (!skip) run_op(d, s, o);
    mgpu__mutex_lock(&d->lock);
    s->running = 0;
    if (mgpu__host_graph_unfinished(o)) {
      /* A part stopped at a node that waits: the stream parks there when
       * it is taken next, unless the wait is over by then. */
      keep_or_push(d, s, &kept);
      continue;
    }
    s->nfinished++;
    s->head = o->next;
    if (s->head == NULL) {
      s->tail = NULL;
      s->sync_at = 0;
      mgpu__cond_broadcast(&d->idle);
    } else {
      mgpu__host_sync_wake(d, s);
      keep_or_push(d, s, &kept);
    }
    mgpu__host_op_free(o);
  }
  mgpu__mutex_unlock(&d->lock);
  mgpu__cpu_busy(0); /* not counted once gone */
  return NULL;
}
