/* Tasks of a pool: submission with dependencies, running, completion
 * (failure propagation to dependents), and the waits. The slots they live
 * in are slots.c's.
 *
 * The fast path (a task with no dependencies) takes a slot from the free
 * list with one CAS, publishes the task with one more, and completes it with
 * an exchange on its successor list and a few counters: no lock and no
 * allocation. Locks are taken only to grow the table and to record a
 * failure. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched-internal.h"
#include "util/fault.h"

/* The task a held handle names, or NULL with *code set to
 * MGPU_EBADHANDLE (not a handle of this pool) or MGPU_EFREED (waited or
 * released already). Sets no detail: callers name the argument. */
static mgpu__task *task_lookup(mgpu__pool *p, mgpu_task h, int *code) {
  uint32_t idx = (uint32_t)h;
  mgpu__task *t = (idx == 0) ? NULL : mgpu__task_at(p, idx - 1);
  if (t == NULL) {
    *code = MGPU_EBADHANDLE;
    return NULL;
  }
  if (atomic_load_explicit(&t->hold, memory_order_acquire) != h) {
    *code = MGPU_EFREED;
    return NULL;
  }
  return t;
}

static int bad_handle(int code, const char *what, mgpu_task h) {
  return mgpu__error(code, "task pool: %s 0x%llx %s", what,
                     (unsigned long long)h,
                     code == MGPU_EFREED
                         ? "was already waited or released"
                         : "is not a task handle of this pool");
}

/* ---- failures ---- */

static char *dup_printf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return mgpu__strdup(buf);
}

/* A failed task's detail is kept on the heap (dup_printf); when no memory
 * was left for it (an allocation failure is often why the task failed),
 * the failure still says what failed and how. */
static void record_failure(mgpu__pool *p, const mgpu__task *t, int r) {
  mgpu__mutex_lock(&p->err_lock);
  if (p->first_err == 0) {
    p->first_err = r;
    if (t->detail != NULL && t->detail[0] != '\0')
      snprintf(p->first_detail, sizeof p->first_detail, "%s", t->detail);
    else
      snprintf(p->first_detail, sizeof p->first_detail,
               "task 0x%llx failed with %s (no memory was left to keep its "
               "detail)", (unsigned long long)mgpu__task_handle(t),
               mgpu_err_name(r));
  }
  mgpu__mutex_unlock(&p->err_lock);
}

/* Marks dependent d as failed because dep (with result r) failed. Only the
 * first failed dependency writes the detail. */
static void fail_dependent(mgpu__task *d, const mgpu__task *dep, int r) {
  int zero = 0;
  if (!atomic_compare_exchange_strong_explicit(&d->dep_code, &zero, r,
                                               memory_order_relaxed,
                                               memory_order_relaxed))
    return;
  d->detail = dup_printf("task 0x%llx depends on task 0x%llx, which failed "
                         "with %s: %s",
                         (unsigned long long)mgpu__task_handle(d),
                         (unsigned long long)mgpu__task_handle(dep), mgpu_err_name(r),
                         dep->detail ? dep->detail : "");
}

/* ---- completion ---- */

void mgpu__task_complete(mgpu__pool *p, mgpu__task *t, int r,
                         mgpu__worker *self) {
  /* Dependents that fail because t failed complete here too, without
   * running: a worklist linked through next instead of recursion. */
  mgpu__task *work = NULL;
  for (;;) {
    t->result = r;
    if (r != 0) record_failure(p, t, r);
    mgpu__edge *e =
        atomic_exchange_explicit(&t->succ, MGPU__SEALED, memory_order_acq_rel);
    while (e != NULL) {
      mgpu__edge *next = e->next;
      mgpu__task *d = e->dependent;
      if (r != 0) fail_dependent(d, t, r);
      if (atomic_fetch_sub_explicit(&d->pending, 1, memory_order_acq_rel) ==
          1) {
        if (atomic_load_explicit(&d->dep_code, memory_order_relaxed) != 0) {
          atomic_store_explicit(&d->next, work, memory_order_relaxed);
          work = d;
        } else {
          mgpu__sched_ready(p, d, self);
        }
      }
      e = next;
    }
    if (atomic_exchange_explicit(&t->state, MGPU__T_DONE,
                                 memory_order_acq_rel) == MGPU__T_WAITED)
      mgpu__park_wake(&t->state, 1 << 30);
    mgpu__task_unref(p, t, self);
    if (self != NULL) {
      if (++self->pending_done >= MGPU__FLUSH_BATCH) mgpu__worker_flush(self);
    } else {
      mgpu__inflight_done(p, 1);
    }
    if (work == NULL) return;
    t = work;
    work = atomic_load_explicit(&t->next, memory_order_relaxed);
    r = MGPU_EDEPFAIL;
  }
}

