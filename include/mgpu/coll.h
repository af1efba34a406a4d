/* mgpu coll: collectives over devices, host barriers and stream barriers.
 *
 * A communicator (mgpu_comm) spans a list of devices; rank r is the r-th
 * device of the list. Collectives are stream-ordered, as NCCL's are: every
 * rank calls the collective once, with its own buffers and a stream of its
 * own device, and the data moves when every rank's stream reaches that point.
 * A call returns once every rank has called (or a timeout passed): that is
 * when mismatched arguments are caught, before any data moves. One thread
 * issuing for several ranks wraps its calls in mgpu_group_begin() /
 * mgpu_group_end(), which holds them back until the group ends.
 *
 * Counts are in elements. In place: pass the same buffer as send and recv.
 * For all-gather, in place means rank r's input already sits at element
 * r * count of its recv buffer; for reduce-scatter, rank r's result is
 * written at element r * count of its buffer (NCCL's convention).
 *
 * docs/coll.md is the guide.
 */
#ifndef MGPU_COLL_H
#define MGPU_COLL_H

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgpu_comm mgpu_comm;

/* Who moves the data of a communicator's collectives. */
typedef enum mgpu_coll_provider {
  MGPU_COLL_PROVIDER_AUTO = -1, /* config only: NCCL where it can, else mgpu */
  MGPU_COLL_PROVIDER_MGPU = 0,  /* mgpu's own ring and direct algorithms */
  MGPU_COLL_PROVIDER_NCCL = 1   /* NCCL (whole CUDA GPUs, NCCL present) */
} mgpu_coll_provider;

/* mgpu's own algorithms (provider MGPU). */
typedef enum mgpu_coll_algo {
  MGPU_COLL_ALGO_AUTO = 0,  /* direct where every device reads every other's
                               memory and runs host kernels, else ring */
  MGPU_COLL_ALGO_RING = 1,  /* chunked, pipelined ring of copies and
                               reductions; works on every backend */
  MGPU_COLL_ALGO_DIRECT = 2 /* each rank reduces its slice straight from every
                               peer's buffer and writes it to every output:
                               the least memory traffic; host devices only */
} mgpu_coll_algo;

typedef struct mgpu_comm_config {
  size_t size;        /* sizeof(mgpu_comm_config) */
  int provider;       /* mgpu_coll_provider; AUTO by default */
  int algo;           /* mgpu_coll_algo; AUTO by default */
  size_t chunk_bytes; /* ring pipeline chunk; 0: 1 MiB */
  int timeout_ms;     /* how long a call waits for the other ranks before it
                         returns MGPU_ETIMEDOUT naming the missing devices
                         and their last operations (the flight recorder,
                         mgpu/trace.h); the communicator is then aborted.
                         0: MGPU_TIMEOUT when created (default 30000);
                         -1: forever */
} mgpu_comm_config;

#define MGPU_COMM_CONFIG_INITIALIZER                                       \
  { .size = sizeof(mgpu_comm_config), .provider = MGPU_COLL_PROVIDER_AUTO,  \
    .algo = MGPU_COLL_ALGO_AUTO, .chunk_bytes = 0, .timeout_ms = 0 }

/* Creates a communicator over n distinct devices of one backend (rank r =
 * devs[r]); devices of two backends are MGPU_ENOTSUP. The caller owns it
 * until mgpu_comm_destroy. */
MGPU_EXTERN int mgpu_comm_create(const int *devs, int n, mgpu_comm **comm);
/* The same with a configuration (NULL: the defaults). */
MGPU_EXTERN int mgpu_comm_create_config(const int *devs, int n,
                                        const mgpu_comm_config *config,
                                        mgpu_comm **comm);
/* Waits for the communicator's work in flight, then frees it. Later use of
 * the handle (and a second destroy) is MGPU_EFREED; a collective call
 * waiting inside for its other ranks is woken and returns MGPU_EFREED, and
 * the destroy waits until every call inside has left. mgpu_shutdown
 * destroys the communicators still open. */
MGPU_EXTERN int mgpu_comm_destroy(mgpu_comm *comm);
/* Aborts a communicator whose collectives may be blocked (a rank that will
 * never call, a rank's device or thread gone), from any thread, also while
 * other threads wait inside its collectives. In this order: later calls
 * cannot find the handle; every pending collective of every rank is failed
 * and every call waiting in one is woken, at once; a provider's
 * communicator (NCCL) is aborted for all ranks together, not one rank
 * after another (which can deadlock, each rank waiting for the next);
 * then, once the calls inside have left and the work already issued on the
 * ranks' streams has run, the communicator is freed. The calls that were
 * waiting, or that joined meanwhile, return MGPU_ECANCELED with a detail
 * naming the communicator and the first collective that did not run; the
 * streams of those calls got nothing of them. Later use of the handle (and
 * a destroy or a second abort) is MGPU_EFREED. The caller's ownership of
 * comm ends, as with mgpu_comm_destroy. Returns 0, MGPU_EBADHANDLE or
 * MGPU_EFREED for a bad handle, or the first error of the ranks' devices'
 * synchronize (MGPU_EDEVLOST for a lost device). A thread waiting in a
 * group that also waits on another communicator holds this one until that
 * wait ends (by its result or its timeout); on a communicator spanning
 * processes, an issue already running in the module (mgpu_comm_remote)
 * finishes first. */
