/* GPU memory other processes map (backend/ipc.h), for the store.
 *
 * Export: cuMemCreate with a POSIX file descriptor handle type, exported
 * with cuMemExportToShareableHandle; the driver counts references, so the
 * memory lives until the exporter releases it and the last importer unmaps
 * it. The exporter never maps it. Where the GPU or driver lacks POSIX
 * descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
 * legacy IPC: cudaMalloc and cudaIpcGetMemHandle of the allocation's base,
 * sent with an offset; legacy handles have no driver count, which is why
 * the store frees only once no client holds a reference.
 *
 * Import: cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess (read-only for readers), or cudaIpcOpenMemHandle for
 * legacy handles (which opens once per context). Either way the import map
 * (backend/import-map.h) keeps one mapping per key per process,
 * reference-counted, and unmaps (cudaIpcCloseMemHandle) when the last
 * reference goes. The driver entry points are fetched at run time like the
 * rest of the plugin's, so the plugin loads where a driver lacks them.
 */
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "backend/import-map.h"
#include "cuda-internal.h"

typedef struct cumem_api {
  CUresult (*get_granularity)(size_t *g, const CUmemAllocationProp *prop,
                              CUmemAllocationGranularity_flags option);
  CUresult (*create)(CUmemGenericAllocationHandle *h, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long fl);
  CUresult (*release)(CUmemGenericAllocationHandle h);
  CUresult (*export_handle)(void *shareable, CUmemGenericAllocationHandle h,
                            CUmemAllocationHandleType type,
                            unsigned long long flags);
  CUresult (*import_handle)(CUmemGenericAllocationHandle *h, void *shareable,
                            CUmemAllocationHandleType type);
  CUresult (*address_reserve)(CUdeviceptr *p, size_t size, size_t align,
                              CUdeviceptr addr, unsigned long long flags);
  CUresult (*address_free)(CUdeviceptr p, size_t size);
  CUresult (*map)(CUdeviceptr p, size_t size, size_t offset,
                  CUmemGenericAllocationHandle h, unsigned long long flags);
  CUresult (*unmap)(CUdeviceptr p, size_t size);
  CUresult (*set_access)(CUdeviceptr p, size_t size,
                         const CUmemAccessDesc *desc, size_t count);
  CUresult (*device_attribute)(int *value, CUdevice_attribute attr,
                               CUdevice dev);
} cumem_api;

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static int api_state; /* 0 not tried, 1 loaded, -1 missing (api_lock) */
static cumem_api api;

static void *entry(const char *sym) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

/* 1 when every cuMem entry point was found. */
static int api_load(void) {
  pthread_mutex_lock(&api_lock);
  if (api_state == 0) {
    *(void **)&api.get_granularity = entry("cuMemGetAllocationGranularity");
    *(void **)&api.create = entry("cuMemCreate");
    *(void **)&api.release = entry("cuMemRelease");
    *(void **)&api.export_handle = entry("cuMemExportToShareableHandle");
    *(void **)&api.import_handle = entry("cuMemImportFromShareableHandle");
    *(void **)&api.address_reserve = entry("cuMemAddressReserve");
    *(void **)&api.address_free = entry("cuMemAddressFree");
    *(void **)&api.map = entry("cuMemMap");
    *(void **)&api.unmap = entry("cuMemUnmap");
    *(void **)&api.set_access = entry("cuMemSetAccess");
    *(void **)&api.device_attribute = entry("cuDeviceGetAttribute");
    void **fns = (void **)&api;
    api_state = 1;
    for (size_t i = 0; i < sizeof api / sizeof(void *); i++)
      if (fns[i] == NULL) api_state = -1;
  }
  int ok = api_state == 1;
  pthread_mutex_unlock(&api_lock);
  return ok;
}

static int drv_fail(mgpu__bdevice *d, CUresult r, const char *what) {
  const char *name = "?";
  if (mgpu__cuda_drv.get_error_name != NULL)
    mgpu__cuda_drv.get_error_name(r, &name);
  return mgpu__error(r == CUDA_ERROR_OUT_OF_MEMORY ? MGPU_ENOMEM
                                                   : MGPU_EBACKEND,
                     "device %d: %s: %s (%d)", d->id, what, name, (int)r);
}

static CUmemAllocationProp alloc_prop(const mgpu__bdevice *d) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = d->ordinal;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

/* What the exporter keeps of one allocation. */
typedef struct cuda_alloc {
  int kind;
  CUmemGenericAllocationHandle handle; /* CUMEM_FD */
  int fd;                              /* CUMEM_FD: the exported fd */
  void *base;                          /* CUDA_LEGACY: cudaMalloc'ed */
} cuda_alloc;

