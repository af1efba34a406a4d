/* Internal interface of the copy layer (src/copy): the pieces that peer.c
 * (path choice, peer state) and staged.c (the pipelined host-staged path,
 * helper streams, pooled events and bounce buffers) share, and what the
 * layers below it (topo, chan) ask of them.
 */
#ifndef MGPU_COPY_INTERNAL_H
#define MGPU_COPY_INTERNAL_H

#include "core/core-internal.h"
#include "mgpu/copy.h"

/* The path a copy of device memory from device src to device dst takes now;
 * turns peer access on first where it was never set for the pair. */
int mgpu__peer_path(int src, int dst, mgpu_copy_path *path);

/* 1 when the two devices are logical devices of one physical GPU. */
int mgpu__same_physical(const mgpu__device *a, const mgpu__device *b);

/* Copies size bytes from src (memory of device sd) to dst (memory of device
 * dd) in chunks through pinned bounce buffers, ordered on s (a stream of sd
 * or dd). Both sides are device memory as far as the backends are told. */
int mgpu__copy_staged(mgpu__device *dd, void *dst, mgpu__device *sd,
                      const void *src, size_t size, mgpu__stream *s);

/* Copies size bytes between two device buffers of different devices of one
 * backend, ordered on s (which belongs to dst->dev or src->dev): it starts
 * after the work queued on s before it, and work queued on s after it (or
 * waiting on an event recorded on s after it) sees the data. Ranges and
 * overlap are already checked. Counts its metrics. */
int mgpu__copy_between_devices(mgpu__buf *dst, size_t dst_offset,
                               const mgpu__buf *src, size_t src_offset,
                               size_t size, mgpu__stream *s);

/* mgpu_memcpy_async on buffers and a stream the caller looked up and holds
 * (a channel's send holds its source from the call to its copy). */
int mgpu__copy_async(mgpu__buf *dst, size_t dst_offset, const mgpu__buf *src,
                     size_t src_offset, size_t size, mgpu__stream *s);

/* Releases helper streams, pooled events and bounce buffers (shutdown). */
void mgpu__staged_shutdown(void);

#endif /* MGPU_COPY_INTERNAL_H */
