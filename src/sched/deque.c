/* Chase–Lev deque: see deque.h for the algorithm and its sources. Comments
 * below name the step of Lê et al. each access corresponds to. */
#include "sched/deque.h"

#include <stdlib.h>

#include "mgpu/error.h"
#include "util/fault.h"

static mgpu__deque_array *array_new(int64_t cap) {
  mgpu__deque_array *a =
      mgpu__malloc(sizeof *a + (size_t)cap * sizeof(_Atomic(void *)));
  if (a == NULL) return NULL;
  a->cap = cap;
  a->older = NULL;
  for (int64_t i = 0; i < cap; i++)
    atomic_init(&a->slot[i], NULL);
  return a;
}

int mgpu__deque_init(mgpu__deque *q, int64_t cap) {
  int64_t c = 16;
  while (c < cap) c *= 2;
  mgpu__deque_array *a = array_new(c);
  if (a == NULL) return MGPU_ENOMEM;
  atomic_init(&q->top, 0);
  atomic_init(&q->bottom, 0);
  atomic_init(&q->array, a);
  return 0;
}

void mgpu__deque_destroy(mgpu__deque *q) {
  mgpu__deque_array *a = atomic_load_explicit(&q->array, memory_order_relaxed);
  while (a != NULL) {
    mgpu__deque_array *older = a->older;
    mgpu__free(a);
    a = older;
  }
  atomic_store_explicit(&q->array, NULL, memory_order_relaxed);
}

/* Copies the live elements [t, b) into an array twice as large. The old
 * one stays readable for thieves that loaded it before the swap. */
static mgpu__deque_array *grow(mgpu__deque *q, mgpu__deque_array *a,
                               int64_t t, int64_t b) {
  mgpu__deque_array *n = array_new(a->cap * 2);
  if (n == NULL) return NULL;
  for (int64_t i = t; i < b; i++) {
    void *x = atomic_load_explicit(&a->slot[i & (a->cap - 1)],
                                   memory_order_relaxed);
    atomic_store_explicit(&n->slot[i & (n->cap - 1)], x, memory_order_relaxed);
  }
  n->older = a;
  atomic_store_explicit(&q->array, n, memory_order_release);
  return n;
}

int mgpu__deque_push(mgpu__deque *q, void *item) {
  int64_t b = atomic_load_explicit(&q->bottom, memory_order_relaxed);
  int64_t t = atomic_load_explicit(&q->top, memory_order_acquire);
  mgpu__deque_array *a = atomic_load_explicit(&q->array, memory_order_relaxed);
  if (b - t > a->cap - 1) {
    a = grow(q, a, t, b);
    if (a == NULL) return MGPU_ENOMEM;
  }
  atomic_store_explicit(&a->slot[b & (a->cap - 1)], item,
                        memory_order_relaxed);
  /* The paper's release fence + relaxed store: publishes the slot (and the
   * task it points to) to a thief that reads bottom with acquire. */
  atomic_store_explicit(&q->bottom, b + 1, memory_order_release);
  return 0;
}

/* The stores that put bottom back are release rather than the paper's
 * relaxed: free on x86 and ARMv8 (stlr), and a thief that reads one of
 * them then still synchronizes with the push that wrote its slot, which is
 * what lets ThreadSanitizer prove the task's fields were published. */
void *mgpu__deque_pop(mgpu__deque *q) {
  int64_t b = atomic_load_explicit(&q->bottom, memory_order_relaxed) - 1;
  mgpu__deque_array *a = atomic_load_explicit(&q->array, memory_order_relaxed);
  /* store bottom; seq_cst fence; load top  ==  two seq_cst accesses. */
  atomic_store_explicit(&q->bottom, b, memory_order_seq_cst);
  int64_t t = atomic_load_explicit(&q->top, memory_order_seq_cst);
  void *x = NULL;
  if (t <= b) {
    x = atomic_load_explicit(&a->slot[b & (a->cap - 1)], memory_order_relaxed);
    if (t == b) {
      /* The last element: race the thieves for it on top. */
      if (!atomic_compare_exchange_strong_explicit(
              &q->top, &t, t + 1, memory_order_seq_cst, memory_order_relaxed))
        x = NULL;
      atomic_store_explicit(&q->bottom, b + 1, memory_order_release);
    }
  } else {
    atomic_store_explicit(&q->bottom, b + 1, memory_order_release);
  }
  return x;
}

void *mgpu__deque_steal(mgpu__deque *q) {
  /* load top; seq_cst fence; load bottom  ==  two seq_cst loads (the
   * acquire in them also makes the owner's slot and task writes visible). */
  int64_t t = atomic_load_explicit(&q->top, memory_order_seq_cst);
  int64_t b = atomic_load_explicit(&q->bottom, memory_order_seq_cst);
  if (t >= b) return NULL;
  mgpu__deque_array *a = atomic_load_explicit(&q->array, memory_order_acquire);
  void *x = atomic_load_explicit(&a->slot[t & (a->cap - 1)],
                                 memory_order_relaxed);
  if (!atomic_compare_exchange_strong_explicit(
          &q->top, &t, t + 1, memory_order_seq_cst, memory_order_relaxed))
    return NULL;
  return x;
}
