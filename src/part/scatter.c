/* Scatter and gather of a host array by a distribution, per-part buffers,
 * and the device speed measurement behind weighted distributions.
 *
 * Each part's copies go on that part's stream, so parts on different
 * devices move concurrently. A part whose ranges are large (block,
 * weighted, or block-cyclic with blocks of 64 KiB and more) is copied range
 * by range straight from or into the host array. A fine-grained part
 * (cyclic, small blocks) would cost one copy per element: it is packed into
 * a staging buffer on the host and moved in one copy; on gather a stream
 * callback unpacks the staging buffer into place once the copy is done and
 * frees it, so the call stays asynchronous. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "part/part-internal.h"
#include "util/fault.h"

#define DIRECT_MIN_BYTES (64u << 10)

static int part_is_direct(const mgpu__dist *d, int p, size_t elem) {
  return !d->cyclic || d->block * elem >= DIRECT_MIN_BYTES ||
         mgpu__dist_nranges(d, p) <= 1;
}

/* What a gather callback needs, copied so that the caller may destroy the
 * distribution before the streams finish. */
typedef struct unpack_job {
  void *host;
  const unsigned char *staging;
  size_t elem, n, block, count;
  int p, nparts;
} unpack_job;

static void unpack_cb(void *arg) {
  unpack_job *j = arg;
  size_t local = 0;
  for (size_t k = (size_t)j->p; local < j->count; k += (size_t)j->nparts) {
    size_t begin = k * j->block;
    size_t len = j->n - begin > j->block ? j->block : j->n - begin;
    memcpy((unsigned char *)j->host + begin * j->elem,
           j->staging + local * j->elem, len * j->elem);
    local += len;
  }
  mgpu__free((void *)j->staging);
  mgpu__free(j);
}

static void free_cb(void *arg) { mgpu__free(arg); }

static int check_args(const mgpu__dist *d, const void *host, size_t elem,
                      mgpu_buffer *const *bufs, const char *what) {
  if (d == NULL || bufs == NULL || (host == NULL && d->n > 0) || elem == 0)
    return mgpu__error(MGPU_EINVAL, "%s: %s", what,
                       d == NULL      ? "dist is NULL"
                       : bufs == NULL ? "bufs is NULL"
                       : elem == 0    ? "element size is 0"
                                      : "host array is NULL");
  for (int p = 0; p < d->nparts; p++) {
    size_t count = mgpu__dist_count(d, p);
    if (count == 0) continue;
    if (bufs[p] == NULL)
      return mgpu__error(MGPU_EBADHANDLE, "%s: buffer of part %d (device %d,"
                         " %zu elements) is NULL", what, p, d->devices[p],
                         count);
    int bdev = mgpu_buffer_device(bufs[p]);
    if (bdev < 0)
      return mgpu__error(MGPU_EFREED, "%s: buffer of part %d (device %d, "
                         "%zu elements) is not a live buffer", what, p,
                         d->devices[p], count);
    if (bdev != d->devices[p])
      return mgpu__error(MGPU_EWRONGDEV, "%s: buffer of part %d is on device "
                         "%d, the part is on device %d", what, p, bdev,
                         d->devices[p]);
    if (mgpu_buffer_size(bufs[p]) / elem < count)
      return mgpu__error(MGPU_ERANGE, "%s: buffer of part %d (device %d) "
                         "holds %zu bytes, the part needs %zu elements of %zu "
                         "bytes", what, p, bdev, mgpu_buffer_size(bufs[p]),
                         count, elem);
  }
  return 0;
}

