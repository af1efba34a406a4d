/* The staging buffers and the pipelined staging of collectives. */
#include <string.h>

#include "mpi/mpi-internal.h"

static int bounce_alloc(int dev, mpi_bounce *b) {
  int rc = mgpu_malloc_host(&b->buf, dev, mgpu__mpi.chunk);
  if (rc != 0) return rc;
  b->host = mgpu_buffer_ptr(b->buf);
  memset(b->host, 0, mgpu__mpi.chunk); /* touch every page now, not per call */
  return mgpu_event_create(&b->done, dev);
}

static void bounce_free(mpi_bounce *b) {
  if (b->done != NULL) mgpu_event_destroy(b->done);
  if (b->buf != NULL) mgpu_free(b->buf);
  memset(b, 0, sizeof *b);
}

static void staging_free(mpi_staging *p) {
  if (p->pack != NULL) mgpu_free(p->pack);
  if (p->d2h != NULL) mgpu_stream_destroy(p->d2h);
  if (p->h2d != NULL) mgpu_stream_destroy(p->h2d);
  for (int s = 0; s < MPI_STAGE_SLOTS; s++) {
    bounce_free(&p->coll_in[s]);
    bounce_free(&p->coll_out[s]);
    bounce_free(&p->send[s]);
    bounce_free(&p->recv[s]);
  }
  memset(p, 0, sizeof *p);
}

int mgpu__mpi_staging(int dev, mpi_staging **staging) {
  if (dev < 0 || dev >= MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_ENODEV, "rank %d: no device %d",
                       mgpu__mpi.rank, dev);
  mpi_staging *p = &mgpu__mpi.staging[dev];
  if (!p->ready) {
    int rc = mgpu_stream_create(&p->d2h, dev);
    if (rc == 0) rc = mgpu_stream_create(&p->h2d, dev);
    for (int s = 0; rc == 0 && s < MPI_STAGE_SLOTS; s++) {
      if (rc == 0) rc = bounce_alloc(dev, &p->coll_in[s]);
      if (rc == 0) rc = bounce_alloc(dev, &p->coll_out[s]);
      if (rc == 0) rc = bounce_alloc(dev, &p->send[s]);
      if (rc == 0) rc = bounce_alloc(dev, &p->recv[s]);
    }
    if (rc != 0) {
      staging_free(p);
      return rc;
    }
    p->ready = 1;
  }
  *staging = p;
  return 0;
}

int mgpu__mpi_pack(int dev, size_t need, mpi_staging **staging) {
  int rc = mgpu__mpi_staging(dev, staging);
  if (rc != 0) return rc;
  mpi_staging *p = *staging;
  if (need == 0) need = 1;
  if (p->pack_size >= need) return 0;
  if (p->pack != NULL) mgpu_free(p->pack);
  p->pack = NULL;
  p->pack_size = 0;
  if ((rc = mgpu_malloc(&p->pack, dev, need)) != 0) return rc;
  p->pack_size = need;
  return 0;
}

void mgpu__mpi_staging_free_all(void) {
  for (int d = 0; d < MGPU_MAX_DEVICES; d++)
    if (mgpu__mpi.staging[d].ready) staging_free(&mgpu__mpi.staging[d]);
}

static int run_direct(const mpi_plan *pl) {
  void *out = pl->out.handle != NULL ? mgpu__mpi_addr(&pl->out, pl->out_off)
                                     : NULL;
  void *in = pl->in_place ? out
             : pl->in.handle != NULL ? mgpu__mpi_addr(&pl->in, pl->in_off)
                                     : NULL;
  size_t c = pl->count;
  if (pl->splittable && pl->count * pl->esize > MPI_HOST_CHUNK)
    c = MPI_HOST_CHUNK / pl->esize;
  for (size_t e0 = 0; e0 < pl->count; e0 += c) {
    size_t n = pl->count - e0 < c ? pl->count - e0 : c, at = e0 * pl->esize;
    int rc = pl->fn(pl->ctx, in ? (unsigned char *)in + at : NULL,
                    out ? (unsigned char *)out + at : NULL, n, pl->in_place);
    if (rc != 0) return rc;
  }
  return 0;
}

