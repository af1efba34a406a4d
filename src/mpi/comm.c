/* mgpu_mpi_comm_create: an mgpu_comm over the devices of every rank, so
 * that mgpu_allreduce and the other collectives work across processes
 * unchanged. The coll layer meets the local ranks of each collective and
 * hands them to issue() below (mgpu_comm_create_remote), which runs it in
 * three phases:
 *   1. within the process: every local rank's input into one buffer on the
 *      leader's device (local rank 0), reduced there with the built-in
 *      element-wise kernel (copies between devices take the copy layer's
 *      direct or staged path);
 *   2. across processes, between the leaders, by MPI through this module's
 *      calls (staged in pipelined chunks where MPI cannot read the memory);
 *      a large all-reduce goes as reduce-scatter + all-gather, and in
 *      chunks, so that the local reduction of chunk k+1 and the copies back
 *      of chunk k-1 overlap MPI on chunk k;
 *   3. within the process again: the result copied to every local rank.
 * Where every device of every rank is a whole CUDA GPU and NCCL is built in,
 * one NCCL communicator spans ranks x GPUs instead (ncclCommInitRank, the
 * unique id broadcast over MPI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi/mpi-internal.h"

#include "mpi/nccl-api.h"

/* A large all-reduce between leaders goes as reduce-scatter + all-gather. */
#define SPLIT_ALLREDUCE_BYTES ((size_t)1 << 20)

typedef struct mpi_comm_ctx {
  MPI_Comm comm;       /* duplicate: one process per rank */
  int me, nprocs;
  int *first, *count;  /* global rank of each process's first device; its
                          number of devices */
  int equal;           /* every process has the same number of devices */
  int leader_dev;      /* local rank 0's device */
  mgpu_stream *mpi_stream; /* idle stream of the leader's device handed to
                              the MPI calls (they wait for nothing queued) */
  mgpu_event *reduced[2];  /* a chunk's local reduction is done */
  mgpu_buffer *acc, *scratch; /* on the leader's device, grown as needed */
  size_t acc_size, scratch_size;
#ifdef MGPU_HAVE_NCCL
  int nccl;
  int nccl_aborted; /* nccl_wait timed out and aborted the communicators */
  int nlocal;
  ncclComm_t nccl_comms[MGPU_MAX_DEVICES];
#endif
} mpi_comm_ctx;

static int grow(mgpu_buffer **buf, size_t *have, int dev, size_t need) {
  if (*buf != NULL && *have >= need) return 0;
  if (*buf != NULL) mgpu_free(*buf);
  *buf = NULL;
  *have = 0;
  size_t size = need < 4096 ? 4096 : need;
  int rc = mgpu_malloc(buf, dev, size);
  if (rc == 0) *have = size;
  return rc;
}

/* The process that holds global rank r. */
static int owner(const mpi_comm_ctx *x, int r) {
  int p = 0;
  while (p + 1 < x->nprocs && x->first[p + 1] <= r) p++;
  return p;
}

static int sync_all(const mgpu_coll_call *calls, int n) {
  int first = 0;
  for (int i = 0; i < n; i++) {
    int rc = mgpu_stream_synchronize(calls[i].stream);
    if (rc != 0 && first == 0) first = rc;
  }
  return first;
}

/* acc[0 .. len) = op over every local rank's send[off .. off + len). */
static int local_reduce(mpi_comm_ctx *x, const mgpu_coll_call *calls, int n,
                        size_t len, mgpu_stream *s) {
  size_t es = mgpu_dtype_size(calls[0].dtype);
  int rc = mgpu_memcpy_async(x->acc, 0, calls[0].send, calls[0].send_offset,
                             len, s);
  if (rc == 0 && n > 1) rc = grow(&x->scratch, &x->scratch_size, x->leader_dev, len);
  for (int i = 1; i < n && rc == 0; i++) {
    rc = mgpu_memcpy_async(x->scratch, 0, calls[i].send, calls[i].send_offset,
                           len, s);
    if (rc == 0)
      rc = mgpu_elementwise(s, x->acc, 0, x->acc, 0, x->scratch, 0, len / es,
                            calls[0].dtype, calls[i].op);
  }
  int src = mgpu_stream_synchronize(s);
  return rc != 0 ? rc : src;
}

