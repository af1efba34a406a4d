/* Devices: properties, the per-thread current device, and each device's own
 * host thread that runs mgpu_run_on_device work.
 *
 * The host thread makes its device current once (cudaSetDevice on CUDA), so
 * that a user's own CUDA calls inside fn target that device. Work reaches it
 * through a FIFO queue under the device's queue_lock; the thread is its only
 * consumer. A call made from the host thread for its own device runs inline,
 * since queueing it would wait on itself.
 *
 * A call from a thread that is no host thread, while the queue is empty,
 * goes through the device's fast lane instead (internal.h: a request line
 * written by the caller, an answer line written by the host thread, no
 * lock). Both sides spin before they park (mgpu__spin_pair_until for the
 * lane and the host thread's idle watch, mgpu__spin_wait for queued
 * items): the host thread watches for the next call for a while after each
 * one, and the caller watches for its result, so a round trip between two
 * running threads costs cache-line transfers, not two wake-ups; each side
 * parks on queue_cond when its adaptive budget runs out.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "util/numa.h"
#include "util/fault.h"

#define LANE_DETAIL 512 /* bytes of a failure's detail handed back */

struct mgpu__work_item {
  mgpu_device_fn fn;
  void *arg;
  int dev;
  int result;
  /* Set (release) by the host thread once result is written; the caller
   * may see it without the lock and return, so the host thread touches the
   * item no more after setting it (but to free an abandoned one). */
  _Atomic int done;
  int waiter;       /* the device whose host thread waits for it, or -1
                       (queue_lock) */
  char detail[LANE_DETAIL]; /* the host thread's error detail when fn
                               failed */
  int abandoned;    /* an async item whose wait was refused: the host thread
                       frees it once run (queue_lock) */
  mgpu__work_item *next;
};

/* What an async handle (a handle of the table, MGPU__H_WORK) names: the
 * work item, freed by mgpu_work_wait. It outlives mgpu_shutdown (which runs
 * every queued item first), so it can still be waited afterwards. */
typedef struct mgpu__work {
  mgpu__work_item item;
  uintptr_t handle;
} mgpu__work;

/* The calling thread's current device, valid for the mgpu_init numbered
 * current_epoch: a device chosen before a shutdown names nothing after the
 * next init (which may open fewer devices), so a thread starts again from
 * device 0 then, as a new thread does (as in CUDA). */
static _Thread_local int current_device;
static _Thread_local unsigned current_epoch;

static void set_current(int dev) {
  current_device = dev;
  current_epoch = mgpu__init_epoch();
}

static int get_current(void) {
  if (current_epoch != mgpu__init_epoch()) set_current(0);
  return current_device;
}
static _Thread_local int host_thread_of = -1;

int mgpu__current_host_thread_device(void) { return host_thread_of; }

int mgpu__device_numa_node(mgpu__device *d) {
  /* Host devices are placed, not asked (their backend is still being set
   * up by mgpu_init while their host threads start and call here): device i
   * on node i modulo the node count, which spreads them over the sockets. */
  if (d->ops->caps.mem_model == MGPU__MEM_MODEL_HOST)
    return d->id % mgpu__numa_count();
  mgpu_device_props p;
  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.numa_node = -1;
  if (d->ops->props(d->bdev, &p) != 0) {
    mgpu_error_clear(); /* an unknown node is an answer, not an error */
    return -1;
  }
  if (p.numa_node >= 0) return p.numa_node;
  if (p.pci_bus_id[0] != '\0') return mgpu__numa_node_of_bus_id(p.pci_bus_id);
  return -1;
}

/* Pins the calling host thread near its device (hwloc only), so that what
 * it allocates and touches lives near the device. */
static void bind_host_thread(mgpu__device *d) {
  int node = mgpu__device_numa_node(d);
  if (mgpu__numa_bind_thread(node) == 0)
    mgpu__log(MGPU_LOG_DEBUG, "device %d: host thread bound to NUMA node %d",
              d->id, node);
}

/* Owners of the fast lane (internal.h, mgpu__device.lane). */
enum { LANE_FREE, LANE_TAKEN, LANE_CLOSED };

