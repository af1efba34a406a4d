/* mgpu mpi: one process per rank under mpirun or srun, each with its share
 * of the node's devices, and device buffers moved between ranks by MPI.
 *
 * This header includes <mpi.h>; mgpu.h does not, so programs without MPI
 * never see it. Link with libmgpu_mpi (pkg-config mgpu-mpi, CMake target
 * mgpu::mpi). docs/mpi.md is the guide.
 *
 * Conventions:
 * - Offsets are in bytes, counts in elements of an mgpu_dtype, as in the
 *   built-in kernels of mgpu/core.h. Every type and op of the in-process
 *   collectives is accepted (FLOAT16 and BFLOAT16 are reduced on the host by
 *   MPI operators of this module).
 * - Beyond mgpu_dtype, the module moves the element types below (NumPy's
 *   other integers and bool, and raw bytes), passed where a call takes an
 *   mgpu_dtype. Integers take every op; MGPU_MPI_BOOL takes MGPU_MIN
 *   (logical and) and MGPU_MAX (logical or); MGPU_MPI_BYTES, counted in
 *   bytes, is moved and never reduced (MGPU_EINVAL naming the op).
 * - Each call takes an optional stream of the buffer's device: the data is
 *   read after the work queued on that stream so far (NULL: after all work
 *   of the buffer's device), and a received buffer is ready when the call
 *   (or mgpu_mpi_wait) returns. A stream of another device is
 *   MGPU_EWRONGDEV.
 * - Where a buffer's memory lives decides the path, counted in
 *   mgpu_mpi_stats: host devices, pinned and unified buffers hand their
 *   pointer to MPI ("host"); device memory goes straight to MPI only when MPI
 *   is CUDA-aware ("direct"), else through pooled pinned bounce buffers in
 *   pipelined chunks ("staged"). A device pointer never reaches an MPI that
 *   cannot take it.
 * - Before any data moves, every rank's arguments are compared: a buffer too
 *   small on one rank, or counts, types, ops or roots that differ, fail the
 *   call on every rank (MGPU_ERANGE / MGPU_EMISMATCH, the detail naming the
 *   rank). A rank that does not arrive within the timeout
 *   (MGPU_MPI_TIMEOUT_MS) fails the call with MGPU_ETIMEDOUT naming it; the
 *   communicator should not be used for further collectives after that.
 * - Every wait for another rank, the data phase included, ends within
 *   MGPU_MPI_TIMEOUT_MS: a rank that fails or dies mid-call leaves the
 *   others with MGPU_ETIMEDOUT naming it (docs/mpi.md, "When a rank fails").
 *   After a data phase timed out MPI may still hold the call's buffers: the
 *   module refuses every later call and the program should call MPI_Abort.
 * - Tags from MGPU_MPI_TAG_RESERVED up are the module's own.
 * - The calls are made by one thread at a time (MPI_THREAD_FUNNELED or
 *   SERIALIZED is enough).
 */
#ifndef MGPU_MPI_H
#define MGPU_MPI_H

#include <mpi.h>

#include "mgpu/coll.h"
#include "mgpu/core.h"
#include "mgpu/part.h"