/* The task's span on its worker's track, and the arrow of a steal from the
 * owner's worker (when the thief took it) to the task. The owner may have
 * been idle or not yet started then, so the arrow starts in a 1 ns
 * "stolen" mark on the owner's track: a flow binds to an enclosing span,
 * and one with none is dropped by the viewer. Integer timestamps make the
 * mark either inside a task span of the owner or outside it, never across
 * its edge. */
static void trace_task(mgpu__worker *w, mgpu__task *t, uint64_t t0) {
  int from = w->stolen_from;
  const mgpu__worker *v = from >= 0 ? &w->pool->workers[from] : NULL;
  mgpu__trace_arg args[] = {
      MGPU__TARG_I("task", mgpu__task_handle(t)),
      MGPU__TARG_I("device", w->dev),
      MGPU__TARG_I("stolen_from", v != NULL ? v->dev : -1)};
  mgpu__trace_span(w->dev, w->trace_track, "task", t0, w->clock_ns, args, 3);
  if (v != NULL) {
    uint64_t at = w->stolen_ns > t0 ? w->stolen_ns : t0;
    mgpu__trace_arg mark[] = {MGPU__TARG_I("task", mgpu__task_handle(t)),
                              MGPU__TARG_I("to_device", w->dev)};
    mgpu__trace_span(v->dev, v->trace_track, "stolen", at, at + 1, mark, 2);
    mgpu__trace_flow("steal", (mgpu__trace_point){v->dev, v->trace_track, at},
                     (mgpu__trace_point){w->dev, w->trace_track, at + 1});
  }
}

/* Adds a run of dt ns to w's statistics: the device's busy time gets it
 * less the stream work the backend counted since stream_busy0. */
static void task_account(mgpu__worker *w, uint64_t dt, uint64_t stream_busy0) {
  /* Only this worker writes its statistics: a load and a store, no
   * locked instruction. The global metrics are added in batches. */
  atomic_store_explicit(
      &w->busy_ns,
      atomic_load_explicit(&w->busy_ns, memory_order_relaxed) + dt,
      memory_order_relaxed);
  atomic_store_explicit(
      &w->tasks_run,
      atomic_load_explicit(&w->tasks_run, memory_order_relaxed) + 1,
      memory_order_relaxed);
  w->pending_run++;
  /* The device's busy_ns gets the task's time less the stream work the
   * backend already counted, so that the two are not added twice. */
  uint64_t stream_busy =
      atomic_load_explicit(w->device_busy, memory_order_relaxed) -
      stream_busy0;
  w->pending_busy += dt > stream_busy ? dt - stream_busy : 0;
}

/* Runs t's function or kernel on w's stream and waits for what it queued;
 * returns what it returned (or the wait's failure). */