/* Every local rank's recv[recv_offset ..] = acc[from ..] (len bytes). */
static int local_spread(mpi_comm_ctx *x, const mgpu_coll_call *calls, int n,
                        size_t from, size_t step, size_t len) {
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (calls[i].recv == NULL) continue;
    rc = mgpu_memcpy_async(calls[i].recv, calls[i].recv_offset, x->acc,
                           from + step * (size_t)i, len, calls[i].stream);
  }
  int src = sync_all(calls, n);
  return rc != 0 ? rc : src;
}

/* acc[off ..] all-reduced across the leaders (count elements). */
static int leaders_allreduce(mpi_comm_ctx *x, size_t off, size_t count,
                             mgpu_dtype t, mgpu_op op) {
  size_t bytes = count * mgpu_dtype_size(t);
  if (bytes >= SPLIT_ALLREDUCE_BYTES && count % (size_t)x->nprocs == 0) {
    /* Each leader reduces one slice, then every slice goes to all. */
    size_t part = count / (size_t)x->nprocs;
    int rc = mgpu_mpi_reduce_scatter(x->acc, off, x->acc, off, part, t, op,
                                     x->comm, x->mpi_stream);
    return rc != 0 ? rc : mgpu_mpi_allgather(x->acc, off, x->acc, off, part,
                                             t, x->comm, x->mpi_stream);
  }
  return mgpu_mpi_allreduce(x->acc, off, x->acc, off, count, t, op, x->comm,
                            x->mpi_stream);
}

/* Chunk by chunk, so that the phases overlap: the local reduction of chunk
 * k+1 runs on the leader's stream and the copies of chunk k-1 back to the
 * local ranks on theirs while MPI moves chunk k. */
static int hier_allreduce(mpi_comm_ctx *x, const mgpu_coll_call *c, int n) {
  size_t es = mgpu_dtype_size(c[0].dtype), count = c[0].count;
  mgpu_stream *s = c[0].stream;
  size_t chunk = mgpu__mpi.chunk / es;
  if (chunk == 0) chunk = 1;
  size_t nchunks = (count + chunk - 1) / chunk;
  int rc = n > 1 ? grow(&x->scratch, &x->scratch_size, x->leader_dev,
                        count * es)
                 : 0;
  for (size_t k = 0; k <= nchunks && rc == 0; k++) {
    if (k < nchunks) { /* local reduction of chunk k, queued */
      size_t e0 = k * chunk, m = count - e0 < chunk ? count - e0 : chunk;
      size_t at = e0 * es;
      rc = mgpu_memcpy_async(x->acc, at, c[0].send, c[0].send_offset + at,
                             m * es, s);
      for (int i = 1; i < n && rc == 0; i++) {
        rc = mgpu_memcpy_async(x->scratch, at, c[i].send,
                               c[i].send_offset + at, m * es, s);
        if (rc == 0)
          rc = mgpu_elementwise(s, x->acc, at, x->acc, at, x->scratch, at, m,
                                c[0].dtype, c[0].op);
      }
      if (rc == 0) rc = mgpu_event_record(x->reduced[k % 2], s);
    }
    if (rc == 0 && k >= 1) { /* MPI on chunk k-1, then its copies back */
      size_t j = k - 1, e0 = j * chunk;
      size_t m = count - e0 < chunk ? count - e0 : chunk, at = e0 * es;
      rc = mgpu_event_synchronize(x->reduced[j % 2]);
      if (rc == 0 && x->nprocs > 1)
        rc = leaders_allreduce(x, at, m, c[0].dtype, c[0].op);
      for (int i = 0; i < n && rc == 0; i++)
        rc = mgpu_memcpy_async(c[i].recv, c[i].recv_offset + at, x->acc, at,
                               m * es, c[i].stream);
    }
  }
  int src = sync_all(c, n);
  return rc != 0 ? rc : src;
}

