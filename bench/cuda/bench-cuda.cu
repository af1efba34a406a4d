/* mgpu-bench-cuda: mgpu on a CUDA device next to bare CUDA, in one run.
 *
 * The mgpu command links no CUDA code, so the baselines that need the CUDA
 * runtime live in this separate program (built only with the toolkit). It
 * prints the one JSON shape of every benchmark (--json) or a table:
 *  - pinned H2D, D2H and D2D copies through mgpu (async on a stream + sync)
 *    next to plain cudaMemcpy from pageable memory, and next to a bare
 *    cudaMemcpyAsync of the same pinned buffers (what mgpu adds);
 *  - mgpu_launch of an empty kernel next to a bare cudaLaunchKernel on a
 *    stream of the same device, per launch in bursts followed by one sync;
 *  - mgpu_run_on_device round trip next to the launch of an empty kernel
 *    followed by cudaStreamSynchronize.
 * Figures are medians of --reps runs after a warm-up.
 *
 * Usage: mgpu-bench-cuda [--json] [--quick] [--reps N] (MGPU_DEVICES picks
 * the devices; device 0 must be a CUDA device).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgpu.h"
extern "C" {
#include "bench.h"
}

struct empty_args {
  int unused;
};

__global__ void empty_kernel(struct empty_args) {}

static const mgpu_kernel empty = {"empty", NULL, (const void *)empty_kernel, NULL};

#define CHECK(expr)                                                         \
  do {                                                                      \
    int rc_ = (int)(expr);                                                  \
    if (rc_ != 0) {                                                         \
      fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__,    \
              #expr, rc_, mgpu_error_detail());                             \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

#define CUDA_CHECK(expr)                                                    \
  do {                                                                      \
    cudaError_t e_ = (expr);                                                \
    if (e_ != cudaSuccess) {                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,         \
              cudaGetErrorName(e_));                                        \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

/* Times fn reps times after one warm-up; median seconds. */
template <typename F> static double time_median(int reps, F fn) {
  double *v = (double *)malloc(sizeof(double) * reps);
  fn();
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    fn();
    v[r] = bench_now() - t0;
  }
  double m = bench_median(v, reps);
  free(v);
  return m;
}

static int empty_fn(int, void *) { return 0; }

