/* The slot table of a pool's tasks and its free list, and the batches a
 * worker hands back (freed slots, completions, metrics).
 *
 * The table only grows, in chunks of MGPU__TASK_CHUNK slots, so a task's
 * address and index stay valid for the life of the pool. Free slots form a
 * Treiber stack of slot indices; its head carries a tag that changes on
 * every successful CAS, so a pop that read a stale next cannot succeed
 * (ABA). Taking a slot is one CAS; only growing takes a lock. */
#include <stdlib.h>

#include "sched/sched-internal.h"
#include "util/fault.h"

mgpu__task *mgpu__task_at(mgpu__pool *p, uint32_t idx) {
  uint32_t c = idx / MGPU__TASK_CHUNK;
  if (c >= atomic_load_explicit(&p->nchunks, memory_order_acquire))
    return NULL;
  mgpu__task *chunk = atomic_load_explicit(&p->chunks[c], memory_order_acquire);
  return chunk + idx % MGPU__TASK_CHUNK;
}

/* Pushes the chain first .. last (linked through next_free) on the free
 * list. The tag changes on every successful CAS, push or pop, so a pop that
 * read a stale next_free cannot succeed (ABA). */
static void free_push(mgpu__pool *p, mgpu__task *first, mgpu__task *last) {
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_relaxed);
  uint64_t next;
  do {
    atomic_store_explicit(&last->next_free, (uint32_t)head,
                          memory_order_relaxed);
    next = ((head >> 32) + 1) << 32 | (uint64_t)(first->idx + 1);
  } while (!atomic_compare_exchange_weak_explicit(
      &p->free_head, &head, next, memory_order_release, memory_order_relaxed));
}

static mgpu__task *free_pop(mgpu__pool *p) {
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_acquire);
  for (;;) {
    uint32_t top = (uint32_t)head;
    if (top == 0) return NULL;
    mgpu__task *t = mgpu__task_at(p, top - 1);
    uint32_t below = atomic_load_explicit(&t->next_free, memory_order_relaxed);
    uint64_t next = ((head >> 32) + 1) << 32 | below;
    if (atomic_compare_exchange_weak_explicit(&p->free_head, &head, next,
                                              memory_order_acquire,
                                              memory_order_acquire))
      return t;
  }
}

/* Adds a chunk of slots (slow path, under grow_lock) and returns one. */
static mgpu__task *grow(mgpu__pool *p) {
  mgpu__mutex_lock(&p->grow_lock);
  mgpu__task *t = free_pop(p); /* another thread may have grown it */
  if (t != NULL) goto out;
  uint32_t c = atomic_load_explicit(&p->nchunks, memory_order_relaxed);
  if (c == MGPU__TASK_MAX_CHUNKS) goto out;
  mgpu__task *chunk = mgpu__calloc(MGPU__TASK_CHUNK, sizeof *chunk);
  if (chunk == NULL) goto out;
  for (uint32_t i = 0; i < MGPU__TASK_CHUNK; i++) {
    chunk[i].idx = c * MGPU__TASK_CHUNK + i;
    atomic_init(&chunk[i].gen, 1);
    if (i + 1 < MGPU__TASK_CHUNK)
      atomic_init(&chunk[i].next_free, chunk[i].idx + 2);
  }
  atomic_store_explicit(&p->chunks[c], chunk, memory_order_release);
  atomic_store_explicit(&p->nchunks, c + 1, memory_order_release);
  /* Keep slot 0 of the chunk, put 1 .. CHUNK-1 on the free list. */
  free_push(p, &chunk[1], &chunk[MGPU__TASK_CHUNK - 1]);
  t = &chunk[0];
out:
  mgpu__mutex_unlock(&p->grow_lock);
  return t;
}

