/* mgpu interop: handing buffers to other libraries without a copy (DLPack).
 *
 * A buffer is exported as a DLPack 1.1 managed tensor (mgpu/dlpack.h), the
 * exchange format of NumPy, CuPy, PyTorch and the Python array API. The
 * tensor describes memory of the buffer in place: writes through either side
 * are seen by the other, ordered as the work of the device orders them (a
 * consumer on another stream must wait for mgpu's work first, as with any
 * two streams).
 */
#ifndef MGPU_INTEROP_H
#define MGPU_INTEROP_H

#include <stdint.h>

#include "mgpu/core.h"
#include "mgpu/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exports a view of buf as a DLPack managed tensor in *managed: ndim
 * dimensions of shape[] elements of dtype, starting offset bytes into the
 * buffer, strides[] in elements (NULL: compact row-major). ndim 0 is one
 * element. shape and strides are copied. The tensor is writable (flags 0).
 *
 * Its device is kDLCPU (id 0) for every host device and for pinned memory,
 * kDLCUDA with the GPU's CUDA ordinal for device memory of a CUDA device
 * (also of a logical device cut from a split GPU: the ordinal is the
 * GPU's), and kDLCUDAManaged for unified memory of a CUDA device.
 *
 * Ownership: the tensor holds a reference on the buffer's memory until its
 * deleter is called, exactly once, by whoever holds it: on any thread, also
 * after mgpu_shutdown. The handle stays the caller's: mgpu_free on an
 * exported buffer returns 0 and retires the handle at once (its later use
 * is MGPU_EFREED), while the memory is released by the last deleter.
 * mgpu_shutdown leaves exported memory in place: the last deleter frees it
 * (host memory), or it is kept until the process ends (memory of a backend
 * plugin, whose driver state is gone).
 *
 * Errors: MGPU_EBADHANDLE / MGPU_EFREED for buf, MGPU_EINVAL for a NULL
 * managed, a negative ndim or more than 64 dimensions, NULL shape with
 * ndim > 0, a negative extent, a dtype that is not whole bytes (bits not a
 * multiple of 8, lanes 0) or an offset not a multiple of the element size;
 * MGPU_ERANGE when an element of the view lies outside the buffer;
 * MGPU_ENOMEM. The detail names the buffer's device, the offset and the
 * dimension at fault. */
MGPU_EXTERN int mgpu_buffer_dlpack(mgpu_buffer *buf, size_t offset,
                                   DLDataType dtype, int ndim,
                                   const int64_t *shape,
                                   const int64_t *strides,
                                   DLManagedTensorVersioned **managed);

/* Makes *buf a buffer over the memory of a DLPack managed tensor another
 * library owns (a NumPy array, a CuPy array, a PyTorch tensor), without a
 * copy: every mgpu call takes it as a buffer of its own (it is
 * mgpu_buffer_wrap'ed, so it does not count against the device's budget).
 * On success the buffer owns managed: mgpu_free (or mgpu_shutdown, or the
 * last deleter of an export of the buffer) calls managed->deleter exactly
 * once. On failure managed stays the caller's, untouched.
 *
 * dev: the mgpu device to put it on, or -1 for the one its memory lives on.
 * kDLCPU and kDLCUDAHost memory goes on a host device (dev -1: the calling
 * thread's current device if it is a host device, else the first one);
 * kDLCUDA and kDLCUDAManaged memory of CUDA GPU n on a device cut from GPU
 * n (dev -1: the first such device). kDLCUDAHost memory may also go on a
 * device of any CUDA GPU, as pinned memory.
 *
 * The buffer covers the tensor's elements from data + byte_offset, which
 * must be compact row-major (strides NULL, or those of a C-order array;
 * extents of 1 may have any stride). A tensor flagged
 * DLPACK_FLAG_BITMASK_READ_ONLY gives a read-only buffer (MGPU_EREADONLY
 * on writes).
 *
 * Errors: MGPU_EINVAL (NULL arguments, a version other than 1.x, a dtype
 * that is not whole bytes, an empty or non-contiguous tensor, negative
 * extents), MGPU_ENODEV (memory on a device mgpu did not open: a GPU with
 * no open device, or no host device open for host memory), MGPU_EWRONGDEV
 * (dev cannot reach that memory), MGPU_ENOTSUP (another device type);
 * the detail names the device type and id, the shape or the stride. */
MGPU_EXTERN int mgpu_buffer_from_dlpack(mgpu_buffer **buf, int dev,
                                        DLManagedTensorVersioned *managed);

/* Makes work that native, another library's stream of the backend's kind,
 * queues from now on wait for the work queued on stream so far, without
 * blocking the host: the order a DLPack consumer's stream needs before it
 * reads an export. On CUDA native is a cudaStream_t (1: the legacy default
 * stream, 2: the per-thread default stream); an event recorded on stream,
 * in its device's context (a green context for a split GPU), is waited on by
 * native. Errors: MGPU_EBADHANDLE / MGPU_EFREED for stream, MGPU_EINVAL for
 * a NULL native, MGPU_ENOTSUP on a backend without such streams (host
 * devices: the caller waits for the stream on the host instead),
 * MGPU_EBACKEND with the driver's error (a handle the driver refuses). */
MGPU_EXTERN int mgpu_stream_order_native(mgpu_stream *stream, void *native);

/* The DLPack device of buf's memory (as mgpu_buffer_dlpack reports it). */
MGPU_EXTERN int mgpu_buffer_dldevice(mgpu_buffer *buf, DLDevice *device);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_INTEROP_H */
