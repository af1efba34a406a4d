/* Memory that other processes can map: what the backend table's ipc
 * sub-table exchanges (the store daemon exports, its clients import).
 *
 * An exporter allocates with the sub-table's alloc and gets a description
 * (kind, file descriptor or legacy handle bytes, sizes) to send to another
 * process; the file descriptor travels with SCM_RIGHTS. An importer maps the description
 * with import. Imports are reference-counted per process by key (the
 * exporter's instance and object id): a second import of the same memory
 * maps nothing new, and the memory is unmapped when the last reference goes
 * (unimport). An exporter never maps what it exports.
 */
#ifndef MGPU_BACKEND_IPC_H
#define MGPU_BACKEND_IPC_H

#include <stddef.h>
#include <stdint.h>

typedef enum mgpu__ipc_kind {
  MGPU__IPC_MEMFD = 1,      /* host memory: a sealed memfd, mmap */
  MGPU__IPC_CUMEM_FD = 2,   /* CUDA: cuMemCreate with a POSIX fd handle */
  MGPU__IPC_CUDA_LEGACY = 3 /* CUDA: cudaIpcMemHandle_t of a cudaMalloc */
} mgpu__ipc_kind;

typedef struct mgpu__ipc_mem {
  int kind;              /* mgpu__ipc_kind */
  int fd;                /* MEMFD, CUMEM_FD: the exported descriptor; -1 */
  size_t size;           /* bytes usable */
  size_t map_size;       /* bytes to map (granularity-rounded) */
  size_t offset;         /* of the memory in the mapping (legacy base+offset) */
  uint8_t legacy[64];    /* CUDA_LEGACY: the cudaIpcMemHandle_t */
  uint64_t key[2];       /* import map key: exporter instance, object id */
} mgpu__ipc_mem;

struct mgpu__bdevice;

/* The host backend's entries (src/backend/host/ipc.c); they need no device.
 * Export side: a sealed memfd of size bytes (grow and shrink refused).
 * out->fd belongs to *alloc until mgpu__host_ipc_free. */
int mgpu__host_ipc_alloc(struct mgpu__bdevice *d, size_t size,
                         mgpu__ipc_mem *out, void **alloc);
void mgpu__host_ipc_free(struct mgpu__bdevice *d, void *alloc);
/* A new descriptor of the memory to send (the caller closes it): read-only
 * (a reopen with O_RDONLY) unless writable, or -1 with errno. */
int mgpu__host_ipc_export_fd(struct mgpu__bdevice *d, void *alloc,
                             int writable);
/* Seals the memory against every later write, through any descriptor or
 * mapping made from now on (F_SEAL_FUTURE_WRITE): what a sealed store
 * object is. MGPU_ENOTSUP when the kernel cannot. */
int mgpu__host_ipc_seal(struct mgpu__bdevice *d, void *alloc);
/* Import side: maps m (writable or read-only) or takes another reference
 * on the mapping of the same key. The caller keeps m->fd and closes it. */
int mgpu__host_ipc_import(struct mgpu__bdevice *d, const mgpu__ipc_mem *m,
                          int writable, void **ptr);
/* Makes an imported mapping read-only (after a seal): a writable import is
 * remapped, at the same address, from a read-only reopen of its
 * descriptor, so that mprotect cannot make it writable again. */
int mgpu__host_ipc_protect(struct mgpu__bdevice *d, void *ptr);
void mgpu__host_ipc_unimport(struct mgpu__bdevice *d, void *ptr);

/* The UUID of host device ordinal: the same in every process of this
 * machine ("host-" + 8 hex digits of the machine id + "-" + ordinal), so
 * that processes name host devices alike across MGPU_DEVICES orders. */
void mgpu__host_uuid(int ordinal, char *out, size_t n);

#endif /* MGPU_BACKEND_IPC_H */
