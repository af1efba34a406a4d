/* Copies between two devices: choosing the path, and the peer access state.
 *
 * mgpu_memcpy_async (copy.c) checks handles, ranges and overlap; a copy with
 * a host-visible side stays there (an ordinary copy on the stream's device),
 * and a copy of device memory between two different devices comes here, to
 * mgpu__copy_between_devices. Here the path is a device copy between logical
 * devices of one GPU (one memory), the backend's direct peer copy where peer
 * access is on for the pair, and otherwise the pipelined host-staged copy of
 * staged.c. Turning a pair of one GPU off sends its copies through the host
 * too, which is how the staged path is measured on a machine with one GPU.
 *
 * Peer access is kept per unordered pair of devices. A pair starts unset; the
 * first copy (or path query) between them turns it on when the backend says
 * both directions can, so copies go direct without any setup. The user can
 * turn it off and on again; both calls are harmless to repeat because the
 * state, not the backend, answers a repeat.
 */
#include <string.h>

#include "copy/copy-internal.h"

enum peer_state {
  PEER_UNSET = 0, /* never asked: the first copy decides */
  PEER_ON = 1,    /* direct copies */
  PEER_OFF = 2,   /* turned off by mgpu_peer_disable */
  PEER_NONE = 3   /* the pair cannot copy directly */
};

/* Indexed [low id][high id]. Written under peer_lock (which also serializes
 * the backend's enable and disable calls); read without it. */
static _Atomic int peer_state[MGPU_MAX_DEVICES][MGPU_MAX_DEVICES];
static mgpu__mutex peer_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_PEER);

static _Atomic int *state_of(int a, int b) {
  return a < b ? &peer_state[a][b] : &peer_state[b][a];
}

int mgpu__same_physical(const mgpu__device *a, const mgpu__device *b) {
  return a->ops == b->ops && a->ops->caps.splits_share_memory &&
         a->spec.ordinal == b->spec.ordinal;
}

/* Both devices checked, distinct. */
static int pair_check(int a, int b, mgpu__device **da, mgpu__device **db) {
  int rc = mgpu__device_check(a, da);
  if (rc == 0) rc = mgpu__device_check(b, db);
  return rc;
}

static int can_access(mgpu__device *a, mgpu__device *b, int *yes) {
  *yes = 0;
  if (a == b || mgpu__same_physical(a, b)) {
    *yes = 1;
    return 0;
  }
  if (a->ops != b->ops) return 0; /* different backends: through the host */
  int ab = 0, ba = 0;
  int rc = a->ops->peer_can_access(a->bdev, b->bdev, &ab);
  if (rc == 0) rc = b->ops->peer_can_access(b->bdev, a->bdev, &ba);
  if (rc != 0) return rc;
  *yes = ab && ba;
  return 0;
}

int mgpu_peer_can_access(int a, int b, int *yes) {
  mgpu__device *da, *db;
  if (yes == NULL)
    return mgpu__error(MGPU_EINVAL, "peer query of devices %d and %d: the "
                       "result pointer is NULL", a, b);
  int rc = pair_check(a, b, &da, &db);
  if (rc != 0) return rc;
  return can_access(da, db, yes);
}

/* Turns the backend's peer access of the pair on or off, both directions.
 * On failure of the second direction the first is undone. */
static int backend_peer_set(mgpu__device *a, mgpu__device *b, int on) {
  if (mgpu__same_physical(a, b)) return 0; /* one memory: nothing to do */
  if (on) {
    int rc = a->ops->peer_enable(a->bdev, b->bdev);
    if (rc != 0) return rc;
    rc = b->ops->peer_enable(b->bdev, a->bdev);
    if (rc != 0) a->ops->peer_disable(a->bdev, b->bdev);
    return rc;
  }
  int rc = a->ops->peer_disable(a->bdev, b->bdev);
  int rc2 = b->ops->peer_disable(b->bdev, a->bdev);
  return rc != 0 ? rc : rc2;
}

/* Moves the pair to PEER_ON (want_on) or PEER_OFF. Called under peer_lock. */
static int pair_set_locked(mgpu__device *a, mgpu__device *b, int want_on) {
  _Atomic int *st = state_of(a->id, b->id);
  int cur = *st;
  if (want_on) {
    if (cur == PEER_ON) return 0;
    int yes;
    int rc = can_access(a, b, &yes);
    if (rc != 0) return rc;
    if (!yes) {
      *st = PEER_NONE;
      return mgpu__error(MGPU_ENOTSUP,
                         "devices %d and %d cannot copy directly between "
                         "each other (copies between them go host-staged)",
                         a->id, b->id);
    }
    rc = backend_peer_set(a, b, 1);
    if (rc != 0) return rc;
    *st = PEER_ON;
    return 0;
  }
  if (cur == PEER_ON) {
    int rc = backend_peer_set(a, b, 0);
    if (rc != 0) return rc;
  }
  /* A pair that cannot go direct stays PEER_NONE, so that a later enable
   * still reports why. */
  if (cur != PEER_NONE) *st = PEER_OFF;
  return 0;
}

