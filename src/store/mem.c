/* The store's memory goes through the backend of its device: a memfd on host
 * devices, exported cuMem allocations (or legacy IPC) on CUDA devices. This
 * file picks the backend's entries; the store never asks more than that. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "store/store-internal.h"

int mgpu__store_device_uuid(int dev, char *out, size_t n) {
  mgpu_device_props p = {.size = sizeof p};
  int rc = mgpu_device_get_props(dev, &p);
  if (rc != 0) return rc;
  if (p.uuid[0] == '\0' && p.backend_kind == MGPU_BACKEND_HOST)
    mgpu__host_uuid(p.ordinal, p.uuid, sizeof p.uuid);
  snprintf(out, n, "%s", p.uuid);
  return 0;
}

int mgpu__store_device_of_uuid(const char *uuid) {
  char u[64];
  for (int d = 0; d < mgpu__ndevices(); d++)
    if (mgpu__store_device_uuid(d, u, sizeof u) == 0 && strcmp(u, uuid) == 0)
      return d;
  return -1;
}

static int backend_kind(int dev) {
  mgpu__device *d = mgpu__device_get(dev);
  return d == NULL ? -1 : (int)d->ops->kind;
}

int mgpu__store_mem_alloc(int dev, size_t size, mgpu__ipc_mem *out,
                          void **alloc) {
  mgpu__device *d;
  int rc = mgpu__device_check(dev, &d);
  if (rc != 0) return rc;
  if (d->ops->kind == MGPU_BACKEND_HOST)
    return mgpu__host_ipc_alloc(d->b, size, out, alloc);
  return mgpu__error(MGPU_ENOTSUP, "device %d: its backend cannot export "
                     "memory to other processes", dev);
}

void mgpu__store_mem_free(int dev, void *alloc) {
  mgpu__device *d = mgpu__device_get(dev);
  if (d != NULL && d->ops->kind == MGPU_BACKEND_HOST)
    mgpu__host_ipc_free(d->b, alloc);
}

int mgpu__store_mem_export_fd(int dev, void *alloc, const mgpu__ipc_mem *m,
                              int writable) {
  if (m->fd < 0) return -1;
  if (m->kind == MGPU__IPC_MEMFD && !writable && backend_kind(dev) == 0)
    return mgpu__host_ipc_readonly_fd(mgpu__device_get(dev)->b, alloc);
  return fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
}

int mgpu__store_mem_import(int dev, const mgpu__ipc_mem *m, int writable,
                           void **ptr) {
  if (m->kind == MGPU__IPC_MEMFD) return mgpu__host_ipc_import(NULL, m, writable, ptr);
  (void)dev;
  return mgpu__error(MGPU_ENOTSUP, "object %llu: CUDA memory cannot be "
                     "imported by this build", (unsigned long long)m->key[1]);
}

int mgpu__store_mem_protect(int dev, const mgpu__ipc_mem *m, void *ptr) {
  (void)dev;
  if (m->kind == MGPU__IPC_MEMFD) return mgpu__host_ipc_protect(NULL, ptr);
  return MGPU_ENOTSUP;
}

void mgpu__store_mem_unimport(int dev, const mgpu__ipc_mem *m, void *ptr) {
  (void)dev;
  if (m->kind == MGPU__IPC_MEMFD) mgpu__host_ipc_unimport(NULL, ptr);
}
