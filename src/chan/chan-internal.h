/* Internal interface of the channels (src/chan/).
 *
 * channel.c   the channels: create, send, receive, close, destroy.
 * record.c    a send or receive on a capturing stream, recorded into the
 *             graph (core/capture.h) instead of run.
 */
#ifndef MGPU_CHAN_INTERNAL_H
#define MGPU_CHAN_INTERNAL_H

#include "core/core-internal.h"
#include "mgpu/chan.h"

/* One end's call, checked, as record.c takes it: a send (send 1) of size
 * bytes of buf from offset, or a receive into buf at offset, on stream s
 * (held by the caller, capturing), with the call's timeout as given. */
typedef struct mgpu__chan_call {
  mgpu_channel *chan; /* the handle */
  int src_dev, dst_dev, capacity;
  int send;
  mgpu_buffer *buf;
  size_t offset, size;
  int timeout_ms;
} mgpu__chan_call;

/* Records the call into the graph s captures: a node on s's device, which
 * a replay issues as the same call on the stream it names. Sends and
 * receives of one channel pair up in the capture (the j-th receive follows
 * the j-th send, and send p follows receive p - capacity), so that a
 * replay from one thread issues them in an order that cannot block. */
int mgpu__chan_record(const mgpu__chan_call *call, mgpu__stream *s);

/* (channel.c) 0 when a send (send 1) or receive could be issued on the
 * channel now as far as its state goes: MGPU_EFREED once destroyed,
 * MGPU_ECLOSED for a send once closed. */
int mgpu__chan_check(mgpu_channel *h, int send);

#endif /* MGPU_CHAN_INTERNAL_H */
