/* Host barriers and stream barriers.
 *
 * The host barrier counts arrivals per generation in one word (state: the
 * generation in the high half, the count in the low), changed by
 * compare-and-swap: no lock on the way in, so two threads arriving together
 * do not meet at a mutex (which sent them to the kernel at most rounds). The
 * last thread to arrive starts a new generation; the others leave when they
 * see the generation move on: first by watching it (mgpu__spin_until; of
 * two parties the pair wait on the other rank, mgpu__spin_pair_until), so
 * threads that arrive close together pass without a wake-up, then asleep
 * on the condition variable. A sleeper counts itself in sleepers under the
 * lock before it looks at the generation, and the last arrival reads
 * sleepers after its compare-and-swap (both sequentially consistent), so
 * either the sleeper sees the new generation or the last arrival sees the
 * sleeper and wakes it under the lock. A thread whose wait runs out
 * withdraws its arrival (a compare-and-swap that fails if the generation
 * ended meanwhile: then the wait succeeded), so the barrier stays
 * consistent and reusable, and names the devices whose threads never
 * came. A barrier that includes a lost device cannot
 * complete: its waiters (woken by the device-lost hook, lost.c) and later
 * callers withdraw and fail with MGPU_EDEVLOST naming the device.
 *
 * The stream barrier records one event per stream and makes every stream
 * wait for every other's event; the host only queues. Its events are reused
 * round after round: a stream wait takes the event's state when it is
 * queued, so re-recording later does not disturb earlier rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "util/fault.h"

typedef struct mgpu__barrier {
  uintptr_t handle;
  int n;
  int devs[MGPU_MAX_DEVICES];
  /* lock and cond: the sleep of a waiter whose watch ran out. */
  mgpu__mutex lock;
  mgpu__cond cond;
  _Atomic int sleepers;  /* waiters on cond or about to be (under lock) */
  _Atomic int destroyed; /* set under lock by destroy: waiters leave, EFREED */
  /* A call of the rank is inside: set by its arrival (an exchange, so a
   * second call as the same rank is refused), cleared by that call as it
   * leaves, withdrawn or not. While a generation is open, the ranks not
   * inside are those that have not arrived (named by a timeout). A line
   * each: two ranks' flags on one would move it between their cores at
   * every call. */
  struct {
    _Alignas(64) _Atomic unsigned char v;
  } inside[MGPU_MAX_DEVICES];
  mgpu__spin spin;
  /* Two parties: each rank's watch is a pair wait on the other rank
   * (mgpu__spin_pair_until), which publishes the CPU it arrived on (a
   * hint, relaxed). */
  mgpu__spin pair_spin[2];
  _Atomic int cpu[2];
  /* On lines of its own, every arrival writes it: the generation (high 32
   * bits) and the ranks arrived in it (low 32 bits). A generation ends
   * only once each waiter arrived, so a waiter sees it move on at most
   * once: 32 bits are enough to tell. */
  char pad0[128];
  _Atomic uint64_t state;
  char pad1[128];
  /* The generation again, raised by the last arrival after its
   * compare-and-swap: what waiters watch. Watching state itself would
   * keep pulling the line that the next arrival must take to write, and
   * its compare-and-swap would wait for it. It lags state for a moment,
   * and a waiter may leave by state meanwhile (its sleep, or its look
   * between watches) and arrive again: so it only moves forward
   * (raise_gen_word), and a waiter compares it to its generation as a
   * wrapping count (gen_ended), never for equality, or a late raiser
   * would let waiters of a later generation pass early. */
  _Atomic uint32_t gen_word;
  char pad2[128];
} mgpu__barrier;

#define GEN_OF(st) ((uint32_t)((st) >> 32))
#define COUNT_OF(st) ((uint32_t)(st))

