/* Per-device counters. Every layer adds to them with relaxed atomics; they
 * never steer the runtime. The list of counters is MGPU_METRICS_MAP, so the
 * public struct and the recorder share one definition. */
#include <string.h>

#include "core/internal.h"

_Static_assert(MGPU__M_COUNT <= 32, "mgpu__device.counters is too small");

void mgpu__metric_add(int dev, enum mgpu__metric m, uint64_t value) {
  mgpu__device *d = mgpu__device_get(dev);
  if (d != NULL)
    atomic_fetch_add_explicit(&d->counters[m], value, memory_order_relaxed);
}

int mgpu_metrics_snapshot(mgpu_metrics *out) {
  if (out == NULL || out->size != sizeof *out)
    return mgpu__error(MGPU_EINVAL, "mgpu_metrics_snapshot: out is NULL or its "
                       "size field is not sizeof(mgpu_metrics)");
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_metrics_snapshot: mgpu_init has not "
                       "been called");
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->ndevices = mgpu__ndevices();
  double max_busy = 0, sum_busy = 0;
  for (int i = 0; i < out->ndevices; i++) {
    mgpu__device *d = mgpu__device_get(i);
    mgpu_device_metrics *m = &out->dev[i];
    m->mem_in_use = d->mem_in_use;
    m->mem_peak = d->mem_peak;
#define MGPU__METRIC_COPY(name, doc) \
  m->name = atomic_load_explicit(&d->counters[MGPU__M_##name], memory_order_relaxed);
    MGPU_METRICS_MAP(MGPU__METRIC_COPY)
#undef MGPU__METRIC_COPY
    double busy = (double)m->busy_ns;
    if (busy > max_busy) max_busy = busy;
    sum_busy += busy;
  }
  if (sum_busy > 0) out->load_imbalance = max_busy / (sum_busy / out->ndevices) - 1;
  return 0;
}

int mgpu_metrics_reset(void) {
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_metrics_reset: mgpu_init has not "
                       "been called");
  for (int i = 0; i < mgpu__ndevices(); i++) {
    mgpu__device *d = mgpu__device_get(i);
    for (int m = 0; m < MGPU__M_COUNT; m++) d->counters[m] = 0;
    d->mem_peak = (uint64_t)d->mem_in_use;
  }
  return 0;
}
