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
 * keeps one mapping per key per process, reference-counted, and unmaps
 * (cudaIpcCloseMemHandle) when the last reference goes; import_lock guards
 * it. The driver entry points are fetched at run time like the rest of the
 * plugin's, so the plugin loads where a driver lacks them.
 */
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

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
  if (!api_load()) return 0;
  /* A CUdevice is the device's ordinal. */
  if (api.device_attribute(
          &yes, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          (CUdevice)d->ordinal) != CUDA_SUCCESS)
    return 0;
  return yes;
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
  int rc = 0;
  if (posix_fd_supported(d)) {
    CUmemAllocationProp prop = alloc_prop(d);
    size_t gran = 0;
    CUresult r = api.get_granularity(&gran, &prop,
                                     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || gran == 0) {
      rc = drv_fail(d, r, "cuMemGetAllocationGranularity");
      goto out;
    }
    size_t map_size = (size + gran - 1) / gran * gran;
    r = api.create(&a->handle, map_size, &prop, 0);
    if (r != CUDA_SUCCESS) {
      rc = drv_fail(d, r, "cuMemCreate");
      goto out;
    }
    r = api.export_handle(&a->fd, a->handle,
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      api.release(a->handle);
      rc = drv_fail(d, r, "cuMemExportToShareableHandle");
      goto out;
    }
    a->kind = MGPU__IPC_CUMEM_FD;
    out->kind = MGPU__IPC_CUMEM_FD;
    out->fd = a->fd;
    out->map_size = map_size;
  } else {
    cudaError_t err = cudaMalloc(&a->base, size);
    cudaIpcMemHandle_t h;
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&h, a->base);
    if (err != cudaSuccess) {
      if (a->base != NULL) cudaFree(a->base);
      rc = mgpu__cuda_fail(d->id, err, "cudaMalloc/cudaIpcGetMemHandle");
      goto out;
    }
    a->kind = MGPU__IPC_CUDA_LEGACY;
    out->kind = MGPU__IPC_CUDA_LEGACY;
    out->map_size = size;
    out->offset = 0; /* the handle names the allocation's base */
    memcpy(out->legacy, &h, sizeof h < sizeof out->legacy ? sizeof h
                                                           : sizeof out->legacy);
  }
out:
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

/* ---- the import map ---- */

typedef struct import_entry {
  uint64_t key[2];
  int kind;
  CUdeviceptr base;
  size_t map_size;
  CUmemGenericAllocationHandle handle;
  int refs;
  struct import_entry *next;
} import_entry;

static pthread_mutex_t import_lock = PTHREAD_MUTEX_INITIALIZER;
static import_entry *imports; /* import_lock */