static int task_call(mgpu__worker *w, mgpu__task *t) {
  atomic_store_explicit(&w->running, 1, memory_order_relaxed);
  /* Back to back, a task starts when the previous one ended: one clock
   * read per task instead of two (a read costs 40-90 ns in some VMs). */
  uint64_t t0 = w->clock_ns ? w->clock_ns : mgpu__now_ns();
  /* What the device's streams count as busy meanwhile (a host device
   * counts the work it runs for the task's stream itself). */
  uint64_t stream_busy0 =
      atomic_load_explicit(w->device_busy, memory_order_relaxed);
  mgpu_error_clear();
  mgpu__flight_record(w->dev, "pool task", 0, (uintptr_t)w->stream);
  int r;
  if (t->fn != NULL)
    r = t->fn(w->dev, w->stream, t->arg);
  else
    r = mgpu_launch(w->stream, t->kernel, t->grid, t->block, t->args,
                    t->args_size);
  /* The task is complete once the work it queued is: dependents may
   * read what it wrote. */
  int rs = w->sync_ops->stream_synchronize(w->sync_dev, w->sync_stream);
  if (r == 0) r = rs;
  /* A task that switched the thread to another device must not leave
   * the next task there. */
  int cur;
  if (mgpu_get_device(&cur) == 0 && cur != w->dev) mgpu_set_device(w->dev);
  w->clock_ns = mgpu__now_ns();
  atomic_store_explicit(&w->running, 0, memory_order_relaxed);
  task_account(w, w->clock_ns - t0, stream_busy0);
  if (mgpu__trace_enabled()) trace_task(w, t, t0);
  return r;
}

void mgpu__task_run(mgpu__worker *w, mgpu__task *t) {
  mgpu__pool *p = w->pool;
  int r;
  if (atomic_load_explicit(&t->dep_code, memory_order_relaxed) != 0) {
    r = MGPU_EDEPFAIL; /* a dependency failed while it was queued */
  } else if (atomic_load_explicit(&p->canceling, memory_order_relaxed)) {
    r = MGPU_ECANCELED;
    t->detail = dup_printf("task 0x%llx canceled: its pool was destroyed "
                           "before it ran",
                           (unsigned long long)mgpu__task_handle(t));
  } else {
    r = task_call(w, t);
    /* Its device was lost under it: a re-runnable task starts again on
     * another device, and its dependents wait for that run. */
    if (r != 0 && t->rerunnable && mgpu__worker_lost(w)) {
      mgpu__sched_elsewhere(p, t, w);
      return;
    }
    if (r > 0) { /* a task must return 0 or a negative code */
      mgpu__error(MGPU_EINVAL, "the task returned %d, which is neither 0 nor "
                  "a negative MGPU_E... code", r);
      r = MGPU_EINVAL;
    }
    if (r != 0) {
      const char *d = mgpu_error_detail();
      t->detail = dup_printf("device %d: task 0x%llx failed with %s: %s",
                             w->dev, (unsigned long long)mgpu__task_handle(t),
                             mgpu_err_name(r),
                             d[0] ? d : "(the task set no detail)");
      atomic_fetch_add_explicit(&w->tasks_failed, 1, memory_order_relaxed);
    }
  }
  mgpu__task_complete(p, t, r, w);
}

/* ---- submission ---- */

static int check_desc(mgpu__pool *p, const mgpu_task_desc *d) {
  if (d == NULL || d->size < sizeof(mgpu_task_desc))
    return mgpu__error(MGPU_EINVAL, "task pool: task descriptor is NULL or "
                       "its size field is not sizeof(mgpu_task_desc)");
  if ((d->fn == NULL) == (d->kernel == NULL))
    return mgpu__error(MGPU_EINVAL, "task pool: a task needs exactly one of "
                       "fn and kernel");
  if (d->kernel != NULL && d->args_size > 0 && d->args == NULL)
    return mgpu__error(MGPU_EINVAL, "task pool: kernel task '%s' has "
                       "args_size %zu but args NULL",
                       d->kernel->name ? d->kernel->name : "?", d->args_size);
  if (d->ndeps < 0 || (d->ndeps > 0 && d->deps == NULL))
    return mgpu__error(MGPU_EINVAL, "task pool: %d dependencies given with "
                       "deps %s", d->ndeps, d->deps ? "set" : "NULL");
  if (d->device != -1 &&
      (d->device < 0 || d->device >= MGPU_MAX_DEVICES ||
       p->dev_to_worker[d->device] < 0))
    return mgpu__error(MGPU_ENODEV, "task pool: preferred device %d is not "
                       "one of the pool's %d devices", d->device, p->n);
  for (int i = 0; i < d->ndeps; i++) {
    int code;
    if (task_lookup(p, d->deps[i], &code) == NULL) {
      char what[32];
      snprintf(what, sizeof what, "dependency %d", i);
      return bad_handle(code, what, d->deps[i]);
    }
  }
  return 0;
}