int mgpu_barrier_create(const int *devs, int n, mgpu_barrier **barrier) {
  if (barrier == NULL) return mgpu__error(MGPU_EINVAL, "barrier: NULL output");
  *barrier = NULL;
  if (devs == NULL || n < 1 || n > MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "barrier: %d devices (need 1 to %d)", n,
                       MGPU_MAX_DEVICES);
  for (int r = 0; r < n; r++) {
    mgpu__device *d;
    int rc = mgpu__device_check(devs[r], &d);
    if (rc != 0) return rc;
  }
  mgpu__barrier *b = mgpu__aligned_alloc(_Alignof(mgpu__barrier), sizeof *b);
  if (b == NULL) return mgpu__error(MGPU_ENOMEM, "barrier: out of memory");
  memset(b, 0, sizeof *b);
  b->n = n;
  memcpy(b->devs, devs, (size_t)n * sizeof *devs);
  atomic_store(&b->cpu[0], -1);
  atomic_store(&b->cpu[1], -1);
  mgpu__mutex_init(&b->lock, MGPU__LOCK_BARRIER);
  mgpu__cond_init(&b->cond);
  uintptr_t h = mgpu__handle_new(MGPU__H_BARRIER, b);
  if (h == 0) {
    mgpu__cond_destroy(&b->cond);
    mgpu__mutex_destroy(&b->lock);
    mgpu__free(b);
    return mgpu__error(MGPU_ENOMEM, "barrier: too many open handles");
  }
  b->handle = h;
  *barrier = (mgpu_barrier *)h;
  return 0;
}

/* The rest of a destroy, once the handle h is closed. */
static void barrier_free(mgpu__barrier *b, uintptr_t h) {
  mgpu__mutex_lock(&b->lock);
  atomic_store(&b->destroyed, 1);
  mgpu__cond_broadcast(&b->cond);
  mgpu__mutex_unlock(&b->lock);
  mgpu__handle_retire(h);
  mgpu__cond_destroy(&b->cond);
  mgpu__mutex_destroy(&b->lock);
  mgpu__free(b);
}

int mgpu_barrier_destroy(mgpu_barrier *barrier) {
  int err = 0;
  /* Later calls fail; the threads waiting inside are woken and leave with
   * MGPU_EFREED; retiring waits until they have. */
  mgpu__barrier *b =
      mgpu__handle_close((uintptr_t)barrier, MGPU__H_BARRIER, "barrier", &err);
  if (b == NULL) return err;
  barrier_free(b, (uintptr_t)barrier);
  return 0;
}

/* Names the devices that have not arrived (the caller excepted), then
 * their last operations. */
static void missing_list(const mgpu__barrier *b, int self, char *out,
                         size_t size) {
  size_t len = 0;
  int missing[MGPU_MAX_DEVICES], n = 0;
  out[0] = '\0';
  for (int r = 0; r < b->n && len + 16 < size; r++)
    if (!atomic_load_explicit(&b->inside[r].v, memory_order_relaxed) &&
        r != self) {
      len += (size_t)snprintf(out + len, size - len, "%s%d (rank %d)",
                              len ? ", " : "", b->devs[r], r);
      missing[n++] = b->devs[r];
    }
  if (len + 32 >= size) return;
  len += (size_t)snprintf(out + len, size - len, " did not arrive; ");
  mgpu__flight_list(missing, n, out + len, size - len);
}

/* The first rank whose device was lost, or -1: the barrier cannot complete
 * (a lost device's thread stops calling). */
static int lost_rank(const mgpu__barrier *b) {
  for (int r = 0; r < b->n; r++)
    if (mgpu__device_is_lost(b->devs[r])) return r;
  return -1;
}

static int lost_error(const mgpu__barrier *b, int rank, int lost) {
  return mgpu__error(MGPU_EDEVLOST,
                     "barrier: rank %d (device %d): device %d (rank %d) was "
                     "lost, so the barrier cannot complete",
                     rank, b->devs[rank], b->devs[lost], lost);
}

static int barrier_wait_on(mgpu__barrier *b, int rank, int timeout_ms);
static int barrier_wait(mgpu_barrier *barrier, int rank, int timeout_ms);

/* While tracing, the wait is a span on the calling thread. */
int mgpu_barrier_wait(mgpu_barrier *barrier, int rank, int timeout_ms) {
  if (!mgpu__trace_enabled()) return barrier_wait(barrier, rank, timeout_ms);
  uint64_t t0 = mgpu__now_ns();
  int rc = barrier_wait(barrier, rank, timeout_ms);
  mgpu__trace_arg a[] = {MGPU__TARG_I("rank", rank), MGPU__TARG_I("result", rc)};
  mgpu__trace_thread_span("barrier", t0, mgpu__now_ns(), a, 2);
  return rc;
}

static int barrier_wait(mgpu_barrier *barrier, int rank, int timeout_ms) {
  int err = 0;
  /* A pin: the handle's slot word, which a use would write, is read by
   * every rank's call (see the pins in core/handle.c). */
  uintptr_t h = (uintptr_t)barrier;
  int mark = mgpu__handle_pin(&h, 1);
  mgpu__barrier *b =
      mark >= 0
          ? mgpu__handle_pinned(h, MGPU__H_BARRIER, "barrier", &err)
          : mgpu__handle_get(h, MGPU__H_BARRIER, "barrier", &err);
  int rc = b != NULL ? barrier_wait_on(b, rank, timeout_ms) : err;
  if (mark >= 0)
    mgpu__handle_unpin(mark);
  else if (b != NULL)
    mgpu__handle_put(h);
  return rc;
}