static int hier_reduce(mpi_comm_ctx *x, const mgpu_coll_call *c, int n) {
  size_t es = mgpu_dtype_size(c[0].dtype), bytes = c[0].count * es;
  int root_proc = owner(x, c[0].root);
  int rc = local_reduce(x, c, n, bytes, c[0].stream);
  if (rc == 0 && x->nprocs > 1)
    rc = mgpu_mpi_reduce(x->acc, 0, x->me == root_proc ? x->acc : NULL, 0,
                         c[0].count, c[0].dtype, c[0].op, root_proc, x->comm,
                         c[0].stream);
  if (rc != 0 || x->me != root_proc) return rc;
  return local_spread(x, c, n, 0, 0, bytes); /* only the root has a recv */
}

static int hier_broadcast(mpi_comm_ctx *x, const mgpu_coll_call *c, int n) {
  size_t es = mgpu_dtype_size(c[0].dtype), bytes = c[0].count * es;
  int root_proc = owner(x, c[0].root);
  int rc = 0;
  if (x->me == root_proc) {
    const mgpu_coll_call *r = &c[c[0].root - x->first[x->me]];
    rc = mgpu_memcpy_async(x->acc, 0, r->send, r->send_offset, bytes,
                           r->stream);
    if (rc == 0) rc = mgpu_stream_synchronize(r->stream);
  }
  if (rc == 0 && x->nprocs > 1)
    rc = mgpu_mpi_bcast(x->acc, 0, c[0].count, c[0].dtype, root_proc, x->comm,
                        c[0].stream);
  return rc != 0 ? rc : local_spread(x, c, n, 0, 0, bytes);
}

static int hier_allgather(mpi_comm_ctx *x, const mgpu_coll_call *c, int n) {
  size_t es = mgpu_dtype_size(c[0].dtype), bytes = c[0].count * es;
  size_t mine = (size_t)x->first[x->me] * bytes;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    rc = mgpu_memcpy_async(x->acc, mine + (size_t)i * bytes, c[i].send,
                           c[i].send_offset, bytes, c[0].stream);
  if (rc == 0) rc = mgpu_stream_synchronize(c[0].stream);
  if (rc == 0 && x->nprocs > 1) {
    if (x->equal) {
      rc = mgpu_mpi_allgather(x->acc, 0, x->acc, 0, (size_t)n * c[0].count,
                              c[0].dtype, x->comm, c[0].stream);
    } else {
      for (int p = 0; p < x->nprocs && rc == 0; p++)
        rc = mgpu_mpi_bcast(x->acc, (size_t)x->first[p] * bytes,
                            (size_t)x->count[p] * c[0].count, c[0].dtype, p,
                            x->comm, c[0].stream);
    }
  }
  if (rc != 0) return rc;
  /* recv_offset is where the gathered array starts (in place: the rank's
   * own block was handed as send_offset; recv starts at 0). */
  size_t total = bytes * (size_t)(x->first[x->nprocs - 1] +
                                  x->count[x->nprocs - 1]);
  return local_spread(x, c, n, 0, 0, total);
}