/* Links t after dep; returns 1 if t must wait for it. */
static int add_edge(mgpu__task *t, mgpu__edge *e, mgpu__task *dep) {
  e->dependent = t;
  mgpu__edge *head = atomic_load_explicit(&dep->succ, memory_order_acquire);
  atomic_fetch_add_explicit(&t->pending, 1, memory_order_relaxed);
  for (;;) {
    if (head == MGPU__SEALED) {
      /* Already complete: its result was written before the seal. */
      atomic_fetch_sub_explicit(&t->pending, 1, memory_order_relaxed);
      if (dep->result != 0) fail_dependent(t, dep, dep->result);
      return 0;
    }
    e->next = head;
    if (atomic_compare_exchange_weak_explicit(&dep->succ, &head, e,
                                              memory_order_release,
                                              memory_order_acquire))
      return 1;
  }
}

static int submit(mgpu__pool *p, const mgpu_task_desc *d, mgpu_task *out);

int mgpu_pool_submit(mgpu_pool *h, const mgpu_task_desc *d, mgpu_task *out) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(h, &p);
  if (rc != 0) return rc;
  rc = submit(p, d, out);
  mgpu__pool_put(p);
  return rc;
}

/* Copies what d describes into the fresh task t: its function or kernel
 * with a copy of the arguments, its placement, and room for its edges
 * (*edges). -1 when out of memory. */
static int task_fill(mgpu__pool *p, mgpu__task *t, const mgpu_task_desc *d,
                     mgpu__edge **edges) {
  t->fn = d->fn;
  t->arg = d->arg;
  t->kernel = d->kernel;
  t->grid = d->grid;
  t->block = d->block;
  t->args = NULL;
  t->args_size = d->kernel ? d->args_size : 0;
  if (t->args_size > 0) {
    t->args = t->args_size <= MGPU__TASK_INLINE_ARGS ? t->args_inline
                                                     : mgpu__malloc(t->args_size);
    if (t->args == NULL) return -1;
    memcpy(t->args, d->args, t->args_size);
  }
  *edges = t->edges_inline;
  if (d->ndeps > MGPU__TASK_INLINE_EDGES) {
    *edges = t->edges_heap = mgpu__malloc((size_t)d->ndeps * sizeof **edges);
    if (*edges == NULL) return -1;
  }
  t->home = d->device >= 0 ? p->dev_to_worker[d->device] : -1;
  t->place = -1;
  t->rerunnable = d->rerunnable != 0;
  if (p->policy == MGPU_SCHED_STATIC && t->home < 0) {
    /* Placed now, in submit order, whatever the dependencies. */
    uint64_t k = atomic_fetch_add_explicit(&p->place_next, 1,
                                           memory_order_relaxed);
    t->place = p->static_table[k % (uint64_t)p->static_len];
  }
  return 0;
}

