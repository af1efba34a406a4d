/* Channels: bounded, stream-ordered message queues from one device to
 * another.
 *
 * The slots live on the destination device, in one buffer of capacity *
 * msg_size bytes. Message k uses slot k % capacity. A send queues, on the
 * sender's stream: a wait for the slot's "consumed" event (the receive of
 * message k - capacity has copied it out), the copy into the slot, and a
 * record of the slot's "filled" event. A receive queues, on the receiver's
 * stream: a wait for "filled", the copy out of the slot, and a record of
 * "consumed". So neither host thread waits for the devices; the host blocks
 * only on counts: a sender while capacity messages are sent but not yet
 * received (issued), a receiver while nothing is sent.
 *
 * Events are reused slot after slot: a stream wait takes the event's state
 * when it is queued (as cudaStreamWaitEvent does), and each re-record comes
 * after the wait it must satisfy was queued, because of the counts above.
 *
 * Lifetime: a send or receive holds the channel's handle, and its buffer's
 * and stream's, from its lookup to its return (pinned together: chan_refs;
 * so a free of the source waits for a send that waits for room). Destroy
 * closes the handle, wakes the calls inside (they return MGPU_EFREED) and
 * waits for them to leave.
 *
 * Publishing: message k is published by a store of k + 1 into its slot's
 * cell (a line of its own, with the message's size and how it was copied
 * in), which receivers watch; the bytes of a small-path message of at most
 * CELL_BYTES ride in the cell too, so that the receiver's core fetches one
 * line per message. Receivers publish their count (received), which
 * senders watch for room.
 *
 * Small path: when the end's stream is idle and the slot is ready (its
 * previous message taken out, for a send; this message's copy in done, for
 * a receive), the calling thread copies the message itself, holding the
 * stream's device lock (mgpu__stream_lock_idle, up to 4 KiB) or a claim of
 * the stream (mgpu__stream_claim): in the same stream order as the queued
 * wait, copy and record, without handing anything to a worker. It records
 * no event: the copy is done before the message is published, so the other
 * side needs none. The cell says whether the copy in was queued, and each
 * slot whether its last copy out was (consumed_queued); only then does the
 * other side ask the event (a queued wait on an event that such a copy did
 * not record waits for an earlier message's, which is no less safe). A
 * receive that must queue its copy of a message carried in the cell first
 * puts the bytes into the slot (free: the sender wrote the cell only once
 * the slot's last copy out was done). The small path is taken only for
 * device buffers of host devices on a direct path or within one device (a
 * pair with peer access turned off keeps its host-staged copy); the
 * metrics count the copy as the copy layer would.
 *
 * Offer: a receive that finds no message, on host devices, offers its own
 * buffer while it watches (recv_offer: its turn taken, its stream claimed
 * so that the write keeps the stream's order), and a send of a message
 * that does not fit a cell takes the offer by compare and swap and copies
 * straight into that buffer (send_inline): one copy instead of two. The
 * offer is withdrawn before the watch could become a sleep.
 *
 * Locking: a turn serializes senders (messages keep the order of the send
 * calls), another receivers (send_turn, recv_turn: flags taken by compare
 * and swap, waited for on cond, so that a call waiting behind another ends
 * by its timeout, a destroy, a lost device or a free of its buffer like any
 * other wait; a mutex held by a sender blocked for room kept the next
 * sender past every limit). A call whose watch (the pair spin) saw room or
 * a message takes its turn and publishes without the lock (side_enter_fast,
 * side_leave); the lock is taken only to sleep on cond (turn_take,
 * side_wait), to wake a sleeper, and by close and destroy. A sleeper says
 * so (turn_waiters, send_parked, recv_parked) under the lock before it
 * checks what it waits for; a publisher stores the cell or count and the
 * turn first, then reads those: a sequentially consistent fence (or
 * read-modify-write) between the store and the load on both sides, so one
 * of the two sees the other, and a wake-up, sent under the lock, cannot
 * fall between a sleeper's check and its sleep. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan/chan-internal.h"
#include "copy/copy-internal.h"
#include "core/capture.h"
#include "core/core-internal.h"
#include "mgpu/chan.h"
#include "mgpu/copy.h"
#include "util/fault.h"

typedef struct slot {
  mgpu_event *filled;   /* on the source device */
  mgpu_event *consumed; /* on the destination device */
  /* Whether the slot's last message was copied out by queued operations,
   * whose event the sender must then ask before it writes the slot again;
   * 0 after a copy on the small path, which records no event (it was done
   * when the receiver published). Written by the receiver (only when it
   * changes: the sender reads it) before it publishes its count. */
  _Atomic int consumed_queued;
} slot;

/* What the receiver of a slot's message reads first, on a line of its
 * own, written by the sender only: the message's number, its size, how it
 * was copied in and, up to CELL_BYTES, the message itself. A receiver
 * watches the seq of the cell of its next message; so a small message
 * crosses from the sender's core to the receiver's as one line, where a
 * count on one line and the bytes on another took two (and the count's
 * line a third move, to be written again). */
#define CELL_BYTES 46
/* Where a message's bytes are. */
enum { IN_SLOT, IN_CELL, IN_DST };
typedef struct cell {
  _Atomic uint64_t seq; /* k + 1 once message k is published (release) */
  uint64_t size;        /* bytes of message k */
  /* 1: copied into the slot by queued operations (the receiver waits for
   * the slot's "filled" event); 0: done when published. */
  uint8_t queued;
  /* IN_SLOT; IN_CELL: the bytes are in payload (a small-path send of at
   * most CELL_BYTES); IN_DST: the sender wrote them into the buffer the
   * receiver offered (see offer). */
  uint8_t where;
  unsigned char payload[CELL_BYTES];
} cell;
_Static_assert(sizeof(cell) == 64, "a cell is one line");

/* The receivers' offer word: OFFERED(k) while the receiver of message k
 * offers its buffer, TAKEN(k) once a sender writes message k into it, 0
 * otherwise. */
#define OFFERED(k) (((k) + 1) * 2)
#define TAKEN(k) (((k) + 1) * 2 + 1)