static int hier_reduce_scatter(mpi_comm_ctx *x, const mgpu_coll_call *c,
                               int n) {
  size_t es = mgpu_dtype_size(c[0].dtype), bytes = c[0].count * es;
  int nglobal = x->first[x->nprocs - 1] + x->count[x->nprocs - 1];
  size_t total = bytes * (size_t)nglobal;
  int rc = local_reduce(x, c, n, total, c[0].stream);
  if (rc == 0 && x->nprocs > 1) {
    if (x->equal) {
      rc = mgpu_mpi_reduce_scatter(x->acc, 0, x->acc, 0,
                                   (size_t)n * c[0].count, c[0].dtype,
                                   c[0].op, x->comm, c[0].stream);
    } else {
      for (int p = 0; p < x->nprocs && rc == 0; p++) {
        size_t at = (size_t)x->first[p] * bytes;
        rc = mgpu_mpi_reduce(x->acc, at, x->me == p ? x->acc : NULL, at,
                             (size_t)x->count[p] * c[0].count, c[0].dtype,
                             c[0].op, p, x->comm, c[0].stream);
      }
    }
  }
  if (rc != 0) return rc;
  return local_spread(x, c, n, (size_t)x->first[x->me] * bytes, bytes, bytes);
}

/* A local device of calls that was lost (its index on this rank), or -1. */
static int lost_device(const mgpu_coll_call *calls, int n) {
  for (int i = 0; i < n; i++) {
    int dev = mgpu_stream_device(calls[i].stream);
    mgpu_device_state st = MGPU_DEVICE_OK;
    if (dev >= 0 && mgpu_device_status(dev, &st) == 0 &&
        st == MGPU_DEVICE_LOST)
      return dev;
  }
  return -1;
}

/* The collective failed here before this process's leader reached the
 * other processes: it takes part in their first exchange as a refusal, so
 * that they fail with its code, naming this rank (and the device lost),
 * instead of waiting for it until the timeout. */
static void hier_fail(void *ctx, const mgpu_coll_call *calls, int n,
                      int code) {
  mpi_comm_ctx *x = ctx;
  if (x->nprocs < 2 || calls[0].count == 0) return; /* no exchange */
  char detail[512];
  snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
  mgpu__mpi_refuse(x->comm, code, lost_device(calls, n));
  mgpu__error(code, "%s", detail);
}

static int hier_run(mpi_comm_ctx *x, const mgpu_coll_call *calls, int n);

static int hier_issue(void *ctx, const mgpu_coll_call *calls, int n) {
  mpi_comm_ctx *x = ctx;
  uint64_t before = mgpu__mpi.exchanges;
  int rc = hier_run(x, calls, n);
  /* Failed before any exchange with the other processes: they are
   * waiting in the first one. */
  if (rc != 0 && mgpu__mpi.exchanges == before) hier_fail(x, calls, n, rc);
  return rc;
}

static int hier_run(mpi_comm_ctx *x, const mgpu_coll_call *calls, int n) {
  size_t es = mgpu_dtype_size(calls[0].dtype);
  int nglobal = x->first[x->nprocs - 1] + x->count[x->nprocs - 1];
  size_t need = calls[0].count * es;
  if (calls[0].kind == MGPU_COLL_ALLGATHER ||
      calls[0].kind == MGPU_COLL_REDUCE_SCATTER)
    need *= (size_t)nglobal;
  /* The inputs are read after the work queued on every rank's stream. */
  int rc = sync_all(calls, n);
  if (rc == 0) rc = grow(&x->acc, &x->acc_size, x->leader_dev, need);
  if (rc != 0) return rc;
  switch (calls[0].kind) {
    case MGPU_COLL_ALLREDUCE: return hier_allreduce(x, calls, n);
    case MGPU_COLL_REDUCE: return hier_reduce(x, calls, n);
    case MGPU_COLL_BROADCAST: return hier_broadcast(x, calls, n);
    case MGPU_COLL_ALLGATHER: return hier_allgather(x, calls, n);
    case MGPU_COLL_REDUCE_SCATTER: return hier_reduce_scatter(x, calls, n);
  }
  return mgpu__error(MGPU_EINVAL, "rank %d: unknown collective %d",
                     mgpu__mpi.rank, calls[0].kind);
}