/* Whether a request waits in the lane (read by the host thread). */
static int lane_posted(const mgpu__device *d) {
  return atomic_load_explicit(&d->req.posted, memory_order_acquire) !=
         atomic_load_explicit(&d->ans.done, memory_order_relaxed);
}

/* Runs fn on the host thread of d; the detail of a failure goes to
 * detail. */
static int run_here(mgpu__device *d, mgpu_device_fn fn, void *arg,
                    char *detail, size_t size) {
  set_current(d->id); /* fn may have moved it */
  uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
  mgpu_error_clear();
  int result = fn(d->id, arg);
  /* The failure's detail was written on this thread: hand it over; a
   * function that failed without one gets one (else the caller's thread
   * kept the detail of its own last failure, about something else). */
  if (result < 0 && mgpu_error_detail()[0] != '\0')
    snprintf(detail, size, "%s", mgpu_error_detail());
  else if (result < 0)
    snprintf(detail, size, "device %d: the function returned %s without a "
             "detail", d->id, mgpu_err_name(result));
  if (t0 != 0) mgpu__trace_thread_span("run_on_device", t0, mgpu__now_ns(), NULL, 0);
  return result;
}

/* Wakes whoever sleeps on d's queue_cond (the other side of the lane). */
static void wake_sleepers(mgpu__device *d) {
  mgpu__mutex_lock(&d->queue_lock);
  mgpu__cond_broadcast(&d->queue_cond);
  mgpu__mutex_unlock(&d->queue_lock);
}

/* The host thread runs the lane's posted function and hands the result
 * back; returns whether the caller was awake (spinning) then, so likely
 * to call again soon. */
static int lane_serve(mgpu__device *d) {
  unsigned seq = atomic_load_explicit(&d->req.posted, memory_order_acquire);
  d->ans.result = run_here(d, d->req.fn, d->req.arg, d->req.detail,
                           LANE_DETAIL);
  atomic_store_explicit(&d->ans.host_cpu, mgpu__cpu_now(),
                        memory_order_relaxed);
  /* The store before the load, as the caller's park stores caller_parked
   * before it loads done: one of the two sees the other. */
  atomic_store(&d->ans.done, seq);
  if (!atomic_load(&d->req.caller_parked)) return 1;
  wake_sleepers(d);
  return 0;
}

/* After an answer on the caller's own CPU (the two hand off by yielding it
 * to each other, 1.4 us a round trip on the 2-core machine against 0.3-0.5
 * us on two CPUs): the host thread moves to another of its CPUs, the first
 * time and then once in 64 such answers, since the scheduler would leave
 * the pair there for milliseconds (docs/coll.md). */
static void leave_caller_cpu(mgpu__device *d, unsigned *shared) {
  int cpu = atomic_load_explicit(&d->req.caller_cpu, memory_order_relaxed);
  if (cpu < 0 || cpu != atomic_load_explicit(&d->ans.host_cpu,
                                             memory_order_relaxed))
    return;
  if ((*shared)++ % 64 == 0) mgpu__thread_leave_cpu(cpu);
}

/* What the idle host thread watches for: queued work or a posted lane. */
static int work_ready(const void *p) {
  const mgpu__device *d = p;
  return atomic_load_explicit(&d->queue_ready, memory_order_acquire) ||
         lane_posted(d);
}

/* Runs the first queued work item and hands its result to its waiter.
 * Returns 1 when the thread must end (stopping, nothing left to run and
 * the lane closed), else 0. */
static int queue_serve(mgpu__device *d) {
  mgpu__mutex_lock(&d->queue_lock);
  mgpu__work_item *w = d->queue_head;
  if (w == NULL) { /* stopping, and nothing left to run */
    /* Closed only when free: a caller that took it is served first. */
    int expect = LANE_FREE;
    int closed = atomic_compare_exchange_strong(&d->lane.owner, &expect,
                                                LANE_CLOSED);
    mgpu__mutex_unlock(&d->queue_lock);
    return closed;
  }
  d->queue_head = w->next;
  if (d->queue_head == NULL) {
    d->queue_tail = NULL;
    if (!d->stopping)
      atomic_store_explicit(&d->queue_ready, 0, memory_order_relaxed);
  }
  mgpu__mutex_unlock(&d->queue_lock);
  int result = run_here(d, w->fn, w->arg, w->detail, sizeof w->detail);
  mgpu__mutex_lock(&d->queue_lock);
  w->result = result;
  /* The waiter no longer waits for this device: clear its mark before
   * it wakes, so a later call of this device for it is not taken for a
   * cycle. */
  mgpu__device *waiter =
      w->waiter >= 0 ? mgpu__device_get(w->waiter) : NULL;
  if (waiter != NULL) atomic_store(&waiter->waits_for, -1);
  int abandoned = w->abandoned;
  atomic_store_explicit(&w->done, 1, memory_order_release);
  mgpu__cond_broadcast(&d->queue_cond);
  if (abandoned) mgpu__free(w); /* its mgpu_work, whose first member */
  mgpu__mutex_unlock(&d->queue_lock);
  return 0;
}

