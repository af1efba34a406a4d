/* The CUDA variant of the Mandelbrot demo's kernel, built into
 * libmgpu-demo-cuda.so and opened by the mgpu command with dlopen (the
 * command stays plain C and runs where there is no CUDA). The arithmetic
 * uses the round-to-nearest intrinsics so that nvcc fuses nothing and each
 * pixel matches the host variant's. */
#include <cuda_runtime.h>

extern "C" {
#include "mandel.h"
}

__global__ void mgpu_demo_mandel(mandel_args a) {
  int tx = blockIdx.x * blockDim.x + threadIdx.x;
  int ty = blockIdx.y * blockDim.y + threadIdx.y;
  int px = a.px0 + tx, py = a.py0 + ty;
  if (tx >= a.tile || ty >= a.tile) return;
  if (px >= a.width || py >= a.height) {
    a.out[ty * a.tile + tx] = 0;
    return;
  }
  double cr = __dadd_rn(a.x0, __dmul_rn((double)px, a.dx));
  double ci = __dadd_rn(a.y0, __dmul_rn((double)py, a.dy));
  double zr = 0, zi = 0;
  int n = 0;
  while (n < a.iters) {
    double zr2 = __dmul_rn(zr, zr), zi2 = __dmul_rn(zi, zi);
    if (__dadd_rn(zr2, zi2) > 4.0) break;
    double t = __dadd_rn(__dsub_rn(zr2, zi2), cr);
    zi = __dadd_rn(__dmul_rn(__dmul_rn(2.0, zr), zi), ci);
    zr = t;
    n++;
  }
  a.out[ty * a.tile + tx] = (uint16_t)n;
}

/* The kernel's host stub, for mgpu_kernel.cuda_fn. */
extern "C" __attribute__((visibility("default"))) const void *
mgpu_demo_mandel_cuda_fn(void) {
  return (const void *)mgpu_demo_mandel;
}