#ifdef MGPU_HAVE_NCCL
/* ---- NCCL over ranks x GPUs (whole CUDA GPUs, NCCL built in) ---- */

/* Opened by mgpu_mpi_comm_create before the first NCCL communicator. */
static const mgpu__mpi_nccl_api *nccl;

static int nccl_err(ncclResult_t r, const char *call) {
  return mgpu__error(MGPU_EBACKEND, "rank %d: %s: %s", mgpu__mpi.rank,
                     call, nccl->error_string(r));
}

static int nccl_type(mgpu_dtype t, ncclDataType_t *out) {
  switch (t) {
    case MGPU_FLOAT32: *out = ncclFloat32; return 0;
    case MGPU_FLOAT64: *out = ncclFloat64; return 0;
    case MGPU_INT32: *out = ncclInt32; return 0;
    case MGPU_INT64: *out = ncclInt64; return 0;
    case MGPU_FLOAT16: *out = ncclFloat16; return 0;
    case MGPU_BFLOAT16: *out = ncclBfloat16; return 0;
  }
  return MGPU_EINVAL;
}

/* A collective across processes is complete when its call (or group)
 * returns, on every path (docs/mpi.md): NCCL only queues it on the
 * streams, so wait for them, up to MGPU_MPI_TIMEOUT_MS. A rank that never
 * comes would keep NCCL's kernels spinning for ever: past the limit the
 * communicators are aborted (ncclCommAbort ends those kernels) and every
 * later call on them is refused. */
static int nccl_wait(mpi_comm_ctx *x, const mgpu_coll_call *calls, int n) {
  double deadline = mgpu__mpi_deadline(); /* never, for -1 */
  for (int i = 0; i < n; i++) {
    int rc;
    while ((rc = mgpu_stream_query(calls[i].stream)) == MGPU_EAGAIN) {
      if (MPI_Wtime() > deadline) {
        for (int k = 0; k < x->nlocal; k++)
          nccl->comm_abort(x->nccl_comms[k]);
        x->nccl_aborted = 1;
        return mgpu__error(MGPU_ETIMEDOUT, "rank %d: an NCCL collective "
                           "of global rank %d (%zu elements) did not "
                           "complete within %d ms (MGPU_MPI_TIMEOUT_MS): "
                           "another rank did not come; the communicator is "
                           "aborted", mgpu__mpi.rank, calls[i].rank,
                           calls[i].count, mgpu__mpi.timeout_ms);
      }
      struct timespec nap = {0, 20000};
      nanosleep(&nap, NULL);
    }
    if (rc != 0) return rc;
  }
  return 0;
}

static int nccl_issue(void *ctx, const mgpu_coll_call *calls, int n) {
  mpi_comm_ctx *x = ctx;
  static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMin, ncclMax};
  if (x->nccl_aborted)
    return mgpu__error(MGPU_ECANCELED, "rank %d: the communicator's NCCL "
                       "communicators were aborted after a collective timed "
                       "out", mgpu__mpi.rank);
  ncclDataType_t type;
  if (nccl_type(calls[0].dtype, &type) != 0)
    return mgpu__error(MGPU_EINVAL, "rank %d: dtype %d has no NCCL type "
                       "(global rank %d's collective)", mgpu__mpi.rank,
                       (int)calls[0].dtype, calls[0].rank);
  ncclResult_t r = nccl->group_start();
  for (int i = 0; i < n && r == ncclSuccess; i++) {
    const mgpu_coll_call *c = &calls[i];
    const char *send = c->send ? (const char *)mgpu_buffer_ptr(c->send) +
                                     c->send_offset : NULL;
    char *recv = c->recv ? (char *)mgpu_buffer_ptr(c->recv) + c->recv_offset
                         : NULL;
    cudaStream_t s = (cudaStream_t)mgpu_stream_native(c->stream);
    switch (c->kind) {
      case MGPU_COLL_ALLREDUCE:
        r = nccl->all_reduce(send, recv, c->count, type, ops[c->op],
                             x->nccl_comms[i], s);
        break;
      case MGPU_COLL_REDUCE:
        r = nccl->reduce(send, recv, c->count, type, ops[c->op], c->root,
                         x->nccl_comms[i], s);
        break;
      case MGPU_COLL_BROADCAST:
        r = nccl->broadcast(send, recv, c->count, type, c->root,
                            x->nccl_comms[i], s);
        break;
      case MGPU_COLL_ALLGATHER:
        r = nccl->all_gather(send, recv, c->count, type, x->nccl_comms[i], s);
        break;
      case MGPU_COLL_REDUCE_SCATTER:
        r = nccl->reduce_scatter(send, recv, c->count, type, ops[c->op],
                                 x->nccl_comms[i], s);
        break;
    }
  }
  ncclResult_t e = nccl->group_end();
  if (r != ncclSuccess) return nccl_err(r, "NCCL collective");
  if (e != ncclSuccess) return nccl_err(e, "ncclGroupEnd");
  return nccl_wait(x, calls, n);
}