/* The idle host thread: watches for work (a while longer when the last
 * lane caller was awake), then sleeps on queue_cond if none came. */
static void host_idle(mgpu__device *d, int caller_awake) {
  uint64_t since;
  int seen = mgpu__spin_pair_until(&d->host_spin, work_ready, d,
                                   &d->req.caller_cpu, caller_awake, &since);
  if (seen) return;
  mgpu__mutex_lock(&d->queue_lock);
  /* The store before the load of the lane, as its caller posts before it
   * loads host_parked: one of the two sees the other. queue_ready is
   * written under the lock. */
  atomic_store(&d->ans.host_parked, 1);
  if (!atomic_load_explicit(&d->queue_ready, memory_order_relaxed) &&
      atomic_load(&d->req.posted) == atomic_load(&d->ans.done)) {
    mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
    atomic_store_explicit(&d->ans.host_parked, 0, memory_order_relaxed);
    mgpu__mutex_unlock(&d->queue_lock);
    mgpu__spin_pair_woke(&d->host_spin, since);
    return;
  }
  atomic_store_explicit(&d->ans.host_parked, 0, memory_order_relaxed);
  mgpu__mutex_unlock(&d->queue_lock);
}

static void *host_thread_main(void *arg) {
  mgpu__device *d = arg;
  host_thread_of = d->id;
  set_current(d->id);
  mgpu__thread_role_set("a device's host thread (a function run by "
                        "mgpu_run_on_device)");
  mgpu__trace_name_thread(d->id, "host thread");
  bind_host_thread(d);
  int rc = d->ops->make_current(d->bdev);
  if (rc != 0)
    mgpu__log(MGPU_LOG_WARN, "device %d: host thread could not make its device "
              "current: %s", d->id, mgpu_error_detail());
  int caller_awake = 0; /* the last lane caller was awake when answered */
  unsigned shared = 0;  /* answers given on the caller's CPU */
  /* queue_lock is taken for the queue only: the lane needs none. */
  for (;;) {
    if (lane_posted(d)) {
      caller_awake = lane_serve(d);
      leave_caller_cpu(d, &shared);
    } else if (atomic_load_explicit(&d->queue_ready, memory_order_acquire)) {
      if (queue_serve(d)) break;
    } else {
      host_idle(d, caller_awake);
      caller_awake = 0;
    }
  }
  return NULL;
}

int mgpu__device_thread_start(mgpu__device *d) {
  atomic_store(&d->waits_for, -1);
  atomic_store(&d->lane.owner, LANE_FREE);
  atomic_store(&d->req.posted, 0);
  atomic_store(&d->ans.done, 0);
  atomic_store(&d->ans.host_cpu, -1);
  atomic_store(&d->req.caller_cpu, -1);
  int rc = mgpu__thread_create(&d->host_thread, host_thread_main, d);
  if (rc != 0)
    return mgpu__error(MGPU_ENOMEM, "device %d: cannot start its host thread "
                       "(error %d)", d->id, rc);
  return 0;
}

void mgpu__device_thread_stop(mgpu__device *d) {
  mgpu__mutex_lock(&d->queue_lock);
  d->stopping = 1;
  atomic_store_explicit(&d->queue_ready, 1, memory_order_release);
  mgpu__cond_broadcast(&d->queue_cond);
  mgpu__mutex_unlock(&d->queue_lock);
  mgpu__thread_join(d->host_thread);
}

