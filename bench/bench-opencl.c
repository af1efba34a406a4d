/* The bare OpenCL baselines (bench-opencl.h): the loader opened with
 * dlopen, the calls looked up by name, an empty kernel built on the device,
 * plain cl_mem buffers for the copies. */
#include "bench-opencl.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef MGPU_BENCH_OPENCL

bench_ocl *bench_ocl_open(void *native_queue, char *why, size_t why_size) {
  (void)native_queue;
  snprintf(why, why_size, "this build has no OpenCL headers");
  return NULL;
}
void bench_ocl_close(bench_ocl *o) { (void)o; }
int bench_ocl_native_profiling(const bench_ocl *o) {
  (void)o;
  return 0;
}
int bench_ocl_launch_burst(bench_ocl *o, int iters, int profiled) {
  (void)o, (void)iters, (void)profiled;
  return -1;
}
int bench_ocl_copy_prepare(bench_ocl *o, void *host, size_t size) {
  (void)o, (void)host, (void)size;
  return -1;
}
int bench_ocl_copy_once(bench_ocl *o, int kind, void *host) {
  (void)o, (void)kind, (void)host;
  return -1;
}
void bench_ocl_copy_release(bench_ocl *o) { (void)o; }

#else

#include <dlfcn.h>
#include <string.h>

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

/* The calls used, by name: a member per function, of its own type. */
#define BENCH_OCL_CALLS(X)                                                   \
  X(clGetCommandQueueInfo) X(clCreateCommandQueueWithProperties)             \
  X(clReleaseCommandQueue) X(clCreateProgramWithSource) X(clBuildProgram)    \
  X(clReleaseProgram) X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg) \
  X(clEnqueueNDRangeKernel) X(clFinish) X(clCreateBuffer)                    \
  X(clReleaseMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer)       \
  X(clEnqueueCopyBuffer)

struct bench_ocl {
  void *lib;
#define MEMBER(f) __typeof__(f) *f;
  BENCH_OCL_CALLS(MEMBER)
#undef MEMBER
  cl_context ctx; /* mgpu's, not retained */
  cl_device_id dev;
  cl_command_queue q;
  cl_command_queue qp; /* with profiling on, as mgpu's are by default */
  int native_profiling;  /* mgpu's queue has profiling */
  cl_program prog;
  cl_kernel empty;
  cl_mem a, b; /* the copies' buffers (prepare), or NULL */
  size_t size;
};

/* The context, device and profiling of mgpu's queue mq, into o. */
static cl_int native_info(bench_ocl *o, cl_command_queue mq) {
  cl_int err = o->clGetCommandQueueInfo(mq, CL_QUEUE_CONTEXT, sizeof o->ctx,
                                        &o->ctx, NULL);
  if (err == CL_SUCCESS)
    err = o->clGetCommandQueueInfo(mq, CL_QUEUE_DEVICE, sizeof o->dev,
                                   &o->dev, NULL);
  cl_command_queue_properties props = 0;
  if (err == CL_SUCCESS)
    err = o->clGetCommandQueueInfo(mq, CL_QUEUE_PROPERTIES, sizeof props,
                                   &props, NULL);
  o->native_profiling = (props & CL_QUEUE_PROFILING_ENABLE) != 0;
  return err;
}

