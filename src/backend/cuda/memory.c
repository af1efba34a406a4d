/* Memory of CUDA devices: device, pinned and unified allocations, the
 * stream-ordered mempool (cudaMallocFromPoolAsync on a CUDA pool of each mgpu
 * device), and peer access between GPUs.
 *
 * Allocations are made in the GPU's primary context, which the green
 * contexts of a split GPU share, so a buffer of one logical device can be
 * copied to or read by another logical device of the same GPU directly.
 * Logical devices of one GPU are always "peers": their copies are plain
 * device-to-device copies. The core applies the memory budget of a split.
 */
#include <stdio.h>
#include <string.h>

#include "cuda-internal.h"

int mgpu__cuda_mem_info(mgpu__bdevice *d, size_t *free_bytes,
                        size_t *total_bytes) {
  /* A lost device's context answers nothing: its memory as read at open,
   * none of it free (so that its properties can still be read). */
  if (__atomic_load_n(&d->lost, __ATOMIC_ACQUIRE)) {
    *free_bytes = 0;
    *total_bytes = d->prop.totalGlobalMem;
    return 0;
  }
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = cudaMemGetInfo(free_bytes, total_bytes);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err, "cudaMemGetInfo");
  return 0;
}

int mgpu__cuda_mem_alloc(mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,
                         void **ptr) {
  *ptr = NULL;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = cudaSuccess;
  const char *what = "cudaMalloc";
  int rc = 0;
  switch (kind) {
    case MGPU_MEM_DEVICE:
      err = cudaMalloc(ptr, size);
      break;
    case MGPU_MEM_PINNED:
      /* Portable: pinned for every context of the process, so any GPU (and
       * any green context) may copy from it at full speed. */
      what = "cudaHostAlloc";
      err = cudaHostAlloc(ptr, size, cudaHostAllocPortable);
      break;
    case MGPU_MEM_UNIFIED: {
      /* Asking for more managed memory than the GPU has free can hang the
       * GPU, not only the process: refuse it here. */
      size_t free_bytes = 0, total = 0;
      what = "cudaMallocManaged";
      err = cudaMemGetInfo(&free_bytes, &total);
      if (err == cudaSuccess && size > free_bytes) {
        rc = mgpu__error(
            MGPU_ENOMEM, "device %d: unified buffer of %zu bytes is more than "
            "the %zu bytes free on CUDA device %d", d->id, size, free_bytes,
            d->ordinal);
        break;
      }
      if (err == cudaSuccess)
        err = cudaMallocManaged(ptr, size, cudaMemAttachGlobal);
      break;
    }
    default:
      rc = mgpu__error(MGPU_EINVAL, "device %d: unknown memory "
                       "kind %d", d->id, (int)kind);
  }
  mgpu__cuda_leave(&sc);
  if (rc != 0) return rc;
  if (err != cudaSuccess) {
    *ptr = NULL;
    char what_size[96];
    snprintf(what_size, sizeof what_size, "%s of %zu bytes", what, size);
    return mgpu__cuda_fail(d->id, err, what_size);
  }
  return 0;
}

void mgpu__cuda_mem_free(mgpu__bdevice *d, mgpu_mem_kind kind, void *ptr) {
  if (ptr == NULL) return;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = kind == MGPU_MEM_PINNED ? cudaFreeHost(ptr) : cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    mgpu__cuda_env->log(MGPU_LOG_WARN, "cuda: device %d: freeing %p: %s",
                        d->id, ptr, cudaGetErrorName(err));
  }
  mgpu__cuda_leave(&sc);
}

/* ---- peers ---- */

int mgpu__cuda_peer_can_access(mgpu__bdevice *d, mgpu__bdevice *peer,
                               int *yes) {
  *yes = 0;
  if (d->ordinal == peer->ordinal) {
    *yes = 1; /* two logical devices of one GPU */
    return 0;
  }
  int can = 0;
  cudaError_t err = cudaDeviceCanAccessPeer(&can, d->ordinal, peer->ordinal);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "cudaDeviceCanAccessPeer");
  *yes = can;
  return 0;
}

