/* Devices: properties, the per-thread current device, and each device's own
 * host thread that runs mgpu_run_on_device work.
 *
 * The host thread makes its device current once (cudaSetDevice on CUDA), so
 * that a user's own CUDA calls inside fn target that device. Work reaches it
 * through a FIFO queue under the device's queue_lock; the thread is its only
 * consumer. A call made from the host thread for its own device runs inline,
 * since queueing it would wait on itself.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "util/numa.h"

struct mgpu__work_item {
  mgpu_device_fn fn;
  void *arg;
  int dev;
  int result;
  _Atomic int done; /* written under the device's queue_lock */
  mgpu__work_item *next;
};

/* What an async handle (a handle of the table, MGPU__H_WORK) names: the
 * work item, freed by mgpu_work_wait. It outlives mgpu_shutdown (which runs
 * every queued item first), so it can still be waited afterwards. */
typedef struct mgpu__work {
  mgpu__work_item item;
  uintptr_t handle;
} mgpu__work;

static _Thread_local int current_device; /* 0 for a new thread, as in CUDA */
static _Thread_local int host_thread_of = -1;

int mgpu__current_host_thread_device(void) { return host_thread_of; }

int mgpu__device_numa_node(mgpu__device *d) {
  /* Host devices are placed, not asked (their backend is still being set
   * up by mgpu_init while their host threads start and call here): device i
   * on node i modulo the node count, which spreads them over the sockets. */
  if (d->ops->kind == MGPU_BACKEND_HOST) return d->id % mgpu__numa_count();
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

static void *host_thread_main(void *arg) {
  mgpu__device *d = arg;
  host_thread_of = d->id;
  current_device = d->id;
  mgpu__trace_name_thread(d->id, "host thread");
  bind_host_thread(d);
  int rc = d->ops->make_current(d->bdev);
  if (rc != 0)
    mgpu__log(MGPU_LOG_WARN, "device %d: host thread could not make its device "
              "current: %s", d->id, mgpu_error_detail());
  mgpu__mutex_lock(&d->queue_lock);
  for (;;) {
    mgpu__work_item *w = d->queue_head;
    if (w == NULL) {
      if (d->stopping) break;
      mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
      continue;
    }
    d->queue_head = w->next;
    if (d->queue_head == NULL) d->queue_tail = NULL;
    mgpu__mutex_unlock(&d->queue_lock);
    current_device = d->id; /* fn may have moved it */
    uint64_t t0 = mgpu__trace_enabled() ? mgpu__now_ns() : 0;
    int result = w->fn(d->id, w->arg);
    if (t0 != 0) mgpu__trace_thread_span("run_on_device", t0, mgpu__now_ns(), NULL, 0);
    mgpu__mutex_lock(&d->queue_lock);
    w->result = result;
    w->done = 1;
    mgpu__cond_broadcast(&d->queue_cond);
  }
  mgpu__mutex_unlock(&d->queue_lock);
  return NULL;
}

int mgpu__device_thread_start(mgpu__device *d) {
  int rc = mgpu__thread_create(&d->host_thread, host_thread_main, d);
  if (rc != 0)
    return mgpu__error(MGPU_ENOMEM, "device %d: cannot start its host thread "
                       "(error %d)", d->id, rc);
  return 0;
}

void mgpu__device_thread_stop(mgpu__device *d) {
  mgpu__mutex_lock(&d->queue_lock);
  d->stopping = 1;
  mgpu__cond_broadcast(&d->queue_cond);
  mgpu__mutex_unlock(&d->queue_lock);
  mgpu__thread_join(d->host_thread);
}

static void queue_push(mgpu__device *d, mgpu__work_item *w) {
  w->next = NULL;
  if (d->queue_tail) d->queue_tail->next = w;
  else d->queue_head = w;
  d->queue_tail = w;
  mgpu__cond_broadcast(&d->queue_cond);
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
    int saved = current_device;
    current_device = dev;
    rc = fn(dev, arg);
    current_device = saved;
    return rc;
  }
  mgpu__work_item w = {.fn = fn, .arg = arg, .dev = dev};
  mgpu__mutex_lock(&d->queue_lock);
  if (d->stopping) {
    mgpu__mutex_unlock(&d->queue_lock);
    return mgpu__error(MGPU_ENOINIT, "device %d: shutting down", dev);
  }
  queue_push(d, &w);
  while (!w.done) mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
  mgpu__mutex_unlock(&d->queue_lock);
  return w.result;
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
  mgpu__work *w = calloc(1, sizeof *w);
  if (w == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory for a work "
                       "item", dev);
  w->item.fn = fn;
  w->item.arg = arg;
  w->item.dev = dev;
  w->handle = mgpu__handle_new(MGPU__H_WORK, w);
  if (w->handle == 0) {
    free(w);
    return mgpu__error(MGPU_ENOMEM, "device %d: no work handles left", dev);
  }
  if (host_thread_of == dev) {
    /* Queued behind itself it could never be waited on from fn: run now. */
    int saved = current_device;
    current_device = dev;
    w->item.result = fn(dev, arg);
    current_device = saved;
    w->item.done = 1;
    *work = (mgpu_work *)w->handle;
    return 0;
  }
  mgpu__mutex_lock(&d->queue_lock);
  if (d->stopping) {
    mgpu__mutex_unlock(&d->queue_lock);
    int err = 0;
    mgpu__handle_release(w->handle, MGPU__H_WORK, "work", &err);
    free(w);
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
static int work_done(mgpu__work *w) {
  if (mgpu__lib_enter("mgpu_work_wait") == 0) {
    mgpu__device *d = mgpu__device_get(w->item.dev);
    mgpu__mutex_lock(&d->queue_lock);
    while (!w->item.done) mgpu__cond_wait(&d->queue_cond, &d->queue_lock);
    mgpu__mutex_unlock(&d->queue_lock);
    mgpu__lib_leave();
  } else {
    /* mgpu_shutdown is under way or done: it runs every queued item before
     * its devices go, so the item is done or about to be. */
    mgpu_error_clear();
    while (!atomic_load_explicit(&w->item.done, memory_order_acquire))
      sched_yield();
  }
  return w->item.result;
}

int mgpu_work_wait(mgpu_work *h) {
  int err = 0;
  mgpu__work *w =
      mgpu__handle_get((uintptr_t)h, MGPU__H_WORK, "mgpu_work_wait", &err);
  if (w == NULL) return err;
  int rc = work_done(w);
  mgpu__handle_put((uintptr_t)h);
  /* Of two waits racing on one handle, one frees it; the other (and any
   * later one) is MGPU_EFREED. */
  if (mgpu__handle_release((uintptr_t)h, MGPU__H_WORK, "mgpu_work_wait",
                           &err) == NULL)
    rc = err;
  else
    free(w);
  return rc;
}

int mgpu_set_device(int dev) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  rc = d->ops->make_current(d->bdev);
  if (rc != 0) return rc;
  current_device = dev;
  return 0;
}

int mgpu_get_device(int *dev) {
  if (dev == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_get_device: NULL output pointer");
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_get_device: mgpu_init has not been "
                       "called");
  *dev = current_device;
  return 0;
}

int mgpu_device_get_props(int dev, mgpu_device_props *p) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
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
  if (d->ops->kind == MGPU_BACKEND_HOST && mgpu__ndevices() > 1)
    p->peer_capable = mgpu__config()->host_peer ? 1 : 0;
  else if (d->ops->kind == MGPU_BACKEND_HOST)
    p->peer_capable = 0;
  return 0;
}
