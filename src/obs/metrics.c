/* Per-device counters (see obs.h). The list of counters is MGPU_METRICS_MAP,
 * so the public struct and the recorder share one definition. */
#include <pthread.h>
#include <string.h>

#include "mgpu/module.h"
#include "obs/flight.h"
#include "obs/obs.h"
#include "obs/trace.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/thread.h"

/* One device's counters; written by any thread with relaxed atomics. */
/* Each device's counters start on a line pair of their own: the threads
 * that work for two devices add to them at every operation, and a line
 * shared by the end of one device's and the start of the next one's would
 * move between their cores. */
typedef struct obs_device {
  _Alignas(128) _Atomic uint64_t counters[MGPU__M_COUNT];
  _Atomic uint64_t mem_in_use;
  _Atomic uint64_t mem_peak;
  _Atomic uint64_t pool_cached;
  _Atomic uint64_t copy_ns[MGPU_METRIC_PATHS];
  _Atomic uint64_t copy_bytes[MGPU_METRIC_PATHS];
} obs_device;

static obs_device obs_dev[MGPU_MAX_DEVICES];

/* The counters a thread adds to: its own block, which only it writes (a
 * relaxed load and store, where an atomic add on the device's counter is
 * a locked instruction, and a channel call, say, adds three times). A
 * counter's value is its device's counter (a thread without a block, a
 * polled counter) plus every block's plus what ended threads left
 * (tc_retired), less the base taken at the last reset. Blocks are linked
 * in tc_list under tc_lock; at its thread's exit a block is added into
 * tc_retired and freed (tc_thread_exit), under tc_lock too, so that a sum
 * sees it once, and a reader polling the device's counter (which takes
 * differences of it) does not see it jump. */
typedef struct thread_counts {
  struct thread_counts *next; /* tc_list, under tc_lock */
  _Atomic uint64_t c[MGPU_MAX_DEVICES][MGPU__M_COUNT];
} thread_counts;

static mgpu__mutex tc_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_METRICS_REG);
static thread_counts *tc_list;              /* tc_lock */
static uint64_t tc_base[MGPU_MAX_DEVICES][MGPU__M_COUNT];    /* tc_lock */
static uint64_t tc_retired[MGPU_MAX_DEVICES][MGPU__M_COUNT]; /* tc_lock */
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static int tc_key_ok;
/* The calling thread's block; NULL before its first add, or for good
 * (tc_none) when memory or the key was short: it then adds atomically. */
static _Thread_local thread_counts *tc_mine;
static _Thread_local int tc_none;
/* Counters that a reader polls through mgpu__metric_counter (the task
 * pool's busy_ns): added to the device's counter itself from then on. */
static _Atomic unsigned char polled[MGPU__M_COUNT];

static void tc_thread_exit(void *arg) {
  thread_counts *t = arg;
  /* A destructor of another key that runs later on this thread and counts
   * adds to the shared counters. */
  tc_mine = NULL;
  tc_none = 1;
  mgpu__mutex_lock(&tc_lock);
  for (thread_counts **p = &tc_list; *p != NULL; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      break;
    }
  for (int d = 0; d < MGPU_MAX_DEVICES; d++)
    for (int m = 0; m < MGPU__M_COUNT; m++)
      tc_retired[d][m] +=
          atomic_load_explicit(&t->c[d][m], memory_order_relaxed);
  mgpu__mutex_unlock(&tc_lock);
  mgpu__free(t);
}

/* A child forked while another thread held tc_lock would wait for it for
 * ever: the child takes it afresh (the list may then miss a block that a
 * thread was adding or folding at the fork; the counts of the child are
 * its own business). */
static void tc_forked_child(void) {
  mgpu__mutex_init(&tc_lock, MGPU__LOCK_METRICS_REG);
}

static void tc_key_make(void) {
  tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0;
  pthread_atfork(NULL, NULL, tc_forked_child);
}

/* The calling thread's block, made at its first add; NULL: none. */
static thread_counts *tc_get(void) {
  if (tc_mine != NULL || tc_none) return tc_mine;
  pthread_once(&tc_once, tc_key_make);
  thread_counts *t = tc_key_ok ? mgpu__calloc(1, sizeof *t) : NULL;
  if (t != NULL && pthread_setspecific(tc_key, t) != 0) {
    mgpu__free(t);
    t = NULL;
  }
  if (t == NULL) {
    tc_none = 1;
    return NULL;
  }
  mgpu__mutex_lock(&tc_lock);
  t->next = tc_list;
  tc_list = t;
  mgpu__mutex_unlock(&tc_lock);
  return tc_mine = t;
}

