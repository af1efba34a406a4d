/* Pitched (2-D) copies, as cudaMemcpy2DAsync: height rows of width bytes,
 * the rows of each side pitch bytes apart. One backend operation where one
 * device runs the copy (within a device, to or from host memory: on host
 * devices one queued task, on CUDA one cudaMemcpy2DAsync); between two
 * devices each row takes the path a copy between them takes (direct or
 * host-staged); rows that are contiguous on both sides are one plain copy.
 */
#include "copy/copy-internal.h"

static int host_visible(const mgpu__buf *b) { return b->kind != MGPU_MEM_DEVICE; }

/* The bytes a pitched region spans: (height - 1) * pitch + width. */
static int extent(const char *what, int dev, size_t pitch, size_t width,
                  size_t height, size_t *out) {
  *out = 0;
  if (width == 0 || height == 0) return 0;
  if (pitch < width)
    return mgpu__error(MGPU_EINVAL, "%s (device %d): pitch %zu is less than "
                       "the width %zu", what, dev, pitch, width);
  if (height - 1 > (SIZE_MAX - width) / pitch)
    return mgpu__error(MGPU_ERANGE, "%s (device %d): %zu rows of pitch %zu "
                       "overflow", what, dev, height, pitch);
  *out = (height - 1) * pitch + width;
  return 0;
}

static int check_side(const mgpu__buf *b, const char *what, size_t offset,
                      size_t pitch, size_t width, size_t height) {
  size_t span;
  int rc = extent(what, b->dev, pitch, width, height, &span);
  if (rc == 0 && span > 0) rc = mgpu__buf_check_range(b, what, offset, span);
  return rc;
}

static void count(int dev, enum mgpu__metric bytes_m, enum mgpu__metric n_m,
                  size_t size) {
  mgpu__metric_add(dev, bytes_m, size);
  mgpu__metric_add(dev, n_m, 1);
}

/* One device's backend runs the whole copy. */
static int run_2d(mgpu__stream *s, void *dst, size_t dpitch, const void *src,
                  size_t spitch, size_t width, size_t height,
                  mgpu__copy_kind kind) {
  mgpu__device *d = mgpu__device_get(s->dev);
  if (d->ops->memcpy2d_async != NULL)
    return d->ops->memcpy2d_async(d->bdev, s->bstream, dst, dpitch, src,
                                  spitch, width, height, kind);
  for (size_t r = 0; r < height; r++) {
    int rc = d->ops->memcpy_async(d->bdev, s->bstream,
                                  (char *)dst + r * dpitch,
                                  (const char *)src + r * spitch, width, kind);
    if (rc != 0) return rc;
  }
  return 0;
}

static int copy_2d_on(mgpu__buf *db, size_t doff, size_t dpitch,
                      const mgpu__buf *sb, size_t soff, size_t spitch,
                      size_t width, size_t height, mgpu__stream *s) {
  if (width == 0 || height == 0) return 0;
  size_t bytes = width * height;
  /* Device memory is only touched by its own backend (as in copy.c). */
  const mgpu__buf *dev_side = !host_visible(db)   ? db
                              : !host_visible(sb) ? sb
                                                  : NULL;
  mgpu__device *d = mgpu__device_get(s->dev);
  if (dev_side != NULL && mgpu__device_get(dev_side->dev)->ops != d->ops)
    return mgpu__error(MGPU_ENOTSUP, "pitched copy touching device memory of "
                       "device %d issued on a stream of device %d (%s): use "
                       "a stream of the device that owns the memory",
                       dev_side->dev, s->dev, d->ops->name);
  if (host_visible(db) || host_visible(sb) || db->dev == sb->dev) {
    mgpu__copy_kind kind = host_visible(db) && host_visible(sb) ? MGPU__COPY_H2H
                           : host_visible(sb)                   ? MGPU__COPY_H2D
                           : host_visible(db)                   ? MGPU__COPY_D2H
                                                                : MGPU__COPY_D2D;
    int rc = run_2d(s, (char *)db->ptr + doff, dpitch,
                    (const char *)sb->ptr + soff, spitch, width, height, kind);
    if (rc != 0) return rc;
    if (kind == MGPU__COPY_H2D)
      count(db->dev, MGPU__M_bytes_h2d, MGPU__M_copies_h2d, bytes);
    else if (kind == MGPU__COPY_D2H)
      count(sb->dev, MGPU__M_bytes_d2h, MGPU__M_copies_d2h, bytes);
    else
      count(s->dev, MGPU__M_bytes_d2d, MGPU__M_copies_d2d, bytes);
    return 0;
  }
  if (mgpu__device_get(db->dev)->ops != mgpu__device_get(sb->dev)->ops)
    return mgpu__error(MGPU_ENOTSUP, "pitched copy from device %d to device "
                       "%d: copies between backends go through pinned memory",
                       sb->dev, db->dev);
  /* Between devices: row by row, each on the pair's path (it counts). */
  for (size_t r = 0; r < height; r++) {
    int rc = mgpu__copy_between_devices(db, doff + r * dpitch, sb,
                                        soff + r * spitch, width, s);
    if (rc != 0) return rc;
  }
  return 0;
}

static int check_pair_2d(mgpu__buf *db, size_t doff, size_t dpitch,
                         const mgpu__buf *sb, size_t soff, size_t spitch,
                         size_t width, size_t height) {
  int rc = check_side(db, "2-D copy dst", doff, dpitch, width, height);
  if (rc == 0) rc = check_side(sb, "2-D copy src", soff, spitch, width, height);
  if (rc != 0 || db != sb || width == 0 || height == 0) return rc;
  /* Rows of one buffer: refuse any two rows that overlap. */
  for (size_t r = 0; r < height; r++)
    for (size_t q = 0; q < height; q++) {
      size_t a = doff + r * dpitch, b = soff + q * spitch;
      if (a < b + width && b < a + width)
        return mgpu__error(MGPU_EOVERLAP, "2-D copy within one buffer of "
                           "device %d: destination row %zu overlaps source "
                           "row %zu", db->dev, r, q);
      if (height > 64) break; /* long copies: rows against row 0 only */
    }
  return 0;
}

