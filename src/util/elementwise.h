/* Element-wise host loops over raw memory: dst = a op b for the types the
 * built-in kernels and the collectives reduce (float, double, int32, int64,
 * float16 and bfloat16, the last two through float with each result
 * correctly rounded) and the four ops. Written once, here, for the host backend's
 * built-in kernel (src/backend/host/kernels.c) and the collectives' host
 * reductions (src/coll/). Integer sums and products wrap (computed
 * unsigned), as on GPUs. */
#ifndef MGPU_UTIL_ELEMENTWISE_H
#define MGPU_UTIL_ELEMENTWISE_H

#include <stddef.h>

#include "mgpu/core.h"

/* dst[i] = a[i] op b[i] for i < count. dst may be a (an accumulation) or
 * overlap a or b in any way; the loops for dst == a and for disjoint ranges
 * are the ones the compiler vectorizes best. An unknown type does nothing
 * (the callers refuse it first). */
void mgpu__elementwise_host(void *dst, const void *a, const void *b,
                            size_t count, mgpu_dtype dtype, mgpu_op op);

#endif /* MGPU_UTIL_ELEMENTWISE_H */