int mgpu__task_table_init(mgpu__pool *p) {
  mgpu__mutex_init(&p->grow_lock, MGPU__LOCK_POOL_GROW);
  mgpu__mutex_init(&p->err_lock, MGPU__LOCK_POOL_ERR);
  atomic_init(&p->nchunks, 0);
  atomic_init(&p->free_head, 0);
  for (int i = 0; i < MGPU__TASK_MAX_CHUNKS; i++)
    atomic_init(&p->chunks[i], NULL);
  mgpu__task *t = grow(p);
  if (t == NULL) {
    mgpu__mutex_destroy(&p->err_lock);
    mgpu__mutex_destroy(&p->grow_lock);
    return mgpu__error(MGPU_ENOMEM, "task pool: no memory for task slots");
  }
  free_push(p, t, t);
  return 0;
}

/* Frees what a finished task still holds, outside its slot. */
static void task_scrub(mgpu__task *t) {
  if (t->args != NULL && t->args != t->args_inline) mgpu__free(t->args);
  t->args = NULL;
  mgpu__free(t->edges_heap);
  t->edges_heap = NULL;
  mgpu__free(t->detail);
  t->detail = NULL;
}

void mgpu__task_table_destroy(mgpu__pool *p) {
  uint32_t n = atomic_load_explicit(&p->nchunks, memory_order_acquire);
  for (uint32_t c = 0; c < n; c++) {
    mgpu__task *chunk = atomic_load_explicit(&p->chunks[c], memory_order_relaxed);
    for (uint32_t i = 0; i < MGPU__TASK_CHUNK; i++) task_scrub(&chunk[i]);
    mgpu__free(chunk);
  }
  mgpu__mutex_destroy(&p->err_lock);
  mgpu__mutex_destroy(&p->grow_lock);
}

/* Drops a reference; the last one frees the slot. A worker keeps the
 * slots it frees in a local chain and hands them back in batches (see
 * mgpu__worker_flush): one CAS on the shared free list per batch instead of
 * one per task, which is where submitter and workers collide most. */
void mgpu__task_unref(mgpu__pool *p, mgpu__task *t, mgpu__worker *self) {
  if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
    return;
  task_scrub(t);
  atomic_fetch_add_explicit(&t->gen, 1, memory_order_relaxed);
  if (self == NULL) {
    free_push(p, t, t);
    return;
  }
  atomic_store_explicit(&t->next_free,
                        self->free_first ? self->free_first->idx + 1 : 0,
                        memory_order_relaxed);
  if (self->free_first == NULL) self->free_last = t;
  self->free_first = t;
  if (++self->free_count >= MGPU__FLUSH_BATCH) mgpu__worker_flush(self);
}

/* Counts n tasks as no longer in flight; the last one wakes wait_all. */
void mgpu__inflight_done(mgpu__pool *p, int64_t n) {
  if (atomic_fetch_sub_explicit(&p->inflight, n, memory_order_seq_cst) == n &&
      atomic_load_explicit(&p->idle_waiters, memory_order_seq_cst) > 0) {
    atomic_fetch_add_explicit(&p->idle_seq, 1, memory_order_release);
    mgpu__park_wake(&p->idle_seq, 1 << 30);
  }
}

void mgpu__worker_flush(mgpu__worker *w) {
  mgpu__pool *p = w->pool;
  if (w->free_first != NULL) {
    free_push(p, w->free_first, w->free_last);
    w->free_first = w->free_last = NULL;
    w->free_count = 0;
  }
  /* Metrics before the in-flight count, so that a snapshot taken after
   * wait_all returns sees every task it waited for. */
  if (w->pending_run) {
    mgpu__metric_add(w->dev, MGPU__M_tasks_run, w->pending_run);
    mgpu__metric_add(w->dev, MGPU__M_busy_ns, w->pending_busy);
    w->pending_run = w->pending_busy = 0;
  }
  if (w->pending_stolen) {
    mgpu__metric_add(w->dev, MGPU__M_tasks_stolen, w->pending_stolen);
    w->pending_stolen = 0;
  }
  if (w->pending_done) {
    int64_t n = w->pending_done;
    w->pending_done = 0;
    mgpu__inflight_done(p, n);
  }
}

mgpu__task *mgpu__task_alloc(mgpu__pool *p) {
  mgpu__task *t = free_pop(p);
  return t != NULL ? t : grow(p);
}
