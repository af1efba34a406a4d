/* The MPI module's NCCL entry points, opened with dlopen on the first
 * communicator over whole CUDA GPUs (see nccl-api.h for why nothing links
 * them). libcudart is not opened afresh: the CUDA plugin that owns the
 * devices has loaded it, and cudaSetDevice must act on that copy's state,
 * so it is looked up with RTLD_NOLOAD under the soname of the toolkit the
 * module was built with. */
#include "mpi/nccl-api.h"

#ifdef MGPU_HAVE_NCCL
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static mgpu__mpi_nccl_api api;
static int loaded; /* 1 loaded, -1 failed (not retried), 0 not tried */
static const char *load_why;

/* NCCL's entry points and where each goes in the table. */
static const struct nccl_sym {
  const char *name;
  size_t offset;
} nccl_syms[] = {
    {"ncclGetUniqueId", offsetof(mgpu__mpi_nccl_api, get_unique_id)},
    {"ncclCommInitRank", offsetof(mgpu__mpi_nccl_api, comm_init_rank)},
    {"ncclCommDestroy", offsetof(mgpu__mpi_nccl_api, comm_destroy)},
    {"ncclCommAbort", offsetof(mgpu__mpi_nccl_api, comm_abort)},
    {"ncclGroupStart", offsetof(mgpu__mpi_nccl_api, group_start)},
    {"ncclGroupEnd", offsetof(mgpu__mpi_nccl_api, group_end)},
    {"ncclAllReduce", offsetof(mgpu__mpi_nccl_api, all_reduce)},
    {"ncclReduce", offsetof(mgpu__mpi_nccl_api, reduce)},
    {"ncclBroadcast", offsetof(mgpu__mpi_nccl_api, broadcast)},
    {"ncclAllGather", offsetof(mgpu__mpi_nccl_api, all_gather)},
    {"ncclReduceScatter", offsetof(mgpu__mpi_nccl_api, reduce_scatter)},
    {"ncclGetErrorString", offsetof(mgpu__mpi_nccl_api, error_string)},
};

const mgpu__mpi_nccl_api *mgpu__mpi_nccl_load(const char **why) {
  if (loaded == 0) {
    loaded = -1;
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    void *rt = dlopen(cudart, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    void *nc = NULL, *fn;
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
    /* POSIX lets a dlsym result be stored as a function pointer. */
    fn = dlsym(rt, "cudaSetDevice");
    if (fn == NULL) goto missing;
    memcpy(&api.set_device, &fn, sizeof fn);
    for (size_t i = 0; i < sizeof nccl_syms / sizeof nccl_syms[0]; i++) {
      if ((fn = dlsym(nc, nccl_syms[i].name)) == NULL) goto missing;
      memcpy((char *)&api + nccl_syms[i].offset, &fn, sizeof fn);
    }
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