static void queue_push(mgpu__device *d, mgpu__work_item *w) {
  w->next = NULL;
  if (d->queue_tail) d->queue_tail->next = w;
  else d->queue_head = w;
  d->queue_tail = w;
  atomic_store_explicit(&d->queue_ready, 1, memory_order_release);
  mgpu__cond_broadcast(&d->queue_cond);
}

/* Called by the host thread of a device (self) before it waits for w on
 * device d (d->queue_lock held): marks the wait, then follows the chain of
 * host threads waiting for each other from d. Reaching self again means
 * the wait would never end: the mark is withdrawn and the call fails with
 * MGPU_EDEADLK naming the cycle. The mark is a sequentially consistent
 * store before the loads of the others' marks, so of two threads closing
 * one cycle at once at least one sees the other. */
static int wait_mark(mgpu__device *d, mgpu__work_item *w) {
  w->waiter = host_thread_of;
  if (host_thread_of < 0) return 0;
  mgpu__device *self = mgpu__device_get(host_thread_of);
  atomic_store(&self->waits_for, d->id);
  char chain[256];
  int len = snprintf(chain, sizeof chain, "%d -> %d", self->id, d->id);
  int cur = d->id;
  for (int steps = 0; steps < MGPU_MAX_DEVICES; steps++) {
    mgpu__device *c = mgpu__device_get(cur);
    cur = c != NULL ? atomic_load(&c->waits_for) : -1;
    if (cur < 0) return 0;
    if (len > 0 && (size_t)len < sizeof chain)
      len += snprintf(chain + len, sizeof chain - (size_t)len, " -> %d", cur);
    if (cur == self->id) {
      atomic_store(&self->waits_for, -1);
      w->waiter = -1;
      return mgpu__error(MGPU_EDEADLK, "device %d: its host thread would wait "
                         "for device %d's, closing a cycle of host threads "
                         "waiting for each other (%s): mgpu_run_on_device "
                         "calls in a cycle never end", self->id, d->id,
                         chain);
    }
  }
  return 0;
}

/* The wait of the host thread for w ended (w is done: the host thread
 * touches it no more, so no lock is needed). */
static void wait_unmark(mgpu__work_item *w) {
  mgpu__device *self = w->waiter >= 0 ? mgpu__device_get(w->waiter) : NULL;
  if (self != NULL) atomic_store(&self->waits_for, -1);
  w->waiter = -1;
}

/* The result of a finished item, with its detail on the calling thread. */
static int hand_over(const mgpu__work_item *w) {
  if (w->result < 0 && w->detail[0] != '\0')
    mgpu__error(w->result, "%s", w->detail);
  return w->result;
}

/* Waits for w's result: spins, then parks on queue_cond. */
static void wait_done(mgpu__device *d, mgpu__work_item *w) {
  if (mgpu__spin_wait(&d->caller_spin, &w->done)) return;
  mgpu__mutex_lock(&d->queue_lock);
  while (!atomic_load_explicit(&w->done, memory_order_acquire))
    mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
  mgpu__mutex_unlock(&d->queue_lock);
}

typedef struct lane_wait {
  const mgpu__device *d;
  unsigned seq;
} lane_wait;

static int lane_answered(const void *p) {
  const lane_wait *w = p;
  return atomic_load_explicit(&w->d->ans.done, memory_order_acquire) ==
         w->seq;
}

/* The fast lane: runs fn on d's host thread through d's lane when the queue
 * is empty (what was queued before runs first) and no other caller holds
 * the lane; returns 0 (nothing done) otherwise. Only a thread that is no
 * host thread takes it: it waits for nobody, so it needs no cycle mark. No
 * lock, no allocation, no signal while the host thread is awake: a round
 * trip moves the request line to the host thread and the answer line
 * back. */
