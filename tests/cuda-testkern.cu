/* Kernels and CUDA helpers for tests/test-cuda.c, built into
 * libmgpu-cuda-testkern.so with the shared CUDA runtime. The test is plain C
 * and opens this library with dlopen, so the test suite builds and runs
 * (skipping) where there is no GPU.
 *
 * Each kernel comes as an mgpu_kernel descriptor with a host variant too, so
 * the same descriptor works on host devices.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "mgpu.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

/* y[i] += k * x[i] */
struct tk_axpy_args {
  float *y;
  const float *x;
  float k;
  unsigned n;
};

__global__ void tk_axpy(struct tk_axpy_args a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < a.n) a.y[i] += a.k * a.x[i];
}

static void tk_axpy_host(const mgpu_kernel_ctx *ctx, const void *args) {
  const tk_axpy_args *a = (const tk_axpy_args *)args;
  for (unsigned t = 0; t < ctx->block_dim.x; t++) {
    unsigned i = ctx->block_idx.x * ctx->block_dim.x + t;
    if (i < a->n) a->y[i] += a->k * a->x[i];
  }
}

EXPORT const mgpu_kernel tk_axpy_kernel = {"tk_axpy", tk_axpy_host,
                                           (const void *)tk_axpy, NULL};

/* Spins for about `cycles` clock cycles, then writes value to *flag: a kernel
 * slow enough that a missing wait would be seen. */
struct tk_slow_write_args {
  volatile int *flag;
  long long cycles;
  int value;
};

__global__ void tk_slow_write(struct tk_slow_write_args a) {
  long long start = clock64();
  while (clock64() - start < a.cycles) {
  }
  __threadfence_system();
  *a.flag = a.value;
  __threadfence_system();
}

EXPORT const mgpu_kernel tk_slow_write_kernel = {"tk_slow_write", NULL,
                                                 (const void *)tk_slow_write, NULL};

/* dst[0] = *src: reads what another stream wrote. */
struct tk_read_args {
  int *dst;
  const volatile int *src;
};

__global__ void tk_read(struct tk_read_args a) { a.dst[0] = *a.src; }

EXPORT const mgpu_kernel tk_read_kernel = {"tk_read", NULL,
                                           (const void *)tk_read, NULL};

/* Writes through a bad pointer: an asynchronous error. */
struct tk_fault_args {
  int *bad;
};

__global__ void tk_fault(struct tk_fault_args a) { a.bad[threadIdx.x] = 1; }

EXPORT const mgpu_kernel tk_fault_kernel = {"tk_fault", NULL,
                                            (const void *)tk_fault, NULL};

struct tk_empty_args {
  int unused;
};

__global__ void tk_empty(struct tk_empty_args) {}

EXPORT const mgpu_kernel tk_empty_kernel = {"tk_empty", NULL,
                                            (const void *)tk_empty, NULL};

/* The CUDA device current on the calling thread, or -1. */
EXPORT int tk_current_device(void) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) return -1;
  return dev;
}

/* The user's own CUDA code: allocates, launches <<<>>>, copies back and
 * checks. Returns the CUDA device the memory landed on, or -1 on failure. */
EXPORT int tk_user_code(void) {
  const unsigned n = 1000;
  float host[1000], *x = NULL, *y = NULL;
  for (unsigned i = 0; i < n; i++) host[i] = (float)i;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) return -1;
  if (cudaMalloc(&y, n * sizeof(float)) != cudaSuccess) return -1;
  cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(y, 0, n * sizeof(float));
  tk_axpy_args a = {y, x, 2.0f, n};
  tk_axpy<<<(n + 127) / 128, 128>>>(a);
  cudaMemcpy(host, y, n * sizeof(float), cudaMemcpyDeviceToHost);
  int ok = cudaDeviceSynchronize() == cudaSuccess;
  for (unsigned i = 0; i < n; i++) ok = ok && host[i] == 2.0f * (float)i;
  cudaPointerAttributes attr;
  memset(&attr, 0, sizeof attr);
  int dev = -1;
  if (cudaPointerGetAttributes(&attr, y) == cudaSuccess) dev = attr.device;
  cudaFree(x);
  cudaFree(y);
  return ok ? dev : -1;
}

/* The CUDA device that owns ptr, or -1. */
EXPORT int tk_pointer_device(const void *ptr) {
  cudaPointerAttributes attr;
  memset(&attr, 0, sizeof attr);
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) return -1;
  return attr.device;
}

/* Clock rate in kHz of device dev, so a test can ask for a delay. */
EXPORT int tk_clock_khz(int dev) {
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess)
    return 1000000;
  return khz;
}

/* Each block spins a little, then notes the SM it ran on: used[smid] = 1. */
struct tk_smid_args {
  int *used;
  long long cycles;
};

__global__ void tk_smid(struct tk_smid_args a) {
  long long start = clock64();
  while (clock64() - start < a.cycles) {
  }
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (smid < 1024) a.used[smid] = 1;
  }
}

EXPORT const mgpu_kernel tk_smid_kernel = {"tk_smid", NULL,
                                           (const void *)tk_smid, NULL};