/* Queues the copies of chunk k (elements [e0, e0 + c) of every piece). */
static int queue_in(const mpi_plan *pl, mpi_staging *p, mpi_bounce *b,
                    size_t e0, size_t c) {
  for (int q = 0; q < pl->n_in; q++) {
    int rc = mgpu_memcpy_dtoh_async(
        b->host + (size_t)q * c * pl->esize, pl->in.handle,
        pl->in_off + (size_t)q * pl->in_stride + e0 * pl->esize,
        c * pl->esize, p->d2h);
    if (rc != 0) return rc;
  }
  return mgpu_event_record(b->done, p->d2h);
}

static int queue_out(const mpi_plan *pl, mpi_staging *p, mpi_bounce *b,
                     size_t e0, size_t c) {
  /* The caller's output buffer, handed to the collective as writable. */
  mgpu_buffer *dst = (mgpu_buffer *)pl->out.handle;
  for (int q = 0; q < pl->n_out; q++) {
    int rc = mgpu_memcpy_htod_async(
        dst, pl->out_off + (size_t)q * pl->out_stride + e0 * pl->esize,
        b->host + (size_t)q * c * pl->esize, c * pl->esize, p->h2d);
    if (rc != 0) return rc;
  }
  return mgpu_event_record(b->done, p->h2d);
}

static int run_staged(const mpi_plan *pl) {
  mpi_staging *p;
  int rc = mgpu__mpi_staging(pl->dev, &p);
  if (rc != 0) return rc;
  int pieces = pl->n_in > pl->n_out ? pl->n_in : pl->n_out;
  /* Every rank computes the same c: it depends on the shared chunk size,
   * element size and number of ranks only. */
  int nr = pl->nranks;
  size_t widest = (size_t)(pieces > nr ? pieces : nr) * pl->esize;
  size_t c = mgpu__mpi.chunk / widest;
  if (c == 0)
    return mgpu__error(MGPU_ENOTSUP, "rank %d: %d ranks of %zu-byte "
                       "elements do not fit MGPU_MPI_CHUNK=%zu",
                       mgpu__mpi.rank, nr, pl->esize, mgpu__mpi.chunk);
  size_t nchunks = (pl->count + c - 1) / c;
  int first_err = 0;
  for (size_t k = 0; k <= nchunks; k++) {
    if (k < nchunks && first_err == 0) {
      size_t e0 = k * c, n = pl->count - e0 < c ? pl->count - e0 : c;
      mpi_bounce *in = &p->coll_in[k % MPI_STAGE_SLOTS];
      /* The slot's last chunk was handed to MPI (synchronously) already. */
      if (pl->n_in > 0) first_err = queue_in(pl, p, in, e0, n);
    }
    if (k >= 1) {
      size_t j = k - 1, e0 = j * c, n = pl->count - e0 < c ? pl->count - e0 : c;
      mpi_bounce *in = &p->coll_in[j % MPI_STAGE_SLOTS];
      mpi_bounce *out = &p->coll_out[j % MPI_STAGE_SLOTS];
      /* Every rank must take part in each chunk's MPI call, even after a
       * local copy failed, or the others would wait for it. */
      if (first_err == 0 && pl->n_in > 0)
        first_err = mgpu_event_synchronize(in->done);
      /* The copy back of chunk j - 3 read this out slot. */
      if (first_err == 0 && j >= MPI_STAGE_SLOTS && pl->n_out > 0)
        first_err = mgpu_event_synchronize(out->done);
      /* After a failure the slots' events may not have been recorded: wait
       * for every copy queued, so that MPI never reads or writes a bounce
       * buffer a copy is still using. */
      if (first_err != 0) {
        mgpu_stream_synchronize(p->d2h);
        mgpu_stream_synchronize(p->h2d);
      }
      int mrc = pl->fn(pl->ctx, in->host, out->host, n, 0);
      if (first_err == 0) first_err = mrc;
      /* A step that timed out left its request with MPI: no further step
       * can match the other ranks' calls. */
      if (mgpu__mpi.failed) {
        first_err = mrc != 0 ? mrc : first_err;
        break;
      }
      if (first_err == 0 && pl->n_out > 0)
        first_err = queue_out(pl, p, out, e0, n);
      mgpu__mpi.stats.staged_chunks++;
    }
  }
  int rc1 = mgpu_stream_synchronize(p->d2h);
  int rc2 = mgpu_stream_synchronize(p->h2d);
  return first_err != 0 ? first_err : rc1 != 0 ? rc1 : rc2;
}

int mgpu__mpi_run_plan(const mpi_plan *pl) {
  if (pl->path == MPI_PATH_STAGED) return run_staged(pl);
  return run_direct(pl);
}
