/* The examples' one helper: CHECK(call) prints the failing call, the error's
 * name and mgpu's detail message, and exits 1. A real program would unwind
 * instead; the examples keep to the point. */
#ifndef MGPU_EXAMPLES_CHECK_H
#define MGPU_EXAMPLES_CHECK_H

#include <mgpu.h>
#include <stdio.h>
#include <stdlib.h>

/* What a failed CHECK does after printing (the MPI examples abort every
 * rank instead). */
#ifndef CHECK_FAIL
#define CHECK_FAIL() exit(1)
#endif

#define CHECK(call)                                                          \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ != 0) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,     \
              mgpu_err_name(rc_), mgpu_error_detail());                      \
      CHECK_FAIL();                                                          \
    }                                                                        \
  } while (0)

#endif /* MGPU_EXAMPLES_CHECK_H */