/* 1 when every device of this rank is a whole CUDA GPU. */
static int whole_gpus(int ndev, const int *devs) {
  for (int i = 0; i < ndev; i++) {
    mgpu_device_props p = {.size = sizeof p};
    if (mgpu_device_get_props(devs[i], &p) != 0 ||
        p.backend_kind != MGPU_BACKEND_CUDA || p.split_count != 1)
      return 0;
  }
  return 1;
}

/* A hash of a device's GPU (its UUID), the same in every process. */
static uint64_t gpu_hash(int dev) {
  mgpu_device_props p = {.size = sizeof p};
  mgpu_device_get_props(dev, &p);
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *c = p.uuid; *c != '\0'; c++)
    h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h;
}

/* 1 when two of the communicator's devices are the same GPU (ranks sharing
 * a GPU): NCCL refuses a communicator with one GPU twice ("duplicate GPU",
 * ncclInvalidUsage). Every process answers the same. A process that cannot
 * take the table's memory makes every process answer 1. */
static int gpus_repeat(mpi_comm_ctx *x, int ndev, const int *devs) {
  int n = x->first[x->nprocs - 1] + x->count[x->nprocs - 1];
  uint64_t *all = mgpu_module_malloc((size_t)n * sizeof *all);
  int ok = all != NULL, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, x->comm);
  if (!all_ok) {
    mgpu_module_free(all);
    return 1;
  }
  uint64_t mine[MGPU_MAX_DEVICES];
  for (int i = 0; i < ndev; i++) mine[i] = gpu_hash(devs[i]);
  int repeat = MPI_Allgatherv(mine, ndev, MPI_UINT64_T, all, x->count,
                              x->first, MPI_UINT64_T, x->comm) != MPI_SUCCESS;
  for (int i = 0; i < n && !repeat; i++)
    for (int j = i + 1; j < n && !repeat; j++) repeat = all[i] == all[j];
  mgpu_module_free(all);
  return repeat;
}

static int nccl_open(mpi_comm_ctx *x, int ndev, const int *devs) {
  ncclUniqueId id;
  if (x->me == 0) {
    ncclResult_t r = nccl->get_unique_id(&id);
    if (r != ncclSuccess) memset(&id, 0, sizeof id);
  }
  int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, x->comm);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Bcast");
  int nglobal = x->first[x->nprocs - 1] + x->count[x->nprocs - 1];
  ncclResult_t r = nccl->group_start();
  for (int i = 0; i < ndev && r == ncclSuccess; i++) {
    mgpu_device_props p = {.size = sizeof p};
    mgpu_device_get_props(devs[i], &p);
    nccl->set_device(p.ordinal);
    r = nccl->comm_init_rank(&x->nccl_comms[i], nglobal, id,
                             x->first[x->me] + i);
  }
  ncclResult_t e = nccl->group_end();
  if (r != ncclSuccess) return nccl_err(r, "ncclCommInitRank");
  if (e != ncclSuccess) return nccl_err(e, "ncclGroupEnd");
  x->nccl = 1;
  x->nlocal = ndev;
  return 0;
}
#endif