MGPU_EXTERN int mgpu_comm_abort(mgpu_comm *comm);
/* Number of ranks, or a negative code. */
MGPU_EXTERN int mgpu_comm_size(const mgpu_comm *comm);
/* Device of a rank, or a negative code. */
MGPU_EXTERN int mgpu_comm_device(const mgpu_comm *comm, int rank);
/* MGPU_COLL_PROVIDER_MGPU or _NCCL, or a negative code. */
MGPU_EXTERN int mgpu_comm_provider(const mgpu_comm *comm);
/* "mgpu", "nccl", "auto" or "unknown". */
MGPU_EXTERN const char *mgpu_coll_provider_name(int provider);

/* recv = op over every rank's send (count elements on every rank). */
MGPU_EXTERN int mgpu_allreduce(mgpu_comm *comm, int rank,
                               const mgpu_buffer *send, mgpu_buffer *recv,
                               size_t count, mgpu_dtype dtype, mgpu_op op,
                               mgpu_stream *stream);
/* root's recv = op over every rank's send; recv is ignored (may be NULL) on
 * the other ranks. */
MGPU_EXTERN int mgpu_reduce(mgpu_comm *comm, int rank, const mgpu_buffer *send,
                            mgpu_buffer *recv, size_t count, mgpu_dtype dtype,
                            mgpu_op op, int root, mgpu_stream *stream);
/* Every rank's recv = root's send; send is ignored (may be NULL) on the
 * other ranks. */
MGPU_EXTERN int mgpu_broadcast(mgpu_comm *comm, int rank,
                               const mgpu_buffer *send, mgpu_buffer *recv,
                               size_t count, mgpu_dtype dtype, int root,
                               mgpu_stream *stream);
/* recv (n * count elements) = the ranks' sends (count each), in rank order. */
MGPU_EXTERN int mgpu_allgather(mgpu_comm *comm, int rank,
                               const mgpu_buffer *send, mgpu_buffer *recv,
                               size_t count, mgpu_dtype dtype,
                               mgpu_stream *stream);
/* Rank r's recv (count elements) = op over every rank's send elements
 * [r * count, (r + 1) * count). */
MGPU_EXTERN int mgpu_reduce_scatter(mgpu_comm *comm, int rank,
                                    const mgpu_buffer *send, mgpu_buffer *recv,
                                    size_t count, mgpu_dtype dtype, mgpu_op op,
                                    mgpu_stream *stream);

/* ------------------------------------------------------------------------ */
/* Communicators that span processes                                        */
/* ------------------------------------------------------------------------ */
/* A module that joins processes (libmgpu_mpi: mgpu_mpi_comm_create) makes a
 * communicator whose ranks are the devices of every process. This process
 * holds ranks first_rank .. first_rank + n - 1 (its devs); the collectives
 * above take those global ranks and roots. Each call is checked and the
 * local ranks meet as in any communicator; once every local rank of a
 * collective has called and they agree, the module's issue function runs
 * it across the processes, and its result is every local rank's result. */

/* What a collective asks of one local rank, as handed to issue. */
typedef enum mgpu_coll_kind {
  MGPU_COLL_ALLREDUCE = 0,
  MGPU_COLL_REDUCE = 1,
  MGPU_COLL_BROADCAST = 2,
  MGPU_COLL_ALLGATHER = 3,
  MGPU_COLL_REDUCE_SCATTER = 4
} mgpu_coll_kind;

typedef struct mgpu_coll_call {
  int kind;                  /* mgpu_coll_kind */
  int rank;                  /* global rank */
  const mgpu_buffer *send;   /* NULL where the kind ignores it (non-root) */
  size_t send_offset;        /* bytes; in place, the rank's own block */
  mgpu_buffer *recv;         /* NULL where ignored */
  size_t recv_offset;
  int in_place;
  size_t count;              /* per rank, as in the collectives above */
  mgpu_dtype dtype;
  mgpu_op op;
  int root;                  /* global rank */
  mgpu_stream *stream;       /* the rank's stream */
} mgpu_coll_call;

typedef struct mgpu_comm_remote {
  size_t size;      /* sizeof(mgpu_comm_remote) */
  int nranks;       /* ranks over every process */
  int first_rank;   /* global rank of devs[0] */
  /* Runs one collective across the processes: calls[i] is local rank i's
   * call (n of them, already checked and consistent). Called once per
   * collective, in order, by the thread that brought the last local rank,
   * with the communicator held; returns 0 or a negative code (and a
   * detail) that every local rank's call returns. */
  int (*issue)(void *ctx, const mgpu_coll_call *calls, int n);
  /* Called once by mgpu_comm_destroy, after the local work is done. */
  void (*destroy)(void *ctx);
  void *ctx;
  /* Optional (NULL: none). Called instead of issue, the same way, when a
   * collective fails here before issue (a local device lost, calls that do
   * not agree): code is what every local rank's call returns, and fail
   * tells the other processes, which would otherwise wait in issue for
   * this one. Its own result is ignored. */
  void (*fail)(void *ctx, const mgpu_coll_call *calls, int n, int code);
} mgpu_comm_remote;

