/* Waking the waits of collectives and host barriers when a device is lost.
 *
 * A call that waits for other ranks (a collective's rendezvous, a host
 * barrier) registers its condition variable here while it waits. The core
 * runs coll_device_lost, this layer's device-lost hook (registered below
 * with MGPU__ON_DEVICE_LOST), once per lost device, on the thread whose call
 * first saw the loss (mgpu__device_lost_seen); it broadcasts every
 * registered condition variable, so the waiters wake at once and look
 * at their devices. The hook may run on a thread that holds any lock (a
 * collective being issued holds its communicator's lock, a backend its
 * device's), so it takes only wake_lock, which nothing is taken under, and
 * broadcasts without the waiters' mutexes (POSIX allows it). A loss found
 * between a waiter's look and its sleep is therefore not seen at once: a
 * waiter sleeps at most MGPU__COLL_LOST_POLL_NS before it looks again. */
#include "coll/coll-internal.h"

static mgpu__mutex wake_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_LOST_WAKE);
static mgpu__coll_waiter *waiters; /* guarded by wake_lock */

void mgpu__coll_wait_begin(mgpu__coll_waiter *w, mgpu__cond *cond) {
  w->cond = cond;
  w->prev = NULL;
  mgpu__mutex_lock(&wake_lock);
  w->next = waiters;
  if (waiters != NULL) waiters->prev = w;
  waiters = w;
  mgpu__mutex_unlock(&wake_lock);
}

void mgpu__coll_wait_end(mgpu__coll_waiter *w) {
  mgpu__mutex_lock(&wake_lock);
  if (w->prev != NULL) w->prev->next = w->next;
  else waiters = w->next;
  if (w->next != NULL) w->next->prev = w->prev;
  mgpu__mutex_unlock(&wake_lock);
}

static void coll_device_lost(int dev) {
  (void)dev; /* each waiter knows which devices it waits for */
  mgpu__mutex_lock(&wake_lock);
  for (mgpu__coll_waiter *w = waiters; w != NULL; w = w->next)
    mgpu__cond_broadcast(w->cond);
  mgpu__mutex_unlock(&wake_lock);
}
MGPU__ON_DEVICE_LOST(coll_device_lost, MGPU__LAYER_WORK)

uint64_t mgpu__coll_wait_until(uint64_t deadline) {
  uint64_t until = mgpu__now_ns() + MGPU__COLL_LOST_POLL_NS;
  return deadline != 0 && deadline < until ? deadline : until;
}