static int lane_run(mgpu__device *d, mgpu_device_fn fn, void *arg, int *rc) {
  if (atomic_load_explicit(&d->queue_ready, memory_order_acquire)) return 0;
  int expect = LANE_FREE;
  if (!atomic_compare_exchange_strong_explicit(&d->lane.owner, &expect,
                                               LANE_TAKEN,
                                               memory_order_acquire,
                                               memory_order_relaxed))
    return 0; /* taken, or the host thread stopped: the queue says which */
  char detail[LANE_DETAIL];
  detail[0] = '\0';
  d->req.fn = fn;
  d->req.arg = arg;
  d->req.detail = detail;
  atomic_store_explicit(&d->req.caller_cpu, mgpu__cpu_now(),
                        memory_order_relaxed);
  lane_wait w = {d, atomic_load_explicit(&d->req.posted,
                                         memory_order_relaxed) + 1};
  /* Posted before the load of host_parked, as the host thread stores it
   * before it loads posted when it parks. */
  atomic_store(&d->req.posted, w.seq);
  int host_awake = !atomic_load(&d->ans.host_parked);
  if (!host_awake) wake_sleepers(d);
  uint64_t since;
  if (!mgpu__spin_pair_until(&d->lane.spin, lane_answered, &w,
                             &d->ans.host_cpu, host_awake, &since)) {
    mgpu__mutex_lock(&d->queue_lock);
    atomic_store(&d->req.caller_parked, 1);
    while (atomic_load(&d->ans.done) != w.seq)
      mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
    atomic_store_explicit(&d->req.caller_parked, 0, memory_order_relaxed);
    mgpu__mutex_unlock(&d->queue_lock);
    mgpu__spin_pair_woke(&d->lane.spin, since);
  }
  int result = d->ans.result;
  atomic_store_explicit(&d->lane.owner, LANE_FREE, memory_order_release);
  if (result < 0 && detail[0] != '\0') mgpu__error(result, "%s", detail);
  *rc = result;
  return 1;
}

static int check_fn(int dev, mgpu_device_fn fn) {
  if (fn == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL function to run", dev);
  return 0;
}

static int run_on_device_in(int dev, mgpu_device_fn fn, void *arg) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc == 0) rc = check_fn(dev, fn);
  if (rc != 0) return rc;
  if (host_thread_of == dev) {
    int saved = get_current();
    set_current(dev);
    rc = fn(dev, arg);
    set_current(saved);
    return rc;
  }
  mgpu__flight_record(dev, "run_on_device", 0, 0);
  if (host_thread_of < 0 && lane_run(d, fn, arg, &rc)) return rc;
  mgpu__work_item w = {.fn = fn, .arg = arg, .dev = dev, .waiter = -1};
  mgpu__mutex_lock(&d->queue_lock);
  if (d->stopping) {
    mgpu__mutex_unlock(&d->queue_lock);
    return mgpu__error(MGPU_ENOINIT, "device %d: shutting down", dev);
  }
  rc = wait_mark(d, &w);
  if (rc != 0) {
    mgpu__mutex_unlock(&d->queue_lock);
    return rc;
  }
  queue_push(d, &w);
  mgpu__mutex_unlock(&d->queue_lock);
  wait_done(d, &w);
  wait_unmark(&w);
  return hand_over(&w);
}

int mgpu_run_on_device(int dev, mgpu_device_fn fn, void *arg) {
  int rc = mgpu__lib_enter("mgpu_run_on_device");
  if (rc != 0) return rc;
  rc = run_on_device_in(dev, fn, arg);
  mgpu__lib_leave();
  return rc;
}

static int run_async(int dev, mgpu_device_fn fn, void *arg,
                     mgpu_work **work) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc == 0) rc = check_fn(dev, fn);
  if (rc == 0 && work == NULL)
    rc = mgpu__error(MGPU_EINVAL, "device %d: NULL work handle pointer", dev);
  if (rc != 0) return rc;
  mgpu__work *w = mgpu__calloc(1, sizeof *w);
  if (w == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a work "
                       "item", dev);
  w->item.fn = fn;
  w->item.arg = arg;
  w->item.dev = dev;
  w->item.waiter = -1;
  w->handle = mgpu__handle_new(MGPU__H_WORK, w);
  if (w->handle == 0) {
    mgpu__free(w);
    return mgpu__error(MGPU_ENOMEM, "device %d: no work handles left", dev);
  }
  if (host_thread_of == dev) {
    /* Queued behind itself it could never be waited on from fn: run now. */
    int saved = get_current();
    set_current(dev);
    w->item.result = fn(dev, arg);
    set_current(saved);
    atomic_store_explicit(&w->item.done, 1, memory_order_relaxed);
    *work = (mgpu_work *)w->handle;
    return 0;
  }
  mgpu__mutex_lock(&d->queue_lock);
  if (d->stopping) {
    mgpu__mutex_unlock(&d->queue_lock);
    int err = 0;
    mgpu__handle_release(w->handle, MGPU__H_WORK, "work", &err);
    mgpu__free(w);
    return mgpu__error(MGPU_ENOINIT, "device %d: shutting down", dev);
  }
  queue_push(d, &w->item);
  mgpu__mutex_unlock(&d->queue_lock);
  *work = (mgpu_work *)w->handle;
  return 0;
}

