/* The CUDA variant of examples/mpi_mandelbrot.c's kernel, built into
 * libmgpu-demo-cuda.so and opened by the example with dlopen (demo_cuda.h),
 * so that the example stays plain C and runs where there is no CUDA. One
 * block per row, its threads striding over the row's pixels; the
 * arithmetic uses the round-to-nearest intrinsics in the host variant's
 * order, so that nvcc fuses nothing and every pixel matches the host's. */
#include <cuda_runtime.h>
#include <stdint.h>

/* The layout of struct mandel_args in examples/mpi_mandelbrot.c. */
struct mpi_mandel_args {
  int32_t *pixels; /* rows [row0, row0 + gridDim.x) of the image */
  int row0, width, height, iters;
};

__global__ void mgpu_example_mpi_mandel(mpi_mandel_args a) {
  int row = a.row0 + (int)blockIdx.x;
  double ci = __dadd_rn(-1.2, __ddiv_rn(__dmul_rn(2.4, (double)row),
                                        (double)(a.height - 1)));
  for (int x = (int)threadIdx.x; x < a.width; x += (int)blockDim.x) {
    double cr = __dadd_rn(-2.2, __ddiv_rn(__dmul_rn(3.2, (double)x),
                                          (double)(a.width - 1)));
    double zr = 0, zi = 0;
    int it = 0;
    while (it < a.iters) {
      double zr2 = __dmul_rn(zr, zr), zi2 = __dmul_rn(zi, zi);
      if (!(__dadd_rn(zr2, zi2) <= 4.0)) break;
      double t = __dadd_rn(__dsub_rn(zr2, zi2), cr);
      zi = __dadd_rn(__dmul_rn(__dmul_rn(2.0, zr), zi), ci);
      zr = t;
      it++;
    }
    a.pixels[(size_t)blockIdx.x * (size_t)a.width + (size_t)x] = it;
  }
}

/* The kernel's host stub, for mgpu_kernel.cuda_fn. */
extern "C" __attribute__((visibility("default"))) const void *
mgpu_example_mpi_mandel_cuda_fn(void) {
  return (const void *)mgpu_example_mpi_mandel;
}
