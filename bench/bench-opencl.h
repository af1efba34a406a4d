/* Bare OpenCL baselines of mgpu bench launch and mgpu bench copy: the same
 * work through plain OpenCL calls on the same device, in the same run.
 *
 * The mgpu command links no vendor library (tools/check-layers.py): the
 * OpenCL ICD loader, libOpenCL.so.1, is opened with dlopen when a baseline
 * is asked for, and the device is the one behind an mgpu stream
 * (mgpu_stream_native is its cl_command_queue), so the baseline and the
 * figure run on one device whatever the numbering. A build without the
 * OpenCL headers has no baselines (bench_ocl_open says so). */
#ifndef MGPU_BENCH_OPENCL_H
#define MGPU_BENCH_OPENCL_H

#include <stddef.h>

typedef struct bench_ocl bench_ocl;

/* Opens the loader and makes a plain in-order queue (no profiling) on the
 * device and context of native_queue, the cl_command_queue of an mgpu
 * stream on an OpenCL device. Returns NULL, with the reason in why, when
 * the loader or a call is missing or fails. The caller owns the result
 * (bench_ocl_close), and keeps mgpu initialized while it is open (the
 * context is mgpu's). */
bench_ocl *bench_ocl_open(void *native_queue, char *why, size_t why_size);
void bench_ocl_close(bench_ocl *o);

/* Median microseconds per launch of an empty kernel, in bursts of iters
 * bare clEnqueueNDRangeKernel calls followed by one clFinish, over reps
 * bursts after a warm-up; 0 when a call failed. */
double bench_ocl_launch_us(bench_ocl *o, int iters, int reps);

enum {
  BENCH_OCL_WRITE, /* clEnqueueWriteBuffer from host */
  BENCH_OCL_READ,  /* clEnqueueReadBuffer into host */
  BENCH_OCL_COPY   /* clEnqueueCopyBuffer between two buffers */
};

/* Median GB/s of one blocking-free copy of size bytes of kind plus
 * clFinish, over reps runs after a warm-up, on cl_mem buffers of the
 * device; host (size bytes, touched) is the host side of WRITE and READ.
 * 0 when a call failed. */
double bench_ocl_copy_gbps(bench_ocl *o, int kind, void *host, size_t size,
                           int reps);

#endif /* MGPU_BENCH_OPENCL_H */
