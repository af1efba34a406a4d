/* mgpu_reduce_to_host: one value from every element of every rank's buffer.
 *
 * Each device folds its own buffer in halves with the backend's element-wise
 * kernel (the first fold reads the user's buffer and writes the pooled
 * scratch buffer, so the input is left intact), until one element is left;
 * that element comes back to the host, which combines the ranks' partial
 * results in rank order. log2(count) kernel launches per device, and the
 * devices fold in parallel. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "util/elementwise.h"

/* Queues the folds of rank r and the copy of its result into *out. */
static int fold(mgpu__comm *c, int r, mgpu_buffer *buf, size_t m,
                mgpu_dtype dtype, mgpu_op op, void *out) {
  size_t esz = mgpu_dtype_size(dtype);
  mgpu_stream *s;
  int rc = mgpu__comm_stream(c, r, &s);
  if (rc != 0) return rc;
  mgpu_buffer *src = buf;
  if (m > 1) {
    mgpu_buffer *scratch;
    rc = mgpu__comm_scratch(c, r, (m + 1) / 2 * esz, &scratch);
    if (rc != 0) return rc;
    while (m > 1) {
      /* x[0 .. m - h) = x[0 .. m - h) op x[h .. m); an odd middle element
       * x[m - h] stays (or is carried over on the first fold). */
      size_t h = (m + 1) / 2, pairs = m - h;
      rc = mgpu_elementwise(s, scratch, 0, src, 0, src, h * esz, pairs, dtype,
                            op);
      if (rc == 0 && h != pairs && src != scratch)
        rc = mgpu_memcpy_async(scratch, pairs * esz, src, pairs * esz, esz, s);
      if (rc != 0) return rc;
      src = scratch;
      m = h;
    }
  }
  return mgpu_memcpy_dtoh_async(out, src, 0, esz, s);
}

/* Checks rank r's buffer: on its device, holding count elements. */
static int check_rank(mgpu__comm *c, int r, mgpu_buffer *h, size_t count,
                      size_t esz) {
  mgpu__buf *b;
  int rc = mgpu__buf_get(h, "buf", &b);
  if (rc != 0) return rc;
  if (b->dev != c->devs[r])
    rc = mgpu__error(MGPU_EWRONGDEV,
                     "reduce_to_host rank %d: buffer is on device %d, "
                     "rank %d is device %d",
                     r, b->dev, r, c->devs[r]);
  else if (count > b->size / esz)
    rc = mgpu__error(MGPU_ERANGE,
                     "reduce_to_host rank %d (device %d): %zu elements "
                     "need %zu bytes, the buffer holds %zu",
                     r, c->devs[r], count, count * esz, b->size);
  mgpu__buf_put(b);
  return rc;
}

static int reduce_to_host(mgpu__comm *c, mgpu_buffer *const *bufs,
                          const size_t *counts, mgpu_dtype dtype, mgpu_op op,
                          void *result) {
  int rc = 0;
  if (c->has_remote)
    return mgpu__error(MGPU_ENOTSUP, "reduce_to_host: the communicator spans "
                       "processes; use mgpu_allreduce");
  size_t esz = mgpu_dtype_size(dtype);
  if (bufs == NULL || counts == NULL || result == NULL)
    return mgpu__error(MGPU_EINVAL, "reduce_to_host: NULL argument");
  if (esz != 4 && esz != 8)
    return mgpu__error(MGPU_ENOTSUP, "reduce_to_host: type %s",
                       mgpu_dtype_name(dtype));
  if (op < MGPU_SUM || op > MGPU_MAX)
    return mgpu__error(MGPU_EINVAL, "reduce_to_host: unknown op %d", (int)op);
  int any = 0;
  for (int r = 0; r < c->n; r++) {
    if (counts[r] == 0) continue;
    any = 1;
    rc = check_rank(c, r, bufs[r], counts[r], esz);
    if (rc != 0) return rc;
  }
  if (!any)
    return mgpu__error(MGPU_EINVAL,
                       "reduce_to_host: every count is 0: no value to return");

  uint64_t partial[MGPU_MAX_DEVICES];
  mgpu__mutex_lock(&c->lock);
  /* The buffers hold what earlier work on any stream wrote, and the scratch
   * buffers are free of collectives in flight. */
  for (int r = 0; r < c->n && rc == 0; r++)
    if (counts[r] > 0) rc = mgpu_device_synchronize(c->devs[r]);
  for (int r = 0; r < c->n && rc == 0; r++)
    if (counts[r] > 0)
      rc = fold(c, r, bufs[r], counts[r], dtype, op, &partial[r]);
  for (int r = 0; r < c->n; r++) {
    if (c->streams[r] == NULL) continue;
    int src = mgpu_stream_synchronize(c->streams[r]);
    if (rc == 0) rc = src;
  }
  mgpu__mutex_unlock(&c->lock);
  if (rc != 0) return rc;

  int have = 0;
  for (int r = 0; r < c->n; r++) {
    if (counts[r] == 0) continue;
    if (!have)
      memcpy(result, &partial[r], esz);
    else
      mgpu__elementwise_host(result, result, &partial[r], 1, dtype, op);
    have = 1;
  }
  return 0;
}

int mgpu_reduce_to_host(mgpu_comm *comm, mgpu_buffer *const *bufs,
                        const size_t *counts, mgpu_dtype dtype, mgpu_op op,
                        void *result) {
  mgpu__comm *c;
  int rc = mgpu__comm_get(comm, &c);
  if (rc != 0) return rc;
  rc = reduce_to_host(c, bufs, counts, dtype, op, result);
  mgpu__comm_put(c);
  return rc;
}
