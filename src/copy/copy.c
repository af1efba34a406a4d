/* The copy entry points: host to device, device to host, and the one
 * buffer-to-buffer call that picks the path.
 *
 * Every check (handles, ranges, overlap, which device the stream belongs to)
 * is made here before any byte moves. A copy that has a host-visible side
 * (pinned or unified memory) is an ordinary copy on the stream's device; a
 * copy between two device buffers of one device is a device copy; two device
 * buffers of different devices go to the peer layer (peer.c), which takes a
 * device copy (logical devices of one GPU), the direct or the host-staged
 * path. Metrics are counted where the path is chosen.
 */
#include "copy/copy-internal.h"
#include "core/capture.h"

static int host_visible(const mgpu__buf *buf) {
  return buf->kind != MGPU_MEM_DEVICE;
}

static void count(int dev, enum mgpu__metric bytes_m, enum mgpu__metric n_m,
                  size_t size) {
  mgpu__metric_add(dev, bytes_m, size);
  mgpu__metric_add(dev, n_m, 1);
}

/* The stream of an asynchronous copy; it may be capturing (the caller
 * records instead of queuing). */
static int stream_for(mgpu_stream *h, const mgpu__buf *buf, const char *what,
                      mgpu__stream **s) {
  int rc = mgpu__stream_get_capturing(h, s);
  if (rc != 0) return rc;
  if ((*s)->dev != buf->dev)
    return mgpu__error(MGPU_EWRONGDEV, "%s: buffer of device %d used on a "
                       "stream of device %d", what, buf->dev, (*s)->dev);
  return 0;
}

int mgpu_memcpy_htod_async(mgpu_buffer *dst, size_t dst_offset,
                           const void *host, size_t size, mgpu_stream *stream) {
  mgpu__buf *buf = NULL;
  mgpu__stream *s = NULL;
  int rc = mgpu__buf_get(dst, "htod dst", &buf);
  if (rc == 0) rc = mgpu__buf_check_writable(buf, "htod dst");
  if (rc == 0) rc = stream_for(stream, buf, "htod dst", &s);
  if (rc == 0) rc = mgpu__buf_check_range(buf, "htod dst", dst_offset, size);
  if (rc == 0 && host == NULL && size > 0)
    rc = mgpu__error(MGPU_EINVAL, "htod: NULL host pointer for %zu bytes to "
                     "device %d", size, buf->dev);
  if (rc == 0 && size > 0 && mgpu__stream_capture(s) != NULL)
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_HTOD, .dev = s->dev, .dst = dst,
        .dst_offset = dst_offset, .host = (void *)host, .size = size});
  else if (rc == 0 && size > 0) {
    mgpu__flight_record(buf->dev, "memcpy_htod_async", size, (uintptr_t)stream);
    mgpu__device *d = mgpu__device_get(buf->dev);
    mgpu__copy_kind kind = host_visible(buf) ? MGPU__COPY_H2H : MGPU__COPY_H2D;
    rc = d->ops->memcpy_async(d->bdev, s->bstream,
                              (char *)buf->ptr + dst_offset, host, size, kind);
    if (rc == 0) count(buf->dev, MGPU__M_bytes_h2d, MGPU__M_copies_h2d, size);
  }
  mgpu__stream_put(s);
  mgpu__buf_put(buf);
  return rc;
}