typedef struct mgpu__channel {
  uintptr_t handle;
  int src_dev, dst_dev;
  size_t msg_size;
  int capacity;
  mgpu_buffer *slots_buf;
  mgpu__buf *slots_b; /* slots_buf resolved: the channel owns it */
  slot *slots;
  cell *cells; /* one a slot, 64-byte aligned */

  mgpu__mutex lock;
  mgpu__cond cond;
  _Atomic int turn_waiters; /* calls waiting for a turn (changed under lock) */
  _Atomic int closed;       /* set under lock */
  _Atomic int destroyed;    /* set under lock by destroy: the calls inside
                               leave */
  uint64_t sent_ns, received_ns; /* under lock: see side_leave */
  /* Each side's state on two lines of its own (128 bytes apart: a core
   * fetches lines in pairs), written by that side only (but for the
   * offer word, which a sender takes by compare and swap on the line it
   * reads for room anyway, only when a receiver offered). The first holds
   * what the other side never reads (the turn, the wait, the senders'
   * count); the second what it reads (the receivers' count, parked, the
   * CPU), the count written once a message, the rest only when it
   * changes: a line that the other side watches costs a miss at every
   * write to it, and lines written by both would move between the two
   * threads' cores at every message.
   *  - the turn (1: a sender, or a receiver, is inside), taken by compare
   *    and swap, so that senders keep the order of their calls and one
   *    receiver takes each message;
   *  - the count of messages published by senders (sent: receivers read
   *    the cells instead) or taken by receivers (received), moved with the
   *    turn held; sent is stored after the message's cell, so a receiver
   *    may take message k before sent says k + 1, but no sender reads it
   *    before the publisher gives the turn back;
   *  - whether a call of the side sleeps on cond (parked; set under lock
   *    before it checks what it waits for, so a side that publishes and
   *    then finds it clear needs no wake-up: a sequentially consistent
   *    fence between the store and the load on both sides);
   *  - the side's wait, a pair wait (mgpu__spin_pair_until: one sender
   *    waits for room and one receiver for a message, the turns let no
   *    second one in), and the CPU of its last call, a relaxed hint for
   *    the other side's wait;
   *  - on the receivers' second line, the offer (recv_offer). */
  char pad0[128];
  _Atomic int send_turn;
  mgpu__spin send_spin;
  _Atomic uint64_t sent;
  char pad1[128];
  _Atomic int send_parked;
  _Atomic int send_cpu; /* -1: none yet */
  char pad2[128];
  _Atomic int recv_turn;
  mgpu__spin recv_spin;
  char pad3[128];
  _Atomic uint64_t received;
  _Atomic int recv_parked;
  _Atomic int recv_cpu; /* -1: none yet */
  /* The receiver's offer (OFFERED, TAKEN; see recv_offer): the receiver
   * holding its turn stores where message k may go (offer_at), then
   * OFFERED(k); a sender that takes it swaps in TAKEN(k), the receiver
   * withdraws it by swapping in 0 or, once taken, stores 0. */
  _Atomic uint64_t offer;
  _Atomic(char *) offer_at;
  char pad4[128];
} mgpu__channel;

static void chan_free(mgpu__channel *ch) {
  if (ch->slots != NULL) {
    for (int i = 0; i < ch->capacity; i++) {
      if (ch->slots[i].filled) mgpu_event_destroy(ch->slots[i].filled);
      if (ch->slots[i].consumed) mgpu_event_destroy(ch->slots[i].consumed);
    }
    mgpu__free(ch->slots);
  }
  mgpu__free(ch->cells);
  if (ch->slots_buf != NULL) mgpu_free(ch->slots_buf);
  mgpu__free(ch);
}

/* Checks the arguments of mgpu_channel_create: two devices of one
 * backend, and slots that are not empty and fit in a size_t. */
static int create_check(int src_dev, int dst_dev, size_t msg_size,
                        int capacity) {
  mgpu__device *sd, *dd;
  int rc = mgpu__device_check(src_dev, &sd);
  if (rc == 0) rc = mgpu__device_check(dst_dev, &dd);
  if (rc != 0) return rc;
  if (sd->ops != dd->ops)
    return mgpu__error(MGPU_ENOTSUP,
                       "channel %d -> %d: device %d (%s) and device %d (%s) "
                       "are of different backends",
                       src_dev, dst_dev, src_dev, sd->ops->name, dst_dev,
                       dd->ops->name);
  if (msg_size == 0 || capacity < 1)
    return mgpu__error(MGPU_EINVAL,
                       "channel %d -> %d: message size %zu and capacity %d "
                       "must both be at least 1",
                       src_dev, dst_dev, msg_size, capacity);
  if (msg_size > SIZE_MAX / (size_t)capacity ||
      (size_t)capacity > SIZE_MAX / sizeof(cell))
    return mgpu__error(MGPU_ERANGE, "channel %d -> %d: %d slots of %zu bytes",
                       src_dev, dst_dev, capacity, msg_size);
  return 0;
}

int mgpu_channel_create(int src_dev, int dst_dev, size_t msg_size,
                        int capacity, mgpu_channel **chan) {
  if (chan == NULL) return mgpu__error(MGPU_EINVAL, "channel: NULL output");
  *chan = NULL;
  int rc = create_check(src_dev, dst_dev, msg_size, capacity);
  if (rc != 0) return rc;
  mgpu__channel *ch = mgpu__calloc(1, sizeof *ch);
  if (ch == NULL)
    return mgpu__error(MGPU_ENOMEM, "channel %d -> %d: out of host memory",
                       src_dev, dst_dev);
  ch->src_dev = src_dev;
  ch->dst_dev = dst_dev;
  ch->msg_size = msg_size;
  ch->capacity = capacity;
  atomic_store(&ch->send_cpu, -1);
  atomic_store(&ch->recv_cpu, -1);
  rc = mgpu_malloc(&ch->slots_buf, dst_dev, msg_size * (size_t)capacity);
  if (rc == 0) rc = mgpu__buf_get(ch->slots_buf, "channel slots", &ch->slots_b);
  if (rc != 0) goto fail;
  mgpu__buf_put(ch->slots_b); /* only the channel frees it */
  ch->slots = mgpu__calloc((size_t)capacity, sizeof *ch->slots);
  ch->cells = mgpu__aligned_alloc(64, (size_t)capacity * sizeof *ch->cells);
  if (ch->cells != NULL)
    memset(ch->cells, 0, (size_t)capacity * sizeof *ch->cells);
  if (ch->slots == NULL || ch->cells == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "channel %d -> %d: out of host memory for "
                     "%d slots", src_dev, dst_dev, capacity);
    goto fail;
  }
  for (int i = 0; i < capacity; i++) {
    rc = mgpu_event_create(&ch->slots[i].filled, src_dev);
    if (rc == 0) rc = mgpu_event_create(&ch->slots[i].consumed, dst_dev);
    if (rc != 0) goto fail;
  }
  mgpu__mutex_init(&ch->lock, MGPU__LOCK_CHANNEL);
  mgpu__cond_init(&ch->cond);
  uintptr_t h = mgpu__handle_new(MGPU__H_CHANNEL, ch);
  if (h == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "channel %d -> %d: too many open handles",
                     src_dev, dst_dev);
    goto fail_locks;
  }
  ch->handle = h;
  *chan = (mgpu_channel *)h;
  return 0;

fail_locks:
  mgpu__cond_destroy(&ch->cond);
  mgpu__mutex_destroy(&ch->lock);
fail:
  chan_free(ch);
  return rc;
}

static int chan_get(mgpu_channel *h, mgpu__channel **out) {
  int err = 0;
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_CHANNEL, "channel", &err);
  return *out ? 0 : err;
}

static void chan_put(mgpu_channel *h) { mgpu__handle_put((uintptr_t)h); }

