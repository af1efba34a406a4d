/* Host memory other processes can map (backend/ipc.h): a memfd made with
 * MFD_ALLOW_SEALING and sealed against shrinking and growing, so that no
 * process holding it can cut it under a reader (which would then fault with
 * SIGBUS). Importers get a read-only descriptor (a reopen of the memfd with
 * O_RDONLY through /proc/self/fd) unless they created the object.
 *
 * A read-only descriptor alone does not make the memory immutable: anyone
 * holding it can reopen /proc/self/fd/N with O_RDWR (a memfd's inode lets
 * every user write). So the object's seal seals the memory itself
 * (mgpu__host_ipc_seal): F_SEAL_FUTURE_WRITE refuses every write(), every
 * new writable shared mapping and every hole punched, whoever asks, and
 * F_SEAL_SEAL keeps the seals from being changed. The creator's writable
 * mapping, which the seal lets live, is then replaced by a mapping of a
 * read-only reopen (mgpu__host_ipc_protect), which mprotect cannot make
 * writable again.
 *
 * Imports: one mapping per (exporter instance, object id) per process,
 * reference-counted in the backend's import map (backend/import-map.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/thread.h"

/* The import map's lock is a ranked library mutex (HOST_IPC). */
#define MGPU__IMPORT_MAP_MUTEX mgpu__mutex
#define MGPU__IMPORT_MAP_MUTEX_INITIALIZER                                    \
  MGPU__MUTEX_INITIALIZER(MGPU__LOCK_HOST_IPC)
#define MGPU__IMPORT_MAP_LOCK(m) mgpu__mutex_lock(m)
#define MGPU__IMPORT_MAP_UNLOCK(m) mgpu__mutex_unlock(m)
#include "backend/import-map.h"
#include "backend/ipc.h"
#include "util/fault.h"
#include "util/log.h"

/* Linux 5.1; older C libraries lack the name. */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

typedef struct host_alloc {
  int fd;
  size_t size;
} host_alloc;

static size_t page_round(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (n + page - 1) / page * page;
}

