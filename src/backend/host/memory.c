/* The host backend's memory: "device memory" is host memory from the
 * allocation seam; every host device may read every other's (peer access),
 * unless the configuration forbids it. */
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/obs.h"
#include "util/fault.h"
#include "util/log.h"

/* Where each allocation starts. Every block begins at a multiple of 256
 * bytes (what cudaMalloc promises), after a header that holds the address
 * to free; a small one (under 64 KiB) 256 bytes into its allocation.
 *
 * A block of 64 KiB or more starts at one of 15 offsets from 256 to 3840
 * bytes into a page, a different one for each of 15 such allocations in
 * turn (the next colour). Blocks that all began at the same place in a
 * page (as they did: the large ones on a 2 MiB boundary, and the C library
 * starts each block it maps on its own 16 bytes past a page boundary)
 * would put element i of every buffer at the same address modulo 4 KiB:
 * a kernel reading one buffer and writing another (out[i] =
 * f(in[i - n .. i + n])) then has its loads match the low 12 bits of
 * stores still in flight, which a CPU must treat as a possible dependency
 * (4 KiB aliasing), and both fall into the same cache sets. The 5-point
 * Jacobi sweep of two 1024-row slabs on two host devices ran 1-4 % faster
 * with staggered buffers than with aligned ones (docs/PERF.md). The
 * colours go in an order that keeps the first few far apart: 2048, 1024,
 * 3072, 512, ...
 *
 * A large block (2 MiB or more) is also 2 MiB-aligned and offered to
 * transparent huge pages, since first touch of 4 KiB pages is the slowest
 * part of a fresh buffer here. */
#define HOST_HUGE ((size_t)2 << 20)
#define HOST_COLOURED ((size_t)64 << 10)
#define HOST_PAGE ((size_t)4096)
#define HOST_HEAD ((size_t)256)
#define HOST_COLOURS 15

static size_t next_colour(void) {
  static const unsigned char order[HOST_COLOURS] = {8,  4, 12, 2, 10, 6, 14, 1,
                                                    9,  5, 13, 3, 11, 7, 15};
  static atomic_uint turn;
  unsigned k = atomic_fetch_add_explicit(&turn, 1, memory_order_relaxed);
  return HOST_HEAD * order[k % HOST_COLOURS];
}

int mgpu__host_mem_alloc(mgpu__bdevice *d, mgpu_mem_kind kind, size_t size,
                         void **ptr) {
  (void)kind;
  int large = size >= HOST_HUGE, coloured = size >= HOST_COLOURED;
  size_t align = large ? HOST_HUGE : coloured ? HOST_PAGE : HOST_HEAD;
  size_t extra = coloured ? HOST_PAGE : HOST_HEAD;
  /* NULL also when the round-up to align wraps past zero (pinned memory
   * has no budget in front of it). */
  void *p = size <= SIZE_MAX - extra ? mgpu__aligned_alloc(align, size + extra)
                                     : NULL;
  if (p == NULL)
    return mgpu__error(MGPU_ENOMEM, "host device %d: the system refused "
                       "%zu bytes", d->id, size);
#ifdef MADV_HUGEPAGE
  if (large)
    madvise(p, (size + extra + HOST_HUGE - 1) / HOST_HUGE * HOST_HUGE,
            MADV_HUGEPAGE);
#endif
  char *block = (char *)p + (coloured ? next_colour() : HOST_HEAD);
  ((void **)block)[-1] = p;
  *ptr = block;
  return 0;
}

/* The allocation of a block of mgpu__host_mem_alloc. */
static void host_block_free(void *ptr) {
  if (ptr != NULL) mgpu__free(((void **)ptr)[-1]);
}

void mgpu__host_mem_free(mgpu__bdevice *d, mgpu_mem_kind kind, void *ptr) {
  (void)d;
  (void)kind;
  host_block_free(ptr);
}

/* Host memory needs no device: freeing its allocation is all. */
void mgpu__host_mem_free_detached(mgpu_mem_kind kind, void *ptr) {
  (void)kind;
  host_block_free(ptr);
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
