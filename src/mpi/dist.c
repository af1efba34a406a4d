/* Distributions over the devices of every rank, and scatter / gather between
 * a buffer on the root rank and every part of every rank: the lesson's
 * "scatter from rank 0 to every device of every rank" as one call.
 *
 * The distribution's parts are the global devices in rank order (rank p's
 * device d is part first_device(p) + d); its ranges depend only on n, the
 * number of parts and the layout, so each rank computes them itself. The
 * root packs every part's elements into a pooled buffer on its own device
 * (mgpu_dist_copy_part: one pitched copy per part for cyclic layouts), sends
 * each part to its rank with the module's point to point (tag = part) and
 * copies its own parts locally; the other ranks receive straight into their
 * parts' buffers. Gather is the reverse. */
#include <stdlib.h>
#include <string.h>

#include "mgpu/part.h"
#include "mpi/mpi-internal.h"

/* Where the parts live: process p holds parts first[p] .. first[p] +
 * count[p] - 1. Collective over comm. */
static int part_owners(MPI_Comm comm, int **first, int **count, int *nprocs,
                       int *me) {
  MPI_Comm_size(comm, nprocs);
  MPI_Comm_rank(comm, me);
  *first = mgpu_module_calloc((size_t)*nprocs, sizeof **first);
  *count = mgpu_module_calloc((size_t)*nprocs, sizeof **count);
  if (*first == NULL || *count == NULL) {
    mgpu_module_free(*first);
    mgpu_module_free(*count);
    return mgpu__error(MGPU_ENOMEM, "rank %d: part owners",
                             mgpu__mpi.rank);
  }
  int mine = mgpu_device_count();
  int rc = MPI_Allgather(&mine, 1, MPI_INT, *count, 1, MPI_INT, comm);
  if (rc != MPI_SUCCESS) {
    mgpu_module_free(*first);
    mgpu_module_free(*count);
    return mgpu__mpi_err(rc, "MPI_Allgather");
  }
  for (int p = 1; p < *nprocs; p++) (*first)[p] = (*first)[p - 1] + (*count)[p - 1];
  return 0;
}

int mgpu_mpi_dist_create(MPI_Comm comm, size_t n, const mgpu_dist_opts *opts,
                         mgpu_dist **dist) {
  int rc = mgpu__mpi_ready("mgpu_mpi_dist_create");
  if (rc != 0) return rc;
  int *first, *count, nprocs, me;
  if ((rc = part_owners(comm, &first, &count, &nprocs, &me)) != 0) return rc;
  int total = first[nprocs - 1] + count[nprocs - 1];
  mgpu_module_free(first);
  mgpu_module_free(count);
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  if (opts != NULL) {
    if (opts->ndevices != 0 || opts->devices != NULL)
      return mgpu__error(MGPU_EINVAL, "rank %d: mgpu_mpi_dist_create: "
                               "the parts are every rank's devices; leave "
                               "ndevices 0 and devices NULL", mgpu__mpi.rank);
    if (opts->kind == MGPU_DIST_WEIGHTED && opts->weights == NULL)
      return mgpu__error(MGPU_EINVAL, "rank %d: mgpu_mpi_dist_create: "
                               "a weighted distribution across ranks needs "
                               "its weights", mgpu__mpi.rank);
    o = *opts;
  }
  /* The part layer wants a local device per part; the ranges do not depend
   * on it. Device 0 stands in for parts of other ranks. */
  int *devs = mgpu_module_calloc((size_t)total, sizeof *devs);
  if (devs == NULL)
    return mgpu__error(MGPU_ENOMEM, "rank %d: distribution",
                             mgpu__mpi.rank);
  o.ndevices = total;
  o.devices = devs;
  rc = mgpu_dist_create(dist, n, &o);
  mgpu_module_free(devs);
  return rc;
}

/* A type of elem bytes for the module's transfers (no reduction). */
static int raw_type(size_t elem, mgpu_dtype *t, size_t *per) {
  if (elem % 8 == 0) *t = MGPU_INT64, *per = elem / 8;
  else if (elem % 4 == 0) *t = MGPU_INT32, *per = elem / 4;
  else if (elem % 2 == 0) *t = MGPU_FLOAT16, *per = elem / 2;
  else
    return mgpu__error(MGPU_ENOTSUP, "rank %d: elements of %zu bytes "
                             "(odd sizes are not supported across ranks)",
                             mgpu__mpi.rank, elem);
  return 0;
}

