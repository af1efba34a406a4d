/* The pool's lock-free queues other than the deque: the per-worker inbox (a
 * Treiber stack taken whole, so pops never race each other and ABA cannot
 * arise), the shared MPMC ring of the dynamic policy (Vyukov's bounded
 * queue: each cell carries a sequence number saying whose turn it is), and
 * futex parking. */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdlib.h>

#include "sched/sched-internal.h"
#include "util/fault.h"

void mgpu__inbox_push(_Atomic(mgpu__task *) *inbox, mgpu__task *t) {
  mgpu__task *head = atomic_load_explicit(inbox, memory_order_relaxed);
  do {
    atomic_store_explicit(&t->next, head, memory_order_relaxed);
  } while (!atomic_compare_exchange_weak_explicit(
      inbox, &head, t, memory_order_release, memory_order_relaxed));
}

mgpu__task *mgpu__inbox_take(_Atomic(mgpu__task *) *inbox) {
  if (atomic_load_explicit(inbox, memory_order_relaxed) == NULL) return NULL;
  mgpu__task *t = atomic_exchange_explicit(inbox, NULL, memory_order_acquire);
  /* The stack is newest first; reverse it so tasks run in submit order. */
  mgpu__task *fifo = NULL;
  while (t != NULL) {
    mgpu__task *next = atomic_load_explicit(&t->next, memory_order_relaxed);
    atomic_store_explicit(&t->next, fifo, memory_order_relaxed);
    fifo = t;
    t = next;
  }
  return fifo;
}

int mgpu__ring_init(mgpu__ring *r, size_t cap) {
  r->cells = mgpu__malloc(cap * sizeof *r->cells);
  if (r->cells == NULL) return MGPU_ENOMEM;
  for (size_t i = 0; i < cap; i++) {
    atomic_init(&r->cells[i].seq, i);
    atomic_init(&r->cells[i].task, NULL);
  }
  r->mask = cap - 1;
  atomic_init(&r->enq, 0);
  atomic_init(&r->deq, 0);
  atomic_init(&r->overflow_count, 0);
  mgpu__mutex_init(&r->overflow_lock, MGPU__LOCK_POOL_OVERFLOW);
  r->overflow_head = r->overflow_tail = NULL;
  return 0;
}

void mgpu__ring_destroy(mgpu__ring *r) {
  if (r->cells == NULL) return;
  mgpu__free(r->cells);
  r->cells = NULL;
  mgpu__mutex_destroy(&r->overflow_lock);
}

static int ring_try_push(mgpu__ring *r, mgpu__task *t) {
  size_t pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
  mgpu__ring_cell *c;
  for (;;) {
    c = &r->cells[pos & r->mask];
    size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    intptr_t dif = (intptr_t)seq - (intptr_t)pos;
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->enq, &pos, pos + 1,
                                                memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (dif < 0) {
      return 0; /* full */
    } else {
      pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
    }
  }
  atomic_store_explicit(&c->task, t, memory_order_relaxed);
  atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
  return 1;
}

void mgpu__ring_push(mgpu__ring *r, mgpu__task *t) {
  if (atomic_load_explicit(&r->overflow_count, memory_order_acquire) == 0 &&
      ring_try_push(r, t))
    return;
  /* Slow path: the ring is full (or was). */
  mgpu__mutex_lock(&r->overflow_lock);
  atomic_store_explicit(&t->next, NULL, memory_order_relaxed);
  if (r->overflow_tail)
    atomic_store_explicit(&r->overflow_tail->next, t, memory_order_relaxed);
  else
    r->overflow_head = t;
  r->overflow_tail = t;
  atomic_fetch_add_explicit(&r->overflow_count, 1, memory_order_release);
  mgpu__mutex_unlock(&r->overflow_lock);
}

static mgpu__task *ring_try_pop(mgpu__ring *r) {
  size_t pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
  mgpu__ring_cell *c;
  for (;;) {
    c = &r->cells[pos & r->mask];
    size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    intptr_t dif = (intptr_t)seq - (intptr_t)(pos + 1);
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->deq, &pos, pos + 1,
                                                memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (dif < 0) {
      return NULL; /* empty */
    } else {
      pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
    }
  }
  mgpu__task *t = atomic_load_explicit(&c->task, memory_order_relaxed);
  atomic_store_explicit(&c->seq, pos + r->mask + 1, memory_order_release);
  return t;
}

mgpu__task *mgpu__ring_pop(mgpu__ring *r) {
  mgpu__task *t = ring_try_pop(r);
  if (t != NULL ||
      atomic_load_explicit(&r->overflow_count, memory_order_acquire) == 0)
    return t;
  mgpu__mutex_lock(&r->overflow_lock);
  t = r->overflow_head;
  if (t != NULL) {
    r->overflow_head = atomic_load_explicit(&t->next, memory_order_relaxed);
    if (r->overflow_head == NULL) r->overflow_tail = NULL;
    atomic_fetch_sub_explicit(&r->overflow_count, 1, memory_order_release);
  }
  mgpu__mutex_unlock(&r->overflow_lock);
  return t;
}

int mgpu__ring_empty(mgpu__ring *r) {
  size_t d = atomic_load_explicit(&r->deq, memory_order_acquire);
  size_t e = atomic_load_explicit(&r->enq, memory_order_acquire);
  return d == e &&
         atomic_load_explicit(&r->overflow_count, memory_order_acquire) == 0;
}

/* Futexes rather than a mutex and condition variable: a worker parks on
 * its own word, and a waker that finds no sleeper pays one load, not a
 * lock. All data moves through the atomics above; the futex only sleeps. */
void mgpu__park_wait(_Atomic uint32_t *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL,
          NULL, 0);
}

void mgpu__park_wake(_Atomic uint32_t *word, int count) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL,
          0);
}
