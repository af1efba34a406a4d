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
 * Small path: when the end's stream is idle and the slot is ready (the
 * "consumed" event of its previous message complete for a send, "filled"
 * for a receive), the calling thread claims the stream, copies the message
 * itself and completes the event at once (mgpu__stream_claim,
 * mgpu__event_record_claimed): exactly what the three queued operations
 * would have done, in the same stream order, without handing anything to
 * a worker. It is taken only for device buffers of host devices on a
 * direct path (a pair with peer access turned off keeps its host-staged
 * copy); the metrics count the copy as the copy layer would.
 *
 * Locking: send_lock serializes senders (messages keep the order of the send
 * calls), recv_lock serializes receivers; lock guards the counts, closed and
 * users. Lock order: send_lock or recv_lock, then lock. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mgpu/chan.h"
#include "mgpu/copy.h"

typedef struct slot {
  mgpu_event *filled;   /* on the source device */
  mgpu_event *consumed; /* on the destination device */
  size_t size;          /* bytes of the message in it (written by the sender
                           before it publishes the message under lock) */
} slot;

typedef struct mgpu__channel {
  int src_dev, dst_dev;
  size_t msg_size;
  int capacity;
  mgpu_buffer *slots_buf;
  slot *slots;

  mgpu__mutex send_lock, recv_lock;
  mgpu__mutex lock;
  mgpu__cond cond;
  /* Written under lock; read without it by a thread that watches for room
   * or a message before it sleeps on cond. */
  _Atomic uint64_t sent;     /* messages published by senders */
  _Atomic uint64_t received; /* messages taken by receivers */
  _Atomic int closed;
  mgpu__spin spin;
  int users;         /* threads inside send or recv */
} mgpu__channel;

static void chan_free(mgpu__channel *ch) {
  if (ch->slots != NULL) {
    for (int i = 0; i < ch->capacity; i++) {
      if (ch->slots[i].filled) mgpu_event_destroy(ch->slots[i].filled);
      if (ch->slots[i].consumed) mgpu_event_destroy(ch->slots[i].consumed);
    }
    free(ch->slots);
  }
  if (ch->slots_buf != NULL) mgpu_free(ch->slots_buf);
  free(ch);
}

int mgpu_channel_create(int src_dev, int dst_dev, size_t msg_size,
                        int capacity, mgpu_channel **chan) {
  if (chan == NULL) return mgpu__error(MGPU_EINVAL, "channel: NULL output");
  *chan = NULL;
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
  if (msg_size > SIZE_MAX / (size_t)capacity)
    return mgpu__error(MGPU_ERANGE, "channel %d -> %d: %d slots of %zu bytes",
                       src_dev, dst_dev, capacity, msg_size);
  mgpu__channel *ch = calloc(1, sizeof *ch);
  if (ch == NULL) return mgpu__error(MGPU_ENOMEM, "channel: out of memory");
  ch->src_dev = src_dev;
  ch->dst_dev = dst_dev;
  ch->msg_size = msg_size;
  ch->capacity = capacity;
  rc = mgpu_malloc(&ch->slots_buf, dst_dev, msg_size * (size_t)capacity);
  if (rc != 0) goto fail;
  ch->slots = calloc((size_t)capacity, sizeof *ch->slots);
  if (ch->slots == NULL) {
    rc = mgpu__error(MGPU_ENOMEM, "channel: out of memory");
    goto fail;
  }
  for (int i = 0; i < capacity; i++) {
    rc = mgpu_event_create(&ch->slots[i].filled, src_dev);
    if (rc == 0) rc = mgpu_event_create(&ch->slots[i].consumed, dst_dev);
    if (rc != 0) goto fail;
  }
  mgpu__mutex_init(&ch->send_lock);
  mgpu__mutex_init(&ch->recv_lock);
  mgpu__mutex_init(&ch->lock);
  mgpu__cond_init(&ch->cond);
  uintptr_t h = mgpu__handle_new(MGPU__H_CHANNEL, ch);
  if (h == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "channel: too many open handles");
    goto fail_locks;
  }
  *chan = (mgpu_channel *)h;
  return 0;

