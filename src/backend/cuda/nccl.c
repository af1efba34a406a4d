/* NCCL as the collective provider of CUDA devices.
 *
 * libnccl is opened with dlopen when the plugin is loaded, never linked, so
 * libmgpu-cuda.so still loads where NCCL is missing; then the backend table
 * leaves the collective slots NULL and the core runs its own ring. NCCL is
 * only offered when no GPU is split: NCCL refuses two ranks on one GPU.
 *
 * One communicator per mgpu communicator, made with ncclCommInitAll over
 * the ranks' GPUs in one process. The core calls coll_run once per rank,
 * between coll_group_start and coll_group_end when one thread issues for
 * several ranks, as NCCL requires.
 *
 * Threading: the function pointers are set once by mgpu__cuda_nccl_load
 * (at plugin entry, which mgpu_init serializes) and read-only afterwards.
 */
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

static struct {
  void *handle;
  ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t); /* NULL in an NCCL without it */
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t,
                             ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t,
                         ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t,
                             ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t,
                                 ncclRedOp_t, ncclComm_t, cudaStream_t);
  const char *(*error_string)(ncclResult_t);
} nccl;

typedef struct nccl_comm {
  int n;
  int ids[MGPU_MAX_DEVICES]; /* mgpu device id of each rank */
  ncclComm_t comms[MGPU_MAX_DEVICES];
} nccl_comm;

#define LOAD(field, name)                                   \
  do {                                                      \
    *(void **)&nccl.field = dlsym(nccl.handle, name);       \
    if (nccl.field == NULL) goto missing;                   \
  } while (0)

int mgpu__cuda_nccl_load(void) {
  if (nccl.handle != NULL) return 1;
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    mgpu__cuda_env->log(MGPU_LOG_DEBUG, "cuda: libnccl not found: collectives "
                        "on CUDA devices use mgpu's ring");
    return 0;
  }
  nccl.handle = h;
  LOAD(comm_init_all, "ncclCommInitAll");
  LOAD(comm_destroy, "ncclCommDestroy");
  LOAD(group_start, "ncclGroupStart");
  LOAD(group_end, "ncclGroupEnd");
  LOAD(all_reduce, "ncclAllReduce");
  LOAD(reduce, "ncclReduce");
  LOAD(broadcast, "ncclBroadcast");
  LOAD(all_gather, "ncclAllGather");
  LOAD(reduce_scatter, "ncclReduceScatter");
  LOAD(error_string, "ncclGetErrorString");
  *(void **)&nccl.comm_abort = dlsym(h, "ncclCommAbort");
  mgpu__cuda_env->log(MGPU_LOG_DEBUG, "cuda: collectives on whole GPUs use "
                      "NCCL");
  return 1;
missing:
  mgpu__cuda_env->log(MGPU_LOG_INFO, "cuda: libnccl lacks an entry point: "
                      "collectives on CUDA devices use mgpu's ring");
  dlclose(h);
  memset(&nccl, 0, sizeof nccl);
  return 0;
}

static int nccl_fail(int dev, ncclResult_t r, const char *what) {
  return mgpu__error(
      MGPU_EBACKEND, "device %d: %s: NCCL error %d (%s)", dev, what, (int)r,
      nccl.error_string ? nccl.error_string(r) : "?");
}