int mgpu_memcpy_dtoh_async(void *host, const mgpu_buffer *src,
                           size_t src_offset, size_t size,
                           mgpu_stream *stream) {
  mgpu__buf *buf = NULL;
  mgpu__stream *s = NULL;
  int rc = mgpu__buf_get(src, "dtoh src", &buf);
  if (rc == 0) rc = stream_for(stream, buf, "dtoh src", &s);
  if (rc == 0) rc = mgpu__buf_check_range(buf, "dtoh src", src_offset, size);
  if (rc == 0 && host == NULL && size > 0)
    rc = mgpu__error(MGPU_EINVAL, "dtoh: NULL host pointer for %zu bytes from "
                     "device %d", size, buf->dev);
  if (rc == 0 && size > 0 && mgpu__stream_capture(s) != NULL)
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_DTOH, .dev = s->dev, .a = src,
        .a_offset = src_offset, .host = host, .size = size});
  else if (rc == 0 && size > 0) {
    mgpu__flight_record(buf->dev, "memcpy_dtoh_async", size, (uintptr_t)stream);
    mgpu__device *d = mgpu__device_get(buf->dev);
    mgpu__copy_kind kind = host_visible(buf) ? MGPU__COPY_H2H : MGPU__COPY_D2H;
    rc = d->ops->memcpy_async(d->bdev, s->bstream, host,
                              (const char *)buf->ptr + src_offset, size, kind);
    if (rc == 0) count(buf->dev, MGPU__M_bytes_d2h, MGPU__M_copies_d2h, size);
  }
  mgpu__stream_put(s);
  mgpu__buf_put(buf);
  return rc;
}

/* Waits for a spare stream's copy and gives the stream back. */
static int run_sync(int dev, mgpu__stream *s, int rc) {
  mgpu__device *d = mgpu__device_get(dev);
  int r = d->ops->stream_synchronize(d->bdev, s->bstream);
  mgpu__spare_put(s);
  return rc != 0 ? rc : r;
}

int mgpu_memcpy_htod(mgpu_buffer *dst, size_t dst_offset, const void *host,
                     size_t size) {
  mgpu__buf *buf = NULL;
  mgpu__stream *s;
  int rc = mgpu__buf_get(dst, "htod dst", &buf);
  if (rc == 0) rc = mgpu__buf_check_writable(buf, "htod dst");
  if (rc == 0) rc = mgpu__spare_get(buf->dev, &s);
  if (rc != 0) {
    mgpu__buf_put(buf);
    return rc;
  }
  mgpu__device *d = mgpu__device_get(buf->dev);
  rc = mgpu__buf_check_range(buf, "htod dst", dst_offset, size);
  if (rc == 0 && host == NULL && size > 0)
    rc = mgpu__error(MGPU_EINVAL, "htod: NULL host pointer for %zu bytes to "
                     "device %d", size, buf->dev);
  if (rc == 0 && size > 0) {
    mgpu__flight_record(buf->dev, "memcpy_htod", size, 0);
    rc = d->ops->memcpy_async(d->bdev, s->bstream, (char *)buf->ptr + dst_offset, host,
                              size, host_visible(buf) ? MGPU__COPY_H2H
                                                    : MGPU__COPY_H2D);
    if (rc == 0) count(buf->dev, MGPU__M_bytes_h2d, MGPU__M_copies_h2d, size);
  }
  rc = run_sync(buf->dev, s, rc);
  mgpu__buf_put(buf);
  return rc;
}

int mgpu_memcpy_dtoh(void *host, const mgpu_buffer *src, size_t src_offset,
                     size_t size) {
  mgpu__buf *buf = NULL;
  mgpu__stream *s;
  int rc = mgpu__buf_get(src, "dtoh src", &buf);
  if (rc == 0) rc = mgpu__spare_get(buf->dev, &s);
  if (rc != 0) {
    mgpu__buf_put(buf);
    return rc;
  }
  mgpu__device *d = mgpu__device_get(buf->dev);
  rc = mgpu__buf_check_range(buf, "dtoh src", src_offset, size);
  if (rc == 0 && host == NULL && size > 0)
    rc = mgpu__error(MGPU_EINVAL, "dtoh: NULL host pointer for %zu bytes from "
                     "device %d", size, buf->dev);
  if (rc == 0 && size > 0) {
    mgpu__flight_record(buf->dev, "memcpy_dtoh", size, 0);
    rc = d->ops->memcpy_async(d->bdev, s->bstream, host,
                              (const char *)buf->ptr + src_offset, size,
                              host_visible(buf) ? MGPU__COPY_H2H
                                              : MGPU__COPY_D2H);
    if (rc == 0) count(buf->dev, MGPU__M_bytes_d2h, MGPU__M_copies_d2h, size);
  }
  rc = run_sync(buf->dev, s, rc);
  mgpu__buf_put(buf);
  return rc;
}