int main(int argc, char **argv) {
  bench_opts o;
  int nrest = 0;
  if (bench_parse(argc, argv, "mgpu-bench-cuda [--json] [--quick] [--reps N]",
                  &o, NULL, 0, &nrest) != 0)
    return 2;
  CHECK(mgpu_init(NULL));
  mgpu_device_props p;
  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  CHECK(mgpu_device_get_props(0, &p));
  if (p.backend_kind != MGPU_BACKEND_CUDA) {
    fprintf(stderr, "mgpu-bench-cuda: device 0 is not a CUDA device\n");
    mgpu_shutdown();
    return 77;
  }
  const int dev = 0;
  const size_t size = (o.quick ? 16u : 256u) << 20;
  bench_report *r = bench_report_new("cuda");
  char name[96];

  /* ---- copies ---- */
  mgpu_stream *s;
  mgpu_buffer *pin, *d0, *d1;
  CHECK(mgpu_stream_create(&s, dev));
  CHECK(mgpu_malloc_host(&pin, dev, size));
  CHECK(mgpu_malloc(&d0, dev, size));
  CHECK(mgpu_malloc(&d1, dev, size));
  void *pp = mgpu_buffer_ptr(pin);
  memset(pp, 1, size);
  /* Bare CUDA buffers for the baselines, in the same context. */
  CHECK(mgpu_set_device(dev));
  char *pageable = (char *)malloc(size);
  memset(pageable, 2, size); /* pre-touched */
  void *raw0, *raw1;
  cudaStream_t cs;
  CUDA_CHECK(cudaMalloc(&raw0, size));
  CUDA_CHECK(cudaMalloc(&raw1, size));
  CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  double gb = (double)size / 1e9;

  double t_mgpu = time_median(o.reps, [&] {
    CHECK(mgpu_memcpy_htod_async(d0, 0, pp, size, s));
    CHECK(mgpu_stream_synchronize(s));
  });
  double t_page = time_median(o.reps, [&] {
    CUDA_CHECK(cudaMemcpy(raw0, pageable, size, cudaMemcpyHostToDevice));
  });
  double t_bare = time_median(o.reps, [&] {
    CUDA_CHECK(cudaMemcpyAsync(raw0, pp, size, cudaMemcpyHostToDevice, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
  });
  snprintf(name, sizeof name, "H2D pinned %zu MiB", size >> 20);
  bench_report_add(r, name, "bandwidth", gb / t_mgpu, "GB/s",
                   "cudaMemcpy pageable", gb / t_page);
  bench_report_add(r, name, "bandwidth", gb / t_mgpu, "GB/s",
                   "cudaMemcpyAsync pinned", gb / t_bare);

  t_mgpu = time_median(o.reps, [&] {
    CHECK(mgpu_memcpy_dtoh_async(pp, d0, 0, size, s));
    CHECK(mgpu_stream_synchronize(s));
  });
  t_page = time_median(o.reps, [&] {
    CUDA_CHECK(cudaMemcpy(pageable, raw0, size, cudaMemcpyDeviceToHost));
  });
  t_bare = time_median(o.reps, [&] {
    CUDA_CHECK(cudaMemcpyAsync(pp, raw0, size, cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
  });
  snprintf(name, sizeof name, "D2H pinned %zu MiB", size >> 20);
  bench_report_add(r, name, "bandwidth", gb / t_mgpu, "GB/s",
                   "cudaMemcpy pageable", gb / t_page);
  bench_report_add(r, name, "bandwidth", gb / t_mgpu, "GB/s",
                   "cudaMemcpyAsync pinned", gb / t_bare);

  t_mgpu = time_median(o.reps, [&] {
    CHECK(mgpu_memcpy_async(d1, 0, d0, 0, size, s));
    CHECK(mgpu_stream_synchronize(s));
  });
  t_page = time_median(o.reps, [&] {
    CUDA_CHECK(cudaMemcpy(raw1, raw0, size, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  });
  snprintf(name, sizeof name, "D2D %zu MiB", size >> 20);
  bench_report_add(r, name, "bandwidth", gb / t_mgpu, "GB/s", "cudaMemcpy",
                   gb / t_page);

  /* ---- launches ---- */
  const int iters = o.quick ? 1000 : 20000;
  struct empty_args a = {0};
  double l_mgpu = time_median(o.reps, [&] {
    for (int i = 0; i < iters; i++)
      CHECK(mgpu_launch(s, &empty, MGPU_DIM3(1, 1, 1), MGPU_DIM3(32, 1, 1), &a,
                        sizeof a));
    CHECK(mgpu_stream_synchronize(s));
  });
  double l_bare = time_median(o.reps, [&] {
    void *params[1] = {&a};
    for (int i = 0; i < iters; i++)
      CUDA_CHECK(cudaLaunchKernel((const void *)empty_kernel, dim3(1),
                                  dim3(32), params, 0, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
  });
  bench_report_add(r, "launch empty kernel, burst", "per_launch",
                   l_mgpu / iters * 1e6, "us", "cudaLaunchKernel",
                   l_bare / iters * 1e6);

  const int rt = o.quick ? 200 : 2000;
  double rod = time_median(o.reps, [&] {
    for (int i = 0; i < rt; i++) mgpu_run_on_device(dev, empty_fn, NULL);
  });
  double lsync = time_median(o.reps, [&] {
    void *params[1] = {&a};
    for (int i = 0; i < rt; i++) {
      CUDA_CHECK(cudaLaunchKernel((const void *)empty_kernel, dim3(1),
                                  dim3(32), params, 0, cs));
      CUDA_CHECK(cudaStreamSynchronize(cs));
    }
  });
  double one_mgpu = time_median(o.reps, [&] {
    for (int i = 0; i < rt; i++) {
      CHECK(mgpu_launch(s, &empty, MGPU_DIM3(1, 1, 1), MGPU_DIM3(32, 1, 1), &a,
                        sizeof a));
      CHECK(mgpu_stream_synchronize(s));
    }
  });
  bench_report_add(r, "run_on_device empty fn", "latency", rod / rt * 1e6,
                   "us", "cudaLaunchKernel+sync", lsync / rt * 1e6);
  bench_report_add(r, "launch empty kernel + sync", "latency",
                   one_mgpu / rt * 1e6, "us", "cudaLaunchKernel+sync",
                   lsync / rt * 1e6);

  bench_report_finish(r, o.json);
  CUDA_CHECK(cudaStreamDestroy(cs));
  CUDA_CHECK(cudaFree(raw0));
  CUDA_CHECK(cudaFree(raw1));
  free(pageable);
  CHECK(mgpu_free(pin));
  CHECK(mgpu_free(d0));
  CHECK(mgpu_free(d1));
  CHECK(mgpu_stream_destroy(s));
  CHECK(mgpu_shutdown());
  return 0;
}
