/* NCCL and the one CUDA runtime call the MPI module's NCCL path needs, as
 * function pointers opened with dlopen (src/mpi/nccl-api.c), never linked:
 * libmgpu_mpi, the Python extension and the mgpu command then carry no
 * NEEDED entry on libnccl or libcudart, so they load where CUDA is absent and
 * do not put a second NCCL in front of the one PyTorch ships. Only built
 * where the CUDA toolkit's and NCCL's headers were found (MGPU_HAVE_NCCL). */
#ifndef MGPU_MPI_NCCL_API_H
#define MGPU_MPI_NCCL_API_H

#ifdef MGPU_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

typedef struct mgpu__mpi_nccl_api {
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
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
  /* From the libcudart the CUDA plugin already loaded. */
  cudaError_t (*set_device)(int);
} mgpu__mpi_nccl_api;

/* Opens libnccl and finds libcudart on first use; the table stays for the
 * life of the process. Returns the table, or NULL with why (a static
 * string) when either is missing or lacks an entry point: the caller then
 * takes the hierarchical path over MPI. Called by one thread at a time
 * (mgpu/mpi.h). */
const mgpu__mpi_nccl_api *mgpu__mpi_nccl_load(const char **why);
#endif

#endif /* MGPU_MPI_NCCL_API_H */