int mgpu_run_on_device_async(int dev, mgpu_device_fn fn, void *arg,
                             mgpu_work **work) {
  int rc = mgpu__lib_enter("mgpu_run_on_device_async");
  if (rc != 0) return rc;
  rc = run_async(dev, fn, arg, work);
  mgpu__lib_leave();
  return rc;
}

/* Waits for a work item's function (the caller holds its handle). */
static int work_done(mgpu__work *w, int *refused) {
  if (mgpu__lib_enter("mgpu_work_wait") == 0) {
    mgpu__device *d = mgpu__device_get(w->item.dev);
    mgpu__mutex_lock(&d->queue_lock);
    if (!w->item.done) {
      int rc = wait_mark(d, &w->item);
      if (rc != 0) {
        /* Refused: mgpu_work_wait spends the handle all the same, and the
         * work still runs (see abandon). */
        mgpu__mutex_unlock(&d->queue_lock);
        mgpu__lib_leave();
        *refused = 1;
        return rc;
      }
    }
    mgpu__mutex_unlock(&d->queue_lock);
    wait_done(d, &w->item);
    wait_unmark(&w->item);
    mgpu__lib_leave();
  } else {
    /* mgpu_shutdown is under way or done: it runs every queued item before
     * its devices go, so the item is done or about to be. */
    mgpu_error_clear();
    while (!atomic_load_explicit(&w->item.done, memory_order_acquire))
      sched_yield();
  }
  return hand_over(&w->item);
}

/* A work item whose wait was refused: freed now if it already ran, else by
 * the host thread once it has. */
static void abandon(mgpu__work *w) {
  mgpu__device *d = mgpu__device_get(w->item.dev);
  int done = 1;
  if (d != NULL) {
    mgpu__mutex_lock(&d->queue_lock);
    done = w->item.done;
    if (!done) w->item.abandoned = 1;
    mgpu__mutex_unlock(&d->queue_lock);
  }
  if (done) mgpu__free(w);
}

int mgpu_work_wait(mgpu_work *h) {
  int err = 0;
  mgpu__work *w =
      mgpu__handle_get((uintptr_t)h, MGPU__H_WORK, "mgpu_work_wait", &err);
  if (w == NULL) return err;
  int refused = 0;
  int rc = work_done(w, &refused);
  mgpu__handle_put((uintptr_t)h);
  /* Of two waits racing on one handle, one frees it; the other (and any
   * later one) is MGPU_EFREED. */
  if (mgpu__handle_release((uintptr_t)h, MGPU__H_WORK, "mgpu_work_wait",
                           &err) == NULL)
    rc = err;
  else if (refused)
    abandon(w);
  else
    mgpu__free(w);
  return rc;
}

int mgpu_device_status(int dev, mgpu_device_state *state) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (state == NULL)
    return mgpu__error(MGPU_EINVAL, "device %d: NULL state pointer", dev);
  *state = d->ops->loss != NULL && d->ops->loss->lost(d->bdev, NULL, 0)
               ? MGPU_DEVICE_LOST
               : MGPU_DEVICE_OK;
  return 0;
}

int mgpu__device_is_lost(int dev) {
  mgpu__device *d = mgpu__device_get(dev);
  return d != NULL && d->ops->loss != NULL &&
         d->ops->loss->lost(d->bdev, NULL, 0);
}

int mgpu__device_lose(int dev, const char *why) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (d->ops->loss == NULL)
    return mgpu__error(MGPU_ENOTSUP, "device %d: its %s backend cannot lose "
                       "a device on request", dev, d->ops->name);
  d->ops->loss->lose(d->bdev, why);
  mgpu__device_lost_seen(dev);
  return 0;
}