/* One part, one direction, queued on s. */
static int move_part(const mgpu__dist *d, int p, void *host, size_t elem,
                     mgpu_buffer *buf, mgpu_stream *s, int to_device) {
  size_t count = mgpu__dist_count(d, p);
  unsigned char *h = host;
  if (count == 0) return 0;
  if (part_is_direct(d, p, elem)) {
    size_t nr = mgpu__dist_nranges(d, p), local = 0;
    for (size_t r = 0; r < nr; r++) {
      mgpu_range g = mgpu__dist_range(d, p, r);
      size_t bytes = (g.end - g.begin) * elem;
      int rc = to_device
                   ? mgpu_memcpy_htod_async(buf, local * elem,
                                            h + g.begin * elem, bytes, s)
                   : mgpu_memcpy_dtoh_async(h + g.begin * elem, buf,
                                            local * elem, bytes, s);
      if (rc != 0) return rc;
      local += g.end - g.begin;
    }
    return 0;
  }
  unsigned char *staging = mgpu__malloc(count * elem);
  if (staging == NULL)
    return mgpu__error(MGPU_ENOMEM, "scatter/gather: no memory to stage %zu "
                       "bytes of part %d (device %d)", count * elem, p,
                       d->devices[p]);
  if (to_device) {
    size_t nr = mgpu__dist_nranges(d, p), local = 0;
    for (size_t r = 0; r < nr; r++) {
      mgpu_range g = mgpu__dist_range(d, p, r);
      memcpy(staging + local * elem, h + g.begin * elem,
             (g.end - g.begin) * elem);
      local += g.end - g.begin;
    }
    int rc = mgpu_memcpy_htod_async(buf, 0, staging, count * elem, s);
    if (rc == 0) rc = mgpu_stream_add_callback(s, free_cb, staging);
    if (rc != 0) {
      /* The copy may be queued: free only after the stream is done. */
      int sync_rc = mgpu_stream_synchronize(s);
      (void)sync_rc;
      mgpu__free(staging);
    }
    return rc;
  }
  unpack_job *j = mgpu__malloc(sizeof *j);
  if (j == NULL) {
    mgpu__free(staging);
    return mgpu__error(MGPU_ENOMEM, "gather: out of memory");
  }
  *j = (unpack_job){host, staging, elem, d->n, d->block, count, p, d->nparts};
  int rc = mgpu_memcpy_dtoh_async(staging, buf, 0, count * elem, s);
  if (rc == 0) rc = mgpu_stream_add_callback(s, unpack_cb, j);
  if (rc != 0) {
    int sync_rc = mgpu_stream_synchronize(s);
    (void)sync_rc;
    mgpu__free(staging);
    mgpu__free(j);
  }
  return rc;
}

static int move_all(const mgpu__dist *d, void *host, size_t elem,
                    mgpu_buffer *const *bufs, mgpu_stream *const *streams,
                    int to_device) {
  const char *what = to_device ? "scatter" : "gather";
  int rc = check_args(d, host, elem, bufs, what);
  if (rc != 0) return rc;
  if (streams != NULL) {
    for (int p = 0; p < d->nparts && rc == 0; p++)
      rc = move_part(d, p, host, elem, bufs[p], streams[p], to_device);
    return rc;
  }
  /* Synchronous: a stream per part for the call, so that parts on
   * different devices still overlap. */
  mgpu_stream **own =
      d->nparts > 0 ? mgpu__calloc((size_t)d->nparts, sizeof *own) : NULL;
  if (own == NULL) return mgpu__error(MGPU_ENOMEM, "%s: out of memory", what);
  for (int p = 0; p < d->nparts && rc == 0; p++) {
    if (mgpu__dist_count(d, p) == 0) continue;
    rc = mgpu_stream_create(&own[p], d->devices[p]);
    if (rc == 0)
      rc = move_part(d, p, host, elem, bufs[p], own[p], to_device);
  }
  for (int p = 0; p < d->nparts; p++) {
    if (own[p] == NULL) continue;
    int src = mgpu_stream_synchronize(own[p]);
    if (rc == 0) rc = src;
    mgpu_stream_destroy(own[p]);
  }
  mgpu__free(own);
  return rc;
}

int mgpu_scatter(const mgpu_dist *h, const void *host, size_t elem,
                 mgpu_buffer *const *bufs, mgpu_stream *const *streams) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(h, &d);
  if (rc != 0) return rc;
  rc = move_all(d, (void *)host, elem, bufs, streams, 1);
  mgpu__dist_put(d);
  return rc;
}

