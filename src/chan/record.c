/* Channel sends and receives recorded into a graph (core/capture.h,
 * MGPU__GOP_CALL with one member).
 *
 * A replay issues the same call again, with the handles it named, on the
 * replay's stream of the device: it waits for room or for a message as
 * the call would (bounded by the same timeout), and reports the same
 * errors. The pairing of sends and receives in the capture orders them in
 * every replay (chan-internal.h). A replayed receive does not report the
 * message's size (there is no caller to tell).
 */
#include <stdio.h>

#include "chan/chan-internal.h"
#include "core/capture.h"
#include "util/fault.h"

typedef struct rec {
  mgpu__graph_call base;
  mgpu__chan_call call;
} rec;

static int rec_issue(mgpu__graph_call *base, mgpu_stream *const *streams) {
  const mgpu__chan_call *k = &((rec *)base)->call;
  if (k->send)
    return mgpu_channel_send_timeout(k->chan, k->buf, k->offset, k->size,
                                     streams[0], k->timeout_ms);
  return mgpu_channel_recv_timeout(k->chan, k->buf, k->offset, NULL,
                                   streams[0], k->timeout_ms);
}

/* 0 while the channel (not closed, for a send) and the buffer are live. */
static int rec_check(const mgpu__graph_call *base) {
  const mgpu__chan_call *k = &((const rec *)base)->call;
  int rc = mgpu__chan_check(k->chan, k->send);
  mgpu__buf *b;
  if (rc == 0 && (rc = mgpu__buf_get(k->buf, k->send ? "src" : "dst", &b)) == 0)
    mgpu__buf_put(b);
  if (rc == 0) return 0;
  char detail[256];
  snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
  return mgpu__error(rc, "recorded %s of channel %d -> %d: %s", base->name,
                     k->src_dev, k->dst_dev, detail);
}

static void rec_release(mgpu__graph_call *base) { mgpu__free(base); }

int mgpu__chan_record(const mgpu__chan_call *call, mgpu__stream *s) {
  rec *r = mgpu__calloc(1, sizeof *r);
  if (r == NULL)
    return mgpu__error(MGPU_ENOMEM, "channel %d -> %d: out of host memory to "
                       "record a %s", call->src_dev, call->dst_dev,
                       call->send ? "send" : "receive");
  atomic_init(&r->base.refs, 1);
  r->base.nmembers = 1;
  r->base.name = call->send ? "channel send" : "channel receive";
  r->base.issue = rec_issue;
  r->base.check = rec_check;
  r->base.release = rec_release;
  r->call = *call;
  mgpu__graph_op op = {.kind = MGPU__GOP_CALL, .dev = s->dev,
                       .call = &r->base, .member = 0,
                       .pair_key = (const void *)call->chan,
                       .pair_role = call->send ? 1 : 2,
                       .pair_depth = call->capacity};
  int rc = mgpu__capture_record(s, &op);
  mgpu__graph_call_unref(&r->base);
  return rc;
}