/* Wakes the sleepers after the generation moved on, if there are any. */
static void wake_sleepers(mgpu__barrier *b) {
  if (atomic_load(&b->sleepers) == 0) return; /* after the CAS: see top */
  mgpu__mutex_lock(&b->lock);
  mgpu__cond_broadcast(&b->cond);
  mgpu__mutex_unlock(&b->lock);
}

/* Raises gen_word to g unless it is already there or beyond (counts
 * compared as wrapping 32-bit ones: see gen_word). */
static void raise_gen_word(mgpu__barrier *b, uint32_t g) {
  uint32_t cur = atomic_load_explicit(&b->gen_word, memory_order_relaxed);
  while ((int32_t)(g - cur) > 0 &&
         !atomic_compare_exchange_weak_explicit(&b->gen_word, &cur, g,
                                                memory_order_release,
                                                memory_order_relaxed))
    continue;
}

/* Rank's arrival: < 0 an error, 1 when it was the last rank and released
 * the others, 0 when it must wait for generation *gen to end (inside). */
static int barrier_arrive(mgpu__barrier *b, int rank, uint32_t *gen) {
  if (atomic_load(&b->destroyed))
    return mgpu__error(MGPU_EFREED, "barrier: destroyed during the call");
  if (atomic_exchange(&b->inside[rank].v, 1))
    return mgpu__error(MGPU_EINVAL,
                       "barrier: rank %d (device %d) is already waiting",
                       rank, b->devs[rank]);
  int lost = lost_rank(b);
  if (lost >= 0) {
    atomic_store(&b->inside[rank].v, 0);
    return lost_error(b, rank, lost);
  }
  int cpu = b->n == 2 ? mgpu__cpu_now() : -1; /* stored when it moved */
  if (cpu != -1 &&
      atomic_load_explicit(&b->cpu[rank], memory_order_relaxed) != cpu)
    atomic_store_explicit(&b->cpu[rank], cpu, memory_order_relaxed);
  uint64_t st = atomic_load(&b->state), next;
  do {
    next = COUNT_OF(st) + 1 == (uint32_t)b->n
               ? (uint64_t)(GEN_OF(st) + 1) << 32
               : st + 1;
  } while (!atomic_compare_exchange_weak(&b->state, &st, next));
  if (COUNT_OF(next) == 0) {
    /* The window in which a waiter that leaves through state may arrive
     * again before gen_word moves (test barrier.late_release). */
    mgpu__fault_stall("barrier_release");
    raise_gen_word(b, GEN_OF(next));
    atomic_store(&b->inside[rank].v, 0);
    wake_sleepers(b);
    return 1;
  }
  *gen = GEN_OF(st);
  return 0;
}

/* Takes back rank's arrival in generation gen: 1 when it did, 0 when the
 * generation ended meanwhile (the wait succeeded). */
static int barrier_withdraw(mgpu__barrier *b, uint32_t gen) {
  uint64_t st = atomic_load(&b->state);
  do {
    if (GEN_OF(st) != gen) return 0;
  } while (!atomic_compare_exchange_weak(&b->state, &st, st - 1));
  return 1;
}

typedef struct gen_watch {
  const mgpu__barrier *b;
  uint32_t gen;
} gen_watch;

/* The watch, on gen_word (state moved on before it): past the waiter's
 * generation. */
static int gen_ended(const void *p) {
  const gen_watch *w = p;
  return (int32_t)(atomic_load_explicit(&w->b->gen_word,
                                        memory_order_acquire) -
                   w->gen) > 0;
}

/* The same on state itself, for the sleep's look (after its count of
 * sleepers: see the top) and a withdrawal's. */
static int gen_ended_state(const mgpu__barrier *b, uint32_t gen) {
  return GEN_OF(atomic_load(&b->state)) != gen;
}

/* Watches the generation a while before sleeping; 1 when it moved on.
 * Of two parties the partner is the other rank (a pair wait); of more,
 * any of them may come last. *since: for mgpu__spin_pair_woke after a
 * park (0: none). */