static void chan_destroy(mgpu__channel *ch);

int mgpu_channel_destroy(mgpu_channel *chan) {
  int err = 0;
  mgpu__channel *ch =
      mgpu__handle_close((uintptr_t)chan, MGPU__H_CHANNEL, "channel", &err);
  if (ch == NULL) return err;
  chan_destroy(ch);
  return 0;
}

/* The rest of a destroy, once the handle is closed. */
static void chan_destroy(mgpu__channel *ch) {
  /* Wake the calls inside (waiting for room or for a message), then wait
   * for them to leave. */
  mgpu__mutex_lock(&ch->lock);
  ch->destroyed = 1;
  mgpu__cond_broadcast(&ch->cond);
  mgpu__mutex_unlock(&ch->lock);
  mgpu__handle_retire(ch->handle);
  /* The sends' copies run on the source device's streams: wait for them
   * before the slots go away (mgpu_free waits only for the destination). */
  for (int i = 0; i < ch->capacity; i++) {
    mgpu_event_synchronize(ch->slots[i].filled);
    mgpu_event_synchronize(ch->slots[i].consumed);
  }
  mgpu__cond_destroy(&ch->cond);
  mgpu__mutex_destroy(&ch->lock);
  chan_free(ch);
}

/* Shutdown: channels still open are destroyed, so their handles are
 * MGPU_EFREED afterwards (and after a new mgpu_init). */
static void shutdown_channel(void *obj, void *arg) {
  (void)arg;
  chan_destroy(obj);
}

static void channels_shutdown(void) {
  mgpu__handle_foreach(MGPU__H_CHANNEL, shutdown_channel, NULL);
}
MGPU__ON_SHUTDOWN(channels_shutdown, MGPU__LAYER_WORK)

int mgpu__chan_check(mgpu_channel *h, int send) {
  mgpu__channel *ch;
  int rc = chan_get(h, &ch);
  if (rc != 0) return rc;
  if (send && atomic_load(&ch->closed))
    rc = mgpu__error(MGPU_ECLOSED, "channel %d -> %d: closed", ch->src_dev,
                     ch->dst_dev);
  chan_put(h);
  return rc;
}

int mgpu_channel_close(mgpu_channel *chan) {
  mgpu__channel *ch;
  int rc = chan_get(chan, &ch);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&ch->lock);
  ch->closed = 1;
  mgpu__cond_broadcast(&ch->cond);
  mgpu__mutex_unlock(&ch->lock);
  chan_put(chan);
  return 0;
}

/* What one send or receive holds from its lookup to its return: the
 * channel, the call's buffer and its stream (a capturing stream too: the
 * call is then recorded, record.c). Pinned together where the thread's pin
 * record has room (mark >= 0): one exchange on a line of the calling
 * thread's own, where a use of each is a compare-and-swap on the handle's
 * slot word, and the channel's is written by the other end's thread too,
 * so that each call would move that line between the two threads' cores.
 * Held one by one otherwise (mark -1). */
typedef struct chan_refs {
  int mark;
  mgpu__channel *ch;
  mgpu__buf *b;
  mgpu__stream *s;
} chan_refs;

/* Looks the three handles up (what names the buffer argument). On failure
 * too the caller gives back what was taken with refs_put. */
static int refs_take(chan_refs *r, mgpu_channel *chan,
                     const mgpu_buffer *buf, const char *what,
                     mgpu_stream *stream) {
  uintptr_t h[3] = {(uintptr_t)chan, (uintptr_t)buf, (uintptr_t)stream};
  int rc = 0;
  r->ch = NULL;
  r->b = NULL;
  r->s = NULL;
  if ((r->mark = mgpu__handle_pin(h, 3)) < 0) {
    rc = chan_get(chan, &r->ch);
    if (rc == 0) rc = mgpu__buf_get(buf, what, &r->b);
    if (rc == 0) rc = mgpu__stream_get_capturing(stream, &r->s);
    return rc;
  }
  if ((r->ch = mgpu__handle_pinned(h[0], MGPU__H_CHANNEL, "channel",
                                   &rc)) != NULL &&
      (r->b = mgpu__handle_pinned(h[1], MGPU__H_BUFFER, what, &rc)) != NULL)
    r->s = mgpu__handle_pinned(h[2], MGPU__H_STREAM, "stream", &rc);
  return rc;
}

static void refs_put(chan_refs *r) {
  if (r->mark >= 0) {
    mgpu__handle_unpin(r->mark);
  } else {
    mgpu__stream_put(r->s);
    mgpu__buf_put(r->b);
    if (r->ch != NULL) mgpu__handle_put(r->ch->handle);
  }
  r->mark = -1;
  r->ch = NULL;
  r->b = NULL;
  r->s = NULL;
}

/* Checks the buffer and stream of one end (dev). */
static int check_end(const chan_refs *r, const char *what, int dev,
                     size_t offset, size_t size) {
  const mgpu__channel *ch = r->ch;
  if (r->b->dev != dev || r->s->dev != dev)
    return mgpu__error(MGPU_EWRONGDEV,
                       "channel %d -> %d: %s buffer on device %d and stream on "
                       "device %d; this end is device %d",
                       ch->src_dev, ch->dst_dev, what, r->b->dev, r->s->dev,
                       dev);
  return mgpu__buf_check_range(r->b, what, offset, size);
}

/* The error of a call woken by close or destroy. */
static int ended(const mgpu__channel *ch, int destroyed, const char *how) {
  if (destroyed)
    return mgpu__error(MGPU_EFREED, "channel %d -> %d: destroyed during the "
                       "call", ch->src_dev, ch->dst_dev);
  return mgpu__error(MGPU_ECLOSED, "channel %d -> %d: %s", ch->src_dev,
                     ch->dst_dev, how);
}

static int channel_send(const chan_refs *r, const mgpu_buffer *src,
                        size_t offset, size_t size, mgpu_stream *stream,
                        int timeout_ms);
static int channel_recv(const chan_refs *r, mgpu_buffer *dst, size_t offset,
                        size_t *size, mgpu_stream *stream, int timeout_ms);

/* A copy was queued but the event that publishes it could not be recorded:
 * the message is not sent (or not taken), and nothing may stay in flight
 * that a later destroy or free would not wait for. Waits for the stream,
 * keeping the first failure's code and detail. */
static void settle(mgpu_stream *stream, int rc, const char *what) {
  char detail[256];
  snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
  mgpu_stream_synchronize(stream);
  mgpu__error(rc, "%s (the message was not %s)", detail, what);
}

/* With ch->lock held: waits for a signal until the deadline (0: none), at
 * most LOST_POLL_NS at a time, setting *late once the deadline passed;
 * returns peer when that device was lost (it will never signal), else -1. */
