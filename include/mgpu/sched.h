/* mgpu sched: a task pool over devices.
 *
 * A pool owns one worker thread per device (with that device current) and
 * one stream per device. A task is a function given its device and that
 * stream, or a kernel launch; it is complete when it has returned and the
 * work it queued on the stream has finished. Three policies:
 *
 *   MGPU_SCHED_STATIC    each task is placed on a device when submitted,
 *                        by weights (smooth weighted round-robin); no moving
 *   MGPU_SCHED_DYNAMIC   one shared queue; an idle device takes the oldest
 *   MGPU_SCHED_WS        work stealing: a deque per device, the owner works
 *                        at one end, idle devices steal at the other,
 *                        nearest device first
 *
 * Tasks may wait for other tasks (dependencies) and may prefer a device
 * (affinity). A task that fails (its function returns a negative code) fails
 * its dependents too, with MGPU_EDEPFAIL; the pool stays usable.
 *
 * Threads: every call may be made from any thread, also from inside a task
 * (a task may submit tasks), except the waits, which a task must not call
 * (MGPU_EINVAL: a worker waiting on work queued behind it would deadlock).
 * See docs/sched.md.
 */
#ifndef MGPU_SCHED_H
#define MGPU_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgpu_sched_policy {
  MGPU_SCHED_STATIC = 0,
  MGPU_SCHED_DYNAMIC = 1,
  MGPU_SCHED_WS = 2
} mgpu_sched_policy;

/* What mgpu_pool_destroy does with tasks that have not finished. */
typedef enum mgpu_pool_on_destroy {
  MGPU_POOL_WAIT = 0,  /* run every task submitted, then stop */
  MGPU_POOL_CANCEL = 1 /* finish the running tasks; the others complete as
                          MGPU_ECANCELED without running */
} mgpu_pool_on_destroy;

/* Distance between two devices, smaller is nearer (0: same device). */
typedef double (*mgpu_distance_fn)(int from_dev, int to_dev, void *arg);

typedef struct mgpu_pool_opts {
  size_t size;               /* sizeof(mgpu_pool_opts) */
  mgpu_sched_policy policy;  /* default MGPU_SCHED_WS */
  int ndevices;              /* 0: every open device */
  const int *devices;        /* NULL: 0 .. ndevices-1; distinct */
  const double *weights;     /* static: share of tasks per device (>= 0,
                                not all 0); NULL: equal */
  mgpu_pool_on_destroy on_destroy;
  /* Work stealing: the order in which a thief visits victims, nearest
   * first. NULL: ring order from the thief's own index (i+1, i+2, ...),
   * until the topology layer supplies link distances. */
  mgpu_distance_fn distance;
  void *distance_arg;
} mgpu_pool_opts;

#define MGPU_POOL_OPTS_INITIALIZER                                         \
  { .size = sizeof(mgpu_pool_opts), .policy = MGPU_SCHED_WS, .ndevices = 0, \
    .devices = NULL, .weights = NULL, .on_destroy = MGPU_POOL_WAIT,         \
    .distance = NULL, .distance_arg = NULL }

typedef struct mgpu_pool mgpu_pool;

/* A task handle: 0 is no task. Handles are only handed out on request (see
 * mgpu_pool_submit) and stay valid until waited or released. */
typedef uint64_t mgpu_task;

/* A task body: dev is the device it runs on (the thread's current device),
 * stream a stream of that device owned by the pool. Returns 0 or a negative
 * MGPU_E... code (set a detail with the failing call, as mgpu calls do). */
typedef int (*mgpu_task_fn)(int dev, mgpu_stream *stream, void *arg);

typedef struct mgpu_task_desc {
  size_t size;                 /* sizeof(mgpu_task_desc) */
  mgpu_task_fn fn;             /* either fn(arg) ... */
  void *arg;
  const mgpu_kernel *kernel;   /* ... or a kernel launch (fn NULL) */
  mgpu_dim3 grid, block;
  const void *args;            /* copied at submit */
  size_t args_size;
  const mgpu_task *deps;       /* tasks this one waits for (held handles) */
  int ndeps;
  int device;                  /* preferred device (mgpu id), -1: none */
} mgpu_task_desc;