int mgpu_gather(const mgpu_dist *h, void *host, size_t elem,
                mgpu_buffer *const *bufs, mgpu_stream *const *streams) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(h, &d);
  if (rc != 0) return rc;
  rc = move_all(d, host, elem, bufs, streams, 0);
  mgpu__dist_put(d);
  return rc;
}

static void free_buffers(const mgpu__dist *d, mgpu_buffer **bufs);

static int alloc_buffers(const mgpu__dist *d, size_t elem,
                         mgpu_buffer **bufs) {
  if (bufs == NULL || elem == 0)
    return mgpu__error(MGPU_EINVAL, "distribution: alloc_buffers needs a "
                       "dist, a bufs array and an element size");
  for (int p = 0; p < d->nparts; p++) bufs[p] = NULL;
  for (int p = 0; p < d->nparts; p++) {
    size_t count = mgpu__dist_count(d, p);
    if (count == 0) continue;
    if (count > SIZE_MAX / elem) {
      free_buffers(d, bufs);
      return mgpu__error(MGPU_ERANGE, "distribution: part %d (device %d) "
                         "owns %zu elements of %zu bytes, more than a size_t "
                         "holds", p, d->devices[p], count, elem);
    }
    int rc = mgpu_malloc(&bufs[p], d->devices[p], count * elem);
    if (rc != 0) {
      free_buffers(d, bufs);
      return rc;
    }
  }
  return 0;
}

int mgpu_dist_alloc_buffers(const mgpu_dist *h, size_t elem,
                            mgpu_buffer **bufs) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(h, &d);
  if (rc != 0) return rc;
  rc = alloc_buffers(d, elem, bufs);
  mgpu__dist_put(d);
  return rc;
}

void mgpu_dist_free_buffers(const mgpu_dist *h, mgpu_buffer **bufs) {
  const mgpu__dist *d;
  if (mgpu__dist_get(h, &d) != 0) return;
  free_buffers(d, bufs);
  mgpu__dist_put(d);
}

static void free_buffers(const mgpu__dist *d, mgpu_buffer **bufs) {
  if (bufs == NULL) return;
  for (int p = 0; p < d->nparts; p++) {
    if (bufs[p] != NULL) mgpu_free(bufs[p]);
    bufs[p] = NULL;
  }
}

/* Times y += a*x over 1 Mi floats on each device in turn (one device at a
 * time, so they do not slow each other), best of three after a warm-up. */
int mgpu_device_speed(int ndev, const int *devs, double *speed) {
  const size_t count = 1u << 20;
  if (ndev < 1 || speed == NULL)
    return mgpu__error(MGPU_EINVAL, "device speed: %d devices, speed %s",
                       ndev, speed ? "set" : "NULL");
  for (int i = 0; i < ndev; i++) {
    int dev = devs ? devs[i] : i;
    mgpu_buffer *x = NULL, *y = NULL;
    mgpu_stream *s = NULL;
    float one = 1.0f;
    int rc = mgpu_malloc(&x, dev, count * sizeof(float));
    if (rc == 0) rc = mgpu_malloc(&y, dev, count * sizeof(float));
    if (rc == 0) rc = mgpu_stream_create(&s, dev);
    if (rc == 0) rc = mgpu_fill(s, x, 0, count, MGPU_FLOAT32, &one);
    if (rc == 0) rc = mgpu_fill(s, y, 0, count, MGPU_FLOAT32, &one);
    double best = 0;
    for (int rep = 0; rep < 4 && rc == 0; rep++) {
      rc = mgpu_stream_synchronize(s);
      uint64_t t0 = mgpu__now_ns();
      if (rc == 0) rc = mgpu_axpy(s, y, 0, x, 0, count, MGPU_FLOAT32, 0.5);
      if (rc == 0) rc = mgpu_stream_synchronize(s);
      double dt = (double)(mgpu__now_ns() - t0);
      if (rep > 0 && (best == 0 || dt < best)) best = dt;
    }
    if (s) mgpu_stream_destroy(s);
    if (y) mgpu_free(y);
    if (x) mgpu_free(x);
    if (rc != 0) return rc;
    speed[i] = (double)count / (best > 0 ? best * 1e-9 : 1e-9);
  }
  return 0;
}
