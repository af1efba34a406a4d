/* The fault seam around backend calls. The core never calls a backend's
 * table directly: each device holds a copy of it whose fallible entries
 * first count one site of kind MGPU__FAULT_BACKEND named after the operation
 * ("memcpy_async", "launch", ...) and fail with MGPU_EBACKEND when a rule of
 * MGPU_FAULT (or mgpu__fault_set) says so, as a driver error would (or with
 * MGPU_EDEVLOST, the device lost, for a rule ending in "=devlost"), and
 * otherwise call through. A call for a lost device is refused, and a call
 * that returns MGPU_EDEVLOST for a device its backend now reports lost (a
 * CUDA sticky error) runs the core's device-lost hooks. The entries that
 * cannot fail (close, frees, queries, the native handle) are the backend's
 * own.
 *
 * The wrappers are generated from the slot lists of backend/backend.h, which
 * say for each slot whether it is fallible, a wait, or called as it is.
 * There is one wrapped table (and one of each sub-table) per backend, so
 * that two devices of the same backend still share one table pointer (the
 * core compares them). The tables are filled on first use under wrap_lock
 * and never change after. */
#include <stdio.h>
#include <string.h>

#include "core/core-internal.h"
#include "util/fault.h"

/* The backends a process uses at once (host, CUDA, OpenCL): one wrapped
 * table for each, found by its name. */
#define NBACKENDS 3

static mgpu__mutex wrap_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_BACKEND_WRAP);
static const mgpu__backend_ops *real_ops[NBACKENDS]; /* guarded by wrap_lock */
static mgpu__backend_ops wrapped_ops[NBACKENDS];     /* filled once, then read */
/* The wrapped sub-tables, one of each per backend (filled with the table). */
#define MGPU__FAULT_SUBTABLE_STORE(member, type, slots)                     \
  static type wrapped_##member[NBACKENDS];
MGPU__BACKEND_SUBTABLES(MGPU__FAULT_SUBTABLE_STORE)

/* The mgpu id of a backend device, for details; -1 before init completes. */
static int bdevice_id(mgpu__bdevice *b) {
  for (int i = 0; i < mgpu__ndevices(); i++) {
    mgpu__device *d = mgpu__device_get(i);
    if (d != NULL && d->bdev == b) return i;
  }
  return -1;
}

/* hit: what mgpu__fault_hit said. A rule ending in "=devlost" fails the call
 * as a driver's sticky error would: the call's device is lost from here on
 * (a call for no device fails as any injected failure does). */
static int injected(int backend, const char *op, mgpu__bdevice *dev, int hit) {
  if (hit == MGPU__FAULT_LOSE && dev != NULL &&
      real_ops[backend]->loss != NULL) {
    char why[64];
    snprintf(why, sizeof why, "MGPU_FAULT backend:%s=devlost", op);
    real_ops[backend]->loss->lose(dev, why);
    int id = bdevice_id(dev);
    mgpu__device_lost_seen(id);
    return mgpu__error(MGPU_EDEVLOST, "%s device %d was lost in %s (%s)",
                       real_ops[backend]->name, id, op, why);
  }
  return mgpu__error(MGPU_EBACKEND, "%s backend: %s failed (a failure injected "
                     "by MGPU_FAULT)", real_ops[backend]->name, op);
}

/* A backend call for dev returned rc: MGPU_EDEVLOST from a device the
 * backend now reports lost (a CUDA sticky error) tells the layers above. A
 * wait that failed because it waited for another, lost device leaves dev
 * alone: the backend does not report dev lost. */
static int seen(int backend, mgpu__bdevice *dev, int rc) {
  if (rc == MGPU_EDEVLOST && dev != NULL && real_ops[backend]->loss != NULL &&
      real_ops[backend]->loss->lost(dev, NULL, 0))
    mgpu__device_lost_seen(bdevice_id(dev));
  return rc;
}

/* New work for a lost device is refused before it reaches the backend. */
static int refuse_lost(int backend, mgpu__bdevice *dev, const char *op) {
  char why[96];
  if (dev == NULL || real_ops[backend]->loss == NULL ||
      !real_ops[backend]->loss->lost(dev, why, sizeof why))
    return 0;
  int id = bdevice_id(dev);
  mgpu__device_lost_seen(id);
  return mgpu__error(MGPU_EDEVLOST, "%s device %d was lost (%s): %s refused",
                     real_ops[backend]->name, id, why, op);
}

/* The wrappers, generated from the slot lists of backend/backend.h: for
 * each slot the list marks FAIL or WAIT, one wrapper per backend index i,
 * named w<i>_<group>_<name>. The fault site is named after the slot
 * ("memcpy_async"), a sub-table's slot after its group and name
 * ("mempool_alloc_async", "graph_launch"); the claim group's slots keep their
 * own names ("stream_claim"). */