#define LOST_POLL_NS 10000000u
static int wait_on(mgpu__channel *ch, int peer, uint64_t deadline,
                   int *late) {
  uint64_t until = mgpu__now_ns() + LOST_POLL_NS;
  if (deadline != 0 && deadline < until) until = deadline;
  mgpu__cond_timedwait(&ch->cond, &ch->lock, until);
  if (deadline != 0 && mgpu__now_ns() >= deadline) *late = 1;
  return mgpu__device_is_lost(peer) ? peer : -1;
}

/* A send waiting for room, or a receive waiting for a message, whose
 * buffer a free (on another thread) has begun to release: the call gives
 * up, nothing moved, and the free, which waits for the calls inside the
 * buffer, goes on. Waiting instead would keep the free waiting for a
 * receiver (or sender) that may be the very thread calling the free. */
static int freed_while_waiting(const mgpu__channel *ch, const char *call,
                               const char *arg, const mgpu_buffer *buf,
                               const char *waited_for) {
  return mgpu__error(MGPU_EFREED, "channel %d -> %d: %s buffer %p was freed "
                     "while the %s waited for %s; nothing was %s",
                     ch->src_dev, ch->dst_dev, arg, (const void *)buf, call,
                     waited_for, call[0] == 's' ? "sent" : "received");
}

static int peer_lost(const mgpu__channel *ch, int lost) {
  return mgpu__error(MGPU_EDEVLOST, "channel %d -> %d: device %d was lost",
                     ch->src_dev, ch->dst_dev, lost);
}

static int timed_out(const mgpu__channel *ch, const char *what, int timeout_ms,
                     int other_dev);

/* Takes a side's turn if it is free: 1 when it did. */
static int turn_try(_Atomic int *turn) {
  int expect = 0;
  return atomic_compare_exchange_strong(turn, &expect, 1);
}

/* Takes the turn of one side (turn: &ch->send_turn or &ch->recv_turn),
 * waiting behind the call inside as for room or a message: until the
 * deadline, a destroy, the loss of the other end (peer) or a free of the
 * call's buffer (bh; arg and buf name it). 0 with the turn, else the code
 * with its detail. */
static int turn_take(mgpu__channel *ch, _Atomic int *turn, int peer,
                     uint64_t deadline, int timeout_ms, uintptr_t bh,
                     const char *call, const char *arg,
                     const mgpu_buffer *buf) {
  int late = 0, lost = -1, freed = 0, got = 0;
  mgpu__mutex_lock(&ch->lock);
  atomic_fetch_add(&ch->turn_waiters, 1);
  while (!ch->destroyed && !late && lost < 0 &&
         !(freed = mgpu__handle_closing(bh)) && !(got = turn_try(turn)))
    lost = wait_on(ch, peer, deadline, &late);
  atomic_fetch_sub(&ch->turn_waiters, 1);
  int destroyed = ch->destroyed;
  mgpu__mutex_unlock(&ch->lock);
  if (got) return 0;
  if (destroyed) return ended(ch, 1, "destroyed");
  if (lost >= 0) return peer_lost(ch, lost);
  if (freed)
    return freed_while_waiting(ch, call, arg, buf,
                               call[0] == 's' ? "room" : "a message");
  return timed_out(ch, call[0] == 's' ? "no room (an earlier send still "
                   "waits for room)" : "no message (an earlier receive still "
                   "waits for one)", timeout_ms, peer);
}

/* Gives the turn back and wakes the calls waiting for it, if any. */
static void turn_give(mgpu__channel *ch, _Atomic int *turn) {
  atomic_store(turn, 0);
  /* A receiver of a closed channel waits for the sender inside (side_wait):
   * wake it too. */
  if (atomic_load(&ch->turn_waiters) > 0 || atomic_load(&ch->recv_parked)) {
    mgpu__mutex_lock(&ch->lock);
    mgpu__cond_broadcast(&ch->cond);
    mgpu__mutex_unlock(&ch->lock);
  }
}

/* Conditions a sender or receiver watches before it sleeps. */
static int has_room(const void *p) {
  const mgpu__channel *ch = p;
  return atomic_load_explicit(&ch->closed, memory_order_acquire) ||
         atomic_load_explicit(&ch->destroyed, memory_order_acquire) ||
         atomic_load_explicit(&ch->sent, memory_order_acquire) -
                 atomic_load_explicit(&ch->received, memory_order_acquire) <
             (uint64_t)ch->capacity;
}

/* The cell of message k. */
static cell *cell_of(const mgpu__channel *ch, uint64_t k) {
  return &ch->cells[k % (uint64_t)ch->capacity];
}

/* Whether the receivers' next message is published (acquire: its cell and
 * slot are then filled as the sender left them). */
static int message_there(const mgpu__channel *ch) {
  uint64_t k = atomic_load_explicit(&ch->received, memory_order_relaxed);
  return atomic_load_explicit(&cell_of(ch, k)->seq, memory_order_acquire) ==
         k + 1;
}

static int has_message(const void *p) {
  const mgpu__channel *ch = p;
  return atomic_load_explicit(&ch->closed, memory_order_acquire) ||
         atomic_load_explicit(&ch->destroyed, memory_order_acquire) ||
         message_there(ch);
}

/* Whether a side must wait: a sender while every slot holds a message not
 * yet received, a receiver while its next message is not published. The
 * counts move only with a side's turn held: with the turn, a blocked side
 * stays blocked until the other side publishes. */
static int side_blocked(const mgpu__channel *ch, int send) {
  return send ? ch->sent - ch->received == (uint64_t)ch->capacity
              : !message_there(ch);
}

/* The way in without the lock, for a side whose watch saw room (a sender)
 * or a message (a receiver): when its turn is free, the channel open and,
 * for a receiver, the source not lost, takes the turn and reads the number
 * of its message into *k. 1 when it did; 0, with nothing held, when the
 * call must take the full way (turn_take, then side_wait). */
static int side_enter_fast(mgpu__channel *ch, int send, uint64_t *k) {
  _Atomic int *turn = send ? &ch->send_turn : &ch->recv_turn;
  if (!turn_try(turn)) return 0;
  if (ch->closed || ch->destroyed || side_blocked(ch, send) ||
      (!send && mgpu__device_is_lost(ch->src_dev))) {
    turn_give(ch, turn);
    return 0;
  }
  *k = send ? ch->sent : ch->received;
  return 1;
}

/* The way out of a side, for message k: when published, a sender stores
 * k + 1 into the message's cell and then into sent, a receiver into
 * received (then its CPU, a hint for the other side's watch); then the
 * turn is given back. The lock is taken only to wake a sleeper: the other
 * side parked (told, under the lock, when this side published:
 * mgpu__spin_pair_answered), or a call waiting for the turn. */
