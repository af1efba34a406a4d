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

/* Each entry's type is taken from the header's own declaration, so that it
 * cannot drift from it; __typeof__ evaluates nothing and references no
 * symbol. */
typedef struct mgpu__mpi_nccl_api {
  __typeof__(ncclGetUniqueId) *get_unique_id;
  __typeof__(ncclCommInitRank) *comm_init_rank;
  __typeof__(ncclCommDestroy) *comm_destroy;
  __typeof__(ncclCommAbort) *comm_abort;
  __typeof__(ncclGroupStart) *group_start;
  __typeof__(ncclGroupEnd) *group_end;
  __typeof__(ncclAllReduce) *all_reduce;
  __typeof__(ncclReduce) *reduce;
  __typeof__(ncclBroadcast) *broadcast;
  __typeof__(ncclAllGather) *all_gather;
  __typeof__(ncclReduceScatter) *reduce_scatter;
  __typeof__(ncclGetErrorString) *error_string;
  /* From the libcudart the CUDA plugin already loaded. */
  __typeof__(cudaSetDevice) *set_device;
} mgpu__mpi_nccl_api;

/* Opens libnccl and finds libcudart on first use; the table stays for the
 * life of the process. Returns the table, or NULL with why (a static
 * string) when either is missing or lacks an entry point: the caller then
 * takes the hierarchical path over MPI. Called by one thread at a time
 * (mgpu/mpi.h). */
const mgpu__mpi_nccl_api *mgpu__mpi_nccl_load(const char **why);
#endif

#endif /* MGPU_MPI_NCCL_API_H */
