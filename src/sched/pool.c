/* The task pool: creation and destruction, the worker threads, where a
 * ready task goes under each policy, and how idle workers sleep and wake.
 *
 * Where tasks go (see internal.h for the queues):
 *   static   the worker chosen at submit (smooth weighted round-robin), via
 *            its inbox; nobody moves it
 *   dynamic  the shared ring; a task preferring a device goes to that
 *            device's inbox
 *   ws       from a thread outside the pool: the shared ring, from which an
 *            idle worker takes a small batch into its own deque; from a
 *            worker (a task submitting tasks, or a completion releasing its
 *            dependents): that worker's own deque. Idle workers steal from
 *            the other deques, nearest device first. A task preferring a
 *            device goes to its inbox, then its prefer deque, which thieves
 *            only touch while that device is busy running something else.
 *
 * Idle workers poll for 10 us, then park on a futex. Workers
 * that spin without bound would starve each other and the submitter on a
 * machine with fewer cores than devices. The wake-up is a Dekker handshake:
 * a worker sets its sleeping flag and bumps nsleeping (seq_cst RMWs), then
 * looks for work once more before parking; a submitter publishes its task,
 * then reads nsleeping with an RMW. One of the two sees the other.
 */
#include <sched.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched-internal.h"
#include "util/fault.h"

static _Thread_local mgpu__worker *tls_worker;