static void side_leave(mgpu__channel *ch, int send, int published,
                       uint64_t k) {
  if (published) {
    if (send) {
      atomic_store_explicit(&cell_of(ch, k)->seq, k + 1, memory_order_release);
      atomic_store_explicit(&ch->sent, k + 1, memory_order_relaxed);
    } else {
      atomic_store_explicit(&ch->received, k + 1, memory_order_release);
    }
    /* The hint after the message: the other side waits for the message,
     * not for the hint. */
    _Atomic int *cpu = send ? &ch->send_cpu : &ch->recv_cpu;
    int now = mgpu__cpu_now();
    if (atomic_load_explicit(cpu, memory_order_relaxed) != now)
      atomic_store_explicit(cpu, now, memory_order_relaxed);
  }
  atomic_store_explicit(send ? &ch->send_turn : &ch->recv_turn, 0,
                        memory_order_release);
  /* One fence orders both stores before both loads below (a sleeper and
   * a call waiting for the turn each fence between their store and their
   * check: side_wait, turn_take), where a sequentially consistent store
   * each was two locked instructions on the way out of every call. */
  mgpu__fence_seq_cst();
  /* A sender that gives up wakes a receiver too: one of a closed channel
   * waits for the sender inside (sender_inside). */
  int other_parked = (published || send) &&
                     atomic_load(send ? &ch->recv_parked : &ch->send_parked);
  if (!other_parked && atomic_load(&ch->turn_waiters) == 0) return;
  mgpu__mutex_lock(&ch->lock);
  if (other_parked) *(send ? &ch->sent_ns : &ch->received_ns) = mgpu__now_ns();
  mgpu__cond_broadcast(&ch->cond);
  mgpu__mutex_unlock(&ch->lock);
}

/* The slots' device pointer at slot k's offset, when the small path may
 * copy by hand: device memory at both ends (host devices' device memory is
 * the caller's). NULL otherwise. */
static char *inline_slot(const mgpu__channel *ch, const mgpu__buf *user,
                         size_t slot_off) {
  if (user->kind != MGPU_MEM_DEVICE || ch->slots_b->kind != MGPU_MEM_DEVICE)
    return NULL;
  return (char *)ch->slots_b->ptr + slot_off;
}

/* Stores v into a slot word that the other side reads, only when it
 * changes: storing the same value again would still take the line out of
 * the reader's cache, a miss for each side at every message. */
static void store_changed(_Atomic int *w, int v) {
  if (atomic_load_explicit(w, memory_order_relaxed) != v)
    atomic_store_explicit(w, v, memory_order_relaxed);
}

/* Whether the other side's copy of a slot is done: at once when it ran on
 * the small path (queued is 0), else when its event (recorded after the
 * queued copy) completed. */
static int slot_done(const _Atomic int *queued, mgpu_event *event) {
  return !atomic_load_explicit(queued, memory_order_relaxed) ||
         mgpu_event_query(event) == 0;
}

/* Copies up to this many bytes with the device's lock held
 * (mgpu__stream_lock_idle: one try-lock), larger messages with the stream
 * claimed (two locks, the device free meanwhile), as the small
 * collectives do. */
#define LOCKED_COPY_MAX 4096

/* What a send or receive counts, once it has published: the copy of the
 * small path (as the copy layer counts its path: bytes and copies), then
 * the message. Counted after the publish, off the other side's wait. */
typedef struct chan_counts {
  mgpu__metric_inc inc[3];
  int n;
} chan_counts;

static void count(chan_counts *c, enum mgpu__metric m, uint64_t value) {
  c->inc[c->n].m = m;
  c->inc[c->n++].value = value;
}

/* Takes the idle stream s for a copy by hand of size bytes: 1 with its
 * device's lock held, 2 with the stream claimed, 0 when s is busy (nothing
 * taken). */
static int hand_take(mgpu__stream *s, size_t size) {
  if (size <= LOCKED_COPY_MAX && mgpu__stream_lock_idle(s)) return 1;
  return mgpu__stream_claim(s) ? 2 : 0;
}

static void hand_give(mgpu__stream *s, int how) {
  if (how == 1)
    mgpu__stream_unlock_idle(s);
  else
    mgpu__stream_release(s);
}

/* One small-path copy on the stream s when s is idle: size bytes from src
 * to dst, counted into c under bytes_m and n_m. Returns 1 when it ran, 0
 * when the stream was busy (nothing done). */
static int copy_by_hand(mgpu__stream *s, void *dst, const void *src,
                        size_t size, chan_counts *c, enum mgpu__metric bytes_m,
                        enum mgpu__metric n_m) {
  int how = hand_take(s, size);
  if (how == 0) return 0;
  memcpy(dst, src, size);
  hand_give(s, how);
  count(c, bytes_m, size);
  count(c, n_m, 1);
  return 1;
}

/* Takes the receiver's offer for message k of size bytes, if one stands
 * and the message does not fit its cell: where to write it, else NULL. */
static char *offer_take(mgpu__channel *ch, uint64_t k, size_t size) {
  uint64_t offered = OFFERED(k);
  if (size <= CELL_BYTES ||
      atomic_load_explicit(&ch->offer, memory_order_relaxed) != offered ||
      !atomic_compare_exchange_strong(&ch->offer, &offered, TAKEN(k)))
    return NULL;
  return atomic_load_explicit(&ch->offer_at, memory_order_relaxed);
}

/* The small path of a send; 1 when it ran, 0 when the queued path must.
 * A message of at most CELL_BYTES goes into its cell, a larger one into
 * the buffer its receiver offers (offer_take), else into its slot. */
static int send_inline(mgpu__channel *ch, slot *sl, cell *c, uint64_t k,
                       size_t slot_off, const mgpu__buf *b, size_t offset,
                       size_t size, mgpu__stream *s, chan_counts *counts) {
  char *dst = inline_slot(ch, b, slot_off);
  mgpu_copy_path path;
  if (dst == NULL) return 0;
  if (mgpu__peer_path(ch->src_dev, ch->dst_dev, &path) != 0) {
    mgpu_error_clear();
    return 0;
  }
  if (path != MGPU_PATH_DIRECT && path != MGPU_PATH_DEVICE) return 0;
  /* From the second round on, the slot's previous message must be out
   * before the slot is written (an offered buffer needs no slot). */
  int slot_free = k < (uint64_t)ch->capacity ||
                  slot_done(&sl->consumed_queued, sl->consumed);
  int offered = size > CELL_BYTES &&
                atomic_load_explicit(&ch->offer, memory_order_relaxed) ==
                    OFFERED(k);
  if (!slot_free && !offered) return 0;
  int how = hand_take(s, size); /* the stream first: a taken offer is kept */
  if (how == 0) return 0;
  char *to = offered ? offer_take(ch, k, size) : NULL;
  c->where = to != NULL ? IN_DST : size <= CELL_BYTES ? IN_CELL : IN_SLOT;
  if (to == NULL && !slot_free) {
    hand_give(s, how);
    return 0;
  }
  if (c->where == IN_CELL) to = (char *)c->payload;
  if (c->where == IN_SLOT) to = dst;
  /* memmove: a channel from a device to itself may send a buffer's bytes
   * into the same buffer's offered range. */
  memmove(to, (const char *)b->ptr + offset, size);
  hand_give(s, how);
  /* Counted as the copy layer counts the path. */
  int direct = path == MGPU_PATH_DIRECT;
  count(counts, direct ? MGPU__M_bytes_peer_direct : MGPU__M_bytes_d2d, size);
  count(counts, direct ? MGPU__M_copies_peer_direct : MGPU__M_copies_d2d, 1);
  return 1;
}