int mgpu__host_ipc_alloc(struct mgpu__bdevice *d, size_t size,
                         mgpu__ipc_mem *out, void **alloc) {
  (void)d;
  size_t map_size = page_round(size);
  if (size == 0 || map_size < size)
    return mgpu__error(MGPU_EINVAL, "host memory of %zu bytes cannot be "
                       "shared", size);
  host_alloc *a = mgpu__calloc(1, sizeof *a);
  if (a == NULL) return mgpu__error(MGPU_ENOMEM, "out of host memory");
  a->fd = memfd_create("mgpu-store", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (a->fd < 0) {
    int e = errno;
    mgpu__free(a);
    return mgpu__error(MGPU_ENOMEM, "memfd_create of %zu bytes: %s", size,
                       strerror(e));
  }
  if (ftruncate(a->fd, (off_t)map_size) != 0 ||
      fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    int e = errno;
    close(a->fd);
    mgpu__free(a);
    return mgpu__error(MGPU_ENOMEM, "memfd of %zu bytes: size or seals "
                       "refused: %s", size, strerror(e));
  }
  a->size = map_size;
  memset(out, 0, sizeof *out);
  out->kind = MGPU__IPC_MEMFD;
  out->fd = a->fd;
  out->size = size;
  out->map_size = map_size;
  out->offset = 0;
  *alloc = a;
  return 0;
}

void mgpu__host_ipc_free(struct mgpu__bdevice *d, void *alloc) {
  (void)d;
  host_alloc *a = alloc;
  if (a == NULL) return;
  close(a->fd);
  mgpu__free(a);
}

int mgpu__host_ipc_export_fd(struct mgpu__bdevice *d, void *alloc,
                             int writable) {
  (void)d;
  host_alloc *a = alloc;
  if (writable) return fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", a->fd);
  return open(path, O_RDONLY | O_CLOEXEC);
}

int mgpu__host_ipc_seal(struct mgpu__bdevice *d, void *alloc) {
  (void)d;
  host_alloc *a = alloc;
  if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
    return mgpu__error(MGPU_ENOTSUP, "shared host memory of %zu bytes cannot "
                       "be sealed against writes (F_SEAL_FUTURE_WRITE needs "
                       "Linux 5.1): %s", a->size, strerror(errno));
  return 0;
}

/* ---- imports ---- */

/* An import: the map's entry, and a writable import's descriptor, kept to
 * remap it read-only. */
typedef struct host_import {
  mgpu__import_entry link; /* first: the map's entries are host_imports */
  int fd;
} host_import;

static mgpu__import_map imports = MGPU__IMPORT_MAP_INITIALIZER;

int mgpu__host_ipc_import(struct mgpu__bdevice *d, const mgpu__ipc_mem *m,
                          int writable, void **ptr) {
  (void)d;
  *ptr = NULL;
  if (m->kind != MGPU__IPC_MEMFD || m->fd < 0 || m->map_size < m->size ||
      m->offset > m->map_size - m->size)
    return mgpu__error(MGPU_EINVAL, "object %llu: not a host memory "
                       "description (kind %d, fd %d)",
                       (unsigned long long)m->key[1], m->kind, m->fd);
  uintptr_t mapped = mgpu__import_ref(&imports, m->key);
  if (mapped != 0) {
    *ptr = (char *)mapped + m->offset;
    return 0;
  }
  /* The size the sender claims must be the file's: a smaller file would
   * make reads past its end fault. */
  off_t end = lseek(m->fd, 0, SEEK_END);
  if (end < 0 || (size_t)end < m->map_size)
    return mgpu__error(MGPU_EINVAL, "object %llu: shared memory of %lld "
                       "bytes is smaller than the %zu bytes described",
                       (unsigned long long)m->key[1], (long long)end,
                       m->map_size);
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void *base = mmap(NULL, m->map_size, prot, MAP_SHARED, m->fd, 0);
  if (base == MAP_FAILED)
    return mgpu__error(MGPU_ENOMEM, "object %llu: mmap of %zu bytes: %s",
                       (unsigned long long)m->key[1], m->map_size,
                       strerror(errno));
  host_import *e = mgpu__calloc(1, sizeof *e);
  int fd = writable ? fcntl(m->fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (e == NULL || (writable && fd < 0)) {
    int e_no = errno;
    munmap(base, m->map_size);
    if (fd >= 0) close(fd);
    mgpu__free(e);
    return mgpu__error(MGPU_ENOMEM, "object %llu: out of host memory or "
                       "descriptors: %s", (unsigned long long)m->key[1],
                       strerror(e_no));
  }
  e->fd = fd;
  e->link.base = (uintptr_t)base;
  e->link.map_size = m->map_size;
  mgpu__import_add(&imports, &e->link, m->key);
  *ptr = (char *)base + m->offset;
  return 0;
}

/* Replaces e's mapping, in place, by one of a read-only reopen of its
 * descriptor: a mapping mprotect cannot make writable again. The map's
 * lock held. */
static int remap_readonly(host_import *e) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", e->fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0) return -1;
  void *base = (void *)e->link.base;
  void *p = mmap(base, e->link.map_size, PROT_READ, MAP_SHARED | MAP_FIXED,
                 ro, 0);
  int err = errno;
  close(ro);
  errno = err;
  return p == base ? 0 : -1;
}

int mgpu__host_ipc_protect(struct mgpu__bdevice *d, void *ptr) {
  (void)d;
  mgpu__import_lock(&imports);
  host_import *e =
      (host_import *)mgpu__import_find_locked(&imports, (uintptr_t)ptr);
  int rc = 0;
  if (e == NULL) {
    rc = mgpu__error(MGPU_EINVAL, "%p is not imported shared memory", ptr);
  } else if (e->fd < 0 || remap_readonly(e) != 0) {
    /* Without a read-only reopen, at least no write goes through. */
    if (mprotect((void *)e->link.base, e->link.map_size, PROT_READ) != 0)
      rc = mgpu__error(MGPU_EINVAL, "mprotect of shared memory: %s",
                       strerror(errno));
  }
  if (e != NULL && e->fd >= 0) {
    close(e->fd);
    e->fd = -1;
  }
  mgpu__import_unlock(&imports);
  return rc;
}

void mgpu__host_ipc_unimport(struct mgpu__bdevice *d, void *ptr) {
  (void)d;
  host_import *gone =
      (host_import *)mgpu__import_unref(&imports, (uintptr_t)ptr);
  if (gone == NULL) return;
  munmap((void *)gone->link.base, gone->link.map_size);
  if (gone->fd >= 0) close(gone->fd);
  mgpu__free(gone);
}

/* FNV-1a of the machine id (else the host name): stable per machine, so
 * read once per process. Every device property query names the device by
 * it, and the store looks a device up by name at each object it maps:
 * reading the file each time cost three open/read/close a request. */
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;
static uint32_t machine_hash;

static void machine_hash_read(void) {
  char id[128] = "";
  FILE *f = fopen("/etc/machine-id", "r");
  if (f != NULL) {
    if (fgets(id, sizeof id, f) == NULL) id[0] = '\0';
    fclose(f);
  }
  if (id[0] == '\0') gethostname(id, sizeof id - 1);
  uint32_t h = 2166136261u;
  for (const char *c = id; *c != '\0' && *c != '\n'; c++)
    h = (h ^ (uint8_t)*c) * 16777619u;
  machine_hash = h;
}

void mgpu__host_uuid(int ordinal, char *out, size_t n) {
  pthread_once(&machine_once, machine_hash_read);
  snprintf(out, n, "host-%08x-%d", machine_hash, ordinal);
}
