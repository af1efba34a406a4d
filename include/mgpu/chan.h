/* mgpu chan: bounded message channels from one device to another.
 *
 * A channel carries messages of at most msg_size bytes from device src to
 * device dst, holding up to capacity of them in slots on the destination
 * device. Both ends are stream-ordered: a send copies from a buffer on the
 * source device when the sender's stream reaches it, and a receive copies
 * into a buffer on the destination device when the receiver's stream
 * reaches it (after that message's send has completed). The host calls
 * block only for room and for messages: a send waits while capacity messages
 * are sent but not yet received; a receive waits until a message was sent
 * or the channel closed.
 *
 * mgpu_channel_close ends the stream of messages: later sends return
 * MGPU_ECLOSED, and receives return MGPU_ECLOSED once every message sent
 * before the close has been received. A send that had room when the close
 * came (it returns 0) counts as sent before it: a receive waits for its
 * message rather than return MGPU_ECLOSED.
 *
 * Threads: any number of threads may send and receive on one channel;
 * messages keep the order of the send calls.
 *
 * On a stream that captures a graph (mgpu_stream_begin_capture), a send or
 * receive is checked and recorded instead of run; every launch of the
 * graph issues it again, waiting for room or a message as the call does.
 * Within one capture the j-th receive of a channel is ordered after its
 * j-th send, and send p after receive p - capacity; a recorded receive
 * leaves *size as it was (docs/graphs.md).
 */
#ifndef MGPU_CHAN_H
#define MGPU_CHAN_H

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgpu_channel mgpu_channel;

/* Creates a channel; the caller owns it until mgpu_channel_destroy.
 * src_dev and dst_dev may be the same device; two devices of different
 * backends are MGPU_ENOTSUP. capacity >= 1. */
MGPU_EXTERN int mgpu_channel_create(int src_dev, int dst_dev, size_t msg_size,
                                    int capacity, mgpu_channel **chan);
/* Waits for the copies in flight, then frees the channel and its slots. A
 * send or receive blocked in it on another thread is woken and returns
 * MGPU_EFREED; the destroy returns once every call inside has left. Later
 * calls (and a second destroy) are MGPU_EFREED. mgpu_shutdown destroys the
 * channels still open. */
MGPU_EXTERN int mgpu_channel_destroy(mgpu_channel *chan);

/* Sends size bytes (1 .. msg_size) of src from offset, ordered on stream
 * (a stream of the source device). The caller may reuse src for work queued
 * on stream after this call. Blocks while the channel is full, at most
 * MGPU_TIMEOUT (mgpu_config.timeout_ms, default 30 s): then MGPU_ETIMEDOUT
 * with a detail naming the destination device and its last operations, and
 * nothing was sent (the channel stays usable). src is held meanwhile: a
 * mgpu_free of it on another thread while the send waits for room ends the
 * wait (MGPU_EFREED, nothing was sent), and one once the message is being
 * copied waits for the send. */
MGPU_EXTERN int mgpu_channel_send(mgpu_channel *chan, const mgpu_buffer *src,
                                  size_t offset, size_t size,
                                  mgpu_stream *stream);
/* Receives the next message into dst at offset, ordered on stream (a stream
 * of the destination device); *size (may be NULL) is set to its length.
 * Blocks until a message is there, at most MGPU_TIMEOUT: then
 * MGPU_ETIMEDOUT naming the source device and its last operations, and
 * nothing was received. MGPU_ECLOSED once the channel is closed and
 * drained. dst must have room for msg_size bytes from offset, else
 * MGPU_ERANGE and the message stays for the next call; the range is checked
 * only when a message is there, so the call that finds the channel closed
 * and drained is MGPU_ECLOSED whatever its offset. A mgpu_free of dst on
 * another thread while the receive waits for a message ends the wait
 * (MGPU_EFREED, nothing was received). */
MGPU_EXTERN int mgpu_channel_recv(mgpu_channel *chan, mgpu_buffer *dst,
                                  size_t offset, size_t *size,
                                  mgpu_stream *stream);
/* The same with the call's own limit on the wait: timeout_ms milliseconds,
 * 0 for MGPU_TIMEOUT, -1 for no limit (below -1: MGPU_EINVAL). */
MGPU_EXTERN int mgpu_channel_send_timeout(mgpu_channel *chan,
                                          const mgpu_buffer *src,
                                          size_t offset, size_t size,
                                          mgpu_stream *stream,
                                          int timeout_ms);
MGPU_EXTERN int mgpu_channel_recv_timeout(mgpu_channel *chan, mgpu_buffer *dst,
                                          size_t offset, size_t *size,
                                          mgpu_stream *stream,
                                          int timeout_ms);
/* Ends the stream of messages and wakes every blocked sender and receiver. */
MGPU_EXTERN int mgpu_channel_close(mgpu_channel *chan);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_CHAN_H */