static int peer_set(int a, int b, int on) {
  mgpu__device *da, *db;
  int rc = pair_check(a, b, &da, &db);
  if (rc != 0 || a == b) return rc;
  mgpu__mutex_lock(&peer_lock);
  rc = pair_set_locked(da, db, on);
  mgpu__mutex_unlock(&peer_lock);
  return rc;
}

int mgpu_peer_enable(int a, int b) { return peer_set(a, b, 1); }
int mgpu_peer_disable(int a, int b) { return peer_set(a, b, 0); }

int mgpu__peer_path(int src, int dst, mgpu_copy_path *path) {
  mgpu__device *ds, *dd;
  int rc = pair_check(src, dst, &ds, &dd);
  if (rc != 0) return rc;
  if (src == dst) {
    *path = MGPU_PATH_DEVICE;
    return 0;
  }
  _Atomic int *st = state_of(src, dst);
  int cur = *st;
  if (mgpu__same_physical(ds, dd)) { /* one memory: on unless turned off */
    *path = cur == PEER_OFF ? MGPU_PATH_STAGED : MGPU_PATH_DEVICE;
    return 0;
  }
  if (cur == PEER_UNSET) {
    mgpu__mutex_lock(&peer_lock);
    if (*st == PEER_UNSET) {
      int yes = 0;
      if (can_access(ds, dd, &yes) == 0 && yes &&
          backend_peer_set(ds, dd, 1) == 0) {
        *st = PEER_ON;
      } else {
        *st = PEER_NONE;
        mgpu__log(MGPU_LOG_INFO, "devices %d and %d: no direct path, copies "
                  "between them go host-staged", src, dst);
      }
      mgpu_error_clear(); /* a refused pair is not the caller's error */
    }
    cur = *st;
    mgpu__mutex_unlock(&peer_lock);
  }
  *path = cur == PEER_ON ? MGPU_PATH_DIRECT : MGPU_PATH_STAGED;
  return 0;
}

int mgpu_copy_path_get(int src, int dst, mgpu_copy_path *path) {
  if (path == NULL)
    return mgpu__error(MGPU_EINVAL, "path query from device %d to device %d: "
                       "the result pointer is NULL", src, dst);
  return mgpu__peer_path(src, dst, path);
}

const char *mgpu_copy_path_name(mgpu_copy_path path) {
  switch (path) {
    case MGPU_PATH_DEVICE: return "device";
    case MGPU_PATH_DIRECT: return "direct";
    case MGPU_PATH_STAGED: return "staged";
  }
  return "unknown";
}

/* Forgets the peer state (shutdown). */
static void peer_reset(void) {
  mgpu__mutex_lock(&peer_lock);
  for (int i = 0; i < MGPU_MAX_DEVICES; i++)
    for (int j = 0; j < MGPU_MAX_DEVICES; j++) peer_state[i][j] = PEER_UNSET;
  mgpu__mutex_unlock(&peer_lock);
}

/* ---- the copy ---- */

static void count(int dev, int staged, size_t size) {
  mgpu__metric_add(dev, staged ? MGPU__M_bytes_peer_staged
                               : MGPU__M_bytes_peer_direct, size);
  mgpu__metric_add(dev, staged ? MGPU__M_copies_peer_staged
                               : MGPU__M_copies_peer_direct, 1);
}

int mgpu__copy_between_devices(mgpu__buf *dst, size_t dst_offset,
                               const mgpu__buf *src, size_t src_offset,
                               size_t size, mgpu__stream *s) {
  mgpu__device *dd = mgpu__device_get(dst->dev);
  mgpu__device *sd = mgpu__device_get(src->dev);
  mgpu__device *xd = mgpu__device_get(s->dev);
  if (dd == NULL || sd == NULL || xd == NULL)
    return mgpu__error(MGPU_ENODEV, "copy from device %d to device %d on a "
                       "stream of device %d: a device is not open",
                       src->dev, dst->dev, s->dev);
  if (size == 0) return 0;
  char *dp = (char *)dst->ptr + dst_offset;
  const char *sp = (const char *)src->ptr + src_offset;
  mgpu_copy_path path;
  int rc = mgpu__peer_path(src->dev, dst->dev, &path);
  if (rc != 0) return rc;
  if (path == MGPU_PATH_DEVICE) { /* logical devices of one GPU */
    rc = xd->ops->memcpy_async(xd->bdev, s->bstream, dp, sp, size, MGPU__COPY_D2D);
    if (rc == 0) {
      mgpu__metric_add(s->dev, MGPU__M_bytes_d2d, size);
      mgpu__metric_add(s->dev, MGPU__M_copies_d2d, 1);
    }
    return rc;
  }
  if (path == MGPU_PATH_STAGED)
    rc = mgpu__copy_staged(dd, dp, sd, sp, size, s);
  else
    rc = xd->ops->memcpy_peer_async(dd->bdev, dp, sd->bdev, sp, size, xd->bdev, s->bstream);
  if (rc == 0) count(src->dev, path == MGPU_PATH_STAGED, size);
  return rc;
}

/* mgpu_shutdown's hook: the copy layer gives back its helper streams,
 * pooled events and bounce buffers, and forgets the peer state. */
static void copy_shutdown(void) {
  mgpu__staged_shutdown();
  peer_reset();
}
MGPU__ON_SHUTDOWN(copy_shutdown, MGPU__LAYER_COPY)
