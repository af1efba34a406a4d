/* Internal interface of libmgpu_mpi, shared by its files. The module uses
 * only the public API of libmgpu (mgpu.h, mgpu/module.h) and MPI.
 *
 * Threads: the module's state is written by mgpu_mpi_init and
 * mgpu_mpi_finalize on the calling thread and only read in between; the
 * calls are made by one thread at a time (mgpu/mpi.h), so the staging buffers,
 * the request list and the counters need no lock. */
#ifndef MGPU_MPI_INTERNAL_H
#define MGPU_MPI_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/coll.h"
#include "mgpu/copy.h"
#include "mgpu/core.h"
#include "mgpu/error.h"
#include "mgpu/module.h"
#include "mgpu/mpi.h"

/* The module's errors read like the core's: mgpu__error(code, fmt, ...)
 * writes the calling thread's detail and returns code. A macro over the
 * exported setter (mgpu/module.h), so that the module references no internal
 * symbol of libmgpu (tools/check-layers.py --build). */
#define mgpu__error(...) mgpu_module_error(__VA_ARGS__)

#define MPI_TAG_CHECK (MGPU_MPI_TAG_RESERVED + 1)
#define MPI_TAG_HANDSHAKE (MGPU_MPI_TAG_RESERVED + 2)
#define MPI_TAG_ACK (MGPU_MPI_TAG_RESERVED + 3)
#define MPI_TAG_ROLL (MGPU_MPI_TAG_RESERVED + 4)

/* Bounce buffers of one device, pinned and pre-touched, allocated on the
 * first staged call of the device and kept until mgpu_mpi_finalize: three
 * slots for collectives (what goes out to MPI, what comes back), three for
 * sends and three for receives, so that a collective and a send and a
 * receive in flight never wait for each other's buffers. */
#define MPI_STAGE_SLOTS 3
typedef struct mpi_bounce {
  mgpu_buffer *buf;
  unsigned char *host; /* host pointer of buf */
  mgpu_event *done;    /* recorded after the copies into or out of it */
} mpi_bounce;

/* The staging buffers of one device: its bounce buffers, the streams that
 * copy through them, and the pack. */
typedef struct mpi_staging {
  int ready;
  mgpu_stream *d2h, *h2d;
  mpi_bounce coll_in[MPI_STAGE_SLOTS], coll_out[MPI_STAGE_SLOTS];
  mpi_bounce send[MPI_STAGE_SLOTS], recv[MPI_STAGE_SLOTS];
  int send_busy, recv_busy; /* a request holds the send / recv slots */
  mgpu_buffer *pack;        /* device memory: pitched transfers packed */
  size_t pack_size;
} mpi_staging;

/* A collective's data movement for the staged pipeline (and, in one step,
 * for memory MPI reads directly). Pieces: n_in ranges of the input buffer,
 * piece p at in_off + p * in_stride, and n_out ranges of the output; chunk
 * k moves elements [k*c, (k+1)*c) of every piece: copied to the host (packed,
 * piece p at p*c), handed to fn, and fn's output (packed the same way)
 * copied back. */
/* Open MPI allocates a temporary of the message's size per reduction (page
 * faults on every call above glibc's mmap threshold) and its bandwidth falls
 * above about 1 MiB on the 2-core machines (docs/PERF.md): reductions of
 * memory MPI reads directly go in pieces of this many bytes. */
#define MPI_HOST_CHUNK ((size_t)1 << 20)

typedef int (*mpi_chunk_fn)(void *ctx, void *in, void *out, size_t c,
                            int in_place);
typedef struct mpi_plan {
  int path;
  int nranks;     /* of the communicator: every rank cuts the same chunks */
  size_t esize, count;
  int dev;        /* the device of the buffers */
  mgpu_buffer_view in; /* resolved once by mgpu__mpi_check_buffer; a NULL
                          handle: no input (out the same) */
  size_t in_off, in_stride;
  int n_in;
  mgpu_buffer_view out;
  size_t out_off, out_stride;
  int n_out;
  int in_place;   /* host path: in and out are one (fn uses MPI_IN_PLACE) */
  int splittable; /* one piece each side, element-wise (all-reduce, reduce,
                     broadcast): memory MPI reads directly is handed over in
                     MPI_HOST_CHUNK pieces */
  mpi_chunk_fn fn;
  void *ctx;
} mpi_plan;

/* Runs the plan: one call of fn on the buffers' own memory (paths host and
 * direct), or the pipelined chunks through the bounce buffers (staged):
 * the copy to the host of chunk k+1, fn on chunk k and the copy back of
 * chunk k-1 overlap. */
int mgpu__mpi_run_plan(const mpi_plan *plan);

