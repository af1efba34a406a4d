/* The CUDA variant of the Jacobi example's kernel (examples/jacobi.h),
 * built into libmgpu-demo-cuda.so and opened by jacobi.h with dlopen, so
 * that the example and `mgpu bench graph` stay plain C and run where there
 * is no CUDA. Each thread takes cells in a grid-stride loop; the arithmetic
 * uses the round-to-nearest intrinsics, in the host variant's order, so
 * that nvcc fuses nothing and every cell matches the host's. */
#include <cuda_runtime.h>

/* The layout of jacobi_args in examples/jacobi.h. */
struct jacobi_cuda_args {
  const float *in;
  float *out;
  int nx, rows;
};

__global__ void mgpu_demo_jacobi(jacobi_cuda_args a) {
  size_t cols = a.nx > 2 ? (size_t)(a.nx - 2) : 0;
  size_t cells = cols * (size_t)a.rows;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < cells;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = 1 + i / cols, c = 1 + i % cols;
    const float *p = a.in + r * (size_t)a.nx + c;
    float s = __fadd_rn(__fadd_rn(__fadd_rn(p[-a.nx], p[a.nx]), p[-1]), p[1]);
    a.out[r * (size_t)a.nx + c] = __fmul_rn(0.25f, s);
  }
}

/* The kernel's host stub, for mgpu_kernel.cuda_fn. */
extern "C" __attribute__((visibility("default"))) const void *
mgpu_demo_jacobi_cuda_fn(void) {
  return (const void *)mgpu_demo_jacobi;
}
