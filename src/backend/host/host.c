/* The host backend: each device is a set of worker threads with a memory
 * budget; its "device memory" is host memory.
 *
 * A stream is an in-order queue of operations. A stream with work is put on
 * its device's ready list; a worker takes it, runs its head operation, and
 * puts it back if more is queued. A stream is on the ready list or run by a
 * worker at most once at a time, so its operations run in order, while
 * several streams of one device run on several workers at once.
 *
 * Events: recording gives the event a new sequence number at call time and
 * queues an operation that marks that number complete. A wait captures the
 * latest sequence number at call time; the waiting stream parks itself on the
 * event when it reaches the wait early, and the recording worker puts it back
 * on its device's ready list. Workers never block on each other.
 *
 * An idle worker watches its ready list (mgpu__spin_until: a budget that
 * adapts to how often watching paid, pausing while a core is free and
 * yielding otherwise), then sleeps on a condition variable: hand-offs
 * between devices in a pipeline stay cheap, and nothing spins for long on a
 * 2-core machine (see watch_for_work).
 *
 * Copies into device memory of 256 KiB or more use non-temporal stores.
 *
 * Observability: each operation is timed where it runs, on the worker.
 * Copies add their time to their path's metric; while a trace is recorded,
 * each operation becomes a span on its stream's track (named by the tag the
 * layer above pushed, else by its kind), and a wait that ran after a record
 * becomes an arrow from the record to the waiting stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "backend/graph.h"
#include "backend/host/host.h"
#include "mgpu/error.h"
#include "obs/obs.h"
#include "obs/trace.h"
#include "util/thread.h"
#include "util/fault.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static const mgpu__backend_env *env;

typedef enum op_kind {
  OP_COPY,
  OP_COPY2D,
  OP_MEMSET,
  OP_LAUNCH,
  OP_BUILTIN,
  OP_CALLBACK,
  OP_RECORD,
  OP_WAIT,
  OP_GRAPH
} op_kind;

typedef struct host_graph host_graph;

typedef struct op {
  op_kind kind;
  struct op *next;
  mgpu__trace_tag *tag; /* the span's name, while tracing; owned */
  union {
    struct {
      void *dst;
      const void *src;
      size_t size;
      int streaming; /* write dst with non-temporal stores */
      int path;      /* mgpu_metric_path, or -1 (host to host) */
    } copy;
    struct {
      unsigned char *dst;
      const unsigned char *src;
      size_t dpitch, spitch, width, height;
    } copy2d;
    struct {
      void *dst;
      int value;
      size_t size;
    } memset;
    struct {
      void (*fn)(const mgpu_kernel_ctx *, const void *);
      mgpu_dim3 grid, block;
      void *args;
      char name[40]; /* the kernel's, for a failure's detail */
    } launch;
    mgpu__builtin builtin;
    struct {
      void (*fn)(void *);
      void *arg;
    } callback;
    struct {
      mgpu__bevent *event;
      uint64_t seq;
    } event;
    struct {
      host_graph *graph;
      uint64_t launch;
      int next; /* the node to run next (owned by the running worker) */
    } graph;
  } u;
} op;

struct mgpu__bevent {
  mgpu__bdevice *dev;
  /* lock guards every field below. It comes after a device's lock
   * (docs/ARCHITECTURE.md, "Lock order"). */
  mgpu__mutex lock;
  mgpu__cond done;
  uint64_t recorded;  /* sequence number of the latest record call */
  uint64_t completed; /* highest sequence number completed */
  uint64_t time_ns;   /* when `completed` was reached */
  mgpu__trace_point recorded_at; /* where and when, for the trace's arrows */
  mgpu__bstream *waiters; /* streams parked on this event */
  /* The work before the latest completion depended on a device that was
   * lost (its id + 1; 0: it did not): a stream that waits for the event
   * fails with MGPU_EDEVLOST naming that device, as does a synchronize. */
  int lost_by;
  /* Record and wait operations queued that still point at the event. A
   * record can outlive a later one that completed first (records on two
   * streams), and a wait can outlive every record: destroy waits for both. */
  int ops;
};

struct mgpu__bstream {
  mgpu__bdevice *dev;
  uint32_t track; /* the stream's track in the trace; set at creation */
  /* Owned by the worker running the stream: when its last operation ran,
   * and the arrow a wait left for the next operation (arrow_name NULL:
   * none). An arrow starts inside the span before a record and ends
   * inside the span after a wait, where Perfetto binds its ends. */
  uint64_t last_t0, last_t1;
  mgpu__trace_point arrow_from;
  const char *arrow_name;
  /* Guarded by dev->lock. */
  op *head, *tail;
  int queued;               /* on the ready list */
  int running;              /* a worker runs its head */
  int parked;               /* waiting on an event */
  int error;                /* first asynchronous error, 0 if none */
  char error_detail[320];   /* its detail */
  /* The lost device (its id + 1) whose loss the stream's work since its
   * last synchronize depends on: its own, or one whose event it waited for.
   * Written under dev->lock, read without it when an event completes. */
  _Atomic int lost_from;
  /* Operations queued and finished since creation: synchronize waits for
   * the count queued at its call, not for the queue to run dry, which a
   * thread that keeps queueing could put off for ever. syncs: threads in
   * synchronize, who want to hear of every finished operation. */
  uint64_t nqueued;
  _Atomic uint64_t nfinished; /* written under dev->lock; synchronize
                                 watches it without the lock */
  int syncs; /* also counts a destroy waiting for the stream to run dry */
  mgpu__bstream *ready_next;
  mgpu__bstream *wait_next; /* in an event's waiters (event lock) */
};