typedef struct mpi_state {
  int initialized;
  MPI_Comm world;         /* duplicate of the communicator given to init */
  int rank, nranks, local_rank, local_size, node, nnodes;
  int ndevices, first_device, total_devices, shared;
  int cuda_aware;
  int force_stage;        /* MGPU_MPI_STAGE=1: every buffer through the
                             bounce buffers (tests the staged path on host
                             devices) */
  int timeout_ms;
  size_t chunk;           /* bytes per bounce region */
  int failed;             /* a data step or an argument check timed out:
                             MPI may still hold a request on the module's
                             or the caller's buffers, and late ranks would
                             pair that call with later ones; every later
                             call is refused */
  char failed_detail[384];
  uint64_t exchanges;     /* argument exchanges with other ranks made */
  MPI_Op half_ops[2][4];  /* [FLOAT16, BFLOAT16][op] */
  /* [8-bit, 16-bit integers][sum, prod], wrapping: Open MPI's built-in
   * MPI_SUM of MPI_INT8_T .. MPI_UINT16_T saturates in its AVX code on
   * 16 elements or more (open-mpi/ompi#8045); MPI_OP_NULL elsewhere. */
  MPI_Op narrow_ops[2][2];
  mpi_staging staging[MGPU_MAX_DEVICES];
  mgpu_mpi_stats stats;
} mpi_state;

extern mpi_state mgpu__mpi;

/* Paths a buffer takes to MPI. */
enum { MPI_PATH_HOST = 0, MPI_PATH_DIRECT = 1, MPI_PATH_STAGED = 2 };

/* MGPU_ENOINIT unless mgpu_mpi_init ran. */
int mgpu__mpi_ready(const char *what);

/* The MPI datatype and reduction of an mgpu type and op (FLOAT16 and
 * BFLOAT16 use the module's operators over MPI_UINT16_T). */
int mgpu__mpi_type(mgpu_dtype dtype, MPI_Datatype *type);
/* Size and name of one of the module's own types (mgpu/mpi.h), else
 * mgpu_dtype_size's and mgpu_dtype_name's. */
size_t mgpu__mpi_dtype_size(mgpu_dtype dtype);
const char *mgpu__mpi_dtype_name(mgpu_dtype dtype);
/* 1 when the MPI_Op of dtype and op is one of the module's own, which
 * runs on the host (never given device memory). */
int mgpu__mpi_op_on_host(mgpu_dtype dtype, mgpu_op op);
int mgpu__mpi_op(mgpu_dtype dtype, mgpu_op op, MPI_Op *mop);

/* Checks a buffer range (what names the argument in the detail): handle,
 * size, range; stream of the same device. Resolves the handle once, into
 * *view, which the call then passes down instead of the handle. Sets
 * *path. */
int mgpu__mpi_check_buffer(const char *what, const mgpu_buffer *buf,
                           size_t offset, size_t bytes, mgpu_stream *stream,
                           mgpu_buffer_view *view, int *path);
/* Waits for the work the data depends on: the stream, else the device. */
int mgpu__mpi_sync_before(const mgpu_buffer_view *view, mgpu_stream *stream);
/* Host-visible address of the buffer + offset (path host or direct). */
void *mgpu__mpi_addr(const mgpu_buffer_view *view, size_t offset);
/* Counts one transfer of dev's memory on its path: the module's stats and
 * the device's metrics (mpi_host, mpi_direct, mpi_staged, bytes_mpi). */
void mgpu__mpi_count(int dev, int path, size_t bytes);

/* Waits for a non-blocking collective's request until the deadline (what
 * names the call and chunk in the detail). On timeout: MGPU_ETIMEDOUT naming
 * the ranks that did not come (a roll call among the ranks of comm), and
 * the module refuses every later call (mgpu__mpi_usable). */
int mgpu__mpi_wait_coll(MPI_Request *req, MPI_Comm comm, const char *what);
/* mgpu__mpi_ready, and MGPU_ETIMEDOUT once a data step or an argument
 * check has timed out (mgpu__mpi.failed). */
int mgpu__mpi_usable(const char *what);
/* Keeps p for the life of the process: memory MPI may still read or write
 * after a call gave up on it (requests left with MPI at a deadline), never
 * freed, and reachable from here (not a leak to a leak checker). */
void mgpu__mpi_keep(void *p);
/* Completes every request still outstanding, as mgpu_mpi_wait would, and
 * frees it (mgpu_mpi_finalize); the first failure, or 0. */
int mgpu__mpi_requests_finish(void);
/* Takes part in the argument exchange of the collective the other ranks
 * of comm are starting, as a rank that refused it with code (dev: the
 * device lost, with MGPU_EDEVLOST): they fail with code naming this rank
 * and dev instead of waiting for it. Returns code (detail kept). */
int mgpu__mpi_refuse(MPI_Comm comm, int code, int dev);
/* MPI_Testall without statuses: MPI_Test on each request in turn (MPICH's
 * header declares MPI_Testall's statuses as an array, which GCC then checks
 * against MPI_STATUSES_IGNORE and refuses under -Werror). */
int mgpu__mpi_test_all(int n, MPI_Request *reqs, int *done);
/* Absolute deadline (MPI_Wtime) for a wait starting now; huge if none. */
double mgpu__mpi_deadline(void);
int mgpu__mpi_err(int mpi_rc, const char *call);

/* The staging buffers of dev, set up on first use. */
int mgpu__mpi_staging(int dev, mpi_staging **staging);
void mgpu__mpi_staging_free_all(void);
/* The bounce buffers of dev, with their pack (device memory for pitched
 * transfers and distributions) grown to need bytes at least. */
int mgpu__mpi_pack(int dev, size_t need, mpi_staging **staging);

#endif /* MGPU_MPI_INTERNAL_H */
