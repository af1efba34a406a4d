/* mgpu copy: every copy of memory (host to buffer, buffer to host, buffer
 * to buffer on one device or between devices), memset, peer access between
 * devices, the path a copy between two devices takes, and the host-staged
 * path's parameters. Implemented by src/copy/.
 *
 * Peer access is a property of a pair of devices. mgpu turns it on for every
 * pair that supports it the first time a copy between the two needs it, so
 * the one copy call (mgpu_memcpy_async) goes direct wherever it can without
 * any setup. mgpu_peer_disable(a, b) turns it off for the pair, so that
 * copies between a and b (channels' included) go through the pipelined
 * host-staged path until mgpu_peer_enable(a, b). Both are harmless to
 * repeat. docs/copy.md is the guide.
 */
#ifndef MGPU_COPY_H
#define MGPU_COPY_H

#include <stddef.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Copies                                                                   */
/* ------------------------------------------------------------------------ */

/* Host memory to a buffer and back. host may be any host pointer (pageable
 * or the pointer of a pinned buffer). The async forms run on the stream,
 * which must belong to the buffer's device; the host memory must stay valid
 * until the copy completes. The synchronous forms run on a stream of their
 * own and return once the copy is done: they do not wait for work queued
 * on other streams (as cudaMemcpy with per-thread default streams), so
 * synchronize the stream that writes the buffer before reading it back. */
MGPU_EXTERN int mgpu_memcpy_htod(mgpu_buffer *dst, size_t dst_offset,
                                 const void *host, size_t size);
MGPU_EXTERN int mgpu_memcpy_dtoh(void *host, const mgpu_buffer *src,
                                 size_t src_offset, size_t size);
MGPU_EXTERN int mgpu_memcpy_htod_async(mgpu_buffer *dst, size_t dst_offset,
                                       const void *host, size_t size,
                                       mgpu_stream *stream);
MGPU_EXTERN int mgpu_memcpy_dtoh_async(void *host, const mgpu_buffer *src,
                                       size_t src_offset, size_t size,
                                       mgpu_stream *stream);

/* Buffer to buffer, any kinds, any devices. The one copy entry point: within
 * a device it is a device copy; between devices a direct peer copy where
 * peer access is enabled, else a pipelined host-staged copy. The stream may
 * belong to either buffer's device; the copy runs in that stream's order.
 * Overlapping ranges of one buffer are MGPU_EOVERLAP. */
MGPU_EXTERN int mgpu_memcpy(mgpu_buffer *dst, size_t dst_offset,
                            const mgpu_buffer *src, size_t src_offset,
                            size_t size);
MGPU_EXTERN int mgpu_memcpy_async(mgpu_buffer *dst, size_t dst_offset,
                                  const mgpu_buffer *src, size_t src_offset,
                                  size_t size, mgpu_stream *stream);

/* Pitched (2-D) copies, as cudaMemcpy2DAsync: height rows of width bytes;
 * row r starts at offset + r * pitch on each side (pitch >= width, else
 * MGPU_EINVAL). Every path of mgpu_memcpy: within a device and to or from
 * host memory one backend operation (one task on host devices, one
 * cudaMemcpy2DAsync on CUDA); between devices row by row on the pair's
 * path (direct or staged). Ranges are checked on the whole span;
 * overlapping rows of one buffer are MGPU_EOVERLAP. Between ranks:
 * mgpu_mpi_send_2d / mgpu_mpi_recv_2d (mgpu/mpi.h). */
MGPU_EXTERN int mgpu_memcpy_2d(mgpu_buffer *dst, size_t dst_offset,
                               size_t dst_pitch, const mgpu_buffer *src,
                               size_t src_offset, size_t src_pitch,
                               size_t width, size_t height);
MGPU_EXTERN int mgpu_memcpy_2d_async(mgpu_buffer *dst, size_t dst_offset,
                                     size_t dst_pitch, const mgpu_buffer *src,
                                     size_t src_offset, size_t src_pitch,
                                     size_t width, size_t height,
                                     mgpu_stream *stream);
/* Host memory on one side; the stream must be the buffer's device's. */
MGPU_EXTERN int mgpu_memcpy_2d_htod_async(mgpu_buffer *dst, size_t dst_offset,
                                          size_t dst_pitch, const void *host,
                                          size_t host_pitch, size_t width,
                                          size_t height, mgpu_stream *stream);
MGPU_EXTERN int mgpu_memcpy_2d_dtoh_async(void *host, size_t host_pitch,
                                          const mgpu_buffer *src,
                                          size_t src_offset, size_t src_pitch,
                                          size_t width, size_t height,
                                          mgpu_stream *stream);

/* Fills size bytes with the byte value. */
MGPU_EXTERN int mgpu_memset_async(mgpu_buffer *dst, size_t offset, int value,
                                  size_t size, mgpu_stream *stream);

/* ------------------------------------------------------------------------ */
/* Peer access                                                              */
/* ------------------------------------------------------------------------ */

/* *yes = 1 when devices a and b can copy directly between each other (both
 * directions), else 0. A device and itself, and two logical devices cut from
 * one GPU, always can. Host devices can unless MGPU_HOST_PEER=none (or the
 * config's host_peer = 0). */
MGPU_EXTERN int mgpu_peer_can_access(int a, int b, int *yes);

/* Turns direct copies between a and b on (both directions). MGPU_ENOTSUP with
 * a detail when the pair cannot; 0 when it already is on. */
MGPU_EXTERN int mgpu_peer_enable(int a, int b);

/* Turns direct copies between a and b off (both directions): copies between
 * them go host-staged, even between two logical devices of one GPU (which
 * otherwise copy within the GPU): that is how the staged path is measured on
 * a machine with one GPU. 0 when it already is off. Copies already queued
 * are not affected. */
MGPU_EXTERN int mgpu_peer_disable(int a, int b);

/* How a copy from one device to another travels. */
typedef enum mgpu_copy_path {
  MGPU_PATH_DEVICE = 0, /* within one device or one GPU: a device copy */
  MGPU_PATH_DIRECT = 1, /* direct peer copy */
  MGPU_PATH_STAGED = 2  /* pipelined through pinned host bounce buffers */
} mgpu_copy_path;

/* The path a copy of device buffers from src to dst takes now (turning peer
 * access on first where it is possible and was not turned off). */
MGPU_EXTERN int mgpu_copy_path_get(int src, int dst, mgpu_copy_path *path);

/* "device", "direct", "staged". */
MGPU_EXTERN const char *mgpu_copy_path_name(mgpu_copy_path path);

/* The host-staged path moves a copy in chunks of chunk bytes through depth
 * pinned bounce buffers (at least 2), so that the device-to-host half of one
 * chunk overlaps the host-to-device half of the one before. The defaults
 * come from the config (MGPU_STAGING_CHUNK, MGPU_STAGING_DEPTH); a chunk
 * left unset there is chosen per pair of devices (8 MiB between GPUs, 1 MiB
 * between host devices), and mgpu_staging_get reports it as 0. A change
 * applies to copies issued after it. chunk 0 or depth 0 leaves that value as
 * it is. A chunk lies between MGPU_STAGING_CHUNK_MIN and _MAX bytes (smaller
 * ones cut a copy into too many pieces, larger ones pin too much memory), a
 * depth between 2 and MGPU_STAGING_DEPTH_MAX (mgpu/core.h): others are
 * MGPU_EINVAL, here, in the config and in the environment variables. */
MGPU_EXTERN int mgpu_staging_set(size_t chunk, int depth);
MGPU_EXTERN int mgpu_staging_get(size_t *chunk, int *depth);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_COPY_H */