static void ctx_free(void *ctx) {
  mpi_comm_ctx *x = ctx;
  if (x == NULL) return;
#ifdef MGPU_HAVE_NCCL
  for (int i = 0; x->nccl && !x->nccl_aborted && i < x->nlocal; i++)
    nccl->comm_destroy(x->nccl_comms[i]);
#endif
  for (int i = 0; i < 2; i++)
    if (x->reduced[i] != NULL) mgpu_event_destroy(x->reduced[i]);
  if (x->mpi_stream != NULL) mgpu_stream_destroy(x->mpi_stream);
  if (x->acc != NULL) mgpu_free(x->acc);
  if (x->scratch != NULL) mgpu_free(x->scratch);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && x->comm != MPI_COMM_NULL) MPI_Comm_free(&x->comm);
  mgpu_module_free(x->first);
  mgpu_module_free(x->count);
  mgpu_module_free(x);
}

/* This rank's device list, checked: 0 or an error with its detail. */
static int check_devices(int ndev, const int *devs) {
  if (ndev < 1 || ndev > MGPU_MAX_DEVICES || devs == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: mgpu_mpi_comm_create: %d "
                       "devices", mgpu__mpi.rank, ndev);
  for (int i = 0; i < ndev; i++)
    if (devs[i] < 0 || devs[i] >= mgpu_device_count())
      return mgpu__error(MGPU_ENODEV, "rank %d: mgpu_mpi_comm_create: no "
                         "device %d", mgpu__mpi.rank, devs[i]);
  return 0;
}

/* A context for the nprocs processes of comm, before any call on it: what
 * can fail here fails before the other ranks wait in MPI. */
static int ctx_alloc(MPI_Comm comm, mpi_comm_ctx **out) {
  int nprocs = 0;
  if (MPI_Comm_size(comm, &nprocs) != MPI_SUCCESS || nprocs < 1)
    return mgpu__error(MGPU_EINVAL, "rank %d: mgpu_mpi_comm_create: "
                       "invalid communicator", mgpu__mpi.rank);
  mpi_comm_ctx *x = mgpu_module_calloc(1, sizeof *x);
  if (x != NULL) {
    x->comm = MPI_COMM_NULL;
    x->first = mgpu_module_calloc((size_t)nprocs, sizeof *x->first);
    x->count = mgpu_module_calloc((size_t)nprocs, sizeof *x->count);
  }
  if (x == NULL || x->first == NULL || x->count == NULL) {
    ctx_free(x);
    return mgpu__error(MGPU_ENOMEM, "rank %d: communicator",
                       mgpu__mpi.rank);
  }
  *out = x;
  return 0;
}

/* Every rank learns whether every rank could start (local: this rank's
 * code), so that all fail together instead of some waiting in MPI. */
static int agree_to_start(MPI_Comm comm, int local) {
  int worst = local;
  int rc = MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MIN, comm);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Allreduce");
  if (local != 0) return local;
  if (worst != 0)
    return mgpu__error(worst, "rank %d: mgpu_mpi_comm_create: another "
                       "rank's devices were refused", mgpu__mpi.rank);
  return 0;
}

/* The context's own communicator, every process's device count and first
 * global rank, and the leader's stream and events. */
