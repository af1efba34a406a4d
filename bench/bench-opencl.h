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

/* Opens the loader and makes two plain in-order queues on the device and
 * context of native_queue, one without profiling and one with it (as
 * mgpu's own queues have it by default, for busy time and traces), the
 * cl_command_queue of an mgpu stream on an OpenCL device, and reads whether
 * that queue has profiling (bench_ocl_native_profiling). Returns NULL,
 * with the reason in why, when
 * the loader or a call is missing or fails. The caller owns the result
 * (bench_ocl_close), and keeps mgpu initialized while it is open (the
 * context is mgpu's). */
bench_ocl *bench_ocl_open(void *native_queue, char *why, size_t why_size);
void bench_ocl_close(bench_ocl *o);

/* 1 when the mgpu queue handed to bench_ocl_open has profiling on (the
 * default), 0 when it is a plain queue (MGPU_OPENCL_BUSY=0): which of the
 * two bare bursts is the like-for-like baseline. */
int bench_ocl_native_profiling(const bench_ocl *o);

/* One burst: iters bare clEnqueueNDRangeKernel calls of an empty kernel,
 * then one clFinish, on the queue without profiling (profiled 0) or the
 * one with it (1). 0, or -1 when a call failed. */
int bench_ocl_launch_burst(bench_ocl *o, int iters, int profiled);

enum {
  BENCH_OCL_WRITE, /* clEnqueueWriteBuffer from host */
  BENCH_OCL_READ,  /* clEnqueueReadBuffer into host */
  BENCH_OCL_COPY   /* clEnqueueCopyBuffer between two buffers */
};

/* Makes two cl_mem buffers of size bytes on the device and touches every
 * page from host (size bytes): the buffers of bench_ocl_copy_once until
 * bench_ocl_copy_release (or close). 0, or -1 when a call failed. */
int bench_ocl_copy_prepare(bench_ocl *o, void *host, size_t size);
/* One copy of kind of the prepared size, then clFinish; host is the host
 * side of WRITE and READ. 0, or -1 when a call failed. */
int bench_ocl_copy_once(bench_ocl *o, int kind, void *host);
void bench_ocl_copy_release(bench_ocl *o);

#endif /* MGPU_BENCH_OPENCL_H */
