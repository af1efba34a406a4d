/* Shared pieces of the store's daemon (server.c) and client (client.c). */
#ifndef MGPU_STORE_INTERNAL_H
#define MGPU_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ipc.h"
#include "store/proto.h"

/* The UUID of this process's mgpu device dev (mgpu initialized); a
 * device without one is named by its backend, name and ordinal (mem.c). */
int mgpu__store_device_uuid(int dev, char *out, size_t n);
/* This process's device of that UUID, or -1. */
int mgpu__store_device_of_uuid(const char *uuid);

/* Memory through the backend of device dev (mem.c). alloc: exportable
 * memory of size bytes, never mapped here. export_fd: a new descriptor to
 * send (read-only for readers where the kind allows), or -1 for kinds
 * without one. import: maps m in this process (dev is -1 for host memory
 * when mgpu is not initialized). */
int mgpu__store_mem_alloc(int dev, size_t size, mgpu__ipc_mem *out,
                          void **alloc);
void mgpu__store_mem_free(int dev, void *alloc);
int mgpu__store_mem_export_fd(int dev, void *alloc, const mgpu__ipc_mem *m,
                              int writable);
/* Whether memory m, imported on dev, is device memory of dev: the device's
 * own memory, or host memory where dev's kernels use host memory as device
 * memory (host devices); 0 (pinned memory of dev) otherwise, and for a bad
 * device. */
int mgpu__store_mem_is_buffer(int dev, const mgpu__ipc_mem *m);
/* Seals the memory against writes through any descriptor (host memfds;
 * a no-op for device memory). */
int mgpu__store_mem_seal(int dev, void *alloc, const mgpu__ipc_mem *m);
int mgpu__store_mem_import(int dev, const mgpu__ipc_mem *m, int writable,
                           void **ptr);
int mgpu__store_mem_protect(int dev, const mgpu__ipc_mem *m, void *ptr);
void mgpu__store_mem_unimport(int dev, const mgpu__ipc_mem *m, void *ptr);

#endif /* MGPU_STORE_INTERNAL_H */
