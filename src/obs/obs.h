/* The recording floor: per-device counters that every layer above records
 * into (metrics.c).
 *
 * obs depends on nothing of mgpu but src/util/ and its own public header
 * (mgpu/metrics.h), so the core, copy, sched, coll and chan record into it
 * without a call running back up. It owns its counters, indexed by the mgpu
 * device number; the core opens it for n devices at mgpu_init and closes it
 * at mgpu_shutdown, and a record for a device outside [0, n) is dropped.
 *
 * Threads: a counter is added to by any thread, into a block of the
 * thread's own (a relaxed load and store, no locked instruction), and read
 * as the sum of the blocks (metrics.c); gauges are relaxed atomics;
 * obs_open and obs_close are called by mgpu_init and mgpu_shutdown only,
 * which the core serializes. Recording never steers the runtime.
 */
#ifndef MGPU_OBS_OBS_H
#define MGPU_OBS_OBS_H

#include <stdatomic.h>
#include <stdint.h>

#include "mgpu/metrics.h"

enum mgpu__metric {
#define MGPU__METRIC_ENUM(name, doc) MGPU__M_##name,
  MGPU_METRICS_MAP(MGPU__METRIC_ENUM)
#undef MGPU__METRIC_ENUM
  MGPU__M_COUNT
};

/* Opens the floor for devices 0 to ndevices - 1, every counter at 0. */
void mgpu__obs_open(int ndevices);
/* Closes it: later records are dropped, snapshots are MGPU_ENOINIT. */
void mgpu__obs_close(void);

/* Adds value to counter m of device dev. */
void mgpu__metric_add(int dev, enum mgpu__metric m, uint64_t value);
/* One addition of mgpu__metrics_add. */
typedef struct mgpu__metric_inc {
  enum mgpu__metric m;
  uint64_t value;
} mgpu__metric_inc;
/* Adds each of the n additions of inc to device dev's counters: one
 * lookup of the thread's block for all (a call that counts a copy's bytes,
 * the copy and the message). */
void mgpu__metrics_add(int dev, const mgpu__metric_inc *inc, int n);
/* The counter itself, for a reader that polls it (the task pool watches
 * busy_ns); NULL when dev is out of range. From the first call on, every
 * add to counter m (of any device) goes to that shared counter, which is
 * otherwise one part of the sum: threads add to blocks of their own. The
 * reader takes differences of it; its value is not the metric's. */
_Atomic uint64_t *mgpu__metric_counter(int dev, enum mgpu__metric m);
/* Memory of device dev that counts against its budget grew (delta > 0) or
 * shrank; keeps the mem_in_use gauge and its peak. */
void mgpu__obs_mem(int dev, int64_t delta);

/* The path of the backend copies the calling thread queues next, as the
 * metrics count them (mgpu_metric_path), or -1: the backend takes it from
 * the kind of copy. The copy layer sets it around its backend calls (the
 * staged path's chunks are device-to-host and host-to-device copies that
 * count as host-staged). */
void mgpu__obs_path_set(int path);
int mgpu__obs_path(void);
/* A copy of bytes on path ran on device dev for ns nanoseconds (the
 * backend calls this when the copy really ran). */
void mgpu__obs_copy_ran(int dev, int path, uint64_t bytes, uint64_t ns);
/* The stream-ordered pool of device dev keeps delta more (fewer, when
 * negative) bytes of freed blocks for reuse; they stay in mem_in_use. */
void mgpu__obs_mempool_cached(int dev, int64_t delta);

/* Records every device's gauges (memory in use, cached by the pool) as
 * trace counters now: when a recording starts and stops. */
void mgpu__obs_trace_gauges(void);

/* max / mean - 1 over n busy times: 0 when every device was idle. The one
 * definition of load imbalance (metrics and pool statistics). */
double mgpu__load_imbalance(const uint64_t *busy_ns, int n);

#endif /* MGPU_OBS_OBS_H */
