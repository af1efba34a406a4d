/* Failing each allocation of one call in turn: what proves that a backend's
 * allocations go through the allocation seam (src/util/fault.h), so that
 * the fault sweep reaches them. */
#ifndef MGPU_TEST_ALLOC_SWEEP_H
#define MGPU_TEST_ALLOC_SWEEP_H

#include <string.h>

#include "task.h"
#include "util/fault.h"

/* call(arg) makes some allocations and returns 0, or an error with nothing
 * left behind and its outputs as they were; undo(arg) releases what a
 * successful call made. Runs call once with no rule, counting its
 * allocations, then once per allocation with that one failing: each run
 * must fail with MGPU_ENOMEM (call checks its outputs itself). Returns how
 * many of the failures had text in their detail; the rules are cleared. */
static inline int test_alloc_sweep(int (*call)(void *), void (*undo)(void *),
                                   void *arg, const char *text) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(call(arg));
  uint64_t calls = mgpu__fault_calls(MGPU__FAULT_ALLOC);
  undo(arg);
  ASSERT(calls > 0);
  int found = 0;
  for (uint64_t n = 1; n <= calls; n++) {
    char spec[32];
    snprintf(spec, sizeof spec, "alloc:%llu", (unsigned long long)n);
    ASSERT_OK(mgpu__fault_set(spec, NULL, 0));
    ASSERT_ERR(MGPU_ENOMEM, call(arg));
    found += strstr(mgpu_error_detail(), text) != NULL;
  }
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  return found;
}

#endif /* MGPU_TEST_ALLOC_SWEEP_H */