struct mgpu__bdevice {
  int id;
  int nworkers;
  mgpu__thread *workers;
  /* lock guards the ready list, stopping and every stream's queue. */
  mgpu__mutex lock;
  mgpu__cond work;  /* a stream became ready, or stopping */
  mgpu__cond idle;  /* some stream's queue became empty, or an operation
                       finished on a stream being synchronized */
  mgpu__bstream *ready_head, *ready_tail;
  int stopping;
  /* Streams on the ready list, readable without the lock: an idle worker
   * watches it for a few microseconds before it sleeps. */
  _Atomic int nready;
  /* Spin budgets (util/thread.h): idle workers watching nready, and
   * synchronize watching a stream's nfinished. */
  mgpu__spin work_spin, sync_spin;
  /* Peer access this device has enabled, by mgpu device id (lock). */
  unsigned char peer_enabled[MGPU_MAX_DEVICES];
  /* A lost device (host_lose, or MGPU_FAULT's device:N@after:K counted by
   * the workers) runs no more work: its queued operations fail the stream
   * with MGPU_EDEVLOST, events still complete so nobody waits for ever, and
   * host callbacks still run (they free what the work used). lost_why is
   * written once, under lock, before lost is set. */
  _Atomic int lost;
  char lost_why[96];
};

/* ---- the ready list (dev->lock held) ---- */

static void ready_push(mgpu__bdevice *d, mgpu__bstream *s) {
  s->queued = 1;
  s->ready_next = NULL;
  if (d->ready_tail) d->ready_tail->ready_next = s;
  else d->ready_head = s;
  d->ready_tail = s;
  atomic_fetch_add_explicit(&d->nready, 1, memory_order_release);
  mgpu__cond_signal(&d->work);
}

static mgpu__bstream *ready_pop(mgpu__bdevice *d) {
  mgpu__bstream *s = d->ready_head;
  if (s == NULL) return NULL;
  d->ready_head = s->ready_next;
  if (d->ready_head == NULL) d->ready_tail = NULL;
  atomic_fetch_sub_explicit(&d->nready, 1, memory_order_relaxed);
  s->queued = 0;
  return s;
}

/* Queues op on s. The op is owned by the stream from here on. */
static void enqueue(mgpu__bstream *s, op *o) {
  mgpu__bdevice *d = s->dev;
  o->next = NULL;
  mgpu__mutex_lock(&d->lock);
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  s->nqueued++;
  if (!s->queued && !s->running && !s->parked) ready_push(d, s);
  mgpu__mutex_unlock(&d->lock);
}

static op *op_new(op_kind kind) {
  op *o = mgpu__calloc(1, sizeof *o);
  if (o == NULL) return NULL;
  o->kind = kind;
  if (mgpu__trace_enabled()) o->tag = mgpu__trace_tag_copy();
  return o;
}

static int op_nomem(mgpu__bdevice *d) {
  return env->set_error(MGPU_ENOMEM, "host device %d: out of host memory "
                        "for a stream operation", d->id);
}

/* ---- running operations ---- */

/* Copies into device memory of at least this size bypass the cache. */
#define STREAMING_MIN ((size_t)256 << 10)

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

/* Puts the parked streams of list w (linked through wait_next, taken off
 * whatever they waited on) back on their devices' ready lists. */
static void unpark(mgpu__bstream *w) {
  while (w != NULL) {
    mgpu__bstream *next = w->wait_next;
    mgpu__mutex_lock(&w->dev->lock);
    w->parked = 0;
    if (!w->queued && !w->running && w->head) ready_push(w->dev, w);
    mgpu__mutex_unlock(&w->dev->lock);
    w = next;
  }
}

