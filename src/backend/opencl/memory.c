/* Memory of OpenCL devices: device, unified and pinned allocations, and
 * peer copies between devices of one platform.
 *
 * Device memory is coarse-grained SVM, unified memory fine-grained SVM
 * where the device offers it (else coarse-grained: the host must then not
 * touch it between copies, as docs/opencl.md says). SVM of a context is
 * usable by every device of that context, which is why devices of one
 * platform are peers and their copies one clEnqueueSVMMemcpy.
 *
 * Pinned memory is a CL_MEM_ALLOC_HOST_PTR buffer mapped once; the host
 * pointer is what mgpu sees, and pinned_list finds the buffer again when it
 * is freed (pinned_lock guards the list).
 */
#include <stdio.h>
#include <stdlib.h>

#include "opencl-internal.h"

typedef struct pinned_block {
  void *ptr;
  cl_mem mem;
  cl_command_queue q; /* the queue that mapped it, to unmap on free */
  size_t size;
  struct pinned_block *next;
} pinned_block;

static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static pinned_block *pinned_list;

static int pinned_alloc(mgpu__bdevice *d, size_t size, void **ptr) {
  mgpu__ocl_phys *ph = d->phys;
  cl_int err = CL_SUCCESS;
  pinned_block *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory for a pinned buffer", d->id);
  const char *what = "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)";
  b->mem = clCreateBuffer(ph->ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                          size, NULL, &err);
  if (err == CL_SUCCESS) {
    what = "clCreateCommandQueueWithProperties";
    b->q = clCreateCommandQueueWithProperties(ph->ctx, ph->dev, NULL, &err);
  }
  if (err == CL_SUCCESS) {
    what = "clEnqueueMapBuffer";
    b->ptr = clEnqueueMapBuffer(b->q, b->mem, CL_TRUE,
                                CL_MAP_READ | CL_MAP_WRITE, 0, size, 0, NULL,
                                NULL, &err);
  }
  if (err != CL_SUCCESS) {
    if (b->q != NULL) clReleaseCommandQueue(b->q);
    if (b->mem != NULL) clReleaseMemObject(b->mem);
    mgpu__free(b);
    char msg[96];
    snprintf(msg, sizeof msg, "%s of %zu bytes", what, size);
    return mgpu__ocl_fail(d, err, msg);
  }
  b->size = size;
  pthread_mutex_lock(&pinned_lock);
  b->next = pinned_list;
  pinned_list = b;
  pthread_mutex_unlock(&pinned_lock);
  *ptr = b->ptr;
  return 0;
}

static void pinned_free(mgpu__bdevice *d, void *ptr) {
  pthread_mutex_lock(&pinned_lock);
  pinned_block **pp = &pinned_list, *b = NULL;
  while (*pp != NULL && (*pp)->ptr != ptr) pp = &(*pp)->next;
  if (*pp != NULL) {
    b = *pp;
    *pp = b->next;
  }
  pthread_mutex_unlock(&pinned_lock);
  if (b == NULL) {
    mgpu__ocl_env->log(MGPU_LOG_WARN, "opencl: device %d: freeing %p: not a "
                       "pinned buffer of this backend", d->id, ptr);
    return;
  }
  cl_event ev = NULL;
  if (clEnqueueUnmapMemObject(b->q, b->mem, b->ptr, 0, NULL, &ev) ==
          CL_SUCCESS &&
      ev != NULL) {
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
  }
  clReleaseCommandQueue(b->q);
  clReleaseMemObject(b->mem);
  mgpu__free(b);
}

int mgpu__ocl_mem_alloc(mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,
                        void **ptr) {
  *ptr = NULL;
  mgpu__ocl_phys *ph = d->phys;
  if (size == 0) size = 1; /* clSVMAlloc refuses 0 bytes */
  switch (kind) {
    case MGPU_MEM_PINNED:
      return pinned_alloc(d, size, ptr);
    case MGPU_MEM_DEVICE:
    case MGPU_MEM_UNIFIED: {
      cl_svm_mem_flags flags = CL_MEM_READ_WRITE;
      if (kind == MGPU_MEM_UNIFIED &&
          (ph->svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER))
        flags |= CL_MEM_SVM_FINE_GRAIN_BUFFER;
      /* 128 bytes: the widest type's alignment on every device here, and
       * what the core promises buffers start at. */
      void *p = clSVMAlloc(ph->ctx, flags, size, 128);
      if (p == NULL)
        return mgpu__error(
            MGPU_ENOMEM, "device %d: clSVMAlloc of %zu bytes failed on "
            "OpenCL device %d (%s)", d->id, size, d->ordinal, ph->name);
      *ptr = p;
      return 0;
    }
  }
  return mgpu__error(MGPU_EINVAL, "device %d: unknown memory "
                     "kind %d", d->id, (int)kind);
}

void mgpu__ocl_mem_free(mgpu__bdevice *d, mgpu_mem_kind kind, void *ptr) {
  if (ptr == NULL) return;
  if (kind == MGPU_MEM_PINNED) {
    pinned_free(d, ptr);
    return;
  }
  clSVMFree(d->phys->ctx, ptr);
}

int mgpu__ocl_mem_info(mgpu__bdevice *d, size_t *free_bytes,
                       size_t *total_bytes) {
  /* OpenCL has no query of free memory: the device's global memory is the
   * total, and the core keeps each device to its budget. */
  *total_bytes = (size_t)d->phys->global_mem;
  *free_bytes = (size_t)d->phys->global_mem;
  return 0;
}

/* ---- peers ---- */

int mgpu__ocl_peer_can_access(mgpu__bdevice *d, mgpu__bdevice *peer,
                              int *yes) {
  *yes = d->phys->ctx == peer->phys->ctx;
  return 0;
}

int mgpu__ocl_peer_enable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  if (d->phys->ctx != peer->phys->ctx)
    return mgpu__error(
        MGPU_ENOTSUP, "device %d: no peer access to device %d: OpenCL "
        "devices of different platforms (%s, %s) share no memory", d->id,
        peer->id, d->phys->platform_name, peer->phys->platform_name);
  return 0; /* SVM of one context is every device's already */
}

int mgpu__ocl_peer_disable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  (void)d;
  (void)peer;
  return 0;
}

int mgpu__ocl_memcpy_peer_async(mgpu__bdevice *dd, void *dst,
                                mgpu__bdevice *sd, const void *src,
                                size_t size, mgpu__bdevice *s_dev,
                                mgpu__bstream *s) {
  if (dd->phys->ctx != sd->phys->ctx)
    return mgpu__error(
        MGPU_ENOTSUP, "device %d: no direct copy from device %d (another "
        "OpenCL platform): the copy must be staged", dd->id, sd->id);
  mgpu__ocl_enqueue_begin(s);
  cl_event ev = NULL;
  cl_int err = clEnqueueSVMMemcpy(s->q, CL_FALSE, dst, src, size, 0, NULL,
                                  &ev);
  if (err == CL_SUCCESS) {
    mgpu__ocl_copy_timed(s, ev, MGPU_METRIC_PATH_PEER_DIRECT, size);
    mgpu__ocl_op_timed(s, ev, "copy.peer", size);
  }
  mgpu__ocl_enqueue_end(s, err, ev);
  if (err != CL_SUCCESS) {
    char what[128];
    snprintf(what, sizeof what, "copy of %zu bytes from device %d to device "
             "%d (clEnqueueSVMMemcpy)", size, sd->id, dd->id);
    return mgpu__ocl_fail(s_dev, err, what);
  }
  return 0;
}