/* Checks both sides of a buffer-to-buffer copy. */
static int check_pair(mgpu__buf *db, size_t dst_offset, const mgpu__buf *sb,
                      size_t src_offset, size_t size) {
  int rc = mgpu__buf_check_range(db, "copy dst", dst_offset, size);
  if (rc == 0) rc = mgpu__buf_check_range(sb, "copy src", src_offset, size);
  if (rc != 0) return rc;
  if (db == sb && size > 0 && dst_offset < src_offset + size &&
      src_offset < dst_offset + size)
    return mgpu__error(MGPU_EOVERLAP, "copy within one buffer of device %d: "
                       "source [%zu, %zu) and destination [%zu, %zu) overlap",
                       db->dev, src_offset, src_offset + size, dst_offset,
                       dst_offset + size);
  return 0;
}

static int copy_on(mgpu__buf *db, size_t dst_offset, const mgpu__buf *sb,
                   size_t src_offset, size_t size, mgpu__stream *s) {
  if (size == 0) return 0;
  mgpu__device *dd = mgpu__device_get(db->dev), *sd = mgpu__device_get(sb->dev);
  mgpu__device *d = mgpu__device_get(s->dev);
  void *dst = (char *)db->ptr + dst_offset;
  const void *src = (const char *)sb->ptr + src_offset;
  int rc;
  /* Device memory is only touched by its own backend: a host worker must
   * never memcpy into a GPU pointer, nor CUDA read a host device's memory
   * as if it were its own. */
  const mgpu__buf *dev_side = !host_visible(db)   ? db
                              : !host_visible(sb) ? sb
                                                  : NULL;
  if (dev_side != NULL && mgpu__device_get(dev_side->dev)->ops != d->ops)
    return mgpu__error(MGPU_ENOTSUP, "copy touching device memory of device "
                       "%d (%s) issued on a stream of device %d (%s): use a "
                       "stream of the device that owns the memory",
                       dev_side->dev, mgpu__device_get(dev_side->dev)->ops->name,
                       s->dev, d->ops->name);
  if (host_visible(db) || host_visible(sb) || db->dev == sb->dev) {
    mgpu__copy_kind kind = host_visible(db) && host_visible(sb) ? MGPU__COPY_H2H
                           : host_visible(sb)                   ? MGPU__COPY_H2D
                           : host_visible(db)                   ? MGPU__COPY_D2H
                                                                : MGPU__COPY_D2D;
    rc = d->ops->memcpy_async(d->bdev, s->bstream, dst, src, size, kind);
    if (rc != 0) return rc;
    switch (kind) {
      case MGPU__COPY_H2D:
        count(db->dev, MGPU__M_bytes_h2d, MGPU__M_copies_h2d, size);
        break;
      case MGPU__COPY_D2H:
        count(sb->dev, MGPU__M_bytes_d2h, MGPU__M_copies_d2h, size);
        break;
      default:
        count(s->dev, MGPU__M_bytes_d2d, MGPU__M_copies_d2d, size);
        break;
    }
    return 0;
  }
  if (dd->ops != sd->ops)
    return mgpu__error(MGPU_ENOTSUP, "copy from device %d (%s) to device %d "
                       "(%s): copies between backends go through pinned "
                       "memory", sb->dev, sd->ops->name, db->dev,
                       dd->ops->name);
  return mgpu__copy_between_devices(db, dst_offset, sb, src_offset, size, s);
}

int mgpu__copy_async(mgpu__buf *db, size_t dst_offset, const mgpu__buf *sb,
                     size_t src_offset, size_t size, mgpu__stream *s) {
  if (s->dev != db->dev && s->dev != sb->dev)
    return mgpu__error(MGPU_EWRONGDEV, "copy from device %d to device %d "
                       "issued on a stream of device %d", sb->dev, db->dev,
                       s->dev);
  int rc = check_pair(db, dst_offset, sb, src_offset, size);
  if (rc == 0 && size > 0)
    mgpu__flight_record(s->dev, "memcpy_async", size, s->handle);
  if (rc == 0) rc = copy_on(db, dst_offset, sb, src_offset, size, s);
  return rc;
}