static void complete_event(mgpu__bevent *e, uint64_t seq, mgpu__bstream *s) {
  int lost_by = atomic_load_explicit(&s->lost_from, memory_order_relaxed);
  if (lost_by == 0 && atomic_load_explicit(&s->dev->lost, memory_order_acquire))
    lost_by = s->dev->id + 1;
  mgpu__mutex_lock(&e->lock);
  if (seq > e->completed) {
    e->completed = seq;
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
  unpark(w);
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
    return env->set_error(MGPU_EINVAL, "mgpu_kernel_fail: %s",
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
static void run_launch(mgpu__bdevice *d, mgpu__bstream *s, const op *o) {
  mgpu_kernel_ctx ctx;
  ctx.grid_dim = o->u.launch.grid;
  ctx.block_dim = o->u.launch.block;
  ctx.device = d->id;
  launch_failure failure = {0, ""};
  running_launch = &failure;
  for (unsigned z = 0; z < ctx.grid_dim.z && !failure.code; z++)
    for (unsigned y = 0; y < ctx.grid_dim.y && !failure.code; y++)
      for (unsigned x = 0; x < ctx.grid_dim.x && !failure.code; x++) {
        ctx.block_idx = MGPU_DIM3(x, y, z);
        o->u.launch.fn(&ctx, o->u.launch.args);
      }
  running_launch = NULL;
  if (failure.code == 0) return;
  mgpu__mutex_lock(&d->lock);
  if (s->error == 0) {
    s->error = failure.code;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d: kernel '%s' failed in block (%u, %u, %u): %s",
             d->id, o->u.launch.name, ctx.block_idx.x, ctx.block_idx.y,
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
static void trace_op(mgpu__bstream *s, const op *o, uint64_t t0, uint64_t t1) {
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

static void run_graph(mgpu__bdevice *d, mgpu__bstream *s, op *o);
static int graph_must_park(mgpu__bstream *s, op *o);
static int graph_unfinished(const op *o);

/* Runs o, the head of s (see worker_main). */
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
      run_launch(d, s, o);
      break;
    case OP_BUILTIN:
      mgpu__host_builtin_run(&o->u.builtin);
      break;
    case OP_CALLBACK:
      o->u.callback.fn(o->u.callback.arg);
      break;
    case OP_GRAPH:
      run_graph(d, s, o);
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
  env->metric_add(d->id, MGPU__BMETRIC_BUSY_NS, t1 - t0);
  if (o->kind == OP_COPY && o->u.copy.path >= 0)
    mgpu__obs_copy_ran(d->id, o->u.copy.path, o->u.copy.size, t1 - t0);
  if (mgpu__trace_enabled()) trace_op(s, o, t0, t1);
}

static void graph_unref(host_graph *g);

static void op_free(op *o) {
  if (o->kind == OP_LAUNCH) mgpu__free(o->u.launch.args);
  if (o->kind == OP_GRAPH) graph_unref(o->u.graph.graph);
  mgpu__free(o->tag);
  mgpu__free(o);
}

/* With d->lock held: 1 if s must park on the event of its head wait. */
static int must_park(mgpu__bstream *s, op *o) {
  mgpu__bevent *e = o->u.event.event;
  int park = 0;
  mgpu__mutex_lock(&e->lock);
  if (e->completed < o->u.event.seq) {
    s->parked = 1;
    s->wait_next = e->waiters;
    e->waiters = s;
    park = 1;
  }
  mgpu__mutex_unlock(&e->lock);
  return park;
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
static void lose_locked(mgpu__bdevice *d, const char *why) {
  if (atomic_load_explicit(&d->lost, memory_order_relaxed)) return;
  snprintf(d->lost_why, sizeof d->lost_why, "%s", why);
  atomic_store_explicit(&d->lost, 1, memory_order_release);
  env->log(MGPU_LOG_WARN, "host device %d lost: %s", d->id, why);
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
    lose_locked(d, why);
  }
  if (!atomic_load_explicit(&d->lost, memory_order_relaxed)) return 0;
  if (s->error == 0) {
    s->error = MGPU_EDEVLOST;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d was lost (%s): work queued on the stream did "
             "not run", d->id, d->lost_why);
  }
  if (atomic_load_explicit(&s->lost_from, memory_order_relaxed) == 0)
    atomic_store_explicit(&s->lost_from, d->id + 1, memory_order_relaxed);
  /* A graph's part still posts its signals (and runs its callbacks). */
  return o->kind != OP_CALLBACK && o->kind != OP_GRAPH;
}

static void *worker_main(void *arg) {
  mgpu__bdevice *d = arg;
  mgpu__trace_name_thread(d->id, "host worker");
  mgpu__thread_role_set("a host device's stream worker (a stream callback "
                        "or host kernel)");
  mgpu__mutex_lock(&d->lock);
  for (;;) {
    mgpu__bstream *s = ready_pop(d);
    if (s == NULL) {
      if (d->stopping) break;
      mgpu__mutex_unlock(&d->lock);
      int found = watch_for_work(d);
      mgpu__mutex_lock(&d->lock);
      if (!found && d->ready_head == NULL && !d->stopping)
        mgpu__cond_wait(&d->work, &d->lock);
      continue;
    }
    op *o = s->head;
    if (o->kind == OP_WAIT && must_park(s, o)) continue;
    if (o->kind == OP_GRAPH && graph_must_park(s, o)) continue;
    int skip = skip_op(d, s, o);
    s->running = 1;
    mgpu__mutex_unlock(&d->lock);
    if (!skip) run_op(d, s, o);
    mgpu__mutex_lock(&d->lock);
    s->running = 0;
    if (graph_unfinished(o)) {
      /* A part stopped at a node that waits: the stream parks there when
       * it is taken next, unless the wait is over by then. */
      ready_push(d, s);
      continue;
    }
    s->nfinished++;
    s->head = o->next;
    if (s->head == NULL) {
      s->tail = NULL;
      mgpu__cond_broadcast(&d->idle);
    } else {
      if (s->syncs > 0) mgpu__cond_broadcast(&d->idle);
      ready_push(d, s);
    }
    op_free(o);
  }
  mgpu__mutex_unlock(&d->lock);
  return NULL;
}

/* ---- devices ---- */

static int host_probe(int *count) {
  *count = MGPU_MAX_DEVICES;
  return 0;
}

static void host_close(mgpu__bdevice *d) {
  mgpu__mutex_lock(&d->lock);
  d->stopping = 1;
  mgpu__cond_broadcast(&d->work);
  mgpu__mutex_unlock(&d->lock);
  for (int i = 0; i < d->nworkers; i++) mgpu__thread_join(d->workers[i]);
  mgpu__free(d->workers);
  mgpu__cond_destroy(&d->idle);
  mgpu__cond_destroy(&d->work);
  mgpu__mutex_destroy(&d->lock);
  mgpu__free(d);
}

static int host_open(const mgpu__device_spec *spec, mgpu__bdevice **out) {
  mgpu__bdevice *d = mgpu__calloc(1, sizeof *d);
  if (d == NULL) goto fail_nomem;
  d->id = spec->id;
  d->workers = mgpu__calloc((size_t)env->config->host_workers, sizeof *d->workers);
  if (d->workers == NULL) goto fail_free;
  mgpu__mutex_init(&d->lock, MGPU__LOCK_HOST_DEVICE);
  mgpu__cond_init(&d->work);
  mgpu__cond_init(&d->idle);
  for (int i = 0; i < env->config->host_workers; i++) {
    int rc = mgpu__thread_create(&d->workers[i], worker_main, d);
    if (rc != 0) {
      host_close(d); /* joins the workers started so far */
      return env->set_error(MGPU_ENOMEM, "host device %d: cannot start worker "
                            "thread %d: error %d", spec->id, i, rc);
    }
    d->nworkers++;
  }
  *out = d;
  return 0;
fail_free:
  mgpu__free(d);
fail_nomem:
  return env->set_error(MGPU_ENOMEM, "host device %d: out of host memory",
                        spec->id);
}

static int host_props(mgpu__bdevice *d, mgpu_device_props *p) {
  snprintf(p->name, sizeof p->name, "host device %d", d->id);
  p->multiprocessors = d->nworkers;
  p->numa_node = -1;
  p->peer_capable = env->config->host_peer ? 1 : 0;
  mgpu__host_uuid(p->ordinal, p->uuid, sizeof p->uuid);
  return 0;
}

static int host_make_current(mgpu__bdevice *d) {
  (void)d;
  return 0;
}

/* Large blocks are aligned to 2 MiB and offered to transparent huge pages:
 * first touch of 4 KiB pages is the slowest part of a fresh buffer here. */
static int host_mem_alloc(mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,
                          void **ptr) {
  (void)kind;
  const size_t huge = (size_t)2 << 20;
  size_t align = size >= huge ? huge : 64;
  size_t rounded = (size + align - 1) / align * align;
  void *p = NULL;
  /* rounded < size: the round-up wrapped past zero (pinned memory has no
   * budget in front of it). */
  if (rounded < size || posix_memalign(&p, align, rounded) != 0)
    return env->set_error(MGPU_ENOMEM, "host device %d: the system refused "
                          "%zu bytes", d->id, size);
#ifdef MADV_HUGEPAGE
  if (align == huge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  *ptr = p;
  return 0;
}

static void host_mem_free(mgpu__bdevice *d, mgpu_mem_kind kind, void *ptr) {
  (void)d;
  (void)kind;
  mgpu__free(ptr);
}

/* Host memory needs no device: mgpu__free() is all. */
static void host_mem_free_detached(mgpu_mem_kind kind, void *ptr) {
  (void)kind;
  mgpu__free(ptr);
}

static int host_mem_info(mgpu__bdevice *d, size_t *free_bytes,
                         size_t *total_bytes) {
  (void)d;
  *free_bytes = 0; /* the core applies the budget */
  *total_bytes = 0;
  return 0;
}

/* ---- streams ---- */

static int host_stream_create(mgpu__bdevice *d, mgpu__bstream **out) {
  mgpu__bstream *s = mgpu__calloc(1, sizeof *s);
  if (s == NULL) return op_nomem(d);
  s->dev = d;
  s->track = mgpu__trace_track_new(d->id, NULL);
  *out = s;
  return 0;
}

/* A counter to watch until it reaches a target (mgpu__spin_until): a
 * stream's finished operations, a graph's signal. seq_cst: a graph's
 * waiter counts itself parked and then looks, a poster stores and then
 * looks for parked waiters, and one of the two must see the other. */
typedef struct counter_target {
  const _Atomic uint64_t *counter;
  uint64_t target;
} counter_target;

static int counter_reached(const void *p) {
  const counter_target *t = p;
  return atomic_load(t->counter) >= t->target;
}

static int host_stream_synchronize(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  uint64_t target = s->nqueued;
  if (s->nfinished < target) {
    /* Watch first: work that ends soon is seen without a wake-up. */
    counter_target t = {&s->nfinished, target};
    mgpu__mutex_unlock(&d->lock);
    mgpu__spin_until(&d->sync_spin, counter_reached, &t);
    mgpu__mutex_lock(&d->lock);
  }
  s->syncs++;
  while (s->nfinished < target) mgpu__cond_wait(&d->idle, &d->lock);
  s->syncs--;
  int err = s->error;
  char detail[sizeof s->error_detail];
  memcpy(detail, s->error_detail, sizeof detail);
  s->error = 0;
  atomic_store_explicit(&s->lost_from, 0, memory_order_relaxed);
  mgpu__mutex_unlock(&d->lock);
  if (err != 0) return env->set_error(err, "%s", detail);
  return err;
}

static void host_stream_destroy(mgpu__bdevice *d, mgpu__bstream *s) {
  /* Runs dry first, whatever was queued last: s is freed. */
  mgpu__mutex_lock(&d->lock);
  s->syncs++; /* heard of by whoever finishes its work */
  while (s->head != NULL || s->running) mgpu__cond_wait(&d->idle, &d->lock);
  s->syncs--;
  mgpu__mutex_unlock(&d->lock);
  mgpu__free(s);
}

static int host_stream_query(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  int busy = s->head != NULL || s->running;
  int rc = busy ? MGPU_EAGAIN : s->error;
  if (!busy) {
    s->error = 0;
    atomic_store_explicit(&s->lost_from, 0, memory_order_relaxed);
  }
  mgpu__mutex_unlock(&d->lock);
  return rc;
}

/* A claim is an operation run by the calling thread instead of a worker:
 * `running` keeps enqueue from putting s on the ready list, and the claim
 * counts as one queued operation, so synchronize waits for its release. */
static int host_stream_claim(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  int idle = s->head == NULL && !s->running && !s->queued && !s->parked;
  if (idle) {
    s->running = 1;
    s->nqueued++;
  }
  mgpu__mutex_unlock(&d->lock);
  return idle;
}

static void host_stream_release(mgpu__bdevice *d, mgpu__bstream *s) {
  mgpu__mutex_lock(&d->lock);
  s->running = 0;
  s->nfinished++;
  if (s->syncs > 0) mgpu__cond_broadcast(&d->idle);
  if (s->head != NULL) ready_push(d, s);
  mgpu__mutex_unlock(&d->lock);
}

static int host_stream_lock_idle(mgpu__bdevice *d, mgpu__bstream *s) {
  if (!mgpu__mutex_trylock(&d->lock)) return 0;
  if (s->head == NULL && !s->running && !s->queued && !s->parked) return 1;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

static void host_stream_unlock_idle(mgpu__bdevice *d, mgpu__bstream *s) {
  (void)s;
  mgpu__mutex_unlock(&d->lock);
}

static void *host_stream_native(mgpu__bstream *s) {
  (void)s;
  return NULL;
}

/* ---- events ---- */

static int host_event_create(mgpu__bdevice *d, mgpu__bevent **out) {
  mgpu__bevent *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL) return op_nomem(d);
  e->dev = d;
  mgpu__mutex_init(&e->lock, MGPU__LOCK_HOST_EVENT);
  mgpu__cond_init(&e->done);
  *out = e;
  return 0;
}

static void host_event_destroy(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  /* A pending record completes first, and a queued wait passes: their
   * operations still point at the event. */
  mgpu__mutex_lock(&e->lock);
  while (e->completed < e->recorded || e->ops > 0)
    mgpu__cond_wait(&e->done, &e->lock);
  mgpu__mutex_unlock(&e->lock);
  mgpu__cond_destroy(&e->done);
  mgpu__mutex_destroy(&e->lock);
  mgpu__free(e);
}

static int host_event_record(mgpu__bdevice *d, mgpu__bevent *e,
                             mgpu__bstream *s) {
  op *o = op_new(OP_RECORD);
  if (o == NULL) return op_nomem(d);
  mgpu__mutex_lock(&e->lock);
  o->u.event.seq = ++e->recorded;
  e->ops++;
  mgpu__mutex_unlock(&e->lock);
  o->u.event.event = e;
  enqueue(s, o);
  return 0;
}

static int host_event_record_claimed(mgpu__bdevice *d, mgpu__bevent *e,
                                     mgpu__bstream *s) {
  (void)d;
  mgpu__mutex_lock(&e->lock);
  uint64_t seq = ++e->recorded;
  e->ops++; /* as a queued record's; complete_event gives it back */
  mgpu__mutex_unlock(&e->lock);
  complete_event(e, seq, s);
  return 0;
}

static int host_event_synchronize(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  mgpu__mutex_lock(&e->lock);
  uint64_t target = e->recorded;
  while (e->completed < target) mgpu__cond_wait(&e->done, &e->lock);
  int lost_by = e->lost_by;
  mgpu__mutex_unlock(&e->lock);
  if (atomic_load_explicit(&e->dev->lost, memory_order_acquire))
    return env->set_error(MGPU_EDEVLOST, "host device %d was lost (%s): the "
                          "work before the event may not have run",
                          e->dev->id, e->dev->lost_why);
  if (lost_by != 0)
    return env->set_error(MGPU_EDEVLOST, "host device %d: the work before "
                          "the event depended on host device %d, which was "
                          "lost", e->dev->id, lost_by - 1);
  return 0;
}

static int host_event_query(mgpu__bdevice *d, mgpu__bevent *e) {
  (void)d;
  mgpu__mutex_lock(&e->lock);
  int rc = e->completed < e->recorded ? MGPU_EAGAIN : 0;
  mgpu__mutex_unlock(&e->lock);
  return rc;
}

static int host_event_elapsed_ms(mgpu__bdevice *d, mgpu__bevent *a,
                                 mgpu__bevent *b, float *ms) {
  uint64_t ta = 0, tb = 0;
  int pending = 0, never = 0;
  mgpu__mutex_lock(&a->lock);
  pending |= a->completed < a->recorded;
  never |= a->recorded == 0;
  ta = a->time_ns;
  mgpu__mutex_unlock(&a->lock);
  mgpu__mutex_lock(&b->lock);
  pending |= b->completed < b->recorded;
  never |= b->recorded == 0;
  tb = b->time_ns;
  mgpu__mutex_unlock(&b->lock);
  if (never)
    return env->set_error(MGPU_EINVAL, "device %d: elapsed time of an event "
                          "that was never recorded", d->id);
  if (pending)
    return env->set_error(MGPU_EAGAIN, "device %d: elapsed time asked before "
                          "both events completed", d->id);
  *ms = (float)((double)((int64_t)tb - (int64_t)ta) / 1e6);
  return 0;
}

static int host_stream_wait_event(mgpu__bdevice *d, mgpu__bstream *s,
                                  mgpu__bdevice *ed, mgpu__bevent *e) {
  (void)ed;
  mgpu__mutex_lock(&e->lock);
  uint64_t seq = e->recorded;
  int done = e->completed >= seq;
  mgpu__mutex_unlock(&e->lock);
  /* Nothing to wait for; while tracing the wait is queued all the same,
   * so that its arrow is drawn in order on the worker. */
  if (done && !mgpu__trace_enabled()) return 0;
  op *o = op_new(OP_WAIT);
  if (o == NULL) return op_nomem(d);
  o->u.event.event = e;
  o->u.event.seq = seq;
  mgpu__mutex_lock(&e->lock);
  e->ops++;
  mgpu__mutex_unlock(&e->lock);
  enqueue(s, o);
  return 0;
}

/* ---- work ---- */

static int host_memcpy_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                             const void *src, size_t size,
                             mgpu__copy_kind kind) {
  op *o = op_new(OP_COPY);
  if (o == NULL) return op_nomem(d);
  o->u.copy.dst = dst;
  o->u.copy.src = src;
  o->u.copy.size = size;
  o->u.copy.streaming = (kind == MGPU__COPY_H2D || kind == MGPU__COPY_D2D) &&
                        size >= STREAMING_MIN;
  /* The path the copy layer chose, else the kind's. */
  static const int kind_path[] = {MGPU_METRIC_PATH_H2D, MGPU_METRIC_PATH_D2H,
                                  MGPU_METRIC_PATH_D2D, -1};
  int path = mgpu__obs_path();
  o->u.copy.path = path >= 0 ? path : kind_path[kind];
  enqueue(s, o);
  return 0;
}

static int host_memcpy2d_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                               size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height,
                               mgpu__copy_kind kind) {
  (void)kind;
  op *o = op_new(OP_COPY2D);
  if (o == NULL) return op_nomem(d);
  o->u.copy2d.dst = dst;
  o->u.copy2d.src = src;
  o->u.copy2d.dpitch = dpitch;
  o->u.copy2d.spitch = spitch;
  o->u.copy2d.width = width;
  o->u.copy2d.height = height;
  enqueue(s, o);
  return 0;
}

static int host_memset_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                             int value, size_t size) {
  op *o = op_new(OP_MEMSET);
  if (o == NULL) return op_nomem(d);
  o->u.memset.dst = dst;
  o->u.memset.value = value;
  o->u.memset.size = size;
  enqueue(s, o);
  return 0;
}

static int host_launch(mgpu__bdevice *d, mgpu__bstream *s,
                       const mgpu_kernel *k, mgpu_dim3 grid, mgpu_dim3 block,
                       const void *args, size_t args_size) {
  op *o = op_new(OP_LAUNCH);
  if (o == NULL) return op_nomem(d);
  if (args_size > 0) {
    o->u.launch.args = mgpu__malloc(args_size);
    if (o->u.launch.args == NULL) {
      op_free(o);
      return op_nomem(d);
    }
    memcpy(o->u.launch.args, args, args_size);
  }
  o->u.launch.fn = k->host_fn;
  snprintf(o->u.launch.name, sizeof o->u.launch.name, "%s",
           k->name != NULL ? k->name : "?");
  if (mgpu__trace_enabled() && o->tag == NULL) {
    mgpu__trace_arg a[] = {MGPU__TARG_I("grid_x", grid.x),
                           MGPU__TARG_I("grid_y", grid.y),
                           MGPU__TARG_I("grid_z", grid.z),
                           MGPU__TARG_I("block_x", block.x)};
    char name[MGPU__TRACE_NAME];
    snprintf(name, sizeof name, "kernel %s", k->name ? k->name : "?");
    int pushed = mgpu__trace_tag_push(name, a, 4);
    o->tag = mgpu__trace_tag_copy();
    mgpu__trace_tag_pop(pushed);
  }
  o->u.launch.grid = grid;
  o->u.launch.block = block;
  enqueue(s, o);
  return 0;
}

static int host_builtin(mgpu__bdevice *d, mgpu__bstream *s,
                        const mgpu__builtin *b) {
  op *o = op_new(OP_BUILTIN);
  if (o == NULL) return op_nomem(d);
  o->u.builtin = *b;
  enqueue(s, o);
  return 0;
}

static int host_callback(mgpu__bdevice *d, mgpu__bstream *s,
                         void (*fn)(void *), void *arg) {
  op *o = op_new(OP_CALLBACK);
  if (o == NULL) return op_nomem(d);
  o->u.callback.fn = fn;
  o->u.callback.arg = arg;
  enqueue(s, o);
  return 0;
}

/* ---- peers: every host device can read every other's memory; the
 * configuration (MGPU_HOST_PEER=none) can forbid it to exercise the staged
 * path. ---- */

static int host_peer_can_access(mgpu__bdevice *d, mgpu__bdevice *peer,
                                int *yes) {
  *yes = env->config->host_peer && d != peer;
  return 0;
}

static int host_peer_enable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  if (!env->config->host_peer)
    return env->set_error(MGPU_ENOTSUP, "device %d -> device %d: peer access "
                          "is turned off (MGPU_HOST_PEER=none)", d->id,
                          peer->id);
  mgpu__mutex_lock(&d->lock);
  d->peer_enabled[peer->id] = 1;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

static int host_peer_disable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  mgpu__mutex_lock(&d->lock);
  d->peer_enabled[peer->id] = 0;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

static int host_memcpy_peer_async(mgpu__bdevice *dd, void *dst,
                                  mgpu__bdevice *sd, const void *src,
                                  size_t size, mgpu__bdevice *s_dev,
                                  mgpu__bstream *s) {
  (void)dd;
  (void)sd;
  int saved = mgpu__obs_path();
  mgpu__obs_path_set(MGPU_METRIC_PATH_PEER_DIRECT);
  int rc = host_memcpy_async(s_dev, s, dst, src, size, MGPU__COPY_D2D);
  mgpu__obs_path_set(saved);
  return rc;
}

static void host_lose(mgpu__bdevice *d, const char *why) {
  mgpu__mutex_lock(&d->lock);
  lose_locked(d, why);
  mgpu__mutex_unlock(&d->lock);
}

static int host_lost(mgpu__bdevice *d, char *why, size_t why_size) {
  if (!atomic_load_explicit(&d->lost, memory_order_acquire)) return 0;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", d->lost_why);
  return 1;
}

/* ---- graphs (backend/graph.h) ----
 *
 * A device's part of a graph is one operation: the worker that takes it
 * runs the part's nodes in order, in place, waiting for the signals of
 * other devices' nodes on the board (a short spin, then a park) and posting
 * its own. One hand-off per device and launch instead of one per node. */

struct host_graph {
  _Atomic int refs; /* the owner's, and one per run queued */
  mgpu__graph_board *board;
  mgpu__bgraph_node *nodes; /* args and waits point into blob */
  int n;
  void *blob;
};

static void graph_unref(host_graph *g) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
    return;
  mgpu__graph_board_unref(g->board);
  mgpu__free(g->blob);
  mgpu__free(g->nodes);
  mgpu__free(g);
}

/* The first wait of o's next node that is not over, or -1. */
static int pending_wait(const op *o) {
  const host_graph *g = o->u.graph.graph;
  const mgpu__bgraph_node *n = &g->nodes[o->u.graph.next];
  for (int j = 0; j < n->nwaits; j++) {
    counter_target w = {&g->board->signals[n->waits[j]],
                        2 * o->u.graph.launch};
    if (!counter_reached(&w)) return n->waits[j];
  }
  return -1;
}

static int graph_unfinished(const op *o) {
  return o->kind == OP_GRAPH && o->u.graph.next < o->u.graph.graph->n;
}

/* With s's device lock held, s's head o a part: 1 when its next node must
 * wait, and s is now parked on the board (a post puts it back). */
static int graph_must_park(mgpu__bstream *s, op *o) {
  if (!graph_unfinished(o) ||
      atomic_load_explicit(&s->dev->lost, memory_order_acquire))
    return 0;
  mgpu__graph_board *b = o->u.graph.graph->board;
  mgpu__mutex_lock(&b->lock);
  atomic_fetch_add(&b->nparked, 1);
  int park = pending_wait(o) >= 0;
  if (park) {
    s->parked = 1;
    s->wait_next = b->parked;
    b->parked = s;
  } else {
    atomic_fetch_sub(&b->nparked, 1);
  }
  mgpu__mutex_unlock(&b->lock);
  return park;
}

/* Posts value to signal sig and puts the streams parked on b back on their
 * devices' ready lists (each looks at its wait again when taken). */
static void board_post(mgpu__graph_board *b, int sig, uint64_t value) {
  atomic_store(&b->signals[sig], value);
  if (atomic_load(&b->nparked) == 0) return;
  mgpu__mutex_lock(&b->lock);
  mgpu__bstream *w = b->parked;
  b->parked = NULL;
  for (mgpu__bstream *x = w; x != NULL; x = x->wait_next)
    atomic_fetch_sub(&b->nparked, 1);
  mgpu__mutex_unlock(&b->lock);
  unpark(w);
}

/* Node node of s's part waited for a node of device lost_dev, which was
 * lost: what it reads was never made. */
static void graph_wait_lost(mgpu__bdevice *d, mgpu__bstream *s, int node,
                            int lost_dev) {
  mgpu__mutex_lock(&d->lock);
  if (s->error == 0) {
    s->error = MGPU_EDEVLOST;
    snprintf(s->error_detail, sizeof s->error_detail,
             "host device %d: graph node %d waited for a node of host device "
             "%d, which was lost", d->id, node, lost_dev);
  }
  mgpu__mutex_unlock(&d->lock);
}

static void run_graph_node(mgpu__bdevice *d, mgpu__bstream *s,
                           const mgpu__bgraph_node *n) {
  switch (n->kind) {
    case MGPU__BG_NOP: break;
    case MGPU__BG_COPY: memmove(n->dst, n->src, n->size); break;
    case MGPU__BG_MEMSET: memset(n->dst, n->value, n->size); break;
    case MGPU__BG_BUILTIN: mgpu__host_builtin_run(&n->builtin); break;
    case MGPU__BG_CALLBACK: n->fn(n->arg); break;
    case MGPU__BG_LAUNCH: {
      op k = {.kind = OP_LAUNCH};
      k.u.launch.fn = n->kernel->host_fn;
      k.u.launch.grid = n->grid;
      k.u.launch.block = n->block;
      k.u.launch.args = (void *)n->args;
      snprintf(k.u.launch.name, sizeof k.u.launch.name, "%s",
               n->kernel->name != NULL ? n->kernel->name : "?");
      run_launch(d, s, &k);
      break;
    }
  }
}

/* Runs o's nodes from the next one on, until the end or a node whose
 * wait is not over after a short spin: there the worker gives the stream
 * back (worker_main), to come back to that node once it is posted. On a
 * lost device nothing waits and nothing but host callbacks runs; its
 * signals post the loss. */
static void run_graph(mgpu__bdevice *d, mgpu__bstream *s, op *o) {
  static const char *const names[] = {"graph nop", "graph copy",
                                      "graph memset", "graph kernel",
                                      "graph builtin", "graph callback"};
  host_graph *g = o->u.graph.graph;
  uint64_t posted = 2 * o->u.graph.launch;
  int lost = atomic_load_explicit(&d->lost, memory_order_acquire);
  while (o->u.graph.next < g->n) {
    const mgpu__bgraph_node *n = &g->nodes[o->u.graph.next];
    uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
    int sig;
    if (!lost && (sig = pending_wait(o)) >= 0) {
      counter_target w = {&g->board->signals[sig], posted};
      if (!mgpu__spin_until(&g->board->spin, counter_reached, &w)) return;
      continue; /* look at every wait of the node again */
    }
    for (int j = 0; !lost && j < n->nwaits; j++)
      if (atomic_load(&g->board->signals[n->waits[j]]) & 1)
        graph_wait_lost(d, s, n->node,
                        g->board->signal_device[n->waits[j]]);
    if (!lost || n->kind == MGPU__BG_CALLBACK) run_graph_node(d, s, n);
    if (n->signal >= 0) board_post(g->board, n->signal, posted + (lost != 0));
    if (t0 != 0) {
      mgpu__trace_arg a[] = {MGPU__TARG_I("node", n->node)};
      mgpu__trace_span(d->id, s->track, names[n->kind], t0, mgpu__now_ns(),
                       a, 1);
    }
    o->u.graph.next++;
  }
}

static int host_graph_create(mgpu__bdevice *d, const mgpu__bgraph_part *part,
                             void **out) {
  size_t blob_size = 0;
  for (int i = 0; i < part->n; i++)
    blob_size += (part->nodes[i].args_size + 15) / 16 * 16 +
                 (size_t)part->nodes[i].nwaits * sizeof(int);
  host_graph *g = mgpu__calloc(1, sizeof *g);
  if (g != NULL) {
    g->nodes = mgpu__calloc((size_t)part->n + 1, sizeof *g->nodes);
    g->blob = mgpu__malloc(blob_size + 1);
  }
  if (g == NULL || g->nodes == NULL || g->blob == NULL) {
    if (g != NULL) {
      mgpu__free(g->nodes);
      mgpu__free(g->blob);
    }
    mgpu__free(g);
    return op_nomem(d);
  }
  /* Arguments first (16-byte aligned), then the waits. */
  char *at = g->blob;
  for (int i = 0; i < part->n; i++) {
    g->nodes[i] = part->nodes[i];
    if (part->nodes[i].args_size > 0) {
      memcpy(at, part->nodes[i].args, part->nodes[i].args_size);
      g->nodes[i].args = at;
      at += (part->nodes[i].args_size + 15) / 16 * 16;
    }
  }
  for (int i = 0; i < part->n; i++) {
    size_t bytes = (size_t)part->nodes[i].nwaits * sizeof(int);
    if (bytes > 0) memcpy(at, part->nodes[i].waits, bytes);
    g->nodes[i].waits = (const int *)at;
    at += bytes;
  }
  g->n = part->n;
  g->board = part->board;
  mgpu__graph_board_ref(g->board);
  atomic_init(&g->refs, 1);
  *out = g;
  return 0;
}

static int host_graph_launch(mgpu__bdevice *d, void *graph, mgpu__bstream *s,
                             uint64_t launch) {
  op *o = op_new(OP_GRAPH);
  if (o == NULL) return op_nomem(d);
  host_graph *g = graph;
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  o->u.graph.graph = g;
  o->u.graph.launch = launch;
  enqueue(s, o);
  return 0;
}

static void host_graph_cancel(mgpu__bdevice *d, void *graph,
                              uint64_t launch) {
  (void)d;
  host_graph *g = graph;
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].signal >= 0)
      board_post(g->board, g->nodes[i].signal, 2 * launch + 1);
}