bench_ocl *bench_ocl_open(void *native_queue, char *why, size_t why_size) {
  bench_ocl *o = calloc(1, sizeof *o);
  if (o == NULL) {
    snprintf(why, why_size, "out of memory");
    return NULL;
  }
  o->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (o->lib == NULL) {
    snprintf(why, why_size, "cannot open libOpenCL.so.1: %s", dlerror());
    free(o);
    return NULL;
  }
  void *p;
#define LOAD(f)                                        \
  if ((p = dlsym(o->lib, #f)) == NULL) {               \
    snprintf(why, why_size, "libOpenCL.so.1 has no %s", #f); \
    bench_ocl_close(o);                                \
    return NULL;                                       \
  }                                                    \
  memcpy(&o->f, &p, sizeof p);
  BENCH_OCL_CALLS(LOAD)
#undef LOAD
  cl_int err = native_info(o, native_queue);
  const char *step = "clGetCommandQueueInfo";
  if (err == CL_SUCCESS) {
    step = "clCreateCommandQueueWithProperties";
    o->q = o->clCreateCommandQueueWithProperties(o->ctx, o->dev, NULL, &err);
  }
  cl_queue_properties profiling[] = {CL_QUEUE_PROPERTIES,
                                     CL_QUEUE_PROFILING_ENABLE, 0};
  if (err == CL_SUCCESS)
    o->qp = o->clCreateCommandQueueWithProperties(o->ctx, o->dev, profiling,
                                                  &err);
  static const char *src = "__kernel void empty(int arg) {}\n";
  if (err == CL_SUCCESS) {
    step = "clCreateProgramWithSource";
    o->prog = o->clCreateProgramWithSource(o->ctx, 1, &src, NULL, &err);
  }
  if (err == CL_SUCCESS) {
    step = "clBuildProgram";
    err = o->clBuildProgram(o->prog, 1, &o->dev, "", NULL, NULL);
  }
  if (err == CL_SUCCESS) {
    step = "clCreateKernel";
    o->empty = o->clCreateKernel(o->prog, "empty", &err);
  }
  int zero = 0;
  if (err == CL_SUCCESS) {
    step = "clSetKernelArg";
    err = o->clSetKernelArg(o->empty, 0, sizeof zero, &zero);
  }
  if (err != CL_SUCCESS) {
    snprintf(why, why_size, "%s failed (%d)", step, (int)err);
    bench_ocl_close(o);
    return NULL;
  }
  return o;
}

void bench_ocl_close(bench_ocl *o) {
  if (o == NULL) return;
  bench_ocl_copy_release(o);
  if (o->empty != NULL) o->clReleaseKernel(o->empty);
  if (o->prog != NULL) o->clReleaseProgram(o->prog);
  if (o->q != NULL) o->clReleaseCommandQueue(o->q);
  if (o->qp != NULL) o->clReleaseCommandQueue(o->qp);
  dlclose(o->lib);
  free(o);
}

int bench_ocl_native_profiling(const bench_ocl *o) {
  return o->native_profiling;
}

int bench_ocl_launch_burst(bench_ocl *o, int iters, int profiled) {
  size_t one = 1;
  cl_command_queue q = profiled ? o->qp : o->q;
  for (int i = 0; i < iters; i++)
    if (o->clEnqueueNDRangeKernel(q, o->empty, 1, NULL, &one, &one, 0, NULL,
                                  NULL) != CL_SUCCESS)
      return -1;
  return o->clFinish(q) == CL_SUCCESS ? 0 : -1;
}

int bench_ocl_copy_once(bench_ocl *o, int kind, void *host) {
  cl_int err;
  if (kind == BENCH_OCL_WRITE)
    err = o->clEnqueueWriteBuffer(o->q, o->a, CL_FALSE, 0, o->size, host, 0,
                                  NULL, NULL);
  else if (kind == BENCH_OCL_READ)
    err = o->clEnqueueReadBuffer(o->q, o->a, CL_FALSE, 0, o->size, host, 0,
                                 NULL, NULL);
  else
    err = o->clEnqueueCopyBuffer(o->q, o->a, o->b, 0, 0, o->size, 0, NULL,
                                 NULL);
  if (err == CL_SUCCESS) err = o->clFinish(o->q);
  return err == CL_SUCCESS ? 0 : -1;
}

int bench_ocl_copy_prepare(bench_ocl *o, void *host, size_t size) {
  bench_ocl_copy_release(o);
  cl_int err = CL_SUCCESS;
  o->size = size;
  o->a = o->clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, size, NULL, &err);
  if (err == CL_SUCCESS)
    o->b = o->clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, size, NULL, &err);
  /* Every page of both buffers touched before timing. */
  int rc = err == CL_SUCCESS ? bench_ocl_copy_once(o, BENCH_OCL_WRITE, host)
                             : -1;
  if (rc == 0) rc = bench_ocl_copy_once(o, BENCH_OCL_COPY, host);
  if (rc != 0) bench_ocl_copy_release(o);
  return rc;
}

void bench_ocl_copy_release(bench_ocl *o) {
  if (o->a != NULL) o->clReleaseMemObject(o->a);
  if (o->b != NULL) o->clReleaseMemObject(o->b);
  o->a = o->b = NULL;
}

#endif /* MGPU_BENCH_OPENCL */