static int barrier_watch(mgpu__barrier *b, int rank, uint32_t gen,
                         uint64_t *since) {
  gen_watch w = {b, gen};
  *since = 0;
  if (b->n != 2) return mgpu__spin_until(&b->spin, gen_ended, &w);
  return mgpu__spin_pair_until(&b->pair_spin[rank], gen_ended, &w,
                               &b->cpu[1 - rank], 0, since);
}

/* With more parties than CPUs, whether a watch that ran out should give
 * way to the sleep below: generation gen ended, the barrier was destroyed,
 * a device was lost or the deadline passed (the sleep's loop then says
 * which). */
static int barrier_must_sleep(mgpu__barrier *b, uint32_t gen,
                              uint64_t deadline) {
  return gen_ended_state(b, gen) || atomic_load(&b->destroyed) ||
         lost_rank(b) >= 0 ||
         (deadline != 0 && mgpu__now_ns() >= deadline);
}

/* The sleep of a wait whose watch ran out, under b->lock: until
 * generation gen ends, by its deadline, a destroy or a lost device. */
static int barrier_sleep_locked(mgpu__barrier *b, int rank, uint32_t gen,
                                uint64_t deadline, int timeout_ms) {
  int lost;
  while (!gen_ended_state(b, gen)) {
    if (atomic_load(&b->destroyed))
      return mgpu__error(MGPU_EFREED, "barrier: rank %d (device %d): the "
                         "barrier was destroyed while it waited",
                         rank, b->devs[rank]);
    if ((lost = lost_rank(b)) >= 0 && barrier_withdraw(b, gen))
      return lost_error(b, rank, lost);
    if (mgpu__cond_timedwait(&b->cond, &b->lock,
                             mgpu__coll_wait_until(deadline)) != 0 &&
        deadline != 0 && mgpu__now_ns() >= deadline &&
        barrier_withdraw(b, gen)) {
      char missing[900];
      missing_list(b, rank, missing, sizeof missing);
      return mgpu__error(MGPU_ETIMEDOUT,
                         "barrier: rank %d (device %d) waited %d ms; device(s) "
                         "%s",
                         rank, b->devs[rank], timeout_ms, missing);
    }
  }
  return 0;
}

/* Waits, after barrier_arrive, for generation gen to end: by its deadline,
 * a destroy or a lost device. With more parties than CPUs the wait does not
 * sleep but keeps watching (yielding the CPU at each turn once as many
 * threads watch as there are CPUs), as MPI ranks poll when oversubscribed:
 * the last to arrive is then most likely a thread waiting for a CPU, and a
 * sleep would add a wake-up (tens of microseconds) to every barrier. */
static int barrier_sleep(mgpu__barrier *b, int rank, uint32_t gen,
                         int timeout_ms) {
  /* A destroy meanwhile is seen by the loop below once the watch ends (it
   * is bounded). */
  uint64_t since;
  if (barrier_watch(b, rank, gen, &since)) return 0;
  uint64_t deadline = mgpu__deadline(timeout_ms);
  if (b->n > mgpu__cpus())
    while (!barrier_must_sleep(b, gen, deadline))
      if (barrier_watch(b, rank, gen, &since)) return 0;
  mgpu__coll_waiter waiter;
  mgpu__mutex_lock(&b->lock);
  atomic_fetch_add(&b->sleepers, 1); /* before the look: see the top */
  mgpu__coll_wait_begin(&waiter, &b->cond); /* a lost device wakes it */
  int rc = barrier_sleep_locked(b, rank, gen, deadline, timeout_ms);
  mgpu__coll_wait_end(&waiter);
  atomic_fetch_sub(&b->sleepers, 1);
  mgpu__mutex_unlock(&b->lock);
  if (b->n == 2 && rc == 0) mgpu__spin_pair_woke(&b->pair_spin[rank], since);
  return rc;
}

/* The wait itself; the caller holds the barrier's handle. */
static int barrier_wait_on(mgpu__barrier *b, int rank, int timeout_ms) {
  if (rank < 0 || rank >= b->n)
    return mgpu__error(MGPU_EINVAL, "barrier: rank %d of %d", rank, b->n);
  if (timeout_ms < -1)
    return mgpu__error(MGPU_EINVAL, "barrier: timeout %d ms", timeout_ms);
  timeout_ms = mgpu__timeout_ms(timeout_ms);
  mgpu__flight_record(b->devs[rank], "barrier_wait", 0, 0);
  uint32_t gen = 0;
  int rc = barrier_arrive(b, rank, &gen);
  if (rc != 0) return rc < 0 ? rc : 0;
  rc = barrier_sleep(b, rank, gen, timeout_ms);
  atomic_store(&b->inside[rank].v, 0);
  return rc;
}

