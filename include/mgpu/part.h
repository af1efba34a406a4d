/* mgpu part: distributions of an index range over devices, and scatter /
 * gather of host arrays by a distribution.
 *
 * A distribution splits [0, n) over an ordered list of devices ("parts").
 * Every part owns a list of index ranges; together the ranges of all parts
 * cover [0, n) exactly once. A part stores its elements contiguously, range
 * after range, in its own buffer: that is the "local" order scatter writes
 * and gather reads.
 *
 *   block          part p owns one range, n / P elements (the first n % P
 *                  parts one more)
 *   cyclic         element i belongs to part i % P (block-cyclic, b = 1)
 *   block-cyclic   block k = [k*b, (k+1)*b) belongs to part k % P
 *   weighted       one range per part, sized in proportion to a weight per
 *                  part; weights NULL: each device's measured speed
 *
 * Ranges are computed, not stored, so a cyclic distribution of 10^9 elements
 * costs a few bytes. See docs/sched.md.
 */
#ifndef MGPU_PART_H
#define MGPU_PART_H

#include <stddef.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgpu_dist_kind {
  MGPU_DIST_BLOCK = 0,
  MGPU_DIST_CYCLIC = 1,
  MGPU_DIST_BLOCK_CYCLIC = 2,
  MGPU_DIST_WEIGHTED = 3
} mgpu_dist_kind;

/* Half-open index range [begin, end). */
typedef struct mgpu_range {
  size_t begin, end;
} mgpu_range;

typedef struct mgpu_dist_opts {
  size_t size;            /* sizeof(mgpu_dist_opts) */
  mgpu_dist_kind kind;    /* default MGPU_DIST_BLOCK */
  size_t block;           /* block-cyclic block size b (>= 1) */
  int ndevices;           /* parts; 0: every open device */
  const int *devices;     /* device of each part; NULL: 0 .. ndevices-1.
                             A device may appear more than once. */
  const double *weights;  /* weighted: one per part, >= 0, not all 0.
                             NULL: measured (mgpu_device_speed) */
} mgpu_dist_opts;

#define MGPU_DIST_OPTS_INITIALIZER                                        \
  { .size = sizeof(mgpu_dist_opts), .kind = MGPU_DIST_BLOCK, .block = 1,   \
    .ndevices = 0, .devices = NULL, .weights = NULL }

typedef struct mgpu_dist mgpu_dist;

/* Creates a distribution of [0, n) (n may be 0, or smaller than the number
 * of parts: some parts then own nothing). The caller owns *dist until
 * mgpu_dist_destroy. */
MGPU_EXTERN int mgpu_dist_create(mgpu_dist **dist, size_t n,
                                 const mgpu_dist_opts *opts);
/* Frees the distribution (NULL: nothing, 0). A second destroy and every
 * later call on it are MGPU_EFREED (the queries return their "nothing"
 * value: 0, -1 or an empty range, with the detail set); calls already
 * inside it on other threads finish first. */
MGPU_EXTERN int mgpu_dist_destroy(mgpu_dist *dist);

/* Read-only queries. A bad part index gives 0 (or -1 for the device). */
MGPU_EXTERN size_t mgpu_dist_n(const mgpu_dist *dist);
MGPU_EXTERN int mgpu_dist_nparts(const mgpu_dist *dist);
MGPU_EXTERN int mgpu_dist_device(const mgpu_dist *dist, int part);
/* Elements part owns (the size of its local array). */
MGPU_EXTERN size_t mgpu_dist_count(const mgpu_dist *dist, int part);
/* Number of non-empty ranges of part, and the r-th of them (in increasing
 * order; local offset of range r = elements of ranges 0 .. r-1). */
MGPU_EXTERN size_t mgpu_dist_nranges(const mgpu_dist *dist, int part);
MGPU_EXTERN mgpu_range mgpu_dist_range(const mgpu_dist *dist, int part,
                                       size_t r);
/* The part that owns global index i and its position in the part's local
 * array. MGPU_ERANGE when i >= n. */
