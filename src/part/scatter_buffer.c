/* Scatter and gather between a distribution's parts and an array in a
 * buffer (on any device, or pinned): device data, not only host arrays.
 * A part's ranges are copied with one pitched copy where they are regular
 * (cyclic and block-cyclic layouts: blocks of b elements, P * b apart) and
 * one plain copy where the part owns one range. */
#include <stdint.h>
#include <stdlib.h>

#include "core/core-internal.h"
#include "mgpu/part.h"
#include "part/part-internal.h"

static int check_global(const mgpu__dist *d, const mgpu_buffer *global,
                        size_t offset, size_t elem, const char *what) {
  if (global == NULL || elem == 0)
    return mgpu__error(MGPU_EINVAL, "%s: %s", what,
                       elem == 0 ? "element size is 0" : "buffer is NULL");
  size_t size = mgpu_buffer_size(global);
  int dev = mgpu_buffer_device(global);
  if (dev < 0) return mgpu__error(MGPU_EFREED, "%s: the array's buffer is "
                                  "not a live buffer", what);
  if (d->n > SIZE_MAX / elem || offset > size || d->n * elem > size - offset)
    return mgpu__error(MGPU_ERANGE, "%s: the array of %zu elements of %zu "
                       "bytes at offset %zu does not fit the buffer of %zu "
                       "bytes on device %d", what, d->n, elem, offset, size,
                       dev);
  return 0;
}

static int copy_part(const mgpu__dist *d, int part, mgpu_buffer *global,
                     size_t global_offset, mgpu_buffer *local,
                     size_t local_offset, size_t elem, int to_local,
                     mgpu_stream *stream) {
  if (part < 0 || part >= d->nparts || elem == 0 ||
      global == NULL || local == NULL)
    return mgpu__error(MGPU_EINVAL, "dist_copy_part: bad argument (part %d "
                       "of %d, element size %zu)", part, d->nparts,
                       elem);
  size_t nr = mgpu__dist_nranges(d, part);
  if (nr == 0) return 0;
  mgpu_buffer *dst = to_local ? local : global;
  const mgpu_buffer *src = to_local ? global : local;
  if (!d->cyclic) { /* one range */
    mgpu_range r = mgpu__dist_range(d, part, 0);
    size_t g = global_offset + r.begin * elem, bytes = (r.end - r.begin) * elem;
    size_t doff = to_local ? local_offset : g, soff = to_local ? g : local_offset;
    return stream ? mgpu_memcpy_async(dst, doff, src, soff, bytes, stream)
                  : mgpu_memcpy(dst, doff, src, soff, bytes);
  }
  /* Blocks of d->block elements, nparts * block apart; the last may be
   * short. */
  mgpu_range first = mgpu__dist_range(d, part, 0);
  mgpu_range last = mgpu__dist_range(d, part, nr - 1);
  size_t full = last.end - last.begin == d->block ? nr : nr - 1;
  size_t width = d->block * elem, gpitch = (size_t)d->nparts * width;
  size_t g = global_offset + first.begin * elem;
  int rc = 0;
  if (full > 0) {
    size_t doff = to_local ? local_offset : g, soff = to_local ? g : local_offset;
    size_t dp = to_local ? width : gpitch, sp = to_local ? gpitch : width;
    rc = stream ? mgpu_memcpy_2d_async(dst, doff, dp, src, soff, sp, width,
                                       full, stream)
                : mgpu_memcpy_2d(dst, doff, dp, src, soff, sp, width, full);
  }
  if (rc == 0 && full < nr) {
    size_t lo = local_offset + full * width;
    size_t go = global_offset + last.begin * elem;
    size_t bytes = (last.end - last.begin) * elem;
    size_t doff = to_local ? lo : go, soff = to_local ? go : lo;
    rc = stream ? mgpu_memcpy_async(dst, doff, src, soff, bytes, stream)
                : mgpu_memcpy(dst, doff, src, soff, bytes);
  }
  return rc;
}

static int move_buffer(const mgpu__dist *d, mgpu_buffer *global, size_t off,
                       size_t elem, mgpu_buffer *const *bufs,
                       mgpu_stream *const *streams, int to_local) {
  const char *what = to_local ? "scatter_buffer" : "gather_buffer";
  int rc = check_global(d, global, off, elem, what);
  if (rc == 0 && bufs == NULL)
    rc = mgpu__error(MGPU_EINVAL, "%s: bufs is NULL", what);
  for (int p = 0; rc == 0 && p < d->nparts; p++) {
    size_t count = mgpu__dist_count(d, p);
    if (count == 0) continue;
    if (bufs[p] == NULL || mgpu_buffer_device(bufs[p]) < 0)
      return mgpu__error(MGPU_EBADHANDLE, "%s: buffer of part %d (device %d, "
                         "%zu elements) is NULL or freed", what, p,
                         d->devices[p], count);
    if (mgpu_buffer_device(bufs[p]) != d->devices[p])
      return mgpu__error(MGPU_EWRONGDEV, "%s: buffer of part %d is on device "
                         "%d, the part is on device %d", what, p,
                         mgpu_buffer_device(bufs[p]), d->devices[p]);
    if (mgpu_buffer_size(bufs[p]) / elem < count)
      return mgpu__error(MGPU_ERANGE, "%s: buffer of part %d (device %d) "
                         "holds %zu bytes, the part needs %zu elements of %zu "
                         "bytes", what, p, d->devices[p],
                         mgpu_buffer_size(bufs[p]), count, elem);
  }
  for (int p = 0; rc == 0 && p < d->nparts; p++)
    if (mgpu__dist_count(d, p) > 0)
      rc = copy_part(d, p, global, off, bufs[p], 0, elem, to_local,
                     streams ? streams[p] : NULL);
  return rc;
}

int mgpu_dist_copy_part(const mgpu_dist *dist, int part, mgpu_buffer *global,
                        size_t global_offset, mgpu_buffer *local,
                        size_t local_offset, size_t elem, int to_local,
                        mgpu_stream *stream) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(dist, &d);
  if (rc != 0) return rc;
  rc = copy_part(d, part, global, global_offset, local, local_offset, elem,
                 to_local, stream);
  mgpu__dist_put(d);
  return rc;
}

/* Looks the distribution up, holds it while the parts move. */
static int move(const mgpu_dist *dist, mgpu_buffer *global, size_t off,
                size_t elem, mgpu_buffer *const *bufs,
                mgpu_stream *const *streams, int to_local) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(dist, &d);
  if (rc != 0) return rc;
  rc = move_buffer(d, global, off, elem, bufs, streams, to_local);
  mgpu__dist_put(d);
  return rc;
}

int mgpu_scatter_buffer(const mgpu_dist *d, const mgpu_buffer *src,
                        size_t src_offset, size_t elem,
                        mgpu_buffer *const *bufs,
                        mgpu_stream *const *streams) {
  return move(d, (mgpu_buffer *)src, src_offset, elem, bufs, streams, 1);
}

int mgpu_gather_buffer(const mgpu_dist *d, mgpu_buffer *dst,
                       size_t dst_offset, size_t elem,
                       mgpu_buffer *const *bufs,
                       mgpu_stream *const *streams) {
  return move(d, dst, dst_offset, elem, bufs, streams, 0);
}