int mgpu__cuda_coll_comm_create(mgpu__bdevice **devs, int n, void **out) {
  *out = NULL;
  if (n < 1 || n > MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "NCCL communicator of %d "
                       "ranks", n);
  nccl_comm *c = mgpu__calloc(1, sizeof *c);
  if (c == NULL)
    return mgpu__error(MGPU_ENOMEM, "out of host memory for an "
                       "NCCL communicator of %d ranks", n);
  int ordinals[MGPU_MAX_DEVICES];
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < i; j++)
      if (devs[j]->ordinal == devs[i]->ordinal) {
        mgpu__free(c);
        return mgpu__error(
            MGPU_ENOTSUP, "devices %d and %d are on the same GPU %d: NCCL "
            "refuses two ranks on one GPU", devs[j]->id, devs[i]->id,
            devs[i]->ordinal);
      }
    ordinals[i] = devs[i]->ordinal;
    c->ids[i] = devs[i]->id;
  }
  c->n = n;
  /* ncclCommInitAll changes the calling thread's current device. */
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(NULL, &sc);
  ncclResult_t r = nccl.comm_init_all(c->comms, n, ordinals);
  mgpu__cuda_leave(&sc);
  if (r != ncclSuccess) {
    int rc = nccl_fail(devs[0]->id, r, "ncclCommInitAll");
    mgpu__free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void mgpu__cuda_coll_comm_destroy(void *comm) {
  nccl_comm *c = comm;
  if (c == NULL) return;
  for (int i = 0; i < c->n; i++) nccl.comm_destroy(c->comms[i]);
  mgpu__free(c);
}

void mgpu__cuda_coll_comm_abort(void *comm) {
  nccl_comm *c = comm;
  if (c == NULL) return;
  if (nccl.comm_abort == NULL) {
    mgpu__cuda_coll_comm_destroy(comm);
    return;
  }
  /* Every rank's abort in one group, so that no rank's abort waits for a
   * rank whose kernels were not told yet. */
  nccl.group_start();
  for (int i = 0; i < c->n; i++) nccl.comm_abort(c->comms[i]);
  nccl.group_end();
  mgpu__free(c);
}

int mgpu__cuda_coll_group_start(void) {
  ncclResult_t r = nccl.group_start();
  return r == ncclSuccess ? 0 : nccl_fail(-1, r, "ncclGroupStart");
}

int mgpu__cuda_coll_group_end(void) {
  ncclResult_t r = nccl.group_end();
  return r == ncclSuccess ? 0 : nccl_fail(-1, r, "ncclGroupEnd");
}

static ncclDataType_t nccl_type(mgpu_dtype t) {
  switch (t) {
    case MGPU_FLOAT32: return ncclFloat32;
    case MGPU_FLOAT64: return ncclFloat64;
    case MGPU_INT32: return ncclInt32;
    case MGPU_INT64: return ncclInt64;
    case MGPU_FLOAT16: return ncclFloat16;
    case MGPU_BFLOAT16: return ncclBfloat16;
  }
  return ncclFloat32;
}

static ncclRedOp_t nccl_op(mgpu_op op) {
  switch (op) {
    case MGPU_SUM: return ncclSum;
    case MGPU_PROD: return ncclProd;
    case MGPU_MIN: return ncclMin;
    case MGPU_MAX: return ncclMax;
  }
  return ncclSum;
}

int mgpu__cuda_coll_run(void *comm, int rank, const mgpu__coll_args *a,
                        mgpu__bstream *s) {
  nccl_comm *c = comm;
  if (rank < 0 || rank >= c->n)
    return mgpu__error(MGPU_EINVAL, "NCCL rank %d of %d", rank,
                       c->n);
  ncclComm_t nc = c->comms[rank];
  ncclDataType_t t = nccl_type(a->dtype);
  ncclResult_t r = ncclInvalidArgument;
  const char *what = "?";
  switch (a->kind) {
    case MGPU__COLL_ALLREDUCE:
      what = "ncclAllReduce";
      r = nccl.all_reduce(a->send, a->recv, a->count, t, nccl_op(a->op), nc,
                          s->s);
      break;
    case MGPU__COLL_REDUCE:
      what = "ncclReduce";
      r = nccl.reduce(a->send, a->recv, a->count, t, nccl_op(a->op), a->root,
                      nc, s->s);
      break;
    case MGPU__COLL_BROADCAST:
      what = "ncclBroadcast";
      r = nccl.broadcast(a->send, a->recv, a->count, t, a->root, nc, s->s);
      break;
    case MGPU__COLL_ALLGATHER:
      what = "ncclAllGather";
      r = nccl.all_gather(a->send, a->recv, a->count, t, nc, s->s);
      break;
    case MGPU__COLL_REDUCE_SCATTER:
      what = "ncclReduceScatter";
      r = nccl.reduce_scatter(a->send, a->recv, a->count, t, nccl_op(a->op),
                              nc, s->s);
      break;
  }
  if (r != ncclSuccess) return nccl_fail(c->ids[rank], r, what);
  return 0;
}
