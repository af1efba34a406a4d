/* The host backend's memory: "device memory" is host memory from the
 * allocation seam; every host device may read every other's (peer access),
 * unless the configuration forbids it. */
#include <sys/mman.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/obs.h"
#include "util/fault.h"
#include "util/log.h"

/* Large blocks are aligned to 2 MiB and offered to transparent huge pages:
 * first touch of 4 KiB pages is the slowest part of a fresh buffer here. */
int mgpu__host_mem_alloc(mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,
                         void **ptr) {
  (void)kind;
  const size_t huge = (size_t)2 << 20;
  size_t align = size >= huge ? huge : 64;
  /* NULL also when the round-up to align wraps past zero (pinned memory
   * has no budget in front of it). */
  void *p = mgpu__aligned_alloc(align, size);
  if (p == NULL)
    return mgpu__error(MGPU_ENOMEM, "host device %d: the system refused "
                       "%zu bytes", d->id, size);
#ifdef MADV_HUGEPAGE
  if (align == huge) madvise(p, (size + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
  *ptr = p;
  return 0;
}

void mgpu__host_mem_free(mgpu__bdevice *d, mgpu_mem_kind kind, void *ptr) {
  (void)d;
  (void)kind;
  mgpu__free(ptr);
}

/* Host memory needs no device: mgpu__free() is all. */
void mgpu__host_mem_free_detached(mgpu_mem_kind kind, void *ptr) {
  (void)kind;
  mgpu__free(ptr);
}

int mgpu__host_mem_info(mgpu__bdevice *d, size_t *free_bytes,
                        size_t *total_bytes) {
  (void)d;
  *free_bytes = 0; /* the core applies the budget */
  *total_bytes = 0;
  return 0;
}

/* ---- peers: every host device can read every other's memory; the
 * configuration (MGPU_HOST_PEER=none) can forbid it to exercise the staged
 * path. ---- */

int mgpu__host_peer_can_access(mgpu__bdevice *d, mgpu__bdevice *peer,
                               int *yes) {
  *yes = mgpu__host_env->config->host_peer && d != peer;
  return 0;
}

int mgpu__host_peer_enable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  if (!mgpu__host_env->config->host_peer)
    return mgpu__error(MGPU_ENOTSUP, "device %d -> device %d: peer access "
                       "is turned off (MGPU_HOST_PEER=none)", d->id,
                       peer->id);
  mgpu__mutex_lock(&d->lock);
  d->peer_enabled[peer->id] = 1;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

int mgpu__host_peer_disable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  mgpu__mutex_lock(&d->lock);
  d->peer_enabled[peer->id] = 0;
  mgpu__mutex_unlock(&d->lock);
  return 0;
}

int mgpu__host_memcpy_peer_async(mgpu__bdevice *dd, void *dst,
                                 mgpu__bdevice *sd, const void *src,
                                 size_t size, mgpu__bdevice *s_dev,
                                 mgpu__bstream *s) {
  (void)dd;
  (void)sd;
  int saved = mgpu__obs_path();
  mgpu__obs_path_set(MGPU_METRIC_PATH_PEER_DIRECT);
  int rc = mgpu__host_memcpy_async(s_dev, s, dst, src, size, MGPU__COPY_D2D);
  mgpu__obs_path_set(saved);
  return rc;
}
