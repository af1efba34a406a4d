/* DLPack export: a view of a buffer as a DLManagedTensorVersioned that
 * holds a reference on the buffer's memory (mgpu/interop.h).
 *
 * One allocation carries the managed tensor, the buffer it holds and its
 * shape and strides; the deleter drops the reference (mgpu__buf_unref) and
 * frees that allocation, on whatever thread calls it.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "mgpu/interop.h"
#include "util/fault.h"

#define MAX_DIMS 64

typedef struct export_ctx {
  DLManagedTensorVersioned tensor;
  mgpu__buf *buf;
  int64_t dims[]; /* shape, then strides */
} export_ctx;

static void export_deleter(DLManagedTensorVersioned *self) {
  if (self == NULL) return;
  export_ctx *x = self->manager_ctx;
  mgpu__buf_unref(x->buf);
  mgpu__free(x);
}

/* Where b's memory lives, in DLPack's words: the device backend's DLPack
 * types (its caps). Pinned memory is the host's. */
static DLDevice dl_device_of(const mgpu__buf *b, const mgpu__device *d) {
  DLDevice dev = {kDLCPU, 0};
  const mgpu__backend_caps *caps = &d->ops->caps;
  if (b->kind == MGPU_MEM_DEVICE) dev.device_type = caps->dlpack_device;
  if (b->kind == MGPU_MEM_UNIFIED) dev.device_type = caps->dlpack_unified;
  if (dev.device_type != kDLCPU) dev.device_id = d->spec.ordinal;
  return dev;
}

int mgpu_buffer_dldevice(mgpu_buffer *h, DLDevice *device) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "mgpu_buffer_dldevice", &b);
  if (rc != 0) return rc;
  if (device == NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_buffer_dldevice: NULL output for "
                     "the buffer of device %d", b->dev);
  else
    *device = dl_device_of(b, mgpu__device_get(b->dev));
  mgpu__buf_put(b);
  return rc;
}

/* The lowest and one past the highest byte the view touches, relative to
 * offset, in *lo and *hi (both 0 for an empty view). */
static int view_extent(const mgpu__buf *b, size_t esize, int ndim,
                       const int64_t *shape, const int64_t *strides,
                       int64_t *lo, int64_t *hi) {
  int64_t min = 0, max = 0; /* in elements */
  *lo = *hi = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return mgpu__error(MGPU_EINVAL, "mgpu_buffer_dlpack: dimension %d of "
                         "the view of the buffer of device %d has extent "
                         "%lld", i, b->dev, (long long)shape[i]);
    if (shape[i] == 0) return 0;
  }
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    int64_t st = strides != NULL ? strides[i] : stride;
    int64_t span;
    if (__builtin_mul_overflow(shape[i] - 1, st, &span) ||
        (span < 0 ? __builtin_add_overflow(min, span, &min)
                  : __builtin_add_overflow(max, span, &max)) ||
        (strides == NULL && __builtin_mul_overflow(stride, shape[i], &stride)))
      return mgpu__error(MGPU_ERANGE, "mgpu_buffer_dlpack: dimension %d of "
                         "the view of the buffer of device %d overflows",
                         i, b->dev);
  }
  int64_t e = (int64_t)esize;
  if (__builtin_mul_overflow(min, e, lo) || __builtin_add_overflow(max, 1, &max)
      || __builtin_mul_overflow(max, e, hi))
    return mgpu__error(MGPU_ERANGE, "mgpu_buffer_dlpack: the view of the "
                       "buffer of device %d overflows", b->dev);
  return 0;
}

/* Checks the arguments of an export and that the view lies inside b. */
static int check_view(mgpu__buf *b, size_t offset, DLDataType dtype,
                      int ndim, const int64_t *shape, const int64_t *strides,
                      DLManagedTensorVersioned **managed) {
  int rc;
  if (managed == NULL || ndim < 0 || ndim > MAX_DIMS ||
      (ndim > 0 && shape == NULL))
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_dlpack: buffer of device %d: "
                       "%s", b->dev,
                       managed == NULL ? "NULL output pointer"
                       : ndim < 0 || ndim > MAX_DIMS ? "ndim outside [0, 64]"
                                                     : "NULL shape");
  size_t esize = (size_t)dtype.bits / 8 * dtype.lanes;
  if (dtype.bits == 0 || dtype.bits % 8 != 0 || dtype.lanes == 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_dlpack: buffer of device %d: "
                       "dtype of %u bits x %u lanes is not whole bytes",
                       b->dev, dtype.bits, dtype.lanes);
  if (offset % (dtype.bits / 8) != 0)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_dlpack: buffer of device %d: "
                       "offset %zu is not a multiple of the %u-byte element",
                       b->dev, offset, dtype.bits / 8);
  int64_t lo, hi;
  rc = view_extent(b, esize, ndim, shape, strides, &lo, &hi);
  if (rc != 0) return rc;
  if (hi > lo && ((lo < 0 && (uint64_t)-lo > offset) ||
                  offset + (uint64_t)hi > b->size ||
                  offset + (uint64_t)hi < offset))
    return mgpu__error(MGPU_ERANGE, "mgpu_buffer_dlpack: the view at offset "
                       "%zu spans bytes [%lld, %lld) of it, outside the "
                       "%zu-byte buffer of device %d", offset, (long long)lo,
                       (long long)hi, b->size, b->dev);
  if (hi == lo && offset > b->size)
    return mgpu__error(MGPU_ERANGE, "mgpu_buffer_dlpack: offset %zu is "
                       "outside the %zu-byte buffer of device %d", offset,
                       b->size, b->dev);
  return 0;
}