/* ---- stream barriers ---- */

typedef struct mgpu__stream_barrier {
  uintptr_t handle;
  int n;
  mgpu_stream *streams[MGPU_MAX_DEVICES];
  mgpu_event *events[MGPU_MAX_DEVICES];
} mgpu__stream_barrier;

static void sb_free(mgpu__stream_barrier *sb) {
  for (int i = 0; i < sb->n; i++)
    if (sb->events[i] != NULL) mgpu_event_destroy(sb->events[i]);
  mgpu__free(sb);
}

int mgpu_stream_barrier_create(mgpu_stream *const *streams, int n,
                               mgpu_stream_barrier **barrier) {
  if (barrier == NULL)
    return mgpu__error(MGPU_EINVAL, "stream barrier: NULL output");
  *barrier = NULL;
  if (streams == NULL || n < 1 || n > MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "stream barrier: %d streams (need 1 to %d)",
                       n, MGPU_MAX_DEVICES);
  mgpu__stream_barrier *sb = mgpu__calloc(1, sizeof *sb);
  if (sb == NULL)
    return mgpu__error(MGPU_ENOMEM, "stream barrier: out of memory");
  int rc = 0;
  int devs[MGPU_MAX_DEVICES];
  for (int i = 0; i < n && rc == 0; i++) {
    mgpu__stream *s;
    rc = mgpu__stream_get(streams[i], &s);
    if (rc == 0) {
      devs[i] = s->dev;
      mgpu__stream_put(s);
    }
    if (rc == 0) rc = mgpu__coll_same_backend("stream barrier", devs, i + 1);
    for (int j = 0; j < i && rc == 0; j++)
      if (streams[j] == streams[i])
        rc = mgpu__error(MGPU_EINVAL,
                         "stream barrier: stream %d is listed twice (%d, %d)",
                         i, j, i);
    if (rc == 0) rc = mgpu_event_create(&sb->events[i], devs[i]);
    sb->streams[i] = streams[i];
    sb->n = i + 1;
  }
  uintptr_t h = 0;
  if (rc == 0) {
    h = mgpu__handle_new(MGPU__H_STREAM_BARRIER, sb);
    if (h == 0)
      rc = mgpu__error(MGPU_ENOMEM, "stream barrier: too many open handles");
  }
  if (rc != 0) {
    sb_free(sb);
    return rc;
  }
  sb->handle = h;
  *barrier = (mgpu_stream_barrier *)h;
  return 0;
}

int mgpu_stream_barrier_destroy(mgpu_stream_barrier *barrier) {
  int err = 0;
  mgpu__stream_barrier *sb =
      mgpu__handle_release((uintptr_t)barrier, MGPU__H_STREAM_BARRIER,
                        "stream barrier", &err);
  if (sb == NULL) return err;
  sb_free(sb);
  return 0;
}

int mgpu_stream_barrier_wait(mgpu_stream_barrier *barrier) {
  int err = 0;
  mgpu__stream_barrier *sb = mgpu__handle_get(
      (uintptr_t)barrier, MGPU__H_STREAM_BARRIER, "stream barrier", &err);
  if (sb == NULL) return err;
  int rc = 0;
  for (int i = 0; i < sb->n && rc == 0; i++)
    rc = mgpu_event_record(sb->events[i], sb->streams[i]);
  for (int i = 0; i < sb->n && rc == 0; i++)
    for (int j = 0; j < sb->n && rc == 0; j++)
      if (i != j) rc = mgpu_stream_wait_event(sb->streams[i], sb->events[j]);
  mgpu__handle_put((uintptr_t)barrier);
  return rc;
}

/* Shutdown: barriers and stream barriers still open are destroyed, so their
 * handles are MGPU_EFREED afterwards (and after a new mgpu_init). */
static void shutdown_barrier(void *obj, void *arg) {
  (void)arg;
  mgpu__barrier *b = obj;
  barrier_free(b, b->handle);
}

static void shutdown_stream_barrier(void *obj, void *arg) {
  (void)arg;
  mgpu__stream_barrier *sb = obj;
  mgpu__handle_retire(sb->handle);
  sb_free(sb);
}

static void barriers_shutdown(void) {
  mgpu__handle_foreach(MGPU__H_BARRIER, shutdown_barrier, NULL);
  mgpu__handle_foreach(MGPU__H_STREAM_BARRIER, shutdown_stream_barrier, NULL);
}
MGPU__ON_SHUTDOWN(barriers_shutdown, MGPU__LAYER_WORK)