mgpu__worker *mgpu__sched_self(mgpu__pool *p) {
  mgpu__worker *w = tls_worker;
  return (w != NULL && w->pool == p) ? w : NULL;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- waking ---- */

/* Wakes w if it is parked (or about to park). Returns 1 if it claimed it. */
static int try_wake(mgpu__pool *p, mgpu__worker *w) {
  int one = 1;
  if (!atomic_compare_exchange_strong_explicit(&w->sleeping, &one, 0,
                                               memory_order_seq_cst,
                                               memory_order_relaxed))
    return 0;
  atomic_fetch_sub_explicit(&p->nsleeping, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&w->wake_seq, 1, memory_order_release);
  mgpu__park_wake(&w->wake_seq, 1);
  return 1;
}

/* The reads of sleeping and nsleeping below are read-modify-writes (adding
 * 0) rather than a fence and a load: an RMW reads the latest value, and if
 * the worker's own RMW comes later it acquires everything this thread
 * published before. That is the Dekker handshake in C11 terms, and
 * ThreadSanitizer, which ignores fences, checks it as written. */
static void notify_worker(mgpu__pool *p, mgpu__worker *w) {
  if (atomic_fetch_add_explicit(&w->sleeping, 0, memory_order_seq_cst))
    try_wake(p, w);
}

/* Wakes one parked worker, if any, to pick up work anyone may run. */
static void notify_any(mgpu__pool *p, mgpu__worker *self) {
  if (atomic_fetch_add_explicit(&p->nsleeping, 0, memory_order_seq_cst) <= 0)
    return;
  int start = self ? self->index + 1 : 0;
  for (int k = 0; k < p->n; k++) {
    mgpu__worker *w = &p->workers[(start + k) % p->n];
    if (atomic_load_explicit(&w->sleeping, memory_order_relaxed) &&
        try_wake(p, w))
      return;
  }
}

/* ---- placing ready tasks ---- */

/* The owner-only FIFO: static tasks (nobody else may run them) and tasks a
 * deque had no memory for. Plain pointers, no atomics needed. */
static void owner_append(mgpu__worker *w, mgpu__task *t) {
  atomic_store_explicit(&t->next, NULL, memory_order_relaxed);
  if (w->pinned_tail)
    atomic_store_explicit(&w->pinned_tail->next, t, memory_order_relaxed);
  else
    w->pinned_head = t;
  w->pinned_tail = t;
}

static void to_inbox(mgpu__pool *p, int i, mgpu__task *t) {
  mgpu__inbox_push(&p->workers[i].inbox, t);
  notify_worker(p, &p->workers[i]);
}

/* ---- lost devices ---- */

int mgpu__worker_lost(const mgpu__worker *w) {
  return mgpu__device_is_lost(w->dev);
}

static int retired(const mgpu__pool *p, int i) {
  return atomic_load_explicit(&p->workers[i].retired, memory_order_seq_cst);
}

/* The first worker after `from` whose device works, or -1. */
static int working_after(const mgpu__pool *p, int from) {
  for (int k = 1; k <= p->n; k++) {
    int i = (from + k) % p->n;
    if (!retired(p, i) && !mgpu__worker_lost(&p->workers[i])) return i;
  }
  return -1;
}

/* A task whose preferred (or, static, placed) worker was retired goes
 * elsewhere: the preference is void, the static placement moves on. The
 * caller holds t (it is in no queue). Returns 0, or -1 when no worker of
 * the pool works any more. */
static int redirect(mgpu__pool *p, mgpu__task *t) {
  if (p->policy == MGPU_SCHED_STATIC) {
    int target = t->home >= 0 ? t->home : t->place;
    if (!retired(p, target)) return 0;
    int i = working_after(p, target);
    if (i < 0) return -1;
    t->home = -1;
    t->place = i;
    return 0;
  }
  if (t->home >= 0 && retired(p, t->home)) t->home = -1;
  return 0;
}

void mgpu__sched_elsewhere(mgpu__pool *p, mgpu__task *t, mgpu__worker *w) {
  if (t->home == w->index) t->home = -1;
  int i = working_after(p, w->index);
  if (i < 0) {
    mgpu__error(MGPU_EDEVLOST, "task pool: device %d was lost and no other "
                "device of the pool works", w->dev);
    mgpu__free(t->detail);
    t->detail = mgpu__strdup(mgpu_error_detail());
    mgpu__task_complete(p, t, MGPU_EDEVLOST, NULL);
    return;
  }
  if (p->policy == MGPU_SCHED_STATIC) t->place = i;
  mgpu__free(t->detail);
  t->detail = NULL;
  mgpu__sched_ready(p, t, NULL);
}

void mgpu__sched_ready(mgpu__pool *p, mgpu__task *t, mgpu__worker *self) {
  if (redirect(p, t) != 0) {
    mgpu__worker *w = &p->workers[t->home >= 0 ? t->home : 0];
    mgpu__sched_elsewhere(p, t, w);
    return;
  }
  if (p->policy == MGPU_SCHED_STATIC) {
    int target = t->home >= 0 ? t->home : t->place;
    if (self != NULL && self->index == target) {
      owner_append(self, t);
      return;
    }
    to_inbox(p, target, t);
    return;
  }
  if (t->home >= 0) {
    if (self != NULL && self->index == t->home &&
        mgpu__deque_push(&self->prefer, t) == 0)
      return;
    to_inbox(p, t->home, t);
    return;
  }
  if (p->policy == MGPU_SCHED_WS && self != NULL &&
      mgpu__deque_push(&self->deque, t) == 0) {
    notify_any(p, self);
    return;
  }
  mgpu__ring_push(&p->shared, t);
  notify_any(p, self);
}

/* ---- finding work ---- */

/* Moves the worker's inbox into its own queues. Returns 1 if it moved any. */
static int drain_inbox(mgpu__pool *p, mgpu__worker *w) {
  mgpu__task *t = mgpu__inbox_take(&w->inbox);
  if (t == NULL) return 0;
  if (p->policy == MGPU_SCHED_STATIC) {
    /* Nobody else may run them: splice the list onto the owner FIFO. */
    if (w->pinned_tail)
      atomic_store_explicit(&w->pinned_tail->next, t, memory_order_relaxed);
    else
      w->pinned_head = t;
    while (atomic_load_explicit(&t->next, memory_order_relaxed) != NULL)
      t = atomic_load_explicit(&t->next, memory_order_relaxed);
    w->pinned_tail = t;
    return 1;
  }
  while (t != NULL) {
    mgpu__task *next = atomic_load_explicit(&t->next, memory_order_relaxed);
    int rc = t->home == w->index ? mgpu__deque_push(&w->prefer, t)
                                 : mgpu__deque_push(&w->deque, t);
    if (rc != 0) owner_append(w, t); /* no memory to grow a deque */
    t = next;
  }
  return 1;
}

/* Work stealing: takes a small batch from the shared ring, so that a burst
 * submitted from outside spreads over the deques where thieves find it. */
static mgpu__task *take_shared(mgpu__pool *p, mgpu__worker *w) {
  mgpu__task *t = mgpu__ring_pop(&p->shared);
  if (t == NULL || p->policy != MGPU_SCHED_WS) return t;
  size_t queued = atomic_load_explicit(&p->shared.enq, memory_order_relaxed) -
                  atomic_load_explicit(&p->shared.deq, memory_order_relaxed);
  size_t batch = queued / (size_t)(2 * p->n);
  if (batch > 15) batch = 15;
  for (size_t i = 0; i < batch; i++) {
    mgpu__task *more = mgpu__ring_pop(&p->shared);
    if (more == NULL) break;
    if (mgpu__deque_push(&w->deque, more) != 0) {
      mgpu__ring_push(&p->shared, more);
      break;
    }
  }
  if (batch > 0) notify_any(p, w);
  return t;
}

/* A device that starts a task with more tasks preferring it queued behind
 * is busy with a backlog that the idle devices may take (last resort in
 * find_task). Nobody else would wake them: a submitter only wakes the
 * preferred device. So whoever takes from a prefer deque that still holds
 * tasks wakes one sleeper, which in turn wakes the next when it steals. */
static void backlog_wake(mgpu__pool *p, mgpu__worker *self, mgpu__worker *v) {
  if (p->n > 1 && mgpu__deque_size(&v->prefer) > 0) notify_any(p, self);
}

/* *stolen: the index of the worker the task was stolen from, or -1. */
static mgpu__task *find_task(mgpu__pool *p, mgpu__worker *w, int *stolen) {
  mgpu__task *t;
  *stolen = -1;
again:
  if ((t = w->pinned_head) != NULL) {
    w->pinned_head = atomic_load_explicit(&t->next, memory_order_relaxed);
    if (w->pinned_head == NULL) w->pinned_tail = NULL;
    return t;
  }
  /* Tasks that prefer this device run in submit order: the owner takes
   * them from the top, as a thief would (static tasks, in the owner FIFO
   * above, too). Under work stealing the owner pops its deque at the
   * bottom, newest first, where what it just produced is still in cache. */
  if ((t = mgpu__deque_steal(&w->prefer)) != NULL) {
    backlog_wake(p, w, w);
    return t;
  }
  if (p->policy == MGPU_SCHED_WS ? (t = mgpu__deque_pop(&w->deque)) != NULL
                                 : (t = mgpu__deque_steal(&w->deque)) != NULL)
    return t;
  if (drain_inbox(p, w)) goto again;
  if (p->policy == MGPU_SCHED_STATIC) return NULL;
  if ((t = take_shared(p, w)) != NULL) return t;
  if (p->policy == MGPU_SCHED_WS) {
    for (int k = 0; k < p->n - 1; k++) {
      mgpu__worker *v = &p->workers[w->victims[k]];
      if (mgpu__deque_size(&v->deque) > 0 &&
          (t = mgpu__deque_steal(&v->deque)) != NULL) {
        *stolen = w->victims[k];
        return t;
      }
    }
  }
  /* Last resort: a task that prefers a device which is busy. */
  for (int k = 0; k < p->n - 1; k++) {
    mgpu__worker *v = &p->workers[w->victims[k]];
    if (atomic_load_explicit(&v->running, memory_order_relaxed) &&
        mgpu__deque_size(&v->prefer) > 0 &&
        (t = mgpu__deque_steal(&v->prefer)) != NULL) {
      *stolen = w->victims[k];
      backlog_wake(p, w, v);
      return t;
    }
  }
  return NULL;
}

/* Whether parking now could strand a task this worker should see. */
static int has_work(mgpu__pool *p, mgpu__worker *w) {
  if (w->pinned_head != NULL || mgpu__deque_size(&w->prefer) > 0 ||
      mgpu__deque_size(&w->deque) > 0 ||
      atomic_load_explicit(&w->inbox, memory_order_seq_cst) != NULL)
    return 1;
  if (p->policy == MGPU_SCHED_STATIC) return 0;
  if (!mgpu__ring_empty(&p->shared)) return 1;
  for (int k = 0; k < p->n - 1; k++) {
    mgpu__worker *v = &p->workers[w->victims[k]];
    if (p->policy == MGPU_SCHED_WS && mgpu__deque_size(&v->deque) > 0)
      return 1;
    /* The last resort of find_task: a busy device's preferred backlog. */
    if (atomic_load_explicit(&v->running, memory_order_relaxed) &&
        mgpu__deque_size(&v->prefer) > 0)
      return 1;
  }
  return 0;
}

/* Parks the worker until woken. */
static void park(mgpu__pool *p, mgpu__worker *w) {
  uint32_t seq = atomic_load_explicit(&w->wake_seq, memory_order_acquire);
  atomic_exchange_explicit(&w->sleeping, 1, memory_order_seq_cst);
  atomic_fetch_add_explicit(&p->nsleeping, 1, memory_order_seq_cst);
  if (!has_work(p, w) &&
      !atomic_load_explicit(&p->stopping, memory_order_seq_cst))
    mgpu__park_wait(&w->wake_seq, seq);
  int one = 1;
  if (atomic_compare_exchange_strong_explicit(&w->sleeping, &one, 0,
                                              memory_order_seq_cst,
                                              memory_order_relaxed))
    atomic_fetch_sub_explicit(&p->nsleeping, 1, memory_order_relaxed);
}

/* How long an idle worker keeps looking before it parks: SPIN_NS of
 * polling, bounded by the clock rather than a count because a pause
 * instruction lasts from a few cycles to over a hundred depending on the
 * CPU, then SPIN_YIELDS yields. Long enough to catch the next task of a
 * burst, short enough not to hold a core the submitter or another device
 * needs. */
#ifndef SPIN_NS
#define SPIN_NS 10000
#endif
#define SPIN_YIELDS 2

/* The worker's device was lost: nothing more runs here. Its queued tasks
 * go to the working devices, and so does whatever lands in its queues
 * afterwards (a submitter that read `retired` just before it was set), so
 * it keeps looking, every millisecond, until the pool stops. */
static void retire(mgpu__pool *p, mgpu__worker *w) {
  atomic_store_explicit(&w->retired, 1, memory_order_seq_cst);
  mgpu__log(MGPU_LOG_WARN, "task pool: device %d was lost; its tasks move to "
            "the other devices", w->dev);
  mgpu__worker_flush(w);
  while (!atomic_load_explicit(&p->stopping, memory_order_acquire)) {
    mgpu__task *t;
    while ((t = w->pinned_head) != NULL) {
      w->pinned_head = atomic_load_explicit(&t->next, memory_order_relaxed);
      if (w->pinned_head == NULL) w->pinned_tail = NULL;
      mgpu__sched_elsewhere(p, t, w);
    }
    while ((t = mgpu__deque_steal(&w->prefer)) != NULL ||
           (t = mgpu__deque_pop(&w->deque)) != NULL)
      mgpu__sched_elsewhere(p, t, w);
    for (t = mgpu__inbox_take(&w->inbox); t != NULL;) {
      mgpu__task *next = atomic_load_explicit(&t->next, memory_order_relaxed);
      mgpu__sched_elsewhere(p, t, w);
      t = next;
    }
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
}

static void *worker_main(void *arg) {
  mgpu__worker *w = arg;
  mgpu__pool *p = w->pool;
  tls_worker = w;
  mgpu__thread_owned_by("a task pool's worker"); /* shutdown would join it */
  mgpu__trace_thread_adopt(w->dev, w->trace_track);
  mgpu__thread_role_set("a task pool worker (a task)");
  if (mgpu_set_device(w->dev) != 0)
    mgpu__log(MGPU_LOG_WARN, "task pool: worker of device %d could not make "
              "it current: %s", w->dev, mgpu_error_detail());
  int idle = 0;
  uint64_t idle_since = 0;
  for (;;) {
    int stolen;
    mgpu__task *t = find_task(p, w, &stolen);
    if (t != NULL && mgpu__worker_lost(w)) {
      mgpu__sched_elsewhere(p, t, w);
      retire(p, w);
      break;
    }
    if (t != NULL) {
      idle = 0;
      w->stolen_from = stolen;
      if (stolen >= 0) {
        if (mgpu__trace_enabled()) w->stolen_ns = mgpu__now_ns();
        atomic_store_explicit(
            &w->tasks_stolen,
            atomic_load_explicit(&w->tasks_stolen, memory_order_relaxed) + 1,
            memory_order_relaxed);
        w->pending_stolen++;
      }
      mgpu__task_run(w, t);
      continue;
    }
    /* Out of work: hand back what was batched before anything else, so
     * that wait_all sees the last completions at once. */
    mgpu__worker_flush(w);
    if (atomic_load_explicit(&p->stopping, memory_order_acquire)) break;
    w->clock_ns = 0; /* idle time is not busy time */
    if (idle == 0) idle_since = mgpu__now_ns();
    if (idle == 0 || mgpu__now_ns() - idle_since < SPIN_NS) {
      idle = 1;
      for (int i = 0; i < 4; i++) cpu_relax();
    } else if (idle <= SPIN_YIELDS) {
      idle++;
      sched_yield();
    } else {
      park(p, w);
      idle = 0;
    }
  }
  tls_worker = NULL;
  return NULL;
}

/* ---- creation and destruction ---- */

/* Victims nearest first; ties keep ring order from the thief. */
static void order_victims(mgpu__pool *p, mgpu__worker *w,
                          const mgpu_pool_opts *o) {
  double dist[MGPU_MAX_DEVICES];
  int m = 0;
  for (int k = 1; k < p->n; k++) {
    int v = (w->index + k) % p->n;
    double d = o->distance ? o->distance(w->dev, p->workers[v].dev,
                                         o->distance_arg)
                           : (double)k;
    int j = m++;
    while (j > 0 && dist[j - 1] > d) {
      dist[j] = dist[j - 1];
      w->victims[j] = w->victims[j - 1];
      j--;
    }
    dist[j] = d;
    w->victims[j] = v;
  }
}

/* Smooth weighted round-robin (as nginx balances upstreams): each step adds
 * every weight to its credit and picks the largest credit, which then pays
 * the total. Shares match the weights and placements interleave. */
static int build_static_table(mgpu__pool *p, const double *weights) {
  double credit[MGPU_MAX_DEVICES] = {0}, w[MGPU_MAX_DEVICES], total = 0;
  for (int i = 0; i < p->n; i++) {
    w[i] = weights ? weights[i] : 1.0;
    total += w[i];
  }
  p->static_len = 64 * p->n;
  p->static_table = mgpu__malloc((size_t)p->static_len * sizeof *p->static_table);
  if (p->static_table == NULL) return MGPU_ENOMEM;
  for (int k = 0; k < p->static_len; k++) {
    int best = 0;
    for (int i = 0; i < p->n; i++) {
      credit[i] += w[i];
      if (credit[i] > credit[best]) best = i;
    }
    credit[best] -= total;
    p->static_table[k] = (uint16_t)best;
  }
  return 0;
}

static int check_opts(const mgpu_pool_opts *o, int ndev) {
  if (o->size < sizeof(mgpu_pool_opts))
    return mgpu__error(MGPU_EINVAL, "task pool: opts.size %zu is not "
                       "sizeof(mgpu_pool_opts)", o->size);
  if (o->policy < MGPU_SCHED_STATIC || o->policy > MGPU_SCHED_WS)
    return mgpu__error(MGPU_EINVAL, "task pool: unknown policy %d", o->policy);
  if (o->on_destroy != MGPU_POOL_WAIT && o->on_destroy != MGPU_POOL_CANCEL)
    return mgpu__error(MGPU_EINVAL, "task pool: unknown on_destroy %d",
                       o->on_destroy);
  int n = o->ndevices ? o->ndevices : ndev;
  if (n < 1 || n > MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "task pool: %d devices asked for (1 .. "
                       "%d)", o->ndevices, MGPU_MAX_DEVICES);
  unsigned char seen[MGPU_MAX_DEVICES] = {0};
  double total = 0;
  for (int i = 0; i < n; i++) {
    int d = o->devices ? o->devices[i] : i;
    if (d < 0 || d >= ndev)
      return mgpu__error(MGPU_ENODEV, "task pool: device %d (entry %d) is "
                         "not open (%d devices)", d, i, ndev);
    if (seen[d]++)
      return mgpu__error(MGPU_EINVAL, "task pool: device %d appears twice", d);
    if (o->weights) {
      if (!(o->weights[i] >= 0))
        return mgpu__error(MGPU_EINVAL, "task pool: weight %d of device %d "
                           "is %g", i, d, o->weights[i]);
      total += o->weights[i];
    }
  }
  if (o->weights && !(total > 0))
    return mgpu__error(MGPU_EINVAL, "task pool: the %d weights sum to %g", n,
                       total);
  return 0;
}

static void pool_free(mgpu__pool *p) {
  for (int i = 0; i < p->n; i++) {
    mgpu__worker *w = &p->workers[i];
    if (w->stream) mgpu_stream_destroy(w->stream);
    mgpu__deque_destroy(&w->deque);
    mgpu__deque_destroy(&w->prefer);
  }
  mgpu__ring_destroy(&p->shared);
  mgpu__task_table_destroy(p);
  mgpu__free(p->static_table);
  mgpu__free(p->workers);
  mgpu__free(p);
}

static void stop_workers(mgpu__pool *p) {
  atomic_store_explicit(&p->stopping, 1, memory_order_seq_cst);
  for (int i = 0; i < p->n; i++) {
    mgpu__worker *w = &p->workers[i];
    atomic_fetch_add_explicit(&w->wake_seq, 1, memory_order_release);
    mgpu__park_wake(&w->wake_seq, 1);
  }
  for (int i = 0; i < p->n; i++)
    if (p->workers[i].started) mgpu__thread_join(p->workers[i].thread);
}

int mgpu__pool_get(mgpu_pool *h, mgpu__pool **out) {
  int err = 0;
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_POOL, "task pool", &err);
  return *out != NULL ? 0 : err;
}

void mgpu__pool_put(mgpu__pool *p) { mgpu__handle_put(p->handle); }

/* Allocates a pool of n workers for the devices of o, with its task
 * table. NULL with the code in *rc when out of memory. */
static mgpu__pool *pool_alloc(const mgpu_pool_opts *o, int n, int *rc) {
  mgpu__pool *p = mgpu__aligned_alloc(64, (sizeof *p + 63) & ~(size_t)63);
  if (p == NULL) {
    *rc = mgpu__error(MGPU_ENOMEM, "task pool: out of memory");
    return NULL;
  }
  memset(p, 0, sizeof *p);
  p->workers = mgpu__aligned_alloc(64, ((size_t)n * sizeof *p->workers + 63) &
                                     ~(size_t)63);
  if (p->workers == NULL) {
    mgpu__free(p);
    *rc = mgpu__error(MGPU_ENOMEM, "task pool: out of memory for %d "
                      "workers", n);
    return NULL;
  }
  memset(p->workers, 0, (size_t)n * sizeof *p->workers);
  p->policy = o->policy;
  p->on_destroy = o->on_destroy;
  p->n = n;
  for (int d = 0; d < MGPU_MAX_DEVICES; d++) p->dev_to_worker[d] = -1;
  for (int i = 0; i < n; i++) {
    p->workers[i].pool = p;
    p->workers[i].index = i;
    p->workers[i].dev = o->devices ? o->devices[i] : i;
    p->dev_to_worker[p->workers[i].dev] = i;
  }
  if ((*rc = mgpu__task_table_init(p)) != 0) {
    mgpu__free(p->workers);
    mgpu__free(p);
    return NULL;
  }
  return p;
}

/* Gives worker w its victims, deques, stream and counters; what it made
 * before a failure is left for pool_free. */
static int worker_init(mgpu__pool *p, mgpu__worker *w,
                       const mgpu_pool_opts *o) {
  int rc;
  order_victims(p, w, o);
  if (mgpu__deque_init(&w->deque, 256) != 0 ||
      mgpu__deque_init(&w->prefer, 16) != 0)
    return mgpu__error(MGPU_ENOMEM, "task pool: no memory for the deques "
                       "of device %d", w->dev);
  if ((rc = mgpu_stream_create(&w->stream, w->dev)) != 0) return rc;
  mgpu__stream *s;
  if ((rc = mgpu__stream_get(w->stream, &s)) != 0) return rc;
  mgpu__device *dev = mgpu__device_get(w->dev);
  w->sync_ops = dev->ops;
  w->sync_dev = dev->bdev;
  w->sync_stream = s->bstream;
  mgpu__stream_put(s); /* the pool owns the stream until it is destroyed */
  w->device_busy = mgpu__metric_counter(w->dev, MGPU__M_busy_ns);
  w->trace_track = mgpu__trace_track_new(w->dev, "pool worker");
  return 0;
}

/* Starts the workers' threads; on failure the caller stops those that
 * started (each marked started). */
static int workers_start(mgpu__pool *p) {
  for (int i = 0; i < p->n; i++) {
    mgpu__worker *w = &p->workers[i];
    int err = mgpu__thread_create(&w->thread, worker_main, w);
    if (err != 0)
      return mgpu__error(MGPU_ENOMEM, "task pool: cannot start the worker "
                         "of device %d (errno %d)", w->dev, err);
    w->started = 1;
  }
  return 0;
}

int mgpu_pool_create(mgpu_pool **out, const mgpu_pool_opts *opts) {
  mgpu_pool_opts defaults = MGPU_POOL_OPTS_INITIALIZER;
  const mgpu_pool_opts *o = opts ? opts : &defaults;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "task pool: out pointer is NULL");
  int ndev = mgpu_device_count();
  if (ndev < 0) return ndev;
  int rc = check_opts(o, ndev);
  if (rc != 0) return rc;
  mgpu__pool *p = pool_alloc(o, o->ndevices ? o->ndevices : ndev, &rc);
  if (p == NULL) return rc;
  /* From here on pool_free undoes whatever was made. */
  if (o->policy != MGPU_SCHED_STATIC &&
      mgpu__ring_init(&p->shared, MGPU__RING_CAP) != 0) {
    rc = mgpu__error(MGPU_ENOMEM, "task pool: no memory for the shared queue");
    goto fail;
  }
  if (build_static_table(p, o->policy == MGPU_SCHED_STATIC ? o->weights
                                                           : NULL) != 0) {
    rc = mgpu__error(MGPU_ENOMEM, "task pool: no memory for placements");
    goto fail;
  }
  for (int i = 0; i < p->n; i++)
    if ((rc = worker_init(p, &p->workers[i], o)) != 0) goto fail;
  if ((rc = workers_start(p)) != 0) goto fail_threads;
  p->handle = mgpu__handle_new(MGPU__H_POOL, p);
  if (p->handle == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "task pool: no handles left");
    goto fail_threads;
  }
  *out = (mgpu_pool *)p->handle;
  return 0;