int mgpu_memcpy_async(mgpu_buffer *dst, size_t dst_offset,
                      const mgpu_buffer *src, size_t src_offset, size_t size,
                      mgpu_stream *stream) {
  mgpu__buf *db = NULL, *sb = NULL;
  mgpu__stream *s = NULL;
  int rc = mgpu__buf_get(dst, "copy dst", &db);
  if (rc == 0) rc = mgpu__buf_check_writable(db, "copy dst");
  if (rc == 0) rc = mgpu__buf_get(src, "copy src", &sb);
  if (rc == 0) rc = mgpu__stream_get_capturing(stream, &s);
  if (rc == 0 && mgpu__stream_capture(s) != NULL) {
    /* Checked as the copy would be, then recorded. */
    if (s->dev != db->dev && s->dev != sb->dev)
      rc = mgpu__error(MGPU_EWRONGDEV, "copy from device %d to device %d "
                       "issued on a stream of device %d", sb->dev, db->dev,
                       s->dev);
    if (rc == 0) rc = check_pair(db, dst_offset, sb, src_offset, size);
    if (rc == 0 && size > 0)
      rc = mgpu__capture_record(s, &(mgpu__graph_op){
          .kind = MGPU__GOP_COPY, .dev = s->dev, .dst = dst,
          .dst_offset = dst_offset, .a = src, .a_offset = src_offset,
          .size = size});
  } else if (rc == 0)
    rc = mgpu__copy_async(db, dst_offset, sb, src_offset, size, s);
  mgpu__stream_put(s);
  mgpu__buf_put(sb);
  mgpu__buf_put(db);
  return rc;
}

int mgpu_memcpy(mgpu_buffer *dst, size_t dst_offset, const mgpu_buffer *src,
                size_t src_offset, size_t size) {
  mgpu__buf *db = NULL, *sb = NULL;
  mgpu__stream *s;
  int rc = mgpu__buf_get(dst, "copy dst", &db);
  if (rc == 0) rc = mgpu__buf_check_writable(db, "copy dst");
  if (rc == 0) rc = mgpu__buf_get(src, "copy src", &sb);
  if (rc == 0) rc = check_pair(db, dst_offset, sb, src_offset, size);
  if (rc == 0 && size > 0) {
    /* The side with device memory runs the copy (copy_on requires it). */
    int dev = host_visible(sb) && !host_visible(db) ? db->dev : sb->dev;
    rc = mgpu__spare_get(dev, &s);
    if (rc == 0) {
      mgpu__flight_record(dev, "memcpy", size, 0);
      rc = copy_on(db, dst_offset, sb, src_offset, size, s);
      rc = run_sync(dev, s, rc);
    }
  }
  mgpu__buf_put(sb);
  mgpu__buf_put(db);
  return rc;
}

int mgpu_memset_async(mgpu_buffer *dst, size_t offset, int value, size_t size,
                      mgpu_stream *stream) {
  mgpu__buf *buf = NULL;
  mgpu__stream *s = NULL;
  int rc = mgpu__buf_get(dst, "memset dst", &buf);
  if (rc == 0) rc = mgpu__buf_check_writable(buf, "memset dst");
  if (rc == 0) rc = stream_for(stream, buf, "memset dst", &s);
  if (rc == 0) rc = mgpu__buf_check_range(buf, "memset dst", offset, size);
  if (rc == 0 && size > 0 && mgpu__stream_capture(s) != NULL)
    rc = mgpu__capture_record(s, &(mgpu__graph_op){
        .kind = MGPU__GOP_MEMSET, .dev = s->dev, .dst = dst,
        .dst_offset = offset, .value = value, .size = size});
  else if (rc == 0 && size > 0) {
    mgpu__flight_record(buf->dev, "memset_async", size, (uintptr_t)stream);
    mgpu__device *d = mgpu__device_get(buf->dev);
    rc = d->ops->memset_async(d->bdev, s->bstream, (char *)buf->ptr + offset,
                              value, size);
  }
  mgpu__stream_put(s);
  mgpu__buf_put(buf);
  return rc;
}