/* Lets the mempool of owner be read and written by the GPU of user. */
static void mempool_grant(mgpu__bdevice *owner, mgpu__bdevice *user, int on) {
  if (owner->mempool == NULL) return;
  struct cudaMemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = user->ordinal;
  desc.flags = on ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
  if (cudaMemPoolSetAccess(owner->mempool, &desc, 1) != cudaSuccess)
    (void)cudaGetLastError();
}

int mgpu__cuda_peer_enable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  if (d->ordinal == peer->ordinal) return 0;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = cudaDeviceEnablePeerAccess(peer->ordinal, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    /* Enabling twice is harmless. */
    (void)cudaGetLastError();
    err = cudaSuccess;
  }
  if (err == cudaSuccess) mempool_grant(peer, d, 1);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "cudaDeviceEnablePeerAccess to device %d",
             peer->id);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

int mgpu__cuda_peer_disable(mgpu__bdevice *d, mgpu__bdevice *peer) {
  if (d->ordinal == peer->ordinal) return 0;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = cudaDeviceDisablePeerAccess(peer->ordinal);
  if (err == cudaErrorPeerAccessNotEnabled) {
    (void)cudaGetLastError();
    err = cudaSuccess;
  }
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "cudaDeviceDisablePeerAccess");
  return 0;
}

int mgpu__cuda_memcpy_peer_async(mgpu__bdevice *dd, void *dst,
                                 mgpu__bdevice *sd, const void *src,
                                 size_t size, mgpu__bdevice *s_dev,
                                 mgpu__bstream *s) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(s_dev, &sc);
  pthread_mutex_lock(&s->lock);
  mgpu__cuda_span *sp = mgpu__cuda_op_begin(s, "copy.peer",
                                            MGPU_METRIC_PATH_PEER_DIRECT, size);
  cudaError_t err;
  if (dd->ordinal == sd->ordinal)
    err = cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, s->s);
  else
    err = cudaMemcpyPeerAsync(dst, dd->ordinal, src, sd->ordinal, size, s->s);
  mgpu__cuda_op_end(s, sp, err == cudaSuccess);
  pthread_mutex_unlock(&s->lock);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    char what[128];
    snprintf(what, sizeof what, "copy of %zu bytes from device %d to device "
             "%d", size, sd->id, dd->id);
    return mgpu__cuda_fail(s_dev->id, err, what);
  }
  return 0;
}

/* ---- stream-ordered mempool ---- */

int mgpu__cuda_mempool_alloc_async(mgpu__bdevice *d, mgpu__bstream *s,
                                size_t size, void **ptr) {
  *ptr = NULL;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaError_t err = d->mempool != NULL
                        ? cudaMallocFromPoolAsync(ptr, size, d->mempool, s->s)
                        : cudaMallocAsync(ptr, size, s->s);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) {
    *ptr = NULL;
    char what[96];
    snprintf(what, sizeof what, "cudaMallocFromPoolAsync of %zu bytes", size);
    return mgpu__cuda_fail(d->id, err, what);
  }
  return 0;
}

int mgpu__cuda_mempool_free_async(mgpu__bdevice *d, mgpu__bstream *s, void *ptr) {
  mgpu__cuda_scope sc;
  mgpu__cuda_enter(d, &sc);
  cudaError_t err = cudaFreeAsync(ptr, s->s);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err, "cudaFreeAsync");
  return 0;
}

int mgpu__cuda_mempool_trim(mgpu__bdevice *d) {
  if (d->mempool == NULL) return 0;
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  cudaError_t err = cudaMemPoolTrimTo(d->mempool, 0);
  mgpu__cuda_leave(&sc);
  if (err != cudaSuccess)
    return mgpu__cuda_fail(d->id, err, "cudaMemPoolTrimTo");
  return 0;
}