static int posix_fd_supported(mgpu__bdevice *d) {
  int yes = 0;
  if (mgpu__cuda_env->config->cuda_ipc_legacy == 1) return 0;
  if (!api_load()) return 0;
  /* A CUdevice is the device's ordinal. */
  if (api.device_attribute(
          &yes, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          (CUdevice)d->ordinal) != CUDA_SUCCESS)
    return 0;
  return yes;
}

/* Export through a cuMem allocation and its POSIX descriptor. */
static int alloc_cumem(mgpu__bdevice *d, size_t size, cuda_alloc *a,
                       mgpu__ipc_mem *out) {
  CUmemAllocationProp prop = alloc_prop(d);
  size_t gran = 0;
  CUresult r = api.get_granularity(&gran, &prop,
                                   CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0)
    return drv_fail(d, r, "cuMemGetAllocationGranularity");
  size_t map_size = (size + gran - 1) / gran * gran;
  r = api.create(&a->handle, map_size, &prop, 0);
  if (r != CUDA_SUCCESS) return drv_fail(d, r, "cuMemCreate");
  r = api.export_handle(&a->fd, a->handle,
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) {
    api.release(a->handle);
    return drv_fail(d, r, "cuMemExportToShareableHandle");
  }
  a->kind = MGPU__IPC_CUMEM_FD;
  out->kind = MGPU__IPC_CUMEM_FD;
  out->fd = a->fd;
  out->map_size = map_size;
  return 0;
}

/* Export through cudaMalloc and a legacy handle of the allocation's base. */
static int alloc_legacy(mgpu__bdevice *d, size_t size, cuda_alloc *a,
                        mgpu__ipc_mem *out) {
  cudaError_t err = cudaMalloc(&a->base, size);
  cudaIpcMemHandle_t h;
  if (err == cudaSuccess) err = cudaIpcGetMemHandle(&h, a->base);
  if (err != cudaSuccess) {
    if (a->base != NULL) cudaFree(a->base);
    return mgpu__cuda_fail(d->id, err, "cudaMalloc/cudaIpcGetMemHandle");
  }
  a->kind = MGPU__IPC_CUDA_LEGACY;
  out->kind = MGPU__IPC_CUDA_LEGACY;
  out->map_size = size;
  out->offset = 0; /* the handle names the allocation's base */
  memcpy(out->legacy, &h, sizeof h < sizeof out->legacy ? sizeof h
                                                         : sizeof out->legacy);
  return 0;
}

int mgpu__cuda_ipc_alloc(mgpu__bdevice *d, size_t size, mgpu__ipc_mem *out,
                         void **alloc) {
  cuda_alloc *a = mgpu__calloc(1, sizeof *a);
  if (a == NULL)
    return mgpu__error(MGPU_ENOMEM, "out of host memory");
  a->fd = -1;
  memset(out, 0, sizeof *out);
  out->fd = -1;
  out->size = size;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  int rc = posix_fd_supported(d) ? alloc_cumem(d, size, a, out)
                                 : alloc_legacy(d, size, a, out);
  mgpu__cuda_leave(&sc);
  if (rc != 0) {
    mgpu__free(a);
    return rc;
  }
  *alloc = a;
  return 0;
}

