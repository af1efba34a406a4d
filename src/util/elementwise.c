/* Element-wise host loops (see elementwise.h). One macro writes the loop of
 * each op once; it is expanded for three aliasing cases so that the
 * compiler may vectorize the common ones: disjoint ranges (every pointer
 * restrict), accumulation (dst == a), and anything else (no restrict). */
#include <stdint.h>

#include "util/elementwise.h"
#include "util/half.h"

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

/* The 16-bit types: each element is widened to float (exactly), combined,
 * and rounded back to nearest even, so every step of a reduction is
 * correctly rounded, as the MPI module's operators round (src/mpi/init.c,
 * the same conversions). Element by element, so any overlap of dst with a
 * or b is safe. */
#define DEF_EW16(NAME, TO_F, FROM_F)                                       \
  static void ew_##NAME(void *dst, const void *av, const void *bv,         \
                        size_t n, mgpu_op op) {                            \
    uint16_t *d = dst;                                                     \
    const uint16_t *a = av, *b = bv;                                       \
    for (size_t i = 0; i < n; i++) {                                       \
      float x = TO_F(a[i]), y = TO_F(b[i]), r;                             \
      switch (op) {                                                        \
        case MGPU_SUM: r = x + y; break;                                   \
        case MGPU_PROD: r = x * y; break;                                  \
        case MGPU_MIN: r = y < x ? y : x; break;                           \
        default: r = y > x ? y : x; break;                                 \
      }                                                                    \
      d[i] = FROM_F(r);                                                    \
    }                                                                      \
  }

DEF_EW16(f16, mgpu__half_to_float, mgpu__float_to_half)
DEF_EW16(bf16, mgpu__bf16_to_float, mgpu__float_to_bf16)

void mgpu__elementwise_host(void *dst, const void *a, const void *b,
                            size_t count, mgpu_dtype dtype, mgpu_op op) {
  if (count == 0) return;
  switch (dtype) {
    case MGPU_FLOAT32: ew_f32(dst, a, b, count, sizeof(float), op); break;
    case MGPU_FLOAT64: ew_f64(dst, a, b, count, sizeof(double), op); break;
    case MGPU_INT32: ew_i32(dst, a, b, count, sizeof(int32_t), op); break;
    case MGPU_INT64: ew_i64(dst, a, b, count, sizeof(int64_t), op); break;
    case MGPU_FLOAT16: ew_f16(dst, a, b, count, op); break;
    case MGPU_BFLOAT16: ew_bf16(dst, a, b, count, op); break;
    default: break;
  }
}
