/* CUDA implementations of the built-in kernels: fill, scale, axpy and
 * element-wise sum, prod, min and max for float, double, int32, int64, half
 * and bfloat16.
 *
 * They compute exactly what the host versions (src/backend/host/kernels.c)
 * compute: scale and axpy in double precision and then converted to the
 * element type, so a result is the same on every backend. half and bfloat16
 * exist only here; they compute in float. Every kernel is a grid-stride loop
 * over 64-bit indices, launched with at most a few thousand blocks.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "cuda-internal.h"
}

namespace {

/* Arithmetic of each element type: to and from the type the host version
 * computes in (double; float for the 16-bit types). */
template <typename T> struct num {
  typedef double wide;
  __device__ static wide up(T v) { return (wide)v; }
  __device__ static T down(wide v) { return (T)v; }
  __device__ static T add(T a, T b) { return a + b; }
  __device__ static T mul(T a, T b) { return a * b; }
  __device__ static bool less(T a, T b) { return a < b; }
};

/* Integers: a value outside the type's range saturates and NaN gives 0, as
 * on the host (src/backend/host/kernels.c). The plain conversion does not:
 * on an H100 it turns NaN into INT_MIN. */
template <> __device__ int32_t num<int32_t>::down(double v) {
  if (v != v) return 0;
  if (v >= 2147483648.0) return INT32_MAX;
  if (v <= -2147483649.0) return INT32_MIN;
  return (int32_t)v;
}

template <> __device__ int64_t num<int64_t>::down(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

template <> struct num<__half> {
  typedef float wide;
  __device__ static wide up(__half v) { return __half2float(v); }
  __device__ static __half down(wide v) { return __float2half_rn(v); }
  __device__ static __half add(__half a, __half b) { return down(up(a) + up(b)); }
  __device__ static __half mul(__half a, __half b) { return down(up(a) * up(b)); }
  __device__ static bool less(__half a, __half b) { return up(a) < up(b); }
};

template <> struct num<__nv_bfloat16> {
  typedef float wide;
  __device__ static wide up(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 down(wide v) { return __float2bfloat16_rn(v); }
  __device__ static __nv_bfloat16 add(__nv_bfloat16 a, __nv_bfloat16 b) {
    return down(up(a) + up(b));
  }
  __device__ static __nv_bfloat16 mul(__nv_bfloat16 a, __nv_bfloat16 b) {
    return down(up(a) * up(b));
  }
  __device__ static bool less(__nv_bfloat16 a, __nv_bfloat16 b) {
    return up(a) < up(b);
  }
};

#define GRID_STRIDE(i, n)                                                  \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

template <typename T> __global__ void fill_kernel(T *dst, size_t n, T v) {
  GRID_STRIDE(i, n) dst[i] = v;
}

template <typename T>
__global__ void scale_kernel(T *dst, size_t n, typename num<T>::wide alpha) {
  GRID_STRIDE(i, n) dst[i] = num<T>::down(num<T>::up(dst[i]) * alpha);
}

template <typename T>
__global__ void axpy_kernel(T *y, const T *x, size_t n,
                            typename num<T>::wide alpha) {
  GRID_STRIDE(i, n)
  y[i] = num<T>::down(num<T>::up(y[i]) + alpha * num<T>::up(x[i]));
}

template <typename T, int OP>
__global__ void ew_kernel(T *dst, const T *a, const T *b, size_t n) {
  GRID_STRIDE(i, n) {
    T x = a[i], y = b[i];
    switch (OP) {
      case MGPU_SUM: dst[i] = num<T>::add(x, y); break;
      case MGPU_PROD: dst[i] = num<T>::mul(x, y); break;
      case MGPU_MIN: dst[i] = num<T>::less(y, x) ? y : x; break;
      case MGPU_MAX: dst[i] = num<T>::less(x, y) ? y : x; break;
    }
  }
}

const unsigned kThreads = 256;
const size_t kMaxBlocks = 4096;

unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return b == 0 ? 1u : (unsigned)b;
}

template <typename T>
cudaError_t run(const mgpu__builtin *k, T value, cudaStream_t s) {
  /* The launch's own error only (read below with cudaGetLastError): not
   * one an earlier call on this thread left behind. */
  (void)cudaGetLastError();
  unsigned g = blocks_for(k->count);
  T *dst = (T *)k->dst;
  const T *a = (const T *)k->a, *b = (const T *)k->b;
  typedef typename num<T>::wide wide;
  switch (k->kind) {
    case MGPU__BUILTIN_FILL:
      fill_kernel<T><<<g, kThreads, 0, s>>>(dst, k->count, value);
      break;
    case MGPU__BUILTIN_SCALE:
      scale_kernel<T><<<g, kThreads, 0, s>>>(dst, k->count, (wide)k->alpha);
      break;
    case MGPU__BUILTIN_AXPY:
      axpy_kernel<T><<<g, kThreads, 0, s>>>(dst, a, k->count, (wide)k->alpha);
      break;
    case MGPU__BUILTIN_ELEMENTWISE:
      switch (k->op) {
        case MGPU_SUM: ew_kernel<T, MGPU_SUM><<<g, kThreads, 0, s>>>(dst, a, b, k->count); break;
        case MGPU_PROD: ew_kernel<T, MGPU_PROD><<<g, kThreads, 0, s>>>(dst, a, b, k->count); break;
        case MGPU_MIN: ew_kernel<T, MGPU_MIN><<<g, kThreads, 0, s>>>(dst, a, b, k->count); break;
        case MGPU_MAX: ew_kernel<T, MGPU_MAX><<<g, kThreads, 0, s>>>(dst, a, b, k->count); break;
        default: return cudaErrorInvalidValue;
      }
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t mgpu__cuda_builtin_launch(const mgpu__builtin *b,
                                                 cudaStream_t s) {
  if (b->count == 0) return cudaSuccess;
  switch (b->dtype) {
    case MGPU_FLOAT32: return run<float>(b, b->value.f32, s);
    case MGPU_FLOAT64: return run<double>(b, b->value.f64, s);
    case MGPU_INT32: return run<int32_t>(b, b->value.i32, s);
    case MGPU_INT64: return run<int64_t>(b, b->value.i64, s);
    case MGPU_FLOAT16: {
      __half_raw r;
      r.x = b->value.bits16;
      return run<__half>(b, __half(r), s);
    }
    case MGPU_BFLOAT16: {
      __nv_bfloat16_raw r;
      r.x = b->value.bits16;
      return run<__nv_bfloat16>(b, __nv_bfloat16(r), s);
    }
    default: return cudaErrorInvalidValue;
  }
}