static int submit(mgpu__pool *p, const mgpu_task_desc *d, mgpu_task *out) {
  int rc = check_desc(p, d);
  if (rc != 0) return rc;
  mgpu__task *t = mgpu__task_alloc(p);
  if (t == NULL)
    return mgpu__error(MGPU_ENOMEM, "task pool: no free task slot (%u "
                       "in flight or held at most)",
                       MGPU__TASK_MAX_CHUNKS * MGPU__TASK_CHUNK);
  mgpu__edge *edges;
  if (task_fill(p, t, d, &edges) != 0) goto nomem;
  t->result = 0;
  t->detail = NULL;
  atomic_store_explicit(&t->dep_code, 0, memory_order_relaxed);
  atomic_store_explicit(&t->succ, NULL, memory_order_relaxed);
  atomic_store_explicit(&t->state, MGPU__T_PENDING, memory_order_relaxed);
  /* The submitter's guard, needed only while edges are being added. */
  atomic_store_explicit(&t->pending, d->ndeps > 0, memory_order_relaxed);
  uint64_t h = mgpu__task_handle(t);
  /* Release: a scan that sees the new hold also sees the reset state. */
  atomic_store_explicit(&t->hold, out ? h : 0, memory_order_release);
  atomic_store_explicit(&t->refs, out ? 2 : 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->inflight, 1, memory_order_relaxed);
  if (out) *out = h;
  if (d->ndeps == 0) {
    /* Nothing else can reach t yet: ready without the guard's atomic. */
    mgpu__sched_ready(p, t, mgpu__sched_self(p));
    return 0;
  }

  for (int i = 0; i < d->ndeps; i++)
    add_edge(t, &edges[i], mgpu__task_at(p, (uint32_t)d->deps[i] - 1));
  /* Drop the submitter's guard; whoever reaches 0 makes t ready. */
  if (atomic_fetch_sub_explicit(&t->pending, 1, memory_order_acq_rel) == 1) {
    if (atomic_load_explicit(&t->dep_code, memory_order_relaxed) != 0)
      mgpu__task_complete(p, t, MGPU_EDEPFAIL, mgpu__sched_self(p));
    else
      mgpu__sched_ready(p, t, mgpu__sched_self(p));
  }
  return 0;

nomem:
  atomic_store_explicit(&t->refs, 1, memory_order_relaxed);
  mgpu__task_unref(p, t, NULL); /* its only reference: back to the list */
  return mgpu__error(MGPU_ENOMEM, "task pool: no memory for a task's "
                     "%zu bytes of kernel arguments or %d dependencies",
                     d->args_size, d->ndeps);
}

int mgpu_pool_submit_fn(mgpu_pool *p, mgpu_task_fn fn, void *arg,
                        mgpu_task *out) {
  mgpu_task_desc d = MGPU_TASK_DESC_INITIALIZER;
  d.fn = fn;
  d.arg = arg;
  return mgpu_pool_submit(p, &d, out);
}

/* ---- waiting ---- */

static int check_not_worker(mgpu__pool *p, const char *what) {
  mgpu__worker *w = mgpu__sched_self(p);
  if (w != NULL)
    return mgpu__error(MGPU_EINVAL, "task pool: %s called from a task on "
                       "device %d (it could wait for work queued behind "
                       "itself)", what, w->dev);
  return 0;
}

/* Spins briefly (tasks are often short), then sleeps on the task's state. */
static void wait_done(mgpu__task *t) {
  for (int i = 0; i < 200; i++) {
    if (atomic_load_explicit(&t->state, memory_order_acquire) == MGPU__T_DONE)
      return;
    if (i >= 100) sched_yield();
  }
  uint32_t s = MGPU__T_PENDING;
  atomic_compare_exchange_strong_explicit(&t->state, &s, MGPU__T_WAITED,
                                          memory_order_acq_rel,
                                          memory_order_acquire);
  while (atomic_load_explicit(&t->state, memory_order_acquire) != MGPU__T_DONE)
    mgpu__park_wait(&t->state, MGPU__T_WAITED);
}

/* Releases the user's hold (once, whoever calls). */
static int release_hold(mgpu__pool *p, mgpu__task *t, mgpu_task h) {
  uint64_t expected = h;
  if (!atomic_compare_exchange_strong_explicit(&t->hold, &expected, 0,
                                               memory_order_acq_rel,
                                               memory_order_relaxed))
    return 0;
  mgpu__task_unref(p, t, NULL);
  return 1;
}

/* Takes the user's hold of a task for a wait: from here on the waiter owns
 * that reference, so a second wait or a release of the same handle (even
 * one racing this one) is MGPU_EFREED, and the slot cannot be recycled
 * while this waiter reads the result. */
static int claim_hold(mgpu__pool *p, mgpu_task h, mgpu__task **out) {
  int code;
  mgpu__task *t = task_lookup(p, h, &code);
  if (t == NULL) return bad_handle(code, "task", h);
  uint64_t expected = h;
  if (!atomic_compare_exchange_strong_explicit(&t->hold, &expected, 0,
                                               memory_order_acq_rel,
                                               memory_order_relaxed))
    return bad_handle(MGPU_EFREED, "task", h);
  *out = t;
  return 0;
}