fail_locks:
  mgpu__cond_destroy(&ch->cond);
  mgpu__mutex_destroy(&ch->lock);
  mgpu__mutex_destroy(&ch->recv_lock);
  mgpu__mutex_destroy(&ch->send_lock);
fail:
  chan_free(ch);
  return rc;
}

static int chan_get(mgpu_channel *h, mgpu__channel **out) {
  int err = 0;
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_CHANNEL, "channel", &err);
  return *out ? 0 : err;
}

int mgpu_channel_destroy(mgpu_channel *chan) {
  mgpu__channel *ch;
  int rc = chan_get(chan, &ch);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&ch->lock);
  int users = ch->users;
  mgpu__mutex_unlock(&ch->lock);
  if (users > 0)
    return mgpu__error(MGPU_EAGAIN,
                       "channel %d -> %d: %d thread(s) still send or receive",
                       ch->src_dev, ch->dst_dev, users);
  int err = 0;
  if (mgpu__handle_release((uintptr_t)chan, MGPU__H_CHANNEL, "channel",
                        &err) == NULL)
    return err;
  /* The sends' copies run on the source device's streams: wait for them
   * before the slots go away (mgpu_free waits only for the destination). */
  for (int i = 0; i < ch->capacity; i++) {
    mgpu_event_synchronize(ch->slots[i].filled);
    mgpu_event_synchronize(ch->slots[i].consumed);
  }
  mgpu__cond_destroy(&ch->cond);
  mgpu__mutex_destroy(&ch->lock);
  mgpu__mutex_destroy(&ch->recv_lock);
  mgpu__mutex_destroy(&ch->send_lock);
  chan_free(ch);
  return 0;
}

int mgpu_channel_close(mgpu_channel *chan) {
  mgpu__channel *ch;
  int rc = chan_get(chan, &ch);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&ch->lock);
  ch->closed = 1;
  mgpu__cond_broadcast(&ch->cond);
  mgpu__mutex_unlock(&ch->lock);
  return 0;
}

/* Checks a buffer and stream pair of one end. */
static int check_end(const mgpu__channel *ch, const char *what, int dev,
                     const mgpu_buffer *buf, size_t offset, size_t size,
                     mgpu_stream *stream, mgpu__buf **b, mgpu__stream **s) {
  int rc = mgpu__buf_get(buf, what, b);
  if (rc == 0) rc = mgpu__stream_get(stream, s);
  if (rc != 0) return rc;
  if ((*b)->dev != dev || (*s)->dev != dev)
    return mgpu__error(MGPU_EWRONGDEV,
                       "channel %d -> %d: %s buffer on device %d and stream on "
                       "device %d; this end is device %d",
                       ch->src_dev, ch->dst_dev, what, (*b)->dev, (*s)->dev,
                       dev);
  return mgpu__buf_check_range(*b, what, offset, size);
}

/* Enter/leave: count the threads inside, so destroy can refuse. */
static void enter(mgpu__channel *ch) {
  mgpu__mutex_lock(&ch->lock);
  ch->users++;
  mgpu__mutex_unlock(&ch->lock);
}

static void leave(mgpu__channel *ch) {
  mgpu__mutex_lock(&ch->lock);
  ch->users--;
  mgpu__mutex_unlock(&ch->lock);
}

/* Conditions a sender or receiver watches before it sleeps. */
static int has_room(const void *p) {
  const mgpu__channel *ch = p;
  return atomic_load_explicit(&ch->closed, memory_order_acquire) ||
         atomic_load_explicit(&ch->sent, memory_order_acquire) -
                 atomic_load_explicit(&ch->received, memory_order_acquire) <
             (uint64_t)ch->capacity;
}

static int has_message(const void *p) {
  const mgpu__channel *ch = p;
  return atomic_load_explicit(&ch->closed, memory_order_acquire) ||
         atomic_load_explicit(&ch->received, memory_order_acquire) !=
             atomic_load_explicit(&ch->sent, memory_order_acquire);
}

/* The slots' device pointer at slot k's offset, when the small path may
 * copy by hand: device memory at both ends (host devices' device memory is
 * the caller's). NULL otherwise. */