#define SITE_core(name) #name
#define SITE_claim(name) #name
#define SITE_mempool(name) "mempool_" #name
#define SITE_ipc(name) "ipc_" #name
#define SITE_coll(name) "coll_" #name
#define SITE_loss(name) "loss_" #name
#define SITE_graph(name) "graph_" #name
/* The real slot of backend i. */
#define REAL_core(i, name) real_ops[i]->name
#define REAL_SUB(i, group, name) real_ops[i]->group->name
#define REAL_claim(i, name) REAL_SUB(i, claim, name)
#define REAL_mempool(i, name) REAL_SUB(i, mempool, name)
#define REAL_ipc(i, name) REAL_SUB(i, ipc, name)
#define REAL_coll(i, name) REAL_SUB(i, coll, name)
#define REAL_loss(i, name) REAL_SUB(i, loss, name)
#define REAL_graph(i, name) REAL_SUB(i, graph, name)

/* A fallible call: refused for a lost device, failed by a fault rule, or
 * made (and its MGPU_EDEVLOST seen). */
#define WRAP_FAIL(i, group, ret, name, params, args, dev)                    \
  static ret w##i##_##group##_##name params {                                \
    int lost_rc_ = refuse_lost(i, dev, SITE_##group(name));                  \
    if (lost_rc_ != 0) return lost_rc_;                                      \
    int hit_ = mgpu__fault_hit(MGPU__FAULT_BACKEND, SITE_##group(name));     \
    if (hit_) return injected(i, SITE_##group(name), dev, hit_);             \
    return seen(i, dev, REAL_##group(i, name) args);                         \
  }
/* A wait: a driver that reports an error from a synchronize has still
 * waited (the error is a sticky one of earlier work), and callers rely on
 * that to free what the work used. Its injected failure comes after the
 * real wait. */
#define WRAP_WAIT(i, group, ret, name, params, args, dev)                    \
  static ret w##i##_##group##_##name params {                                \
    int rc = seen(i, dev, REAL_##group(i, name) args);                       \
    int hit_ = mgpu__fault_hit(MGPU__FAULT_BACKEND, SITE_##group(name));     \
    if (hit_ && rc == 0) rc = injected(i, SITE_##group(name), dev, hit_);    \
    return rc;                                                               \
  }
#define WRAP_PLAIN(i, group, ret, name, params, args, dev)
#define WRAP_SLOT(group, seam, ret, name, params, args, dev)                 \
  WRAP_##seam(0, group, ret, name, params, args, dev)                        \
  WRAP_##seam(1, group, ret, name, params, args, dev)                        \
  WRAP_##seam(2, group, ret, name, params, args, dev)
#define WRAP_SUBTABLE(member, type, slots) slots(WRAP_SLOT)
MGPU__BACKEND_CORE_SLOTS(WRAP_SLOT)
MGPU__BACKEND_SUBTABLES(WRAP_SUBTABLE)

/* Fills table t (a copy of backend i's) with the wrappers; an optional slot
 * the backend leaves NULL stays NULL. */
#define SET_FAIL(group, name)                                                \
  if (t->name != NULL)                                                       \
    t->name = i == 0 ? w0_##group##_##name                                   \
              : i == 1 ? w1_##group##_##name                                 \
                       : w2_##group##_##name;
#define SET_WAIT(group, name) SET_FAIL(group, name)
#define SET_PLAIN(group, name)
#define SET_SLOT(group, seam, ret, name, params, args, dev) SET_##seam(group, name)
#define SET_SUBTABLE(member, type, slots)                                    \
  if (real->member != NULL) {                                                \
    type *t = &wrapped_##member[i];                                          \
    *t = *real->member;                                                      \
    slots(SET_SLOT)                                                          \
    w->member = t;                                                           \
  }

/* The index of backend real (by name: a plugin loaded again after a
 * shutdown hands back its table again), or a free one; -1 when every index
 * is another backend's. Called with wrap_lock held. */
static int backend_index(const mgpu__backend_ops *real) {
  for (int i = 0; i < NBACKENDS; i++)
    if (real_ops[i] == NULL || real_ops[i] == real ||
        strcmp(real_ops[i]->name, real->name) == 0)
      return i;
  return -1;
}

const mgpu__backend_ops *mgpu__backend_fault_wrap(
    const mgpu__backend_ops *real) {
  mgpu__mutex_lock(&wrap_lock);
  int i = backend_index(real);
  if (i < 0) {
    mgpu__mutex_unlock(&wrap_lock);
    return real; /* a fourth backend: unreachable, MGPU_DEVICES names three */
  }
  if (real_ops[i] != real) {
    /* First use, or a plugin loaded again after a shutdown. No device of
     * this backend is open now, so nobody reads the table meanwhile. */
    real_ops[i] = real;
    mgpu__backend_ops *w = &wrapped_ops[i];
    *w = *real;
    {
      mgpu__backend_ops *t = w;
      MGPU__BACKEND_CORE_SLOTS(SET_SLOT)
    }
    MGPU__BACKEND_SUBTABLES(SET_SUBTABLE)
  }
  mgpu__mutex_unlock(&wrap_lock);
  return &wrapped_ops[i];
}