fail_threads:
  stop_workers(p);
fail:
  pool_free(p);
  return rc;
}

/* Stops and frees a pool whose handle is closed and retired. */
static int pool_stop(mgpu__pool *p, int cancel) {
  if (cancel) atomic_store_explicit(&p->canceling, 1, memory_order_seq_cst);
  mgpu__pool_drain(p); /* what the last calls inside submitted */
  stop_workers(p);
  int rc = mgpu__pool_take_error(p);
  pool_free(p);
  return rc;
}

int mgpu_pool_destroy(mgpu_pool *h) {
  if (h == NULL) return 0;
  mgpu__pool *p;
  int rc = mgpu__pool_get(h, &p);
  if (rc != 0) return rc;
  mgpu__worker *self = mgpu__sched_self(p);
  if (self != NULL) {
    mgpu__pool_put(p);
    return mgpu__error(MGPU_EINVAL, "task pool: destroyed from its own task "
                       "on device %d", self->dev);
  }
  int cancel = p->on_destroy == MGPU_POOL_CANCEL;
  if (cancel) atomic_store_explicit(&p->canceling, 1, memory_order_seq_cst);
  /* The tasks in flight finish (or are canceled) while the handle is still
   * open, so a task may submit more to its own pool. */
  mgpu__pool_drain(p);
  mgpu__pool_put(p);
  /* Then later calls fail, a second destroy is MGPU_EFREED, and the calls
   * inside (a wait, a submit from another thread) are waited for. */
  int err = 0;
  if (mgpu__handle_close((uintptr_t)h, MGPU__H_POOL, "task pool", &err) ==
      NULL)
    return err;
  mgpu__handle_retire((uintptr_t)h);
  return pool_stop(p, cancel);
}

