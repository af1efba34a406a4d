/* Host implementations of the built-in kernels: fill, scale, axpy and
 * element-wise sum, prod, min and max for float, double, int32 and int64,
 * and for float16 and bfloat16 (computed in float or double, each result
 * rounded to the 16-bit type: the platform's conversions, util/half.h).
 *
 * One macro writes each loop once per type, so the four types cannot drift
 * apart. The loops are plain and contiguous, which lets the compiler
 * vectorize them. The element-wise loops are the platform's
 * (src/util/elementwise.c), shared with the collectives' host reductions. */
#include <stdint.h>

#include "backend/host/host-internal.h"
#include "util/elementwise.h"
#include "util/half.h"

/* The result of scale and axpy is computed in double and converted back.
 * For integers a value outside the type's range would be undefined
 * behaviour: it saturates instead, and NaN gives 0; the CUDA and OpenCL
 * kernels convert the same way. For floating point the conversion is
 * IEEE (too large is infinity). */
static inline float to_f32(double x) { return (float)x; }
static inline double to_f64(double x) { return x; }
static inline int32_t to_i32(double x) {
  if (x != x) return 0;
  if (x >= 2147483648.0) return INT32_MAX;
  if (x <= -2147483649.0) return INT32_MIN;
  return (int32_t)x;
}
static inline int64_t to_i64(double x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0) return INT64_MAX;
  if (x < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)x;
}

#define DEFINE_KERNELS(T, SUFFIX)                                         \
  static void fill_##SUFFIX(T *dst, size_t n, T v) {                         \
    for (size_t i = 0; i < n; i++) dst[i] = v;                               \
  }                                                                          \
  static void scale_##SUFFIX(T *dst, size_t n, double alpha) {               \
    for (size_t i = 0; i < n; i++) dst[i] = to_##SUFFIX(dst[i] * alpha);     \
  }                                                                          \
  static void axpy_##SUFFIX(T *y, const T *x, size_t n, double alpha) {      \
    for (size_t i = 0; i < n; i++)                                           \
      y[i] = to_##SUFFIX((double)y[i] + alpha * (double)x[i]);               \
  }                                                                          \
  static void run_##SUFFIX(const mgpu__builtin *k, T value) {                \
    switch (k->kind) {                                                       \
      case MGPU__BUILTIN_FILL:                                               \
        fill_##SUFFIX(k->dst, k->count, value);                              \
        break;                                                               \
      case MGPU__BUILTIN_SCALE:                                              \
        scale_##SUFFIX(k->dst, k->count, k->alpha);                          \
        break;                                                               \
      case MGPU__BUILTIN_AXPY:                                               \
        axpy_##SUFFIX(k->dst, k->a, k->count, k->alpha);                     \
        break;                                                               \
      default: /* element-wise: mgpu__host_builtin_run */                   \
        break;                                                               \
    }                                                                        \
  }

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(int32_t, i32)
DEFINE_KERNELS(int64_t, i64)

/* The 16-bit types: stored as bits; scale and axpy compute in float with
 * alpha as a float, as the CUDA kernels do (src/backend/cuda/kernels.cu),
 * and round each result to the type. */
#define DEFINE_KERNELS16(SUFFIX, TO_F, FROM_F)                             \
  static void run_##SUFFIX(const mgpu__builtin *k) {                         \
    uint16_t *d = k->dst;                                                    \
    const uint16_t *x = k->a;                                                \
    switch (k->kind) {                                                       \
      case MGPU__BUILTIN_FILL:                                               \
        for (size_t i = 0; i < k->count; i++) d[i] = k->value.bits16;        \
        break;                                                               \
      case MGPU__BUILTIN_SCALE:                                              \
        for (size_t i = 0; i < k->count; i++)                                \
          d[i] = FROM_F(TO_F(d[i]) * (float)k->alpha);                       \
        break;                                                               \
      case MGPU__BUILTIN_AXPY:                                               \
        for (size_t i = 0; i < k->count; i++)                                \
          d[i] = FROM_F(TO_F(d[i]) + (float)k->alpha * TO_F(x[i]));          \
        break;                                                               \
      default: /* element-wise: mgpu__host_builtin_run */                   \
        break;                                                               \
    }                                                                        \
  }

DEFINE_KERNELS16(f16, mgpu__half_to_float, mgpu__float_to_half)
DEFINE_KERNELS16(bf16, mgpu__bf16_to_float, mgpu__float_to_bf16)

void mgpu__host_builtin_run(const mgpu__builtin *b) {
  if (b->kind == MGPU__BUILTIN_ELEMENTWISE) { /* every type: the platform's */
    mgpu__elementwise_host(b->dst, b->a, b->b, b->count, b->dtype, b->op);
    return;
  }
  switch (b->dtype) {
    case MGPU_FLOAT32: run_f32(b, b->value.f32); break;
    case MGPU_FLOAT64: run_f64(b, b->value.f64); break;
    case MGPU_INT32: run_i32(b, b->value.i32); break;
    case MGPU_INT64: run_i64(b, b->value.i64); break;
    case MGPU_FLOAT16: run_f16(b); break;
    case MGPU_BFLOAT16: run_bf16(b); break;
    default: break; /* refused by the core before it gets here */
  }
}