void mgpu__cuda_ipc_free(mgpu__bdevice *d, void *alloc) {
  cuda_alloc *a = alloc;
  if (a == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  if (a->kind == MGPU__IPC_CUMEM_FD) {
    close(a->fd);
    api.release(a->handle); /* importers keep their own references */
  } else {
    cudaFree(a->base);
  }
  mgpu__cuda_leave(&sc);
  mgpu__free(a);
}

int mgpu__cuda_ipc_export_fd(mgpu__bdevice *d, void *alloc, int writable) {
  (void)d;
  (void)writable; /* access is set by the importer (cuMemSetAccess) */
  cuda_alloc *a = alloc;
  if (a->kind != MGPU__IPC_CUMEM_FD) return -1;
  return fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
}

/* ---- imports ---- */

/* An import: the map's entry, and what unmaps it. */
typedef struct cuda_import {
  mgpu__import_entry link; /* first: the map's entries are cuda_imports */
  int kind;
  CUmemGenericAllocationHandle handle; /* CUMEM_FD */
} cuda_import;

static mgpu__import_map imports = MGPU__IMPORT_MAP_INITIALIZER;

/* Lets device d read (and write, if writable) the mapping at base. */
static CUresult set_access(mgpu__bdevice *d, CUdeviceptr base, size_t size,
                           int writable) {
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = d->ordinal;
  acc.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                       : CU_MEM_ACCESS_FLAGS_PROT_READ;
  return api.set_access(base, size, &acc, 1);
}

static int map_cumem(mgpu__bdevice *d, const mgpu__ipc_mem *m, int writable,
                     cuda_import *e) {
  if (!api_load())
    return mgpu__error(MGPU_ENOTSUP, "device %d: the driver "
                       "lacks the cuMem entry points", d->id);
  CUresult r = api.import_handle(&e->handle, (void *)(intptr_t)m->fd,
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return drv_fail(d, r, "cuMemImportFromShareableHandle");
  CUdeviceptr base = 0;
  r = api.address_reserve(&base, m->map_size, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    api.release(e->handle);
    return drv_fail(d, r, "cuMemAddressReserve");
  }
  r = api.map(base, m->map_size, 0, e->handle, 0);
  if (r == CUDA_SUCCESS) {
    r = set_access(d, base, m->map_size, writable);
    if (r != CUDA_SUCCESS) api.unmap(base, m->map_size);
  }
  if (r != CUDA_SUCCESS) {
    api.address_free(base, m->map_size);
    api.release(e->handle);
    return drv_fail(d, r, "cuMemMap/cuMemSetAccess");
  }
  e->link.base = (uintptr_t)base;
  return 0;
}

/* Maps a legacy handle (cudaIpcOpenMemHandle opens it once per context). */
static int map_legacy(mgpu__bdevice *d, const mgpu__ipc_mem *m,
                      cuda_import *e) {
  cudaIpcMemHandle_t h;
  memcpy(&h, m->legacy, sizeof h);
  void *base = NULL;
  cudaError_t err = cudaIpcOpenMemHandle(&base, h,
                                         cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "cudaIpcOpenMemHandle");
  e->link.base = (uintptr_t)base;
  return 0;
}

int mgpu__cuda_ipc_import(mgpu__bdevice *d, const mgpu__ipc_mem *m,
                          int writable, void **ptr) {
  *ptr = NULL;
  uintptr_t mapped = mgpu__import_ref(&imports, m->key);
  if (mapped != 0) {
    *ptr = (void *)(mapped + m->offset);
    return 0;
  }
  cuda_import *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__error(MGPU_ENOMEM, "out of host memory");
  e->kind = m->kind;
  e->link.map_size = m->map_size;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  int rc;
  if (m->kind == MGPU__IPC_CUMEM_FD)
    rc = map_cumem(d, m, writable, e);
  else if (m->kind == MGPU__IPC_CUDA_LEGACY)
    rc = map_legacy(d, m, e);
  else
    rc = mgpu__error(MGPU_EINVAL, "device %d: memory of kind "
                     "%d is not GPU memory", d->id, m->kind);
  mgpu__cuda_leave(&sc);
  if (rc != 0) {
    mgpu__free(e);
    return rc;
  }
  mgpu__import_add(&imports, &e->link, m->key);
  *ptr = (void *)(e->link.base + m->offset);
  return 0;
}

int mgpu__cuda_ipc_protect(mgpu__bdevice *d, void *ptr) {
  mgpu__import_lock(&imports);
  cuda_import *e =
      (cuda_import *)mgpu__import_find_locked(&imports, (uintptr_t)ptr);
  int rc = 0;
  if (e == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "device %d: %p is not "
                     "imported memory", d->id, ptr);
  } else if (e->kind == MGPU__IPC_CUMEM_FD) {
    mgpu__cuda_scope sc;
    mgpu__cuda_enter_ctx(d->primary, &sc);
    CUresult r = set_access(d, (CUdeviceptr)e->link.base, e->link.map_size, 0);
    mgpu__cuda_leave(&sc);
    if (r != CUDA_SUCCESS) rc = drv_fail(d, r, "cuMemSetAccess (read-only)");
  }
  /* Legacy mappings cannot be narrowed; the buffer's read-only flag still
   * refuses every mgpu write. */
  mgpu__import_unlock(&imports);
  return rc;
}

void mgpu__cuda_ipc_unimport(mgpu__bdevice *d, void *ptr) {
  cuda_import *gone =
      (cuda_import *)mgpu__import_unref(&imports, (uintptr_t)ptr);
  if (gone == NULL) return;
  CUdeviceptr base = (CUdeviceptr)gone->link.base;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  if (gone->kind == MGPU__IPC_CUMEM_FD) {
    api.unmap(base, gone->link.map_size);
    api.address_free(base, gone->link.map_size);
    api.release(gone->handle);
  } else {
    cudaIpcCloseMemHandle((void *)gone->link.base);
  }
  mgpu__cuda_leave(&sc);
  mgpu__free(gone);
}
