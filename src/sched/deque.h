/* A Chase–Lev work-stealing deque of pointers (Chase and Lev, SPAA 2005),
 * with the C11 memory orders of Lê, Pop, Cohen and Zappa Nardelli, "Correct
 * and Efficient Work-Stealing for Weak Memory Models" (PPoPP 2013).
 *
 * One owner thread pushes and pops at the bottom (LIFO, no atomic
 * read-modify-write except when taking the last element); any thread steals
 * at the top (FIFO, one CAS). The array grows when full; old arrays are kept
 * until the deque is destroyed, because a thief may still be reading one.
 *
 * The two seq_cst fences of the paper are written as seq_cst accesses to
 * top and bottom instead, so that ThreadSanitizer, which does not model
 * stand-alone fences, sees the same ordering the hardware gets. Slots are
 * atomics for the same reason: a thief reads a slot the owner may be
 * rewriting, and throws the value away when its CAS fails. */
#ifndef MGPU_SCHED_DEQUE_H
#define MGPU_SCHED_DEQUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mgpu__deque_array {
  int64_t cap; /* a power of two */
  struct mgpu__deque_array *older; /* owner only: retired arrays */
  _Atomic(void *) slot[];
} mgpu__deque_array;

typedef struct mgpu__deque {
  /* top: stolen from; changed by CAS (thieves, and the owner taking the
   * last element). bottom: written by the owner only. Kept on separate
   * cache lines so thieves polling top do not slow the owner's bottom. */
  _Alignas(64) _Atomic int64_t top;
  _Alignas(64) _Atomic int64_t bottom;
  _Atomic(mgpu__deque_array *) array;
} mgpu__deque;

/* Returns 0 or MGPU_ENOMEM. */
int mgpu__deque_init(mgpu__deque *q, int64_t cap);
void mgpu__deque_destroy(mgpu__deque *q);

/* Owner only. push returns 0 or MGPU_ENOMEM (growing failed; nothing
 * changed). */
int mgpu__deque_push(mgpu__deque *q, void *item);
void *mgpu__deque_pop(mgpu__deque *q);

/* Any thread. NULL when empty or when it lost a race (retry elsewhere). */
void *mgpu__deque_steal(mgpu__deque *q);

/* Approximate number of elements (any thread). */
static inline int64_t mgpu__deque_size(mgpu__deque *q) {
  int64_t b = atomic_load_explicit(&q->bottom, memory_order_relaxed);
  int64_t t = atomic_load_explicit(&q->top, memory_order_relaxed);
  return b > t ? b - t : 0;
}

#endif /* MGPU_SCHED_DEQUE_H */