#define MGPU_COMM_REMOTE_INITIALIZER \
  { sizeof(mgpu_comm_remote), 0, 0, NULL, NULL, NULL, NULL }

/* Creates a communicator over this process's n devices as ranks
 * remote->first_rank.. of remote->nranks, whose collectives run through
 * remote->issue. MGPU_EINVAL when the ranks do not fit or issue is NULL.
 * The caller owns it until mgpu_comm_destroy. */
MGPU_EXTERN int mgpu_comm_create_remote(const int *devs, int n,
                                        const mgpu_comm_remote *remote,
                                        mgpu_comm **comm);

/* Between these, the calling thread's collective calls only check their own
 * arguments and return; mgpu_group_end() hands them over together and waits
 * until every rank of each has called. Groups nest; the outermost end
 * submits. mgpu_group_end returns the first error of the group's calls.
 * A call's buffers, stream and communicator are looked up again by
 * mgpu_group_end: one freed in between fails the whole group (MGPU_EFREED)
 * before any of it runs. From there to the completion they are held: a
 * free on another thread waits for the collective, except while a call
 * still waits for the other ranks: then it leaves its operation and
 * returns MGPU_EFREED (mgpu_free, mgpu/core.h, has the rule).
 * When the calls' streams capture a graph (mgpu_stream_begin_capture),
 * mgpu_group_end records the group into it instead of running it, every
 * launch running it again: every stream must capture the same graph and
 * every rank of each communicator be called as often (MGPU_EINVAL), the
 * ranks agree (MGPU_EMISMATCH), no communicator span processes
 * (MGPU_ENOTSUP); nothing is recorded otherwise (docs/graphs.md). A call
 * outside a group on a capturing stream is recorded when its communicator
 * has a single rank. */
MGPU_EXTERN int mgpu_group_begin(void);
MGPU_EXTERN int mgpu_group_end(void);

/* *result (one element of dtype) = op over every element of every rank's
 * buffer: rank r contributes counts[r] elements of bufs[r]. Each device
 * reduces its own part, the host combines the partial results. Synchronous;
 * called by one thread for the whole communicator. */
MGPU_EXTERN int mgpu_reduce_to_host(mgpu_comm *comm,
                                    mgpu_buffer *const *bufs,
                                    const size_t *counts, mgpu_dtype dtype,
                                    mgpu_op op, void *result);

/* ------------------------------------------------------------------------ */
/* Barriers                                                                 */
/* ------------------------------------------------------------------------ */

/* A host barrier for one thread per device: rank r is the thread working for
 * devs[r]. Reusable: each round is a new generation. */
typedef struct mgpu_barrier mgpu_barrier;

MGPU_EXTERN int mgpu_barrier_create(const int *devs, int n,
                                    mgpu_barrier **barrier);
/* Frees the barrier. Threads waiting in it are woken and return
 * MGPU_EFREED; the destroy returns once they have left. Later calls (and a
 * second destroy) are MGPU_EFREED. mgpu_shutdown destroys the barriers
 * still open. */
MGPU_EXTERN int mgpu_barrier_destroy(mgpu_barrier *barrier);
/* Blocks until every rank has arrived in this generation. After timeout_ms
 * (0: MGPU_TIMEOUT, default 30000; -1: forever) it returns MGPU_ETIMEDOUT
 * with a detail naming the devices that did not arrive and their last
 * operations (the flight recorder, mgpu/trace.h), and withdraws the caller,
 * so the barrier stays usable.
 * Two threads waiting as one rank at once is MGPU_EINVAL. */
MGPU_EXTERN int mgpu_barrier_wait(mgpu_barrier *barrier, int rank,
                                  int timeout_ms);

/* A stream barrier: queued on a set of streams (of any devices of one
 * backend), it makes every stream wait until all of them have reached it.
 * The host does not block. */
typedef struct mgpu_stream_barrier mgpu_stream_barrier;

MGPU_EXTERN int mgpu_stream_barrier_create(mgpu_stream *const *streams, int n,
                                           mgpu_stream_barrier **barrier);
/* Frees the stream barrier once the calls inside it on other threads have
 * left; later calls (and a second destroy) are MGPU_EFREED. mgpu_shutdown
 * destroys the stream barriers still open. */
MGPU_EXTERN int mgpu_stream_barrier_destroy(mgpu_stream_barrier *barrier);
/* Queues one barrier round on every stream of the set. */
MGPU_EXTERN int mgpu_stream_barrier_wait(mgpu_stream_barrier *barrier);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_COLL_H */
