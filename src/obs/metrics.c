/* Per-device counters (see obs.h). The list of counters is MGPU_METRICS_MAP,
 * so the public struct and the recorder share one definition. */
#include <string.h>

#include "obs/obs.h"
#include "util/log.h"

/* One device's counters; written by any thread with relaxed atomics. */
typedef struct obs_device {
  _Atomic uint64_t counters[MGPU__M_COUNT];
  _Atomic uint64_t mem_in_use;
  _Atomic uint64_t mem_peak;
} obs_device;

static obs_device obs_dev[MGPU_MAX_DEVICES];
/* Devices recorded; 0 while closed. Set by mgpu_init and mgpu_shutdown. */
static _Atomic int obs_ndevices;

static obs_device *device_at(int dev) {
  int n = atomic_load_explicit(&obs_ndevices, memory_order_acquire);
  return dev >= 0 && dev < n ? &obs_dev[dev] : NULL;
}

static void reset_counters(int n) {
  for (int i = 0; i < n; i++) {
    obs_device *d = &obs_dev[i];
    for (int m = 0; m < MGPU__M_COUNT; m++)
      atomic_store_explicit(&d->counters[m], 0, memory_order_relaxed);
    atomic_store_explicit(&d->mem_peak,
                          atomic_load_explicit(&d->mem_in_use,
                                               memory_order_relaxed),
                          memory_order_relaxed);
  }
}

void mgpu__obs_open(int ndevices) {
  if (ndevices > MGPU_MAX_DEVICES) ndevices = MGPU_MAX_DEVICES;
  for (int i = 0; i < ndevices; i++)
    atomic_store_explicit(&obs_dev[i].mem_in_use, 0, memory_order_relaxed);
  reset_counters(ndevices);
  atomic_store_explicit(&obs_ndevices, ndevices, memory_order_release);
}

void mgpu__obs_close(void) {
  atomic_store_explicit(&obs_ndevices, 0, memory_order_release);
}

void mgpu__metric_add(int dev, enum mgpu__metric m, uint64_t value) {
  obs_device *d = device_at(dev);
  if (d != NULL)
    atomic_fetch_add_explicit(&d->counters[m], value, memory_order_relaxed);
}

_Atomic uint64_t *mgpu__metric_counter(int dev, enum mgpu__metric m) {
  obs_device *d = device_at(dev);
  return d != NULL ? &d->counters[m] : NULL;
}

void mgpu__obs_mem(int dev, int64_t delta) {
  obs_device *d = device_at(dev);
  if (d == NULL) return;
  if (delta < 0) {
    atomic_fetch_sub_explicit(&d->mem_in_use, (uint64_t)-delta,
                              memory_order_relaxed);
    return;
  }
  uint64_t now = atomic_fetch_add_explicit(&d->mem_in_use, (uint64_t)delta,
                                           memory_order_relaxed) +
                 (uint64_t)delta;
  uint64_t peak = atomic_load_explicit(&d->mem_peak, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&d->mem_peak, &peak, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

double mgpu__load_imbalance(const uint64_t *busy_ns, int n) {
  double max = 0, sum = 0;
  for (int i = 0; i < n; i++) {
    double b = (double)busy_ns[i];
    if (b > max) max = b;
    sum += b;
  }
  return sum > 0 ? max / (sum / n) - 1.0 : 0.0;
}

int mgpu_metrics_snapshot(mgpu_metrics *out) {
  if (out == NULL || out->size != sizeof *out)
    return mgpu__error(MGPU_EINVAL, "mgpu_metrics_snapshot: out is NULL or its "
                       "size field is not sizeof(mgpu_metrics)");
  int n = atomic_load_explicit(&obs_ndevices, memory_order_acquire);
  if (n == 0)
    return mgpu__error(MGPU_ENOINIT, "mgpu_metrics_snapshot: mgpu_init has not "
                       "been called");
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->ndevices = n;
  uint64_t busy[MGPU_MAX_DEVICES];
  for (int i = 0; i < n; i++) {
    obs_device *d = &obs_dev[i];
    mgpu_device_metrics *m = &out->dev[i];
    m->mem_in_use = atomic_load_explicit(&d->mem_in_use, memory_order_relaxed);
    m->mem_peak = atomic_load_explicit(&d->mem_peak, memory_order_relaxed);
#define MGPU__METRIC_COPY(name, doc)                                 \
  m->name = atomic_load_explicit(&d->counters[MGPU__M_##name],      \
                                 memory_order_relaxed);
    MGPU_METRICS_MAP(MGPU__METRIC_COPY)
#undef MGPU__METRIC_COPY
    busy[i] = m->busy_ns;
  }
  out->load_imbalance = mgpu__load_imbalance(busy, n);
  return 0;
}

int mgpu_metrics_reset(void) {
  int n = atomic_load_explicit(&obs_ndevices, memory_order_acquire);
  if (n == 0)
    return mgpu__error(MGPU_ENOINIT, "mgpu_metrics_reset: mgpu_init has not "
                       "been called");
  reset_counters(n);
  return 0;
}