static void host_graph_destroy(mgpu__bdevice *d, void *graph) {
  (void)d;
  graph_unref(graph);
}

static const mgpu__backend_ops host_ops = {
    .name = "host",
    .kind = MGPU_BACKEND_HOST,
    .probe = host_probe,
    .open = host_open,
    .close = host_close,
    .props = host_props,
    .make_current = host_make_current,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_free_detached = host_mem_free_detached,
    .mem_info = host_mem_info,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_synchronize = host_stream_synchronize,
    .stream_query = host_stream_query,
    .stream_native = host_stream_native,
    .stream_claim = host_stream_claim,
    .stream_release = host_stream_release,
    .stream_lock_idle = host_stream_lock_idle,
    .stream_unlock_idle = host_stream_unlock_idle,
    .event_record_claimed = host_event_record_claimed,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_synchronize = host_event_synchronize,
    .event_query = host_event_query,
    .event_elapsed_ms = host_event_elapsed_ms,
    .stream_wait_event = host_stream_wait_event,
    .memcpy_async = host_memcpy_async,
    .memcpy2d_async = host_memcpy2d_async,
    .memset_async = host_memset_async,
    .launch = host_launch,
    .builtin = host_builtin,
    .host_callback = host_callback,
    .peer_can_access = host_peer_can_access,
    .peer_enable = host_peer_enable,
    .peer_disable = host_peer_disable,
    .memcpy_peer_async = host_memcpy_peer_async,
    .ipc_alloc = mgpu__host_ipc_alloc,
    .ipc_free = mgpu__host_ipc_free,
    .ipc_export_fd = mgpu__host_ipc_export_fd,
    .ipc_import = mgpu__host_ipc_import,
    .ipc_protect = mgpu__host_ipc_protect,
    .ipc_unimport = mgpu__host_ipc_unimport,
    .lose = host_lose,
    .lost = host_lost,
    .graph_create = host_graph_create,
    .graph_launch = host_graph_launch,
    .graph_cancel = host_graph_cancel,
    .graph_destroy = host_graph_destroy,
};

const mgpu__backend_ops *mgpu__host_backend(const mgpu__backend_env *e) {
  env = e;
  return &host_ops;
}