static int export_view(mgpu__buf *b, size_t offset, DLDataType dtype,
                       int ndim, const int64_t *shape, const int64_t *strides,
                       DLManagedTensorVersioned **managed) {
  int rc = check_view(b, offset, dtype, ndim, shape, strides, managed);
  if (rc != 0) return rc;
  export_ctx *x = mgpu__calloc(1, sizeof *x + 2 * (size_t)ndim * sizeof(int64_t));
  if (x == NULL)
    return mgpu__error(MGPU_ENOMEM, "mgpu_buffer_dlpack: out of host memory "
                       "exporting the buffer of device %d", b->dev);
  int64_t *sh = x->dims, *st = x->dims + ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    sh[i] = shape[i];
    st[i] = strides != NULL ? strides[i] : stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  DLManagedTensorVersioned *t = &x->tensor;
  t->version.major = DLPACK_MAJOR_VERSION;
  t->version.minor = DLPACK_MINOR_VERSION;
  t->manager_ctx = x;
  t->deleter = export_deleter;
  t->flags = 0;
  t->dl_tensor.data = b->ptr;
  t->dl_tensor.byte_offset = offset;
  t->dl_tensor.device = dl_device_of(b, mgpu__device_get(b->dev));
  t->dl_tensor.ndim = ndim;
  t->dl_tensor.dtype = dtype;
  t->dl_tensor.shape = ndim > 0 ? sh : NULL;
  t->dl_tensor.strides = ndim > 0 ? st : NULL;
  x->buf = b;
  mgpu__buf_ref(b); /* the export's own reference, past this call's hold */
  *managed = t;
  return 0;
}

int mgpu_buffer_dlpack(mgpu_buffer *h, size_t offset, DLDataType dtype,
                       int ndim, const int64_t *shape, const int64_t *strides,
                       DLManagedTensorVersioned **managed) {
  if (managed != NULL) *managed = NULL;
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "mgpu_buffer_dlpack", &b);
  if (rc != 0) return rc;
  rc = export_view(b, offset, dtype, ndim, shape, strides, managed);
  mgpu__buf_put(b);
  return rc;
}

/* ---- import ---- */

static void release_managed(void *ptr, size_t size, void *arg) {
  (void)ptr;
  (void)size;
  DLManagedTensorVersioned *t = arg;
  if (t->deleter != NULL) t->deleter(t);
}

static const char *dl_type_name(int type) {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    case kDLOpenCL: return "kDLOpenCL";
  }
  return "an unsupported DLPack device type";
}

/* 1 when memory of DLPack type/id is device memory (or unified memory) of
 * d, whose backend's caps name the types it takes; *kind says which. */
static int device_memory_of(const mgpu__device *d, int type, int id,
                            mgpu_mem_kind *kind) {
  const mgpu__backend_caps *caps = &d->ops->caps;
  if (type == kDLCPU || type == kDLCUDAHost) {
    /* Host memory is device memory of devices whose memory is the host's
     * only: an OpenCL device's kernels and copies need its own (SVM)
     * memory. */
    *kind = MGPU_MEM_DEVICE;
    return caps->dlpack_device == kDLCPU;
  }
  if (d->spec.ordinal != id) return 0;
  *kind = type == caps->dlpack_device ? MGPU_MEM_DEVICE : MGPU_MEM_UNIFIED;
  return type == caps->dlpack_device || type == caps->dlpack_unified;
}

/* Picks the device for memory of type/id (want -1: any that fits) and the
 * memory kind it is on that device, by the devices' DLPack types (see
 * dl_device_of). */
