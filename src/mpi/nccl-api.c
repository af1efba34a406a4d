/* The MPI module's NCCL entry points, opened with dlopen on the first
 * communicator over whole CUDA GPUs (see nccl-api.h for why nothing links
 * them). libcudart is not opened afresh: the CUDA plugin that owns the
 * devices has loaded it, and cudaSetDevice must act on that copy's state,
 * so it is looked up with RTLD_NOLOAD under the soname of the toolkit the
 * module was built with. */
#include "mpi/nccl-api.h"

#ifdef MGPU_HAVE_NCCL
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static mgpu__mpi_nccl_api api;
static int loaded; /* 1 loaded, -1 failed (not retried), 0 not tried */
static const char *load_why;

#define LOAD(h, field, name)                   \
  do {                                         \
    *(void **)&api.field = dlsym(h, name);     \
    if (api.field == NULL) goto missing;       \
  } while (0)

const mgpu__mpi_nccl_api *mgpu__mpi_nccl_load(const char **why) {
  if (loaded == 0) {
    loaded = -1;
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    void *rt = dlopen(cudart, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    void *nc = NULL;
    if (rt == NULL) {
      load_why = "the CUDA runtime is not loaded (no CUDA plugin)";
      goto fail;
    }
    nc = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (nc == NULL) nc = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (nc == NULL) {
      load_why = "libnccl not found";
      goto fail;
    }
    LOAD(rt, set_device, "cudaSetDevice");
    LOAD(nc, get_unique_id, "ncclGetUniqueId");
    LOAD(nc, comm_init_rank, "ncclCommInitRank");
    LOAD(nc, comm_destroy, "ncclCommDestroy");
    LOAD(nc, group_start, "ncclGroupStart");
    LOAD(nc, group_end, "ncclGroupEnd");
    LOAD(nc, all_reduce, "ncclAllReduce");
    LOAD(nc, reduce, "ncclReduce");
    LOAD(nc, broadcast, "ncclBroadcast");
    LOAD(nc, all_gather, "ncclAllGather");
    LOAD(nc, reduce_scatter, "ncclReduceScatter");
    LOAD(nc, error_string, "ncclGetErrorString");
    loaded = 1;
    return &api;
  missing:
    load_why = "libnccl or libcudart lacks an entry point";
  fail:
    if (nc != NULL) dlclose(nc);
    if (rt != NULL) dlclose(rt);
    memset(&api, 0, sizeof api);
  }
  if (loaded == 1) return &api;
  if (why != NULL) *why = load_why;
  return NULL;
}
#else
/* ISO C wants a translation unit to declare something. */
typedef int mgpu__mpi_nccl_api_unused;
#endif