/* Counter m of device dev as it reads now, with tc_lock held. */
static uint64_t counter_sum(int dev, int m) {
  uint64_t v = atomic_load_explicit(&obs_dev[dev].counters[m],
                                    memory_order_relaxed) +
               tc_retired[dev][m];
  for (const thread_counts *t = tc_list; t != NULL; t = t->next)
    v += atomic_load_explicit(&t->c[dev][m], memory_order_relaxed);
  return v;
}
/* Devices recorded; 0 while closed. Set by mgpu_init and mgpu_shutdown. */
static _Atomic int obs_ndevices;
/* When the wall clock of utilization started: open or the last reset. */
static _Atomic uint64_t obs_since_ns;
/* The calling thread's copy path for its next backend copies (-1: none). */
static _Thread_local int obs_path = -1;

static obs_device *device_at(int dev) {
  int n = atomic_load_explicit(&obs_ndevices, memory_order_acquire);
  return dev >= 0 && dev < n ? &obs_dev[dev] : NULL;
}

static void reset_counters(int n) {
  mgpu__mutex_lock(&tc_lock);
  for (int i = 0; i < n; i++)
    for (int m = 0; m < MGPU__M_COUNT; m++) tc_base[i][m] = counter_sum(i, m);
  mgpu__mutex_unlock(&tc_lock);
  for (int i = 0; i < n; i++) {
    obs_device *d = &obs_dev[i];
    for (int k = 0; k < MGPU_METRIC_PATHS; k++) {
      atomic_store_explicit(&d->copy_ns[k], 0, memory_order_relaxed);
      atomic_store_explicit(&d->copy_bytes[k], 0, memory_order_relaxed);
    }
    atomic_store_explicit(&d->mem_peak,
                          atomic_load_explicit(&d->mem_in_use,
                                               memory_order_relaxed),
                          memory_order_relaxed);
  }
  atomic_store_explicit(&obs_since_ns, mgpu__now_ns(), memory_order_relaxed);
}

void mgpu__obs_open(int ndevices) {
  pthread_once(&tc_once, tc_key_make);
  if (ndevices > MGPU_MAX_DEVICES) ndevices = MGPU_MAX_DEVICES;
  for (int i = 0; i < ndevices; i++) {
    atomic_store_explicit(&obs_dev[i].mem_in_use, 0, memory_order_relaxed);
    atomic_store_explicit(&obs_dev[i].pool_cached, 0, memory_order_relaxed);
  }
  reset_counters(ndevices);
  mgpu__flight_reset();
  atomic_store_explicit(&obs_ndevices, ndevices, memory_order_release);
}

void mgpu__obs_close(void) {
  atomic_store_explicit(&obs_ndevices, 0, memory_order_release);
}

void mgpu__metrics_add(int dev, const mgpu__metric_inc *inc, int n) {
  obs_device *d = device_at(dev);
  if (d == NULL) return;
  thread_counts *t = tc_get();
  for (int i = 0; i < n; i++) {
    enum mgpu__metric m = inc[i].m;
    if (t == NULL || atomic_load_explicit(&polled[m], memory_order_relaxed)) {
      atomic_fetch_add_explicit(&d->counters[m], inc[i].value,
                                memory_order_relaxed);
      continue;
    }
    _Atomic uint64_t *c = &t->c[dev][m];
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) +
                                 inc[i].value, memory_order_relaxed);
  }
}

void mgpu__metric_add(int dev, enum mgpu__metric m, uint64_t value) {
  mgpu__metric_inc inc = {m, value};
  mgpu__metrics_add(dev, &inc, 1);
}

int mgpu_module_metric_add(int dev, const char *name, uint64_t value) {
  static const char *const names[] = {
#define MGPU__METRIC_NAME(n, doc) #n,
      MGPU_METRICS_MAP(MGPU__METRIC_NAME)
#undef MGPU__METRIC_NAME
  };
  for (int m = 0; name != NULL && m < MGPU__M_COUNT; m++)
    if (strcmp(names[m], name) == 0) {
      mgpu__metric_add(dev, (enum mgpu__metric)m, value);
      return 0;
    }
  return mgpu__error(MGPU_EINVAL, "metrics: no counter named '%s'",
                     name ? name : "(null)");
}

_Atomic uint64_t *mgpu__metric_counter(int dev, enum mgpu__metric m) {
  atomic_store(&polled[m], 1);
  obs_device *d = device_at(dev);
  return d != NULL ? &d->counters[m] : NULL;
}