static int ctx_open(mpi_comm_ctx *x, MPI_Comm comm, int ndev,
                    const int *devs) {
  int rc = MPI_Comm_dup(comm, &x->comm);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Comm_dup");
  MPI_Comm_rank(x->comm, &x->me);
  MPI_Comm_size(x->comm, &x->nprocs);
  rc = MPI_Allgather(&ndev, 1, MPI_INT, x->count, 1, MPI_INT, x->comm);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Allgather");
  x->equal = 1;
  for (int p = 0; p < x->nprocs; p++) {
    x->first[p] = p == 0 ? 0 : x->first[p - 1] + x->count[p - 1];
    x->equal &= x->count[p] == ndev;
  }
  x->leader_dev = devs[0];
  if ((rc = mgpu_stream_create(&x->mpi_stream, devs[0])) == 0 &&
      (rc = mgpu_event_create(&x->reduced[0], devs[0])) == 0)
    rc = mgpu_event_create(&x->reduced[1], devs[0]);
  return rc;
}

/* NCCL over the ranks where every rank's devices are whole GPUs, no GPU
 * appears twice and every rank can open NCCL; else the hierarchical path
 * over MPI (remote as it was). */
static int choose_transport(mpi_comm_ctx *x, int ndev, const int *devs,
                            mgpu_comm_remote *remote) {
#ifdef MGPU_HAVE_NCCL
  int gpus = whole_gpus(ndev, devs), all_gpus = 0;
  const char *why = NULL;
  if (gpus && (nccl = mgpu__mpi_nccl_load(&why)) == NULL) {
    gpus = 0;
    mgpu_module_log(MGPU_LOG_INFO, "rank %d: no NCCL over ranks: %s",
                    mgpu__mpi.rank, why);
  }
  MPI_Allreduce(&gpus, &all_gpus, 1, MPI_INT, MPI_MIN, x->comm);
  if (all_gpus && gpus_repeat(x, ndev, devs)) {
    all_gpus = 0;
    mgpu_module_log(MGPU_LOG_INFO, "rank %d: no NCCL over ranks: ranks "
                    "share a GPU", mgpu__mpi.rank);
  }
  if (all_gpus) {
    int rc = nccl_open(x, ndev, devs);
    if (rc != 0) return rc;
    remote->issue = nccl_issue;
    remote->fail = NULL; /* the other processes wait in NCCL, not in MPI */
  }
#else
  (void)x;
  (void)ndev;
  (void)devs;
  (void)remote;
#endif
  return 0;
}

int mgpu_mpi_comm_create(MPI_Comm comm, int ndev, const int *devs,
                         mgpu_comm **out) {
  int rc = mgpu__mpi_ready("mgpu_mpi_comm_create");
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: mgpu_mpi_comm_create: "
                       "NULL output", mgpu__mpi.rank);
  *out = NULL;
  mpi_comm_ctx *x = NULL;
  int local = check_devices(ndev, devs);
  if (local == 0) local = ctx_alloc(comm, &x);
  if ((rc = agree_to_start(comm, local)) != 0) {
    ctx_free(x);
    return rc;
  }
  if ((rc = ctx_open(x, comm, ndev, devs)) != 0) goto fail;
  mgpu_comm_remote remote = MGPU_COMM_REMOTE_INITIALIZER;
  remote.nranks = x->first[x->nprocs - 1] + x->count[x->nprocs - 1];
  remote.first_rank = x->first[x->me];
  remote.issue = hier_issue;
  remote.fail = hier_fail;
  remote.destroy = ctx_free;
  remote.ctx = x;
  if ((rc = choose_transport(x, ndev, devs, &remote)) != 0) goto fail;
  rc = mgpu_comm_create_remote(devs, ndev, &remote, out);
  if (rc != 0) goto fail;
  mgpu_module_log(MGPU_LOG_INFO, "rank %d: communicator of %d ranks over %d "
                  "processes, ranks %d..%d here, %s", mgpu__mpi.rank,
                  remote.nranks, x->nprocs, remote.first_rank,
                  remote.first_rank + ndev - 1,
                  remote.issue == hier_issue ? "hierarchical over MPI"
                                             : "NCCL");
  return 0;

fail:
  ctx_free(x);
  return rc;
}