static char *inline_slot(const mgpu__channel *ch, const mgpu__buf *user,
                         size_t slot_off) {
  mgpu__buf *slots;
  if (user->kind != MGPU_MEM_DEVICE ||
      mgpu__buf_get(ch->slots_buf, "slots", &slots) != 0 ||
      slots->kind != MGPU_MEM_DEVICE)
    return NULL;
  return (char *)slots->ptr + slot_off;
}

/* One small-path copy on the claimed stream s, when ready (the slot's
 * other event complete): size bytes from src to dst, then done completes;
 * the stream is released and the copy counted under bytes_m and n_m of
 * dev. Returns 1 when it ran. */
static int copy_claimed(mgpu__stream *s, int ready, void *dst, const void *src,
                        size_t size, mgpu__event *done, int dev,
                        enum mgpu__metric bytes_m, enum mgpu__metric n_m) {
  int ran = 0;
  if (ready) {
    memcpy(dst, src, size);
    ran = mgpu__event_record_claimed(done, s) == 0;
  }
  mgpu__stream_release(s);
  mgpu_error_clear();
  if (ran) {
    mgpu__metric_add(dev, bytes_m, size);
    mgpu__metric_add(dev, n_m, 1);
  }
  return ran;
}

/* The small path of a send; 1 when it ran, 0 when the queued path must. */
static int send_inline(mgpu__channel *ch, slot *sl, uint64_t k,
                       size_t slot_off, const mgpu__buf *b, size_t offset,
                       size_t size, mgpu__stream *s) {
  char *dst = inline_slot(ch, b, slot_off);
  mgpu_copy_path path;
  mgpu__event *filled;
  if (dst == NULL || mgpu__event_get(sl->filled, &filled) != 0 ||
      mgpu_copy_path_get(ch->src_dev, ch->dst_dev, &path) != 0 ||
      path != MGPU_PATH_DIRECT || !mgpu__stream_claim(s)) {
    mgpu_error_clear();
    return 0;
  }
  int ready = k < (uint64_t)ch->capacity || mgpu_event_query(sl->consumed) == 0;
  return copy_claimed(s, ready, dst, (const char *)b->ptr + offset, size,
                      filled, ch->src_dev, MGPU__M_bytes_peer_direct,
                      MGPU__M_copies_peer_direct);
}