/* Hooks of the layers below the core that wait for devices
 * (mgpu__on_device_lost), kept sorted by layer, the highest first (the
 * order they run in). Registered from constructors, before any thread can
 * run them; read-only afterwards. */
#define MAX_LOST_HOOKS 8
static mgpu__lost_hook_fn lost_hooks[MAX_LOST_HOOKS];
static mgpu__layer lost_layers[MAX_LOST_HOOKS];
static int nlost_hooks;

void mgpu__on_device_lost(mgpu__lost_hook_fn fn, mgpu__layer layer) {
  for (int i = 0; i < nlost_hooks; i++)
    if (lost_hooks[i] == fn) return;
  if (nlost_hooks == MAX_LOST_HOOKS) abort(); /* a bug in mgpu, at load */
  int at = nlost_hooks; /* after every hook of this layer or a higher one */
  while (at > 0 && lost_layers[at - 1] > layer) at--;
  for (int i = nlost_hooks; i > at; i--) {
    lost_hooks[i] = lost_hooks[i - 1];
    lost_layers[i] = lost_layers[i - 1];
  }
  lost_hooks[at] = fn;
  lost_layers[at] = layer;
  nlost_hooks++;
}

void mgpu__device_lost_seen(int dev) {
  mgpu__device *d = mgpu__device_get(dev);
  if (d == NULL || atomic_exchange(&d->lost_seen, 1)) return;
  for (int i = 0; i < nlost_hooks; i++) lost_hooks[i](dev);
}

int mgpu_set_device(int dev) {
  mgpu__device *d;
  int rc = mgpu__device_enter(dev, &d); /* shutdown waits for it */
  if (rc != 0) return rc;
  rc = d->ops->make_current(d->bdev);
  if (rc == 0) set_current(dev);
  mgpu__lib_leave();
  return rc;
}

int mgpu_get_device(int *dev) {
  if (dev == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_get_device: NULL output pointer");
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_get_device: mgpu_init has not been "
                       "called");
  *dev = get_current();
  return 0;
}

static int get_props(mgpu__device *d, int dev, mgpu_device_props *p);

int mgpu_device_get_props(int dev, mgpu_device_props *p) {
  mgpu__device *d;
  int rc = mgpu__device_enter(dev, &d); /* shutdown waits for it */
  if (rc != 0) return rc;
  rc = get_props(d, dev, p);
  mgpu__lib_leave();
  return rc;
}

static int get_props(mgpu__device *d, int dev, mgpu_device_props *p) {
  int rc;
  if (p == NULL || p->size != sizeof *p)
    return mgpu__error(MGPU_EINVAL, "device %d: props is NULL or its size "
                       "field is not sizeof(mgpu_device_props)", dev);
  memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  snprintf(p->backend, sizeof p->backend, "%s", d->ops->name);
  p->backend_kind = d->ops->kind;
  p->ordinal = d->spec.ordinal;
  p->split_index = d->spec.split_index;
  p->split_count = d->spec.split_count;
  rc = d->ops->props(d->bdev, p);
  if (rc != 0) return rc;
  size_t in_use = (size_t)d->mem_in_use;
  if (d->budget != 0) {
    p->total_mem = d->budget;
    p->free_mem = in_use < d->budget ? d->budget - in_use : 0;
  } else {
    size_t free_b = 0, total_b = 0;
    rc = d->ops->mem_info(d->bdev, &free_b, &total_b);
    if (rc != 0) return rc;
    p->total_mem = total_b;
    p->free_mem = free_b;
  }
  if (d->ops->caps.mem_model == MGPU__MEM_MODEL_HOST)
    p->peer_capable = mgpu__ndevices() > 1 && mgpu__config()->host_peer;
  /* The node the topology reports (mgpu__device_numa_node): where a host
   * device is placed, or the node of a GPU's PCI bus. */
  if (p->numa_node < 0 && d->ops->caps.mem_model == MGPU__MEM_MODEL_HOST)
    p->numa_node = mgpu__device_numa_node(d);
  else if (p->numa_node < 0 && p->pci_bus_id[0] != '\0')
    p->numa_node = mgpu__numa_node_of_bus_id(p->pci_bus_id);
  return 0;
}