/* The small path of a receive of c's message; 1 when it ran, 0 when the
 * queued path must. */
static int recv_inline(mgpu__channel *ch, slot *sl, const cell *c,
                       size_t slot_off, const mgpu__buf *b, size_t offset,
                       mgpu__stream *s, chan_counts *counts) {
  char *src = inline_slot(ch, b, slot_off);
  if (src == NULL || (c->queued && mgpu_event_query(sl->filled) != 0))
    return 0;
  return copy_by_hand(s, (char *)b->ptr + offset,
                      c->where == IN_CELL ? (const char *)c->payload : src,
                      c->size,
                      counts, MGPU__M_bytes_d2d, MGPU__M_copies_d2d);
}

/* While tracing, the copies of message k are spans named name, and the
 * receive's wait for the send is an arrow named "chan". */
static int trace_tag(const char *name, const mgpu__channel *ch, uint64_t k,
                     size_t bytes) {
  if (!mgpu__trace_enabled()) return 0;
  mgpu__trace_arg a[] = {MGPU__TARG_I("bytes", bytes), MGPU__TARG_I("message", k),
                         MGPU__TARG_I("src_dev", ch->src_dev),
                         MGPU__TARG_I("dst_dev", ch->dst_dev)};
  return mgpu__trace_tag_push(name, a, 4);
}

/* The detail of a wait that ran out: the other end's device and its last
 * operations. */
static int timed_out(const mgpu__channel *ch, const char *what, int timeout_ms,
                     int other_dev) {
  char who[768];
  mgpu__flight_list(&other_dev, 1, who, sizeof who);
  return mgpu__error(MGPU_ETIMEDOUT, "channel %d -> %d: %s for %d ms; the "
                     "other end is %s", ch->src_dev, ch->dst_dev, what,
                     timeout_ms, who);
}

int mgpu_channel_send(mgpu_channel *chan, const mgpu_buffer *src,
                      size_t offset, size_t size, mgpu_stream *stream) {
  return mgpu_channel_send_timeout(chan, src, offset, size, stream, 0);
}

int mgpu_channel_send_timeout(mgpu_channel *chan, const mgpu_buffer *src,
                              size_t offset, size_t size, mgpu_stream *stream,
                              int timeout_ms) {
  chan_refs r;
  int rc = refs_take(&r, chan, src, "src", stream);
  if (rc == 0) rc = channel_send(&r, src, offset, size, stream, timeout_ms);
  refs_put(&r);
  return rc;
}

int mgpu_channel_recv(mgpu_channel *chan, mgpu_buffer *dst, size_t offset,
                      size_t *size, mgpu_stream *stream) {
  return mgpu_channel_recv_timeout(chan, dst, offset, size, stream, 0);
}

int mgpu_channel_recv_timeout(mgpu_channel *chan, mgpu_buffer *dst,
                              size_t offset, size_t *size,
                              mgpu_stream *stream, int timeout_ms) {
  chan_refs r;
  int rc = refs_take(&r, chan, dst, "dst", stream);
  if (rc == 0) rc = channel_recv(&r, dst, offset, size, stream, timeout_ms);
  refs_put(&r);
  return rc;
}

/* Ends the checks of a send or receive: the timeout too. */
static int check_timeout(const mgpu__channel *ch, int rc, int timeout_ms) {
  if (rc == 0 && timeout_ms < -1)
    rc = mgpu__error(MGPU_EINVAL, "channel %d -> %d: timeout %d ms",
                     ch->src_dev, ch->dst_dev, timeout_ms);
  return rc;
}

/* For a receiver (send 0): whether a sender holds its turn. A send that
 * took its turn before a close publishes its message after it: the
 * receiver waits for it rather than call the channel drained, which would
 * strand a message whose send returned 0. Its turn taken after the close,
 * a sender gives it back without publishing (side_enter_fast), and its
 * turn_give wakes the receiver. */
static int sender_inside(const mgpu__channel *ch, int send) {
  return !send && atomic_load(&ch->send_turn) != 0;
}

/* The one wait of both sides, holding the side's turn, after the watch
 * of side_enter (since: what it wrote, for mgpu__spin_pair_answered): a
 * sender for room, a receiver for a message (buf, whose resolved end is b,
 * names the call's buffer). 0 with the number of the message to send or
 * receive in *k, else the code that ends the call, with its detail. */
static int side_wait(mgpu__channel *ch, int send, const mgpu__buf *b,
                     const mgpu_buffer *buf, uint64_t deadline,
                     int timeout_ms, uint64_t since, uint64_t *k) {
  int other = send ? ch->dst_dev : ch->src_dev;
  mgpu__spin *spin = send ? &ch->send_spin : &ch->recv_spin;
  _Atomic int *parked_flag = send ? &ch->send_parked : &ch->recv_parked;
  /* A call here holds its side's turn (test
   * handles.channel_send_behind_another_ends waits for that). */
  mgpu__fault_stall("chan_wait");
  mgpu__mutex_lock(&ch->lock);
  int late = 0, parked = 0, freed = 0;
  /* Said before the first check: a publisher that misses it changed the
   * count before the check below reads it (the fence pairs with
   * side_leave's). */
  atomic_store(parked_flag, 1);
  mgpu__fence_seq_cst();
  /* Room comes from the receiver: it never comes from a lost device. A
   * lost source sends nothing more, and what it sent may not have been
   * copied: the receive fails rather than hand over such a message. A
   * free of the call's buffer gives up the wait (see freed_while_waiting). */
  int lost = !send && mgpu__device_is_lost(ch->src_dev) ? ch->src_dev : -1;
  while ((!ch->closed || sender_inside(ch, send)) && !ch->destroyed &&
         side_blocked(ch, send) && lost < 0 && !late &&
         !(freed = mgpu__handle_closing(b->handle))) {
    parked = 1;
    lost = wait_on(ch, other, deadline, &late);
  }
  atomic_store(parked_flag, 0);
  int blocked = side_blocked(ch, send);
  int closed = ch->closed, destroyed = ch->destroyed;
  int open = blocked && (!closed || sender_inside(ch, send)) && !destroyed;
  *k = send ? ch->sent : ch->received;
  uint64_t answered = send ? ch->received_ns : ch->sent_ns;
  mgpu__mutex_unlock(&ch->lock);
  if (parked) mgpu__spin_pair_answered(spin, since, answered);
  /* A close ends a send at once; a receive drains what was sent first. */
  if (lost >= 0 && !destroyed && !(send && closed)) return peer_lost(ch, lost);
  if (freed && open)
    return send ? freed_while_waiting(ch, "send", "src", buf, "room")
                : freed_while_waiting(ch, "receive", "dst", buf, "a message");
  if (late && open)
    return timed_out(ch, send ? "no room (every slot holds a message not "
                     "yet received)" : "no message", timeout_ms, other);
  if (send ? closed || destroyed : blocked || destroyed)
    return ended(ch, destroyed, send ? "closed" : "closed and drained");
  return 0;
}