/* The trace's counter of memory in use follows every change. */
static void trace_mem(int dev, uint64_t now) {
  if (mgpu__trace_enabled())
    mgpu__trace_counter(dev, "memory in use", mgpu__now_ns(), (int64_t)now);
}

void mgpu__obs_mem(int dev, int64_t delta) {
  obs_device *d = device_at(dev);
  if (d == NULL) return;
  if (delta < 0) {
    uint64_t now = atomic_fetch_sub_explicit(&d->mem_in_use, (uint64_t)-delta,
                                             memory_order_relaxed) -
                   (uint64_t)-delta;
    trace_mem(dev, now);
    return;
  }
  uint64_t now = atomic_fetch_add_explicit(&d->mem_in_use, (uint64_t)delta,
                                           memory_order_relaxed) +
                 (uint64_t)delta;
  trace_mem(dev, now);
  uint64_t peak = atomic_load_explicit(&d->mem_peak, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&d->mem_peak, &peak, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

void mgpu__obs_mempool_cached(int dev, int64_t delta) {
  obs_device *d = device_at(dev);
  if (d == NULL) return;
  uint64_t now = atomic_fetch_add_explicit(&d->pool_cached, (uint64_t)delta,
                                           memory_order_relaxed) +
                 (uint64_t)delta;
  if (mgpu__trace_enabled())
    mgpu__trace_counter(dev, "memory cached by the pool", mgpu__now_ns(),
                        (int64_t)now);
}

void mgpu__obs_trace_gauges(void) {
  int n = atomic_load_explicit(&obs_ndevices, memory_order_acquire);
  uint64_t now = mgpu__now_ns();
  for (int i = 0; i < n; i++) {
    mgpu__trace_counter(i, "memory in use", now,
                        (int64_t)atomic_load_explicit(&obs_dev[i].mem_in_use,
                                                      memory_order_relaxed));
    /* The pool's counter appears once the pool holds something. */
    uint64_t cached =
        atomic_load_explicit(&obs_dev[i].pool_cached, memory_order_relaxed);
    if (cached != 0)
      mgpu__trace_counter(i, "memory cached by the pool", now, (int64_t)cached);
  }
}

void mgpu__obs_path_set(int path) { obs_path = path; }
int mgpu__obs_path(void) { return obs_path; }

void mgpu__obs_copy_ran(int dev, int path, uint64_t bytes, uint64_t ns) {
  obs_device *d = device_at(dev);
  if (d == NULL || path < 0 || path >= MGPU_METRIC_PATHS) return;
  atomic_fetch_add_explicit(&d->copy_ns[path], ns, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->copy_bytes[path], bytes, memory_order_relaxed);
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
  uint64_t counts[MGPU_MAX_DEVICES][MGPU__M_COUNT];
  mgpu__mutex_lock(&tc_lock);
  for (int i = 0; i < n; i++)
    for (int m = 0; m < MGPU__M_COUNT; m++)
      counts[i][m] = counter_sum(i, m) - tc_base[i][m];
  mgpu__mutex_unlock(&tc_lock);
  for (int i = 0; i < n; i++) {
    obs_device *d = &obs_dev[i];
    mgpu_device_metrics *m = &out->dev[i];
    m->mem_in_use = atomic_load_explicit(&d->mem_in_use, memory_order_relaxed);
    m->mem_peak = atomic_load_explicit(&d->mem_peak, memory_order_relaxed);
#define MGPU__METRIC_COPY(name, doc) m->name = counts[i][MGPU__M_##name];
    MGPU_METRICS_MAP(MGPU__METRIC_COPY)
#undef MGPU__METRIC_COPY
    m->mem_pool_cached =
        atomic_load_explicit(&d->pool_cached, memory_order_relaxed);
    for (int k = 0; k < MGPU_METRIC_PATHS; k++) {
      m->copy_ns[k] = atomic_load_explicit(&d->copy_ns[k], memory_order_relaxed);
      m->copy_bytes[k] =
          atomic_load_explicit(&d->copy_bytes[k], memory_order_relaxed);
      m->copy_gbps[k] = m->copy_ns[k] ? (double)m->copy_bytes[k] / m->copy_ns[k] : 0;
    }
    busy[i] = m->busy_ns;
  }
  out->load_imbalance = mgpu__load_imbalance(busy, n);
  out->wall_ns = mgpu__now_ns() -
                 atomic_load_explicit(&obs_since_ns, memory_order_relaxed);
  for (int i = 0; i < n; i++)
    out->dev[i].utilization =
        out->wall_ns ? (double)out->dev[i].busy_ns / (double)out->wall_ns : 0;
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