static int pool_wait(mgpu__pool *p, mgpu_task h) {
  int rc = check_not_worker(p, "mgpu_pool_wait");
  if (rc != 0) return rc;
  mgpu__task *t = NULL;
  rc = claim_hold(p, h, &t);
  if (rc != 0) return rc;
  wait_done(t);
  int r = t->result;
  if (r != 0 && t->detail != NULL && t->detail[0] != '\0')
    mgpu__error(r, "%s", t->detail);
  else if (r != 0)
    mgpu__error(r, "task 0x%llx failed with %s (no memory was left to keep "
                "its detail)", (unsigned long long)h, mgpu_err_name(r));
  mgpu__task_unref(p, t, NULL); /* the hold this wait claimed */
  return r;
}

int mgpu_pool_wait(mgpu_pool *ph, mgpu_task h) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(ph, &p);
  if (rc != 0) return rc;
  rc = pool_wait(p, h);
  mgpu__pool_put(p);
  return rc;
}

int mgpu_pool_release(mgpu_pool *ph, mgpu_task h) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(ph, &p);
  if (rc != 0) return rc;
  mgpu__task *t = NULL;
  rc = claim_hold(p, h, &t);
  if (rc == 0) mgpu__task_unref(p, t, NULL);
  mgpu__pool_put(p);
  return rc;
}

/* Waits until nothing is in flight (also used by destroy). */
void mgpu__pool_drain(mgpu__pool *p) {
  for (int i = 0; i < 200; i++) {
    if (atomic_load_explicit(&p->inflight, memory_order_acquire) == 0) return;
    if (i >= 100) sched_yield();
  }
  for (;;) {
    uint32_t seq = atomic_load_explicit(&p->idle_seq, memory_order_acquire);
    atomic_fetch_add_explicit(&p->idle_waiters, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&p->inflight, memory_order_seq_cst) == 0) {
      atomic_fetch_sub_explicit(&p->idle_waiters, 1, memory_order_relaxed);
      return;
    }
    mgpu__park_wait(&p->idle_seq, seq);
    atomic_fetch_sub_explicit(&p->idle_waiters, 1, memory_order_relaxed);
  }
}

/* Returns (and clears) the first failure, setting the caller's detail. */
int mgpu__pool_take_error(mgpu__pool *p) {
  char detail[256];
  mgpu__mutex_lock(&p->err_lock);
  int r = p->first_err;
  snprintf(detail, sizeof detail, "%s", p->first_detail);
  p->first_err = 0;
  p->first_detail[0] = '\0';
  mgpu__mutex_unlock(&p->err_lock);
  if (r != 0) mgpu__error(r, "%s", detail);
  return r;
}

static int wait_all(mgpu__pool *p);

int mgpu_pool_wait_all(mgpu_pool *h) {
  mgpu__pool *p;
  int rc = mgpu__pool_get(h, &p);
  if (rc != 0) return rc;
  rc = wait_all(p);
  mgpu__pool_put(p);
  return rc;
}

static int wait_all(mgpu__pool *p) {
  int rc = check_not_worker(p, "mgpu_pool_wait_all");
  if (rc != 0) return rc;
  mgpu__pool_drain(p);
  /* Release every handle still held: all their tasks are complete. */
  uint32_t n = atomic_load_explicit(&p->nchunks, memory_order_acquire);
  for (uint32_t c = 0; c < n; c++) {
    mgpu__task *chunk = atomic_load_explicit(&p->chunks[c], memory_order_acquire);
    for (uint32_t i = 0; i < MGPU__TASK_CHUNK; i++) {
      mgpu__task *t = &chunk[i];
      uint64_t h = atomic_load_explicit(&t->hold, memory_order_acquire);
      if (h != 0 &&
          atomic_load_explicit(&t->state, memory_order_acquire) == MGPU__T_DONE)
        release_hold(p, t, h);
    }
  }
  return mgpu__pool_take_error(p);
}