static int move(const mgpu_dist *d, mgpu_buffer *global, size_t offset,
                size_t elem, int root, mgpu_buffer *const *bufs, MPI_Comm comm,
                int scatter) {
  const char *what = scatter ? "mgpu_mpi_dist_scatter" : "mgpu_mpi_dist_gather";
  int rc = mgpu__mpi_ready(what);
  if (rc != 0) return rc;
  mgpu_dtype type = MGPU_INT64;
  size_t per = 1;
  if (d == NULL || bufs == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: NULL argument",
                             mgpu__mpi.rank, what);
  if ((rc = raw_type(elem, &type, &per)) != 0) return rc;
  int *first, *count, nprocs, me;
  if ((rc = part_owners(comm, &first, &count, &nprocs, &me)) != 0) return rc;
  int nparts = mgpu_dist_nparts(d);
  int total = first[nprocs - 1] + count[nprocs - 1];
  if (nparts != total || root < 0 || root >= nprocs) {
    rc = mgpu__error(MGPU_EINVAL, "rank %d: %s: %d parts for %d devices "
                           "of every rank, root %d of %d", mgpu__mpi.rank,
                           what, nparts, total, root, nprocs);
    goto out;
  }
  if (total >= MGPU_MPI_TAG_RESERVED) {
    rc = mgpu__error(MGPU_ENOTSUP, "rank %d: %s: %d parts",
                           mgpu__mpi.rank, what, total);
    goto out;
  }
  mgpu_mpi_request **reqs = mgpu_module_calloc((size_t)total, sizeof *reqs);
  if (reqs == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "rank %d: requests", mgpu__mpi.rank);
    goto out;
  }
  if (me == root) {
    if (global == NULL) {
      rc = mgpu__error(MGPU_EINVAL, "rank %d: %s: the root's buffer is "
                             "NULL", mgpu__mpi.rank, what);
      goto done;
    }
    /* Every part in the pack, part after part, on the root's device. */
    mpi_stage_pool *pool;
    size_t need = mgpu_dist_n(d) * elem;
    int dev = mgpu_buffer_device(global);
    if ((rc = mgpu__mpi_pool(dev, &pool)) != 0) goto done;
    if (pool->pack_size < need) {
      if (pool->pack != NULL) mgpu_free(pool->pack);
      pool->pack = NULL;
      pool->pack_size = 0;
      if ((rc = mgpu_malloc(&pool->pack, dev, need ? need : 1)) != 0) goto done;
      pool->pack_size = need ? need : 1;
    }
    size_t at = 0;
    for (int p = 0; p < total && rc == 0; p++) {
      size_t c = mgpu_dist_count(d, p), bytes = c * elem;
      int owner = 0;
      while (owner + 1 < nprocs && first[owner + 1] <= p) owner++;
      if (c > 0 && scatter)
        rc = mgpu_dist_copy_part(d, p, global, offset, pool->pack, at, elem, 1,
                                 NULL);
      if (rc == 0 && c > 0) {
        if (owner == me) {
          mgpu_buffer *b = bufs[p - first[me]];
          rc = scatter ? mgpu_memcpy(b, 0, pool->pack, at, bytes)
                       : mgpu_memcpy(pool->pack, at, b, 0, bytes);
        } else if (scatter) {
          rc = mgpu_mpi_isend(pool->pack, at, c * per, type, owner, p, comm,
                              NULL, &reqs[p]);
        } else {
          rc = mgpu_mpi_irecv(pool->pack, at, c * per, type, owner, p, comm,
                              NULL, &reqs[p]);
        }
      }
      at += bytes;
    }
    for (int p = 0; p < total; p++)
      if (reqs[p] != NULL) {
        int w = mgpu_mpi_wait(reqs[p]);
        if (rc == 0) rc = w;
      }
    /* Gathered: every part from the pack into the array. */
    at = 0;
    for (int p = 0; p < total && rc == 0 && !scatter; p++) {
      size_t c = mgpu_dist_count(d, p);
      if (c > 0)
        rc = mgpu_dist_copy_part(d, p, global, offset, pool->pack, at, elem, 0,
                                 NULL);
      at += c * elem;
    }
  } else {
    for (int i = 0; i < count[me] && rc == 0; i++) {
      int p = first[me] + i;
      size_t c = mgpu_dist_count(d, p);
      if (c == 0) continue;
      rc = scatter ? mgpu_mpi_irecv(bufs[i], 0, c * per, type, root, p, comm,
                                    NULL, &reqs[p])
                   : mgpu_mpi_isend(bufs[i], 0, c * per, type, root, p, comm,
                                    NULL, &reqs[p]);
    }
    for (int p = 0; p < total; p++)
      if (reqs[p] != NULL) {
        int w = mgpu_mpi_wait(reqs[p]);
        if (rc == 0) rc = w;
      }
  }
done:
  mgpu_module_free(reqs);
out:
  mgpu_module_free(first);
  mgpu_module_free(count);
  return rc;
}

int mgpu_mpi_dist_scatter(const mgpu_dist *dist, const mgpu_buffer *src,
                          size_t src_offset, size_t elem_size, int root,
                          mgpu_buffer *const *bufs, MPI_Comm comm) {
  return move(dist, (mgpu_buffer *)src, src_offset, elem_size, root, bufs,
              comm, 1);
}

int mgpu_mpi_dist_gather(const mgpu_dist *dist, mgpu_buffer *dst,
                         size_t dst_offset, size_t elem_size, int root,
                         mgpu_buffer *const *bufs, MPI_Comm comm) {
  return move(dist, dst, dst_offset, elem_size, root, bufs, comm, 0);
}
