/* The host backend's devices: opening one starts its workers, closing it
 * joins them; a device can be lost (by MGPU_FAULT or the core), after
 * which its work is skipped. */
#include <stdatomic.h>
#include <stdio.h>

#include "backend/host/host-internal.h"
#include "backend/ipc.h"
#include "mgpu/error.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/thread.h"

int mgpu__host_probe(int *count) {
  *count = MGPU_MAX_DEVICES;
  return 0;
}

void mgpu__host_close(mgpu__bdevice *d) {
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

int mgpu__host_open(const mgpu__device_spec *spec, mgpu__bdevice **out) {
  mgpu__bdevice *d = mgpu__calloc(1, sizeof *d);
  if (d == NULL) goto fail_nomem;
  d->id = spec->id;
  d->workers = mgpu__calloc((size_t)mgpu__host_env->config->host_workers,
                            sizeof *d->workers);
  if (d->workers == NULL) goto fail_free;
  mgpu__mutex_init(&d->lock, MGPU__LOCK_HOST_DEVICE);
  mgpu__cond_init(&d->work);
  mgpu__cond_init(&d->idle);
  for (int i = 0; i < mgpu__host_env->config->host_workers; i++) {
    int rc = mgpu__thread_create(&d->workers[i], mgpu__host_worker_main, d);
    if (rc != 0) {
      mgpu__host_close(d); /* joins the workers started so far */
      return mgpu__error(MGPU_ENOMEM, "host device %d: cannot start worker "
                         "thread %d: error %d", spec->id, i, rc);
    }
    d->nworkers++;
  }
  *out = d;
  return 0;
fail_free:
  mgpu__free(d);
fail_nomem:
  return mgpu__error(MGPU_ENOMEM, "host device %d: out of host memory",
                     spec->id);
}

int mgpu__host_props(mgpu__bdevice *d, mgpu_device_props *p) {
  snprintf(p->name, sizeof p->name, "host device %d", d->id);
  p->multiprocessors = d->nworkers;
  p->numa_node = -1;
  p->peer_capable = mgpu__host_env->config->host_peer ? 1 : 0;
  mgpu__host_uuid(p->ordinal, p->uuid, sizeof p->uuid);
  return 0;
}

int mgpu__host_make_current(mgpu__bdevice *d) {
  (void)d;
  return 0;
}

void mgpu__host_lose(mgpu__bdevice *d, const char *why) {
  mgpu__mutex_lock(&d->lock);
  mgpu__host_lose_locked(d, why);
  mgpu__mutex_unlock(&d->lock);
}

int mgpu__host_lost(mgpu__bdevice *d, char *why, size_t why_size) {
  if (!atomic_load_explicit(&d->lost, memory_order_acquire)) return 0;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", d->lost_why);
  return 1;
}