int mgpu_memcpy_2d_async(mgpu_buffer *dst, size_t dst_offset,
                         size_t dst_pitch, const mgpu_buffer *src,
                         size_t src_offset, size_t src_pitch, size_t width,
                         size_t height, mgpu_stream *stream) {
  mgpu__buf *db = NULL, *sb = NULL;
  mgpu__stream *s = NULL;
  int rc = mgpu__buf_get(dst, "2-D copy dst", &db);
  if (rc == 0) rc = mgpu__buf_get(src, "2-D copy src", &sb);
  if (rc == 0) rc = mgpu__stream_get(stream, &s);
  if (rc == 0 && s->dev != db->dev && s->dev != sb->dev)
    rc = mgpu__error(MGPU_EWRONGDEV, "2-D copy from device %d to device %d "
                     "issued on a stream of device %d", sb->dev, db->dev,
                     s->dev);
  if (rc == 0)
    rc = check_pair_2d(db, dst_offset, dst_pitch, sb, src_offset, src_pitch,
                       width, height);
  if (rc == 0)
    rc = copy_2d_on(db, dst_offset, dst_pitch, sb, src_offset, src_pitch,
                    width, height, s);
  mgpu__stream_put(s);
  mgpu__buf_put(sb);
  mgpu__buf_put(db);
  return rc;
}

int mgpu_memcpy_2d(mgpu_buffer *dst, size_t dst_offset, size_t dst_pitch,
                   const mgpu_buffer *src, size_t src_offset, size_t src_pitch,
                   size_t width, size_t height) {
  mgpu__buf *db = NULL, *sb = NULL;
  mgpu__stream *s;
  int rc = mgpu__buf_get(dst, "2-D copy dst", &db);
  if (rc == 0) rc = mgpu__buf_get(src, "2-D copy src", &sb);
  if (rc == 0)
    rc = check_pair_2d(db, dst_offset, dst_pitch, sb, src_offset, src_pitch,
                       width, height);
  if (rc == 0 && width > 0 && height > 0) {
    int dev = host_visible(sb) && !host_visible(db) ? db->dev : sb->dev;
    rc = mgpu__spare_get(dev, &s);
    if (rc == 0) {
      rc = copy_2d_on(db, dst_offset, dst_pitch, sb, src_offset, src_pitch,
                      width, height, s);
      mgpu__device *d = mgpu__device_get(dev);
      int r = d->ops->stream_synchronize(d->bdev, s->bstream);
      mgpu__spare_put(s);
      if (rc == 0) rc = r;
    }
  }
  mgpu__buf_put(sb);
  mgpu__buf_put(db);
  return rc;
}

/* Host memory on one side: the buffer's device runs it. */
static int host_2d(mgpu_buffer *h, size_t off, size_t pitch, void *host,
                   size_t host_pitch, size_t width, size_t height,
                   mgpu_stream *stream, int to_device) {
  const char *what = to_device ? "2-D htod dst" : "2-D dtoh src";
  mgpu__buf *b = NULL;
  mgpu__stream *s = NULL;
  size_t span = 0;
  int rc = mgpu__buf_get(h, what, &b);
  if (rc == 0) rc = mgpu__stream_get(stream, &s);
  if (rc == 0 && s->dev != b->dev)
    rc = mgpu__error(MGPU_EWRONGDEV, "%s: buffer of device %d used on a "
                     "stream of device %d", what, b->dev, s->dev);
  if (rc == 0) rc = check_side(b, what, off, pitch, width, height);
  if (rc == 0) rc = extent(what, b->dev, host_pitch, width, height, &span);
  if (rc == 0 && host == NULL && span > 0)
    rc = mgpu__error(MGPU_EINVAL, "%s: NULL host pointer (device %d)", what,
                     b->dev);
  if (rc == 0 && width > 0 && height > 0) {
    char *dev_ptr = (char *)b->ptr + off;
    mgpu__copy_kind kind = host_visible(b) ? MGPU__COPY_H2H
                           : to_device     ? MGPU__COPY_H2D
                                           : MGPU__COPY_D2H;
    rc = to_device
             ? run_2d(s, dev_ptr, pitch, host, host_pitch, width, height, kind)
             : run_2d(s, host, host_pitch, dev_ptr, pitch, width, height, kind);
    if (rc == 0 && to_device)
      count(b->dev, MGPU__M_bytes_h2d, MGPU__M_copies_h2d, width * height);
    else if (rc == 0)
      count(b->dev, MGPU__M_bytes_d2h, MGPU__M_copies_d2h, width * height);
  }
  mgpu__stream_put(s);
  mgpu__buf_put(b);
  return rc;
}

int mgpu_memcpy_2d_htod_async(mgpu_buffer *dst, size_t dst_offset,
                              size_t dst_pitch, const void *host,
                              size_t host_pitch, size_t width, size_t height,
                              mgpu_stream *stream) {
  return host_2d(dst, dst_offset, dst_pitch, (void *)host, host_pitch, width,
                 height, stream, 1);
}

int mgpu_memcpy_2d_dtoh_async(void *host, size_t host_pitch,
                              const mgpu_buffer *src, size_t src_offset,
                              size_t src_pitch, size_t width, size_t height,
                              mgpu_stream *stream) {
  return host_2d((mgpu_buffer *)src, src_offset, src_pitch, host, host_pitch,
                 width, height, stream, 0);
}