/* The flight record of a call, made once it is known whether the call
 * waits: before the wait where it does (what another end's timeout names),
 * else after the publish (off the other side's wait). */
typedef struct flight_note {
  int dev;
  const char *op; /* NULL once recorded */
  uint64_t bytes;
  uintptr_t stream;
} flight_note;

static void flight_note_record(flight_note *n) {
  if (n->op != NULL) mgpu__flight_record(n->dev, n->op, n->bytes, n->stream);
  n->op = NULL;
}

/* Watches for room (a sender) or a message (a receiver) a while, then
 * takes the side's turn: without the lock where the watch saw it ready
 * (side_enter_fast), else, the call recorded (note), by turn_take and the
 * wait of side_wait. On failure gives back the turn. */
static int side_enter(mgpu__channel *ch, int send, const mgpu__buf *b,
                      const mgpu_buffer *buf, int timeout_ms,
                      flight_note *note, uint64_t *k) {
  uint64_t since;
  if (mgpu__spin_pair_until(send ? &ch->send_spin : &ch->recv_spin,
                            send ? has_room : has_message, ch,
                            send ? &ch->recv_cpu : &ch->send_cpu, 0,
                            &since) &&
      side_enter_fast(ch, send, k))
    return 0;
  flight_note_record(note);
  /* The deadline counts from here, a watch (at most 64 us) after the
   * call: waiting behind another sender is part of the wait. */
  uint64_t deadline = mgpu__deadline(timeout_ms);
  int rc = send ? turn_take(ch, &ch->send_turn, ch->dst_dev, deadline,
                            timeout_ms, b->handle, "send", "src", buf)
                : turn_take(ch, &ch->recv_turn, ch->src_dev, deadline,
                            timeout_ms, b->handle, "receive", "dst", buf);
  if (rc == 0) {
    rc = side_wait(ch, send, b, buf, deadline, timeout_ms, since, k);
    if (rc == 0) return 0;
    turn_give(ch, send ? &ch->send_turn : &ch->recv_turn);
  }
  return rc;
}

/* A receive's offer (see the top): what recv_offer did. */
enum {
  OFFER_NONE,      /* made none: nothing held */
  OFFER_DELIVERED, /* the turn held, message k is in the offered buffer */
  OFFER_MESSAGE,   /* the turn held, message k is published as usual */
  OFFER_WAIT       /* the turn held, no message yet: wait (side_wait) */
};

/* Whether a receive into b at offset may offer its buffer: messages that
 * may not fit a cell, memory of a host device at both ends (the claim of
 * the stream says whose), the range whole, no trace (whose spans are of
 * the queued copies). */
static int offer_fits(const mgpu__channel *ch, const mgpu__buf *b,
                      size_t offset) {
  return ch->msg_size > CELL_BYTES && b->kind == MGPU_MEM_DEVICE &&
         ch->slots_b->kind == MGPU_MEM_DEVICE && offset <= b->size &&
         ch->msg_size <= b->size - offset && !mgpu__trace_enabled();
}

/* A receive that finds no message offers its buffer to the sender, which
 * then writes the message there: one copy, not one into the slot and one
 * out. It takes its turn and claims its stream (so that the write is in
 * the stream's order, as the copy out would be) and stores the offer, then
 * watches for the message; it withdraws the offer before it could sleep,
 * so a sender writes only into the buffer of a call that is watching, and
 * a free of the buffer or a destroy waits at most for the watch. The
 * claim is given back before the return. */
static int recv_offer(mgpu__channel *ch, const chan_refs *r, size_t offset,
                      uint64_t *since, uint64_t *k) {
  if (has_message(ch) || !turn_try(&ch->recv_turn)) return OFFER_NONE;
  if (ch->closed || ch->destroyed || !side_blocked(ch, 0) ||
      mgpu__device_is_lost(ch->src_dev) || !mgpu__stream_claim(r->s)) {
    turn_give(ch, &ch->recv_turn);
    return OFFER_NONE;
  }
  *k = ch->received;
  atomic_store_explicit(&ch->offer_at, (char *)r->b->ptr + offset,
                        memory_order_relaxed);
  atomic_store_explicit(&ch->offer, OFFERED(*k), memory_order_release);
  mgpu__fault_stall("chan_offered"); /* test chan.offered_buffer */
  int seen = mgpu__spin_pair_until(&ch->recv_spin, has_message, ch,
                                   &ch->send_cpu, 0, since);
  int there = seen && message_there(ch);
  int taken;
  if (there && cell_of(ch, *k)->where == IN_DST) {
    taken = 1; /* the sender took the offer before it wrote */
  } else {
    uint64_t offered = OFFERED(*k);
    taken = !atomic_compare_exchange_strong(&ch->offer, &offered, 0);
    /* Taken meanwhile: the sender is writing, its message follows. */
    while (taken && !message_there(ch)) sched_yield();
  }
  if (taken) atomic_store_explicit(&ch->offer, 0, memory_order_relaxed);
  mgpu__stream_release(r->s);
  /* A message written into the buffer is handed over whatever happened
   * since (the sender took the offer before any close, and the bytes are
   * there): the call leaves no output changed and failed. */
  if (taken) return OFFER_DELIVERED;
  return there && !ch->closed && !ch->destroyed &&
                 !mgpu__device_is_lost(ch->src_dev)
             ? OFFER_MESSAGE
             : OFFER_WAIT;
}

/* A checked call on a capturing stream, recorded into its graph. */
static int recorded(const chan_refs *r, int send, mgpu_buffer *buf,
                    size_t offset, size_t size, int timeout_ms) {
  const mgpu__channel *ch = r->ch;
  mgpu__chan_call call = {(mgpu_channel *)ch->handle, ch->src_dev,
                          ch->dst_dev, ch->capacity, send, buf, offset, size,
                          timeout_ms};
  return mgpu__chan_record(&call, r->s);
}

/* Queues (or, on the small path, does) the copy of message k into its
 * slot and the record of the slot's "filled" event. */
