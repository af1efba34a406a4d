/* The store's memory goes through the backend table of its device (the ipc
 * entries of backend/backend.h): a sealed memfd on host devices, exported
 * cuMem allocations (or legacy IPC handles) on CUDA devices. The store never
 * asks which backend it talks to. Host memory is mapped by the host
 * backend's own entries whatever device it is opened as, also in a process
 * that has not initialized mgpu or has shut it down.
 *
 * A device whose backend cannot share its own memory with other processes
 * (no ipc entries: OpenCL) holds its objects in host memory, a sealed memfd
 * as on host devices: the object is counted against that device. Where the
 * device's kernels cannot use host memory as device memory, a client wraps
 * it as pinned memory of the device (mgpu__store_mem_is_buffer says 0):
 * copies, the pointer and the host mirror reach it, kernels do not. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/core-internal.h"
#include "store/store-internal.h"
#include "util/fault.h"

/* FNV-1a of text. */
static uint32_t name_hash(const char *text) {
  uint32_t h = 2166136261u;
  for (const char *c = text; *c != '\0'; c++)
    h = (h ^ (uint8_t)*c) * 16777619u;
  return h;
}

int mgpu__store_device_uuid(int dev, char *out, size_t n) {
  mgpu_device_props p = {.size = sizeof p};
  int rc = mgpu_device_get_props(dev, &p);
  if (rc != 0) return rc;
  if (p.uuid[0] != '\0') {
    snprintf(out, n, "%s", p.uuid);
    return 0;
  }
  /* A device without a UUID (OpenCL devices have none in general) is named
   * by its backend, a hash of its name and its ordinal: the same in every
   * process of the machine that sees the same devices. Its objects are
   * host memory (above), which any process can map whatever it calls the
   * device, so a name that fails to match costs only the buffer. */
  char backend[sizeof p.backend];
  size_t i = 0;
  for (; p.backend[i] != '\0' && i + 1 < sizeof backend; i++)
    backend[i] = isalnum((unsigned char)p.backend[i]) ? p.backend[i] : '-';
  backend[i] = '\0';
  snprintf(out, n, "%.12s-%08x-%d", backend[0] ? backend : "dev",
           name_hash(p.name), p.ordinal);
  return 0;
}

int mgpu__store_device_of_uuid(const char *uuid) {
  char u[64];
  for (int d = 0; d < mgpu__ndevices(); d++)
    if (mgpu__store_device_uuid(d, u, sizeof u) == 0 && strcmp(u, uuid) == 0)
      return d;
  return -1;
}

/* The device's table when it can share memory, else NULL with a detail. */
static const mgpu__backend_ops *ipc_ops(int dev, mgpu__device **out) {
  mgpu__device *d;
  if (mgpu__device_check(dev, &d) != 0) return NULL;
  if (d->ops->ipc == NULL) {
    mgpu__error(MGPU_ENOTSUP, "device %d: its %s backend cannot share "
                "memory with other processes", dev, d->ops->name);
    return NULL;
  }
  *out = d;
  return d->ops;
}

/* Whether dev's backend shares its own memory (0: its objects are host
 * memory); a negative code for a bad device. */
static int shares_own_memory(int dev) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  return d->ops->ipc != NULL;
}

int mgpu__store_mem_alloc(int dev, size_t size, mgpu__ipc_mem *out,
                          void **alloc) {
  int own = shares_own_memory(dev);
  if (own < 0) return own;
  if (own == 0) return mgpu__host_ipc_alloc(NULL, size, out, alloc);
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops == NULL) return MGPU_ENOTSUP;
  return ops->ipc->alloc(d->bdev, size, out, alloc);
}

void mgpu__store_mem_free(int dev, void *alloc) {
  if (shares_own_memory(dev) == 0) {
    mgpu__host_ipc_free(NULL, alloc);
    return;
  }
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops != NULL) ops->ipc->free(d->bdev, alloc);
}

int mgpu__store_mem_export_fd(int dev, void *alloc, const mgpu__ipc_mem *m,
                              int writable) {
  if (m->fd < 0) return -1;
  if (shares_own_memory(dev) == 0)
    return mgpu__host_ipc_export_fd(NULL, alloc, writable);
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops == NULL) return -1;
  return ops->ipc->export_fd(d->bdev, alloc, writable);
}

int mgpu__store_mem_is_buffer(int dev, const mgpu__ipc_mem *m) {
  mgpu__device *d;
  if (mgpu__device_check(dev, &d) != 0) return 0;
  if (m->kind != MGPU__IPC_MEMFD) return 1; /* the device's own memory */
  return (d->ops->caps.host_visible & (1u << MGPU_MEM_DEVICE)) != 0;
}

int mgpu__store_mem_seal(int dev, void *alloc, const mgpu__ipc_mem *m) {
  (void)dev;
  /* Device memory has no seal of its own: its readers map it read-only
   * (cuMemSetAccess), which is all the driver offers (docs/store.md). */
  if (m->kind != MGPU__IPC_MEMFD) return 0;
  return mgpu__host_ipc_seal(NULL, alloc);
}

int mgpu__store_mem_import(int dev, const mgpu__ipc_mem *m, int writable,
                           void **ptr) {
  if (m->kind == MGPU__IPC_MEMFD) {
    /* A fault site (backend:ipc_import): the mapping of a store object's
     * host memory, which no fallible backend entry stands in front of. */
    if (mgpu__fault_hit(MGPU__FAULT_BACKEND, "ipc_import"))
      return mgpu__error(MGPU_EBACKEND, "object %llu: mapping its %zu "
                         "bytes of shared memory failed (injected fault "
                         "ipc_import)", (unsigned long long)m->key[1],
                         m->map_size);
    return mgpu__host_ipc_import(NULL, m, writable, ptr);
  }
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops == NULL) return MGPU_ENOTSUP;
  return ops->ipc->import(d->bdev, m, writable, ptr);
}

int mgpu__store_mem_protect(int dev, const mgpu__ipc_mem *m, void *ptr) {
  if (m->kind == MGPU__IPC_MEMFD)
    return mgpu__host_ipc_protect(NULL, ptr);
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops == NULL) return MGPU_ENOTSUP;
  return ops->ipc->protect(d->bdev, ptr);
}

void mgpu__store_mem_unimport(int dev, const mgpu__ipc_mem *m, void *ptr) {
  if (m->kind == MGPU__IPC_MEMFD) {
    mgpu__host_ipc_unimport(NULL, ptr);
    return;
  }
  mgpu__device *d;
  const mgpu__backend_ops *ops = ipc_ops(dev, &d);
  if (ops != NULL) ops->ipc->unimport(d->bdev, ptr);
}