/* The small path of a receive; 1 when it ran, 0 when the queued path must. */
static int recv_inline(mgpu__channel *ch, slot *sl, size_t slot_off,
                       const mgpu__buf *b, size_t offset, size_t n,
                       mgpu__stream *s) {
  char *src = inline_slot(ch, b, slot_off);
  mgpu__event *consumed;
  if (src == NULL || mgpu__event_get(sl->consumed, &consumed) != 0 ||
      !mgpu__stream_claim(s)) {
    mgpu_error_clear();
    return 0;
  }
  return copy_claimed(s, mgpu_event_query(sl->filled) == 0,
                      (char *)b->ptr + offset, src, n, consumed, ch->dst_dev,
                      MGPU__M_bytes_d2d, MGPU__M_copies_d2d);
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

int mgpu_channel_send(mgpu_channel *chan, const mgpu_buffer *src,
                      size_t offset, size_t size, mgpu_stream *stream) {
  mgpu__channel *ch;
  int rc = chan_get(chan, &ch);
  if (rc != 0) return rc;
  mgpu__buf *b;
  mgpu__stream *s;
  rc = check_end(ch, "src", ch->src_dev, src, offset, size, stream, &b, &s);
  if (rc != 0) return rc;
  if (size == 0 || size > ch->msg_size)
    return mgpu__error(MGPU_ERANGE,
                       "channel %d -> %d: message of %zu bytes (1 to %zu)",
                       ch->src_dev, ch->dst_dev, size, ch->msg_size);
  enter(ch);
  mgpu__mutex_lock(&ch->send_lock);
  mgpu__spin_until(&ch->spin, has_room, ch);
  mgpu__mutex_lock(&ch->lock);
  while (!ch->closed && ch->sent - ch->received == (uint64_t)ch->capacity)
    mgpu__cond_wait(&ch->cond, &ch->lock);
  int closed = ch->closed;
  uint64_t k = ch->sent;
  mgpu__mutex_unlock(&ch->lock);
  if (closed) {
    rc = mgpu__error(MGPU_ECLOSED, "channel %d -> %d: closed", ch->src_dev,
                     ch->dst_dev);
    goto out;
  }
  slot *sl = &ch->slots[k % (uint64_t)ch->capacity];
  size_t slot_off = (size_t)(k % (uint64_t)ch->capacity) * ch->msg_size;
  /* While tracing, the queued operations are what the trace shows. */
  int pushed = trace_tag("chan.send", ch, k, size);
  if (pushed || mgpu__trace_enabled() ||
      !send_inline(ch, sl, k, slot_off, b, offset, size, s)) {
    /* From the second round on, the slot's previous message must be
     * copied out first. */
    if (k >= (uint64_t)ch->capacity)
      rc = mgpu_stream_wait_event(stream, sl->consumed);
    /* The copy layer picks the path: direct where peer access is on for
     * the pair, host-staged where it is off (mgpu_peer_disable). */
    if (rc == 0)
      rc = mgpu_memcpy_async(ch->slots_buf, slot_off, src, offset, size,
                             stream);
    if (rc == 0) rc = mgpu_event_record(sl->filled, stream);
  }
  mgpu__trace_tag_pop(pushed);
  if (rc == 0) {
    sl->size = size;
    mgpu__mutex_lock(&ch->lock);
    ch->sent++;
    mgpu__cond_broadcast(&ch->cond);
    mgpu__mutex_unlock(&ch->lock);
    mgpu__metric_add(ch->src_dev, MGPU__M_chan_msgs_sent, 1);
  }
out:
  mgpu__mutex_unlock(&ch->send_lock);
  leave(ch);
  return rc;
}

int mgpu_channel_recv(mgpu_channel *chan, mgpu_buffer *dst, size_t offset,
                      size_t *size, mgpu_stream *stream) {
  mgpu__channel *ch;
  int rc = chan_get(chan, &ch);
  if (rc != 0) return rc;
  mgpu__buf *b;
  mgpu__stream *s;
  rc = check_end(ch, "dst", ch->dst_dev, dst, offset, ch->msg_size, stream,
                 &b, &s);
  if (rc != 0) return rc;
  enter(ch);
  mgpu__mutex_lock(&ch->recv_lock);
  mgpu__spin_until(&ch->spin, has_message, ch);
  mgpu__mutex_lock(&ch->lock);
  while (!ch->closed && ch->received == ch->sent)
    mgpu__cond_wait(&ch->cond, &ch->lock);
  int drained = ch->received == ch->sent;
  uint64_t k = ch->received;
  mgpu__mutex_unlock(&ch->lock);
  if (drained) {
    rc = mgpu__error(MGPU_ECLOSED, "channel %d -> %d: closed and drained",
                     ch->src_dev, ch->dst_dev);
    goto out;
  }
  slot *sl = &ch->slots[k % (uint64_t)ch->capacity];
  size_t slot_off = (size_t)(k % (uint64_t)ch->capacity) * ch->msg_size;
  size_t n = sl->size;
  int pushed = trace_tag("chan.recv", ch, k, n);
  if (pushed || mgpu__trace_enabled() ||
      !recv_inline(ch, sl, slot_off, b, offset, n, s)) {
    rc = mgpu_stream_wait_event(stream, sl->filled);
    if (rc == 0)
      rc = mgpu_memcpy_async(dst, offset, ch->slots_buf, slot_off, n, stream);
    if (rc == 0) rc = mgpu_event_record(sl->consumed, stream);
  }
  mgpu__trace_tag_pop(pushed);
  if (rc == 0) {
    mgpu__mutex_lock(&ch->lock);
    ch->received++;
    mgpu__cond_broadcast(&ch->cond);
    mgpu__mutex_unlock(&ch->lock);
    mgpu__metric_add(ch->dst_dev, MGPU__M_chan_msgs_received, 1);
    if (size != NULL) *size = n;
  }
out:
  mgpu__mutex_unlock(&ch->recv_lock);
  leave(ch);
  return rc;
}