#define MGPU_TASK_DESC_INITIALIZER                                         \
  { .size = sizeof(mgpu_task_desc), .fn = NULL, .arg = NULL,               \
    .kernel = NULL, .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = NULL,   \
    .args_size = 0, .deps = NULL, .ndeps = 0, .device = -1 }

/* Creates a pool; the caller owns it until mgpu_pool_destroy. */
MGPU_EXTERN int mgpu_pool_create(mgpu_pool **pool, const mgpu_pool_opts *opts);

/* Stops the pool after the tasks in flight finished (MGPU_POOL_WAIT) or were
 * canceled (MGPU_POOL_CANCEL), and frees everything it holds; handles still
 * held become invalid. Returns the first error not yet returned by a wait.
 * Tasks may still submit to the pool while it drains; once drained, later
 * calls on the pool (and a second destroy) are MGPU_EFREED, and calls
 * already inside on other threads (a wait) finish first. mgpu_shutdown
 * cancels and destroys the pools still open; a pool handle is MGPU_EFREED
 * after it, also after a new mgpu_init. */
MGPU_EXTERN int mgpu_pool_destroy(mgpu_pool *pool);

/* Submits a task. task NULL: fire and forget (its failure still reaches
 * mgpu_pool_wait_all). task non-NULL: *task is a held handle, usable as a
 * dependency and waited with mgpu_pool_wait; it is released by that wait,
 * by mgpu_pool_release or by mgpu_pool_wait_all. A dependency on a task
 * that already failed makes this one fail with MGPU_EDEPFAIL. */
MGPU_EXTERN int mgpu_pool_submit(mgpu_pool *pool, const mgpu_task_desc *desc,
                                 mgpu_task *task);

/* Shorthand for a function task with no dependencies and no affinity. */
MGPU_EXTERN int mgpu_pool_submit_fn(mgpu_pool *pool, mgpu_task_fn fn,
                                    void *arg, mgpu_task *task);

/* Waits for one held task and releases it. Returns its result: 0, its
 * function's code, MGPU_EDEPFAIL or MGPU_ECANCELED, with the detail. A task
 * handle is waited once: a second wait or a release (even one racing this
 * wait) is MGPU_EFREED. */
MGPU_EXTERN int mgpu_pool_wait(mgpu_pool *pool, mgpu_task task);

/* Releases a held handle without waiting (the task still runs). */
MGPU_EXTERN int mgpu_pool_release(mgpu_pool *pool, mgpu_task task);

/* Waits until no task is in flight (tasks other threads submit meanwhile
 * included) and releases every held handle of a completed task. Returns the
 * first failure since the previous wait_all (or since creation) with its
 * detail, or 0. */
MGPU_EXTERN int mgpu_pool_wait_all(mgpu_pool *pool);

/* Per-device figures of the pool, since creation or the last reset. */
typedef struct mgpu_pool_dev_stats {
  int device;
  uint64_t tasks_run;    /* tasks this device ran (stolen ones included) */
  uint64_t tasks_stolen; /* tasks it took from another device's queues */
  uint64_t tasks_failed;
  uint64_t busy_ns;      /* time spent inside tasks */
} mgpu_pool_dev_stats;

typedef struct mgpu_pool_stats {
  size_t size;           /* sizeof(mgpu_pool_stats) */
  int ndevices;
  double load_imbalance; /* max busy / mean busy - 1; 0 when idle */
  mgpu_pool_dev_stats dev[MGPU_MAX_DEVICES];
} mgpu_pool_stats;

MGPU_EXTERN int mgpu_pool_stats_get(mgpu_pool *pool, mgpu_pool_stats *out);
/* Zeroes the figures; exact only while the pool is idle (a task finishing
 * during the reset may keep its counts). */
MGPU_EXTERN int mgpu_pool_stats_reset(mgpu_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_SCHED_H */