static int import_device(int type, int id, int want, int *dev,
                         mgpu_mem_kind *kind) {
  int host_mem = type == kDLCPU || type == kDLCUDAHost;
  int cuda_mem = type == kDLCUDA || type == kDLCUDAManaged;
  int ocl_mem = type == kDLOpenCL;
  if (!host_mem && !cuda_mem && !ocl_mem)
    return mgpu__error(MGPU_ENOTSUP, "mgpu_buffer_from_dlpack: memory of "
                       "DLPack device type %d (id %d) cannot be used by mgpu",
                       type, id);
  if (want >= 0) {
    mgpu__device *d;
    int rc = mgpu__device_check(want, &d);
    if (rc != 0) return rc;
    const mgpu__backend_caps *caps = &d->ops->caps;
    if (device_memory_of(d, type, id, kind)) {
      *dev = want;
      return 0;
    }
    if (caps->dlpack_pinned != 0 && type == caps->dlpack_pinned) {
      *dev = want;
      *kind = MGPU_MEM_PINNED;
      return 0;
    }
    int own = caps->dlpack_device != kDLCPU;
    return mgpu__error(MGPU_EWRONGDEV, "mgpu_buffer_from_dlpack: %s memory "
                       "(id %d) cannot go on device %d (%s device %d)",
                       dl_type_name(type), id, want, d->ops->name,
                       own ? d->spec.ordinal : want);
  }
  int n = mgpu__ndevices(), cur = 0;
  mgpu_mem_kind k;
  if (host_mem && mgpu_get_device(&cur) == 0 && cur < n &&
      device_memory_of(mgpu__device_get(cur), type, id, &k))
    return import_device(type, id, cur, dev, kind);
  for (int i = 0; i < n; i++)
    if (device_memory_of(mgpu__device_get(i), type, id, &k))
      return import_device(type, id, i, dev, kind);
  return mgpu__error(MGPU_ENODEV, "mgpu_buffer_from_dlpack: %s memory (id "
                     "%d) is on no device mgpu opened", dl_type_name(type),
                     id);
}

int mgpu_buffer_from_dlpack(mgpu_buffer **out, int want,
                            DLManagedTensorVersioned *t) {
  if (out != NULL) *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_buffer_from_dlpack: mgpu_init has "
                       "not been called");
  if (out == NULL || t == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_from_dlpack: NULL %s",
                       out == NULL ? "output pointer" : "managed tensor");
  if (t->version.major != 1)
    return mgpu__error(MGPU_EINVAL, "mgpu_buffer_from_dlpack: DLPack version "
                       "%u.%u, not 1.x", t->version.major, t->version.minor);
  const DLTensor *x = &t->dl_tensor;
  const char *what = "mgpu_buffer_from_dlpack";
  if (x->dtype.bits == 0 || x->dtype.bits % 8 != 0 || x->dtype.lanes == 0)
    return mgpu__error(MGPU_EINVAL, "%s: dtype of %u bits x %u lanes is not "
                       "whole bytes", what, x->dtype.bits, x->dtype.lanes);
  if (x->ndim < 0 || x->ndim > MAX_DIMS || (x->ndim > 0 && x->shape == NULL))
    return mgpu__error(MGPU_EINVAL, "%s: %d dimensions%s", what, x->ndim,
                       x->ndim > 0 && x->shape == NULL ? " with NULL shape"
                                                       : "");
  uint64_t count = 1, expect = 1;
  for (int i = x->ndim - 1; i >= 0; i--) {
    if (x->shape[i] < 0)
      return mgpu__error(MGPU_EINVAL, "%s: dimension %d has extent %lld",
                         what, i, (long long)x->shape[i]);
    if (x->strides != NULL && x->shape[i] > 1 &&
        (uint64_t)x->strides[i] != expect)
      return mgpu__error(MGPU_EINVAL, "%s: the tensor is not contiguous "
                         "(dimension %d has stride %lld, C order needs %llu)",
                         what, i, (long long)x->strides[i],
                         (unsigned long long)expect);
    if (__builtin_mul_overflow(count, (uint64_t)x->shape[i], &count) ||
        __builtin_mul_overflow(expect, (uint64_t)x->shape[i], &expect))
      return mgpu__error(MGPU_EINVAL, "%s: the tensor's size overflows", what);
  }
  uint64_t size;
  if (__builtin_mul_overflow(count, (uint64_t)x->dtype.bits / 8 * x->dtype.lanes,
                             &size) || size > SIZE_MAX)
    return mgpu__error(MGPU_EINVAL, "%s: the tensor's size overflows", what);
  if (size == 0 || x->data == NULL)
    return mgpu__error(MGPU_EINVAL, "%s: an empty tensor (%s) has no memory "
                       "to wrap", what, size == 0 ? "no elements" : "NULL data");
  int dev;
  mgpu_mem_kind kind;
  int rc = import_device(x->device.device_type, x->device.device_id, want,
                         &dev, &kind);
  if (rc != 0) return rc;
  unsigned flags = (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
                       ? MGPU_BUFFER_READONLY : 0;
  return mgpu_buffer_wrap(out, dev, kind, (char *)x->data + x->byte_offset,
                          (size_t)size, flags, release_managed, t);
}