static int map_cumem(mgpu__bdevice *d, const mgpu__ipc_mem *m, int writable,
                     import_entry *e) {
  if (!api_load())
    return mgpu__error(MGPU_ENOTSUP, "device %d: the driver "
                       "lacks the cuMem entry points", d->id);
  CUresult r = api.import_handle(&e->handle, (void *)(intptr_t)m->fd,
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return drv_fail(d, r, "cuMemImportFromShareableHandle");
  r = api.address_reserve(&e->base, m->map_size, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    api.release(e->handle);
    return drv_fail(d, r, "cuMemAddressReserve");
  }
  r = api.map(e->base, m->map_size, 0, e->handle, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = d->ordinal;
    acc.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                         : CU_MEM_ACCESS_FLAGS_PROT_READ;
    r = api.set_access(e->base, m->map_size, &acc, 1);
    if (r != CUDA_SUCCESS) api.unmap(e->base, m->map_size);
  }
  if (r != CUDA_SUCCESS) {
    api.address_free(e->base, m->map_size);
    api.release(e->handle);
    return drv_fail(d, r, "cuMemMap/cuMemSetAccess");
  }
  return 0;
}

int mgpu__cuda_ipc_import(mgpu__bdevice *d, const mgpu__ipc_mem *m,
                          int writable, void **ptr) {
  *ptr = NULL;
  pthread_mutex_lock(&import_lock);
  for (import_entry *e = imports; e != NULL; e = e->next)
    if (e->key[0] == m->key[0] && e->key[1] == m->key[1]) {
      e->refs++;
      *ptr = (void *)(uintptr_t)(e->base + m->offset);
      pthread_mutex_unlock(&import_lock);
      return 0;
    }
  pthread_mutex_unlock(&import_lock);
  import_entry *e = mgpu__calloc(1, sizeof *e);
  if (e == NULL)
    return mgpu__error(MGPU_ENOMEM, "out of host memory");
  e->key[0] = m->key[0];
  e->key[1] = m->key[1];
  e->kind = m->kind;
  e->map_size = m->map_size;
  e->refs = 1;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  int rc = 0;
  if (m->kind == MGPU__IPC_CUMEM_FD) {
    rc = map_cumem(d, m, writable, e);
  } else if (m->kind == MGPU__IPC_CUDA_LEGACY) {
    cudaIpcMemHandle_t h;
    memcpy(&h, m->legacy, sizeof h);
    void *base = NULL;
    cudaError_t err = cudaIpcOpenMemHandle(&base, h,
                                           cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess)
      rc = mgpu__cuda_fail(d->id, err, "cudaIpcOpenMemHandle");
    e->base = (CUdeviceptr)(uintptr_t)base;
  } else {
    rc = mgpu__error(MGPU_EINVAL, "device %d: memory of kind "
                     "%d is not GPU memory", d->id, m->kind);
  }
  mgpu__cuda_leave(&sc);
  if (rc != 0) {
    mgpu__free(e);
    return rc;
  }
  pthread_mutex_lock(&import_lock);
  e->next = imports;
  imports = e;
  pthread_mutex_unlock(&import_lock);
  *ptr = (void *)(uintptr_t)(e->base + m->offset);
  return 0;
}

static import_entry **find(void *ptr) {
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
  for (import_entry **e = &imports; *e != NULL; e = &(*e)->next)
    if (p >= (*e)->base && p < (*e)->base + (*e)->map_size) return e;
  return NULL;
}

int mgpu__cuda_ipc_protect(mgpu__bdevice *d, void *ptr) {
  pthread_mutex_lock(&import_lock);
  import_entry **e = find(ptr);
  int rc = 0;
  if (e == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "device %d: %p is not "
                     "imported memory", d->id, ptr);
  } else if ((*e)->kind == MGPU__IPC_CUMEM_FD) {
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = d->ordinal;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    mgpu__cuda_scope sc;
    mgpu__cuda_enter_ctx(d->primary, &sc);
    CUresult r = api.set_access((*e)->base, (*e)->map_size, &acc, 1);
    mgpu__cuda_leave(&sc);
    if (r != CUDA_SUCCESS) rc = drv_fail(d, r, "cuMemSetAccess (read-only)");
  }
  /* Legacy mappings cannot be narrowed; the buffer's read-only flag still
   * refuses every mgpu write. */
  pthread_mutex_unlock(&import_lock);
  return rc;
}

void mgpu__cuda_ipc_unimport(mgpu__bdevice *d, void *ptr) {
  pthread_mutex_lock(&import_lock);
  import_entry **p = find(ptr);
  import_entry *gone = NULL;
  if (p != NULL && --(*p)->refs == 0) {
    gone = *p;
    *p = gone->next;
  }
  pthread_mutex_unlock(&import_lock);
  if (gone == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  if (gone->kind == MGPU__IPC_CUMEM_FD) {
    api.unmap(gone->base, gone->map_size);
    api.address_free(gone->base, gone->map_size);
    api.release(gone->handle);
  } else {
    cudaIpcCloseMemHandle((void *)(uintptr_t)gone->base);
  }
  mgpu__cuda_leave(&sc);
  mgpu__free(gone);
}