MGPU_EXTERN int mgpu_dist_locate(const mgpu_dist *dist, size_t i, int *part,
                                 size_t *local);

/* Relative speed of each device, measured by timing a built-in kernel
 * (mgpu_axpy over 4 MiB) a few times: elements per second. Used by weighted
 * distributions given no weights. */
MGPU_EXTERN int mgpu_device_speed(int ndevices, const int *devices,
                                  double *speed);

/* Allocates one device buffer per part, of count(part) * elem_size bytes
 * (NULL for a part that owns nothing). The caller frees them with
 * mgpu_dist_free_buffers. */
MGPU_EXTERN int mgpu_dist_alloc_buffers(const mgpu_dist *dist,
                                        size_t elem_size,
                                        mgpu_buffer **bufs);
MGPU_EXTERN void mgpu_dist_free_buffers(const mgpu_dist *dist,
                                        mgpu_buffer **bufs);

/* Copies the host array (n elements of elem_size bytes) into the parts'
 * buffers, bufs[p] holding part p's elements in local order, on streams[p]
 * (a stream of part p's device). Asynchronous: the copies are queued and the
 * call returns; host must stay valid and unchanged until the streams are
 * synchronized, and the buffers are ready then. Fine-grained distributions
 * (blocks under 64 KiB) are packed into staging memory first, one copy per
 * part, and the runtime frees the staging itself. streams NULL: synchronous
 * (on streams made for the call). bufs[p] of a part that owns nothing is
 * ignored and may be NULL. */
MGPU_EXTERN int mgpu_scatter(const mgpu_dist *dist, const void *host,
                             size_t elem_size, mgpu_buffer *const *bufs,
                             mgpu_stream *const *streams);

/* The reverse: every element goes back to its global index in host. With
 * streams the copies are queued; host must stay valid, and is complete only
 * once the streams are synchronized. */
MGPU_EXTERN int mgpu_gather(const mgpu_dist *dist, void *host,
                            size_t elem_size, mgpu_buffer *const *bufs,
                            mgpu_stream *const *streams);

/* The same with the array in a buffer (device memory of any device, pinned
 * or unified) at a byte offset instead of a host array: the copies go
 * buffer to buffer (mgpu_memcpy's paths; the blocks of cyclic layouts as
 * one pitched copy per part). With streams the copies are queued on
 * streams[p] (a stream of part p's device or of the array's); NULL:
 * synchronous. The array must hold n elements from offset (MGPU_ERANGE
 * naming offset and sizes otherwise); a part's buffer that is missing or
 * freed is MGPU_EBADHANDLE, on another device MGPU_EWRONGDEV, too small
 * MGPU_ERANGE; a zero element size MGPU_EINVAL. */
MGPU_EXTERN int mgpu_scatter_buffer(const mgpu_dist *dist,
                                    const mgpu_buffer *src, size_t src_offset,
                                    size_t elem_size,
                                    mgpu_buffer *const *bufs,
                                    mgpu_stream *const *streams);
MGPU_EXTERN int mgpu_gather_buffer(const mgpu_dist *dist, mgpu_buffer *dst,
                                   size_t dst_offset, size_t elem_size,
                                   mgpu_buffer *const *bufs,
                                   mgpu_stream *const *streams);

/* One part's elements between the whole array (in global, from
 * global_offset) and the part's local order (in local, from local_offset):
 * to_local 1 copies array -> local, 0 local -> array. Queued on stream
 * (NULL: synchronous). The building block of the two calls above and of
 * scatter / gather across MPI ranks (mgpu_mpi_dist_scatter). A bad part
 * or argument is MGPU_EINVAL; the copies' own errors (ranges, devices)
 * are mgpu_memcpy's and mgpu_memcpy_2d's. */
MGPU_EXTERN int mgpu_dist_copy_part(const mgpu_dist *dist, int part,
                                    mgpu_buffer *global, size_t global_offset,
                                    mgpu_buffer *local, size_t local_offset,
                                    size_t elem_size, int to_local,
                                    mgpu_stream *stream);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_PART_H */