#ifdef __cplusplus
extern "C" {
#endif

/* User tags must stay below this (MPI guarantees tags up to 32767). */
#define MGPU_MPI_TAG_RESERVED 32000

/* The module's element types beyond mgpu_dtype (see the conventions). */
#define MGPU_MPI_INT8 ((mgpu_dtype)32)
#define MGPU_MPI_UINT8 ((mgpu_dtype)33)
#define MGPU_MPI_INT16 ((mgpu_dtype)34)
#define MGPU_MPI_UINT16 ((mgpu_dtype)35)
#define MGPU_MPI_UINT32 ((mgpu_dtype)36)
#define MGPU_MPI_UINT64 ((mgpu_dtype)37)
#define MGPU_MPI_BOOL ((mgpu_dtype)38)  /* 1 byte, 0 or 1 */
#define MGPU_MPI_BYTES ((mgpu_dtype)39) /* raw bytes: moved, never reduced */

/* ------------------------------------------------------------------------ */
/* Start-up: which devices this rank opens                                  */
/* ------------------------------------------------------------------------ */

/* After MPI_Init: finds this rank's node-local rank with
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (MGPU_MPI_RANKS_PER_NODE=k makes
 * every k consecutive ranks of a machine a "node" of their own, to test
 * several nodes on one machine), and calls mgpu_init with this rank's share
 * of the devices cfg (or MGPU_DEVICES) names:
 * - ranks of a node that see the same devices (compared by UUID, since
 *   CUDA_VISIBLE_DEVICES may differ between processes) split them: with at
 *   least as many ranks as devices each rank gets one device (ranks share a
 *   device when there are more; MGPU_LOG=warn says so), with fewer ranks
 *   each gets a contiguous group of devices. host:N is split the same way.
 * - the path for device memory is chosen once: MGPU_MPI_CUDA_AWARE=auto (the
 *   default: MPIX_Query_cuda_support / MPIX_GPU_query_support), 1 or 0, and
 *   logged at MGPU_LOG=info.
 * Collective over comm (every rank must call it). Environment:
 * MGPU_MPI_TIMEOUT_MS (default 30000, -1 forever), MGPU_MPI_CHUNK (staging
 * chunk, default 1M). Returns MGPU_EALREADY when called twice, MGPU_EINVAL
 * for a bad environment value (detail names variable and value), or
 * mgpu_init's error. */
MGPU_EXTERN int mgpu_mpi_init(MPI_Comm comm, const mgpu_config *cfg);

/* Completes the requests still open (as mgpu_mpi_wait; a later wait on one
 * is MGPU_EBADHANDLE), frees the bounce buffers, the module's communicators
 * and operators, then calls mgpu_shutdown. Returns the first failure of
 * those requests or of the shutdown. Does not call MPI_Finalize. Safe when
 * not initialized. Every rank should call it. */
MGPU_EXTERN int mgpu_mpi_finalize(void);

/* What mgpu_mpi_init decided for the calling rank. */
typedef struct mgpu_mpi_info {
  size_t size;           /* sizeof(mgpu_mpi_info), set by the caller */
  int rank, nranks;      /* in the communicator given to mgpu_mpi_init */
  int local_rank;        /* rank among the ranks of its node */
  int local_size;        /* ranks on its node */
  int node, nnodes;      /* node index (0 .. nnodes-1) */
  int ndevices;          /* devices this rank opened (mgpu_device_count) */
  int first_device;      /* global index of this rank's device 0 over the
                            devices of every rank, in rank order */
  int total_devices;     /* devices of every rank */
  int shared;            /* 1 when another rank of the node opened one of
                            this rank's devices */
  int cuda_aware;        /* 1: device pointers go straight to MPI */
} mgpu_mpi_info;

/* Fills *info (info->size must be set). MGPU_ENOINIT before mgpu_mpi_init. */
MGPU_EXTERN int mgpu_mpi_get_info(mgpu_mpi_info *info);

/* Which path moved the data, counted per call since mgpu_mpi_init. */
typedef struct mgpu_mpi_stats {
  size_t size;            /* sizeof(mgpu_mpi_stats), set by the caller */
  uint64_t calls_host;    /* host memory handed to MPI, no copy */
  uint64_t calls_direct;  /* device pointers handed to a CUDA-aware MPI */
  uint64_t calls_staged;  /* through the pinned bounce buffers */
  uint64_t bytes_host, bytes_direct, bytes_staged; /* this rank's payload */
  uint64_t staged_chunks; /* bounce-buffer chunks moved */
} mgpu_mpi_stats;

MGPU_EXTERN int mgpu_mpi_get_stats(mgpu_mpi_stats *stats);
MGPU_EXTERN int mgpu_mpi_reset_stats(void);

/* ------------------------------------------------------------------------ */
/* Point to point                                                           */
/* ------------------------------------------------------------------------ */

/* Sends count elements at byte offset of buf to rank dest. A send and its
 * receive first agree (count and type must be equal, the receiver's buffer
 * large enough), then the data moves: a mismatch fails both sides with
 * MGPU_EMISMATCH before any data moves. Blocks until the data has left
 * buf. MGPU_ETIMEDOUT (naming dest) when dest does not answer in time. */
MGPU_EXTERN int mgpu_mpi_send(const mgpu_buffer *buf, size_t offset,
                              size_t count, mgpu_dtype dtype, int dest,
                              int tag, MPI_Comm comm, mgpu_stream *stream);

/* Receives count elements from rank source (not MPI_ANY_SOURCE) into buf at
 * byte offset. Returns when the data is in buf. */
MGPU_EXTERN int mgpu_mpi_recv(mgpu_buffer *buf, size_t offset, size_t count,
                              mgpu_dtype dtype, int source, int tag,
                              MPI_Comm comm, mgpu_stream *stream);

/* Pitched (2-D) transfers, as mgpu_memcpy_2d between ranks: height rows of
 * width elements, row r at byte offset + r * pitch (pitch >= width * the
 * element size). The rows are packed on the buffer's device (a pooled
 * buffer, mgpu_memcpy_2d), moved as one message by mgpu_mpi_send / recv,
 * and unpacked; the receiver's shape may differ from the sender's as long
 * as width * height and the type agree. Blocking. */
MGPU_EXTERN int mgpu_mpi_send_2d(const mgpu_buffer *buf, size_t offset,
                                 size_t pitch, size_t width, size_t height,
                                 mgpu_dtype dtype, int dest, int tag,
                                 MPI_Comm comm, mgpu_stream *stream);
MGPU_EXTERN int mgpu_mpi_recv_2d(mgpu_buffer *buf, size_t offset,
                                 size_t pitch, size_t width, size_t height,
                                 mgpu_dtype dtype, int source, int tag,
                                 MPI_Comm comm, mgpu_stream *stream);

typedef struct mgpu_mpi_request mgpu_mpi_request;

/* Non-blocking forms: they check their arguments, post the exchange and
 * return a request the caller owns until mgpu_mpi_wait, which must be
 * called exactly once per request. The buffer must stay allocated and
 * unchanged (send) or untouched (recv) until then. A buffer freed before
 * its data moved makes the wait MGPU_EFREED (the peer's call then times
 * out); its memory stays in place while MPI holds it, so a free never
 * lets MPI read or write memory given back. */
MGPU_EXTERN int mgpu_mpi_isend(const mgpu_buffer *buf, size_t offset,
                               size_t count, mgpu_dtype dtype, int dest,
                               int tag, MPI_Comm comm, mgpu_stream *stream,
                               mgpu_mpi_request **req);
MGPU_EXTERN int mgpu_mpi_irecv(mgpu_buffer *buf, size_t offset, size_t count,
                               mgpu_dtype dtype, int source, int tag,
                               MPI_Comm comm, mgpu_stream *stream,
                               mgpu_mpi_request **req);

/* Completes the request (progressing every other request of this rank
 * meanwhile, so that a send and a receive posted to each other both
 * finish), frees it and returns its result. */
MGPU_EXTERN int mgpu_mpi_wait(mgpu_mpi_request *req);

/* ------------------------------------------------------------------------ */
/* Collectives over the ranks of an MPI communicator                         */
/* ------------------------------------------------------------------------ */
/* Every rank of comm calls with the same count, dtype, op and root. In
 * place: the same buffer and offset as send and recv; for reduce-scatter,
 * rank r's result is then written at element r * count of the buffer (the
 * other elements are left unspecified), for all-gather rank r's input
 * already sits at element r * count, as in mgpu/coll.h. send and recv of
 * one rank must be on one device. */

/* Every rank's buf = root's buf. */
MGPU_EXTERN int mgpu_mpi_bcast(mgpu_buffer *buf, size_t offset, size_t count,
                               mgpu_dtype dtype, int root, MPI_Comm comm,
                               mgpu_stream *stream);

/* root's recv = op over every rank's send; recv ignored (may be NULL) on the
 * other ranks. */
MGPU_EXTERN int mgpu_mpi_reduce(const mgpu_buffer *send, size_t send_offset,
                                mgpu_buffer *recv, size_t recv_offset,
                                size_t count, mgpu_dtype dtype, mgpu_op op,
                                int root, MPI_Comm comm, mgpu_stream *stream);

/* Every rank's recv = op over every rank's send. */
MGPU_EXTERN int mgpu_mpi_allreduce(const mgpu_buffer *send,
                                   size_t send_offset, mgpu_buffer *recv,
                                   size_t recv_offset, size_t count,
                                   mgpu_dtype dtype, mgpu_op op,
                                   MPI_Comm comm, mgpu_stream *stream);

/* Rank r's recv (count elements) = op over elements [r * count, (r + 1) *
 * count) of every rank's send (nranks * count elements). */
MGPU_EXTERN int mgpu_mpi_reduce_scatter(const mgpu_buffer *send,
                                        size_t send_offset, mgpu_buffer *recv,
                                        size_t recv_offset, size_t count,
                                        mgpu_dtype dtype, mgpu_op op,
                                        MPI_Comm comm, mgpu_stream *stream);

/* recv (nranks * count elements) = every rank's send (count), rank order. */
MGPU_EXTERN int mgpu_mpi_allgather(const mgpu_buffer *send,
                                   size_t send_offset, mgpu_buffer *recv,
                                   size_t recv_offset, size_t count,
                                   mgpu_dtype dtype, MPI_Comm comm,
                                   mgpu_stream *stream);

/* Rank r's recv (count) = elements [r * count, (r + 1) * count) of root's
 * send; send ignored (may be NULL) on the other ranks. */
MGPU_EXTERN int mgpu_mpi_scatter(const mgpu_buffer *send, size_t send_offset,
                                 mgpu_buffer *recv, size_t recv_offset,
                                 size_t count, mgpu_dtype dtype, int root,
                                 MPI_Comm comm, mgpu_stream *stream);

/* root's recv (nranks * count) = every rank's send (count), rank order; recv
 * ignored (may be NULL) on the other ranks. */
MGPU_EXTERN int mgpu_mpi_gather(const mgpu_buffer *send, size_t send_offset,
                                mgpu_buffer *recv, size_t recv_offset,
                                size_t count, mgpu_dtype dtype, int root,
                                MPI_Comm comm, mgpu_stream *stream);

/* ------------------------------------------------------------------------ */
/* Distributions over every device of every rank                             */
/* ------------------------------------------------------------------------ */

/* Creates a distribution of [0, n) whose parts are the devices of every
 * rank of comm in rank order: rank p's local device d is part
 * first_device(p) + d (mgpu_mpi_info.first_device for the init
 * communicator). opts as for mgpu_dist_create, with ndevices 0 and devices
 * NULL (the parts are given); a weighted one needs its weights. The ranges
 * queries work for every part; mgpu_dist_device answers 0 for the parts of
 * other ranks. Collective over comm; the caller owns *dist
 * (mgpu_dist_destroy). */
MGPU_EXTERN int mgpu_mpi_dist_create(MPI_Comm comm, size_t n,
                                     const mgpu_dist_opts *opts,
                                     mgpu_dist **dist);

/* One call from the root's buffer to every part of every rank: root's src
 * (n elements of elem_size bytes from src_offset, on any of its devices)
 * is cut by dist and part first_device + i lands in bufs[i] of its rank (a
 * buffer on local device i, in the part's local order, as mgpu_scatter
 * writes). src is ignored on the other ranks. Collective over comm;
 * elem_size even. Blocking. */
MGPU_EXTERN int mgpu_mpi_dist_scatter(const mgpu_dist *dist,
                                      const mgpu_buffer *src,
                                      size_t src_offset, size_t elem_size,
                                      int root, mgpu_buffer *const *bufs,
                                      MPI_Comm comm);
/* The reverse: every part of every rank back into the root's dst. */
MGPU_EXTERN int mgpu_mpi_dist_gather(const mgpu_dist *dist, mgpu_buffer *dst,
                                     size_t dst_offset, size_t elem_size,
                                     int root, mgpu_buffer *const *bufs,
                                     MPI_Comm comm);

/* ------------------------------------------------------------------------ */
/* One communicator over every device of every rank                          */
/* ------------------------------------------------------------------------ */

/* Creates an mgpu_comm whose ranks are the devices of every rank of comm:
 * rank p's devs come after those of ranks 0 .. p-1 (mgpu_mpi_info's
 * first_device when every rank passes all its devices). mgpu_allreduce,
 * mgpu_reduce, mgpu_broadcast, mgpu_allgather and mgpu_reduce_scatter then
 * work across processes unchanged, each process calling for its own ranks
 * (global rank numbers, global roots). Hierarchical: the local ranks'
 * data meet on devs[0] (copies and the built-in reduction kernel), the
 * processes exchange by MPI (this module's calls, staged where MPI cannot
 * read device memory; a large all-reduce as reduce-scatter + all-gather),
 * and the result goes back to every local rank. With NCCL built in and
 * every device of every rank a whole CUDA GPU, no GPU twice (ranks sharing
 * a GPU stay hierarchical), one NCCL communicator over ranks x GPUs runs
 * them instead. Across processes a collective has finished when its call
 * (or the group) returns, on either path: the NCCL path waits for its
 * streams up to MGPU_MPI_TIMEOUT_MS, then aborts the NCCL communicators
 * (MGPU_ETIMEDOUT; later calls on comm are MGPU_ECANCELED). A collective
 * that fails in one process before it reaches the others (a local device
 * lost) fails theirs with the same code, the detail naming the rank and
 * the device (MGPU_EDEVLOST "rank 1 lost its device 0"); not on the NCCL
 * path.
 * Collective over comm. ndev devices, each once. The caller owns *out
 * until mgpu_comm_destroy (before mgpu_mpi_finalize, on every rank). */
MGPU_EXTERN int mgpu_mpi_comm_create(MPI_Comm comm, int ndev, const int *devs,
                                     mgpu_comm **out);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_MPI_H */