/* Shutdown: a pool still open is canceled and freed; its handle is then
 * MGPU_EFREED, also after a new mgpu_init. */
static void shutdown_pool(void *obj, void *arg) {
  (void)arg;
  mgpu__pool *p = obj;
  mgpu__handle_retire(p->handle);
  pool_stop(p, 1);
}

static void pools_shutdown(void) {
  mgpu__handle_foreach(MGPU__H_POOL, shutdown_pool, NULL);
}
MGPU__ON_SHUTDOWN(pools_shutdown, MGPU__LAYER_WORK)

/* ---- statistics ---- */

static int stats_get(mgpu__pool *p, mgpu_pool_stats *out);

int mgpu_pool_stats_get(mgpu_pool *h, mgpu_pool_stats *out) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(h, &p);
  if (rc != 0) return rc;
  rc = stats_get(p, out);
  mgpu__pool_put(p);
  return rc;
}

static int stats_get(mgpu__pool *p, mgpu_pool_stats *out) {
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "task pool: stats is NULL");
  if (out->size < sizeof *out)
    return mgpu__error(MGPU_EINVAL, "task pool: stats.size %zu is not "
                       "sizeof(mgpu_pool_stats)", out->size);
  out->ndevices = p->n;
  uint64_t busy[MGPU_MAX_DEVICES];
  for (int i = 0; i < p->n; i++) {
    mgpu__worker *w = &p->workers[i];
    mgpu_pool_dev_stats *s = &out->dev[i];
    s->device = w->dev;
    s->tasks_run = atomic_load_explicit(&w->tasks_run, memory_order_relaxed);
    s->tasks_stolen =
        atomic_load_explicit(&w->tasks_stolen, memory_order_relaxed);
    s->tasks_failed =
        atomic_load_explicit(&w->tasks_failed, memory_order_relaxed);
    s->busy_ns = atomic_load_explicit(&w->busy_ns, memory_order_relaxed);
    busy[i] = s->busy_ns;
  }
  out->load_imbalance = mgpu__load_imbalance(busy, p->n);
  return 0;
}

int mgpu_pool_stats_reset(mgpu_pool *h) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(h, &p);
  if (rc != 0) return rc;
  for (int i = 0; i < p->n; i++) {
    mgpu__worker *w = &p->workers[i];
    atomic_store_explicit(&w->tasks_run, 0, memory_order_relaxed);
    atomic_store_explicit(&w->tasks_stolen, 0, memory_order_relaxed);
    atomic_store_explicit(&w->tasks_failed, 0, memory_order_relaxed);
    atomic_store_explicit(&w->busy_ns, 0, memory_order_relaxed);
  }
  mgpu__pool_put(p);
  return 0;
}
