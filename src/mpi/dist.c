/* Distributions over the devices of every rank, and scatter / gather between
 * a buffer on the root rank and every part of every rank: the lesson's
 * "scatter from rank 0 to every device of every rank" as one call.
 *
 * The distribution's parts are the global devices in rank order (rank p's
 * device d is part first_device(p) + d); its ranges depend only on n, the
 * number of parts and the layout, so each rank computes them itself. The
 * root packs every part's elements into a staging buffer on its own device
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

/* One scatter or gather of a distribution across the ranks of comm. */
typedef struct dist_move {
  const mgpu_dist *d;
  mgpu_buffer *global;        /* the root's array */
  size_t offset, elem;
  int root, scatter;
  mgpu_buffer *const *bufs;   /* this rank's parts */
  MPI_Comm comm;
  mgpu_dtype type;            /* raw_type of elem, per of them an element */
  size_t per;
  int *first, *count, nprocs, me, total; /* part_owners */
  mgpu_mpi_request **reqs;    /* one per part */
} dist_move;

/* Waits for every request posted; the first error wins over rc 0. */
static int wait_all(const dist_move *m, int rc) {
  for (int p = 0; p < m->total; p++)
    if (m->reqs[p] != NULL) {
      int w = mgpu_mpi_wait(m->reqs[p]);
      if (rc == 0) rc = w;
    }
  return rc;
}

/* The root's side of part p, at byte at of the pack: from or to its own
 * device's buffer, else to or from its owner. */
static int root_part(dist_move *m, mgpu_buffer *pack, int p, size_t at) {
  size_t c = mgpu_dist_count(m->d, p), bytes = c * m->elem;
  if (c == 0) return 0;
  int owner = 0, rc = 0;
  while (owner + 1 < m->nprocs && m->first[owner + 1] <= p) owner++;
  if (m->scatter)
    rc = mgpu_dist_copy_part(m->d, p, m->global, m->offset, pack, at, m->elem,
                             1, NULL);
  if (rc != 0) return rc;
  if (owner == m->me) {
    mgpu_buffer *b = m->bufs[p - m->first[m->me]];
    return m->scatter ? mgpu_memcpy(b, 0, pack, at, bytes)
                      : mgpu_memcpy(pack, at, b, 0, bytes);
  }
  if (m->scatter)
    return mgpu_mpi_isend(pack, at, c * m->per, m->type, owner, p, m->comm,
                          NULL, &m->reqs[p]);
  return mgpu_mpi_irecv(pack, at, c * m->per, m->type, owner, p, m->comm,
                        NULL, &m->reqs[p]);
}

/* The root: every part in the pack, part after part, on its device. */
static int move_root(dist_move *m, const char *what) {
  if (m->global == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: the root's buffer is "
                       "NULL", mgpu__mpi.rank, what);
  mpi_staging *staging;
  int rc = mgpu__mpi_pack(mgpu_buffer_device(m->global),
                          mgpu_dist_n(m->d) * m->elem, &staging);
  if (rc != 0) return rc;
  size_t at = 0;
  for (int p = 0; p < m->total && rc == 0; p++) {
    rc = root_part(m, staging->pack, p, at);
    at += mgpu_dist_count(m->d, p) * m->elem;
  }
  rc = wait_all(m, rc);
  /* Gathered: every part from the pack into the array. */
  at = 0;
  for (int p = 0; p < m->total && rc == 0 && !m->scatter; p++) {
    size_t c = mgpu_dist_count(m->d, p);
    if (c > 0)
      rc = mgpu_dist_copy_part(m->d, p, m->global, m->offset, staging->pack, at,
                               m->elem, 0, NULL);
    at += c * m->elem;
  }
  return rc;
}

/* Any other rank: its parts straight from or to the root. */
static int move_rank(dist_move *m) {
  int rc = 0;
  for (int i = 0; i < m->count[m->me] && rc == 0; i++) {
    int p = m->first[m->me] + i;
    size_t c = mgpu_dist_count(m->d, p);
    if (c == 0) continue;
    rc = m->scatter ? mgpu_mpi_irecv(m->bufs[i], 0, c * m->per, m->type,
                                     m->root, p, m->comm, NULL, &m->reqs[p])
                    : mgpu_mpi_isend(m->bufs[i], 0, c * m->per, m->type,
                                     m->root, p, m->comm, NULL, &m->reqs[p]);
  }
  return wait_all(m, rc);
}

static int move(dist_move *m) {
  const char *what =
      m->scatter ? "mgpu_mpi_dist_scatter" : "mgpu_mpi_dist_gather";
  int rc = mgpu__mpi_ready(what);
  if (rc != 0) return rc;
  if (m->d == NULL || m->bufs == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: NULL argument",
                       mgpu__mpi.rank, what);
  if ((rc = raw_type(m->elem, &m->type, &m->per)) != 0) return rc;
  if ((rc = part_owners(m->comm, &m->first, &m->count, &m->nprocs, &m->me)))
    return rc;
  int nparts = mgpu_dist_nparts(m->d);
  m->total = m->first[m->nprocs - 1] + m->count[m->nprocs - 1];
  if (nparts != m->total || m->root < 0 || m->root >= m->nprocs)
    rc = mgpu__error(MGPU_EINVAL, "rank %d: %s: %d parts for %d devices of "
                     "every rank, root %d of %d", mgpu__mpi.rank, what,
                     nparts, m->total, m->root, m->nprocs);
  else if (m->total >= MGPU_MPI_TAG_RESERVED)
    rc = mgpu__error(MGPU_ENOTSUP, "rank %d: %s: %d parts", mgpu__mpi.rank,
                     what, m->total);
  else if ((m->reqs = mgpu_module_calloc((size_t)m->total,
                                         sizeof *m->reqs)) == NULL)
    rc = mgpu__error(MGPU_ENOMEM, "rank %d: requests", mgpu__mpi.rank);
  else
    rc = m->me == m->root ? move_root(m, what) : move_rank(m);
  mgpu_module_free(m->reqs);
  mgpu_module_free(m->first);
  mgpu_module_free(m->count);
  return rc;
}

int mgpu_mpi_dist_scatter(const mgpu_dist *dist, const mgpu_buffer *src,
                          size_t src_offset, size_t elem_size, int root,
                          mgpu_buffer *const *bufs, MPI_Comm comm) {
  dist_move m = {.d = dist, .global = (mgpu_buffer *)src,
                 .offset = src_offset, .elem = elem_size, .root = root,
                 .scatter = 1, .bufs = bufs, .comm = comm};
  return move(&m);
}

int mgpu_mpi_dist_gather(const mgpu_dist *dist, mgpu_buffer *dst,
                         size_t dst_offset, size_t elem_size, int root,
                         mgpu_buffer *const *bufs, MPI_Comm comm) {
  dist_move m = {.d = dist, .global = dst, .offset = dst_offset,
                 .elem = elem_size, .root = root, .scatter = 0, .bufs = bufs,
                 .comm = comm};
  return move(&m);
}