static int send_copy(mgpu__channel *ch, uint64_t k, mgpu__buf *b,
                     size_t offset, size_t size, mgpu__stream *s,
                     mgpu_stream *stream, chan_counts *counts) {
  int rc = 0;
  slot *sl = &ch->slots[k % (uint64_t)ch->capacity];
  cell *c = cell_of(ch, k);
  size_t slot_off = (size_t)(k % (uint64_t)ch->capacity) * ch->msg_size;
  /* While tracing, the queued operations are what the trace shows. */
  int pushed = trace_tag("chan.send", ch, k, size);
  c->queued = 0;
  if (pushed || mgpu__trace_enabled() ||
      !send_inline(ch, sl, c, k, slot_off, b, offset, size, s, counts)) {
    c->where = IN_SLOT;
    /* From the second round on, the slot's previous message must be
     * copied out first. */
    if (k >= (uint64_t)ch->capacity)
      rc = mgpu_stream_wait_event(stream, sl->consumed);
    /* The copy layer picks the path: direct where peer access is on for
     * the pair, host-staged where it is off (mgpu_peer_disable). */
    if (rc == 0)
      rc = mgpu__copy_async(ch->slots_b, slot_off, b, offset, size, s);
    if (rc == 0) {
      rc = mgpu_event_record(sl->filled, stream);
      if (rc != 0) settle(stream, rc, "sent");
    }
    c->queued = 1;
  }
  mgpu__trace_tag_pop(pushed);
  c->size = size;
  return rc;
}

static int channel_send(const chan_refs *r, const mgpu_buffer *src,
                        size_t offset, size_t size, mgpu_stream *stream,
                        int timeout_ms) {
  mgpu__channel *ch = r->ch;
  /* The receivers' count, which the watch for room reads first, was
   * written on the other end's core: fetched while the checks run. */
  __builtin_prefetch((const void *)&ch->received);
  int rc = check_end(r, "src", ch->src_dev, offset, size);
  if (rc == 0 && (size == 0 || size > ch->msg_size))
    rc = mgpu__error(MGPU_ERANGE,
                     "channel %d -> %d: message of %zu bytes (1 to %zu)",
                     ch->src_dev, ch->dst_dev, size, ch->msg_size);
  if ((rc = check_timeout(ch, rc, timeout_ms)) != 0) return rc;
  if (mgpu__stream_capture(r->s) != NULL)
    return recorded(r, 1, (mgpu_buffer *)src, offset, size, timeout_ms);
  timeout_ms = mgpu__timeout_ms(timeout_ms);
  flight_note note = {ch->src_dev, "channel_send", size, (uintptr_t)stream};
  uint64_t k;
  if ((rc = side_enter(ch, 1, r->b, src, timeout_ms, &note, &k)) != 0)
    return rc;
  mgpu__fault_stall("chan_send_inside"); /* test chan.close_while_sending */
  chan_counts counts = {.n = 0};
  rc = send_copy(ch, k, r->b, offset, size, r->s, stream, &counts);
  side_leave(ch, 1, rc == 0, k);
  flight_note_record(&note);
  if (rc == 0) count(&counts, MGPU__M_chan_msgs_sent, 1);
  mgpu__metrics_add(ch->src_dev, counts.inc, counts.n);
  return rc;
}

/* Queues (or, on the small path, does) the copy of message k out of its
 * slot and the record of the slot's "consumed" event; *n is its size. */
static int recv_copy(mgpu__channel *ch, uint64_t k, mgpu__buf *b,
                     size_t offset, size_t *n, mgpu__stream *s,
                     mgpu_stream *stream, chan_counts *counts) {
  int rc = 0;
  slot *sl = &ch->slots[k % (uint64_t)ch->capacity];
  const cell *c = cell_of(ch, k);
  size_t slot_off = (size_t)(k % (uint64_t)ch->capacity) * ch->msg_size;
  *n = c->size;
  int pushed = trace_tag("chan.recv", ch, k, *n);
  if (pushed || mgpu__trace_enabled() ||
      !recv_inline(ch, sl, c, slot_off, b, offset, s, counts)) {
    /* The queued copy reads the slot: a message in its cell goes there
     * first (the sender wrote it there only once the slot's previous
     * message was out of it). */
    if (c->where == IN_CELL)
      memcpy((char *)ch->slots_b->ptr + slot_off, c->payload, *n);
    rc = mgpu_stream_wait_event(stream, sl->filled);
    if (rc == 0)
      rc = mgpu__copy_async(b, offset, ch->slots_b, slot_off, *n, s);
    if (rc == 0) {
      rc = mgpu_event_record(sl->consumed, stream);
      if (rc != 0) settle(stream, rc, "taken");
    }
    if (rc == 0) store_changed(&sl->consumed_queued, 1);
  } else {
    store_changed(&sl->consumed_queued, 0);
  }
  mgpu__trace_tag_pop(pushed);
  return rc;
}

static int channel_recv(const chan_refs *r, mgpu_buffer *dst, size_t offset,
                        size_t *size, mgpu_stream *stream, int timeout_ms) {
  mgpu__channel *ch = r->ch;
  /* The range of dst is checked once a message is there: the call that
   * finds the channel closed and drained is MGPU_ECLOSED whatever its
   * offset, so a loop that advances its offset per message ends cleanly. */
  int rc = check_end(r, "dst", ch->dst_dev, 0, 0);
  if (rc == 0) rc = mgpu__buf_check_writable(r->b, "mgpu_channel_recv dst");
  if (rc == 0 && mgpu__stream_capture(r->s) != NULL)
    rc = mgpu__buf_check_range(r->b, "dst", offset, ch->msg_size);
  if ((rc = check_timeout(ch, rc, timeout_ms)) != 0) return rc;
  if (mgpu__stream_capture(r->s) != NULL)
    return recorded(r, 0, dst, offset, ch->msg_size, timeout_ms);
  timeout_ms = mgpu__timeout_ms(timeout_ms);
  /* Recorded before the watch: a receiver mostly waits. */
  flight_note note = {ch->dst_dev, "channel_recv", ch->msg_size,
                      (uintptr_t)stream};
  flight_note_record(&note);
  uint64_t k, since = 0;
  int how = offer_fits(ch, r->b, offset) ? recv_offer(ch, r, offset, &since, &k)
                                         : OFFER_NONE;
  if (how == OFFER_NONE) {
    rc = side_enter(ch, 0, r->b, dst, timeout_ms, &note, &k);
  } else if (how == OFFER_WAIT) {
    rc = side_wait(ch, 0, r->b, dst, mgpu__deadline(timeout_ms), timeout_ms,
                   since, &k);
    if (rc != 0) turn_give(ch, &ch->recv_turn);
  }
  if (rc != 0) return rc;
  size_t n = cell_of(ch, k)->size;
  chan_counts counts = {.n = 0};
  if (how != OFFER_DELIVERED) {
    /* A bad range leaves the message in place for the next call. */
    rc = mgpu__buf_check_range(r->b, "dst", offset, ch->msg_size);
    if (rc == 0)
      rc = recv_copy(ch, k, r->b, offset, &n, r->s, stream, &counts);
  }
  side_leave(ch, 0, rc == 0, k);
  if (rc == 0) {
    count(&counts, MGPU__M_chan_msgs_received, 1);
    if (size != NULL) *size = n;
  }
  mgpu__metrics_add(ch->dst_dev, counts.inc, counts.n);
  return rc;
}
