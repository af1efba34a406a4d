/* Element-wise host loops (see elementwise.h). One macro writes the loop of
 * each op once; it is expanded for three aliasing cases so that the
 * compiler may vectorize the common ones: disjoint ranges (every pointer
 * restrict), accumulation (dst == a), and anything else (no restrict). */
#include <stdint.h>

#include "util/elementwise.h"

/* U is the type sums and products are taken in: T itself for floating
 * point, the unsigned type of the same width for integers, so that an
 * integer sum that overflows wraps instead of being undefined behaviour. */
#define EW_LOOPS(T, U, D, A, B, n, op)                                     \
  switch (op) {                                                            \
    case MGPU_SUM:                                                         \
      for (size_t i = 0; i < n; i++) D[i] = (T)((U)A[i] + (U)B[i]);        \
      break;                                                               \
    case MGPU_PROD:                                                        \
      for (size_t i = 0; i < n; i++) D[i] = (T)((U)A[i] * (U)B[i]);        \
      break;                                                               \
    case MGPU_MIN:                                                         \
      for (size_t i = 0; i < n; i++) D[i] = B[i] < A[i] ? B[i] : A[i];     \
      break;                                                               \
    case MGPU_MAX:                                                         \
      for (size_t i = 0; i < n; i++) D[i] = B[i] > A[i] ? B[i] : A[i];     \
      break;                                                               \
  }

#define DEF_EW(T, U, NAME)                                                 \
  static void disjoint_##NAME(T *restrict d, const T *restrict a,          \
                              const T *restrict b, size_t n, mgpu_op op) { \
    EW_LOOPS(T, U, d, a, b, n, op)                                         \
  }                                                                        \
  static void acc_##NAME(T *restrict d, const T *restrict b, size_t n,     \
                         mgpu_op op) {                                     \
    EW_LOOPS(T, U, d, d, b, n, op)                                         \
  }                                                                        \
  static void any_##NAME(T *d, const T *a, const T *b, size_t n,           \
                         mgpu_op op) {                                     \
    EW_LOOPS(T, U, d, a, b, n, op)                                         \
  }                                                                        \
  static void ew_##NAME(void *d, const void *a, const void *b, size_t n,   \
                        size_t esz, mgpu_op op) {                          \
    if (d == a && !overlap(d, b, n * esz))                                 \
      acc_##NAME(d, b, n, op);                                             \
    else if (!overlap(d, a, n * esz) && !overlap(d, b, n * esz))           \
      disjoint_##NAME(d, a, b, n, op);                                     \
    else                                                                   \
      any_##NAME(d, a, b, n, op);                                          \
  }

/* 1 when [x, x + size) and [y, y + size) share a byte. */
static int overlap(const void *x, const void *y, size_t size) {
  uintptr_t p = (uintptr_t)x, q = (uintptr_t)y;
  return p < q + size && q < p + size;
}

DEF_EW(float, float, f32)
DEF_EW(double, double, f64)
DEF_EW(int32_t, uint32_t, i32)
DEF_EW(int64_t, uint64_t, i64)

void mgpu__elementwise_host(void *dst, const void *a, const void *b,
                            size_t count, mgpu_dtype dtype, mgpu_op op) {
  if (count == 0) return;
  switch (dtype) {
    case MGPU_FLOAT32: ew_f32(dst, a, b, count, sizeof(float), op); break;
    case MGPU_FLOAT64: ew_f64(dst, a, b, count, sizeof(double), op); break;
    case MGPU_INT32: ew_i32(dst, a, b, count, sizeof(int32_t), op); break;
    case MGPU_INT64: ew_i64(dst, a, b, count, sizeof(int64_t), op); break;
    default: break;
  }
}
