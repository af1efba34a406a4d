/* The capture seam (core/capture.h): the stream lookup that tells capturing
 * streams apart, and the calls through the graph layer's recorder. */
#include "core/capture.h"

static const mgpu__capture_hooks *_Atomic hooks;
_Atomic int mgpu__captures_active;

void mgpu__capture_hooks_set(const mgpu__capture_hooks *h) {
  atomic_store_explicit(&hooks, h, memory_order_release);
}

int mgpu__stream_get_capturing(mgpu_stream *h, mgpu__stream **out) {
  int err = 0;
  *out = NULL;
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "stream: mgpu_init has not been called");
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_STREAM, "stream", &err);
  return *out != NULL ? 0 : err;
}

int mgpu__capture_record_all(mgpu__stream *const *s, const mgpu__graph_op *ops,
                             int n) {
  const mgpu__capture_hooks *h =
      atomic_load_explicit(&hooks, memory_order_acquire);
  if (h == NULL)
    return mgpu__error(MGPU_ENOTSUP, "device %d: stream captures but no "
                       "recorder is registered", s[0]->dev);
  return h->record(s, ops, n);
}

int mgpu__capture_record(mgpu__stream *s, const mgpu__graph_op *op) {
  return mgpu__capture_record_all(&s, op, 1);
}

static const mgpu__capture_hooks *active_hooks(void) {
  if (atomic_load_explicit(&mgpu__captures_active, memory_order_acquire) == 0)
    return NULL;
  return atomic_load_explicit(&hooks, memory_order_acquire);
}

int mgpu__capture_join(mgpu__stream *s, mgpu__event *e) {
  const mgpu__capture_hooks *h = active_hooks();
  return h != NULL ? h->join(s, e) : 0;
}

void mgpu__capture_forget(mgpu__event *e) {
  const mgpu__capture_hooks *h = active_hooks();
  if (h != NULL) h->forget(e);
}

int mgpu__capture_marked(mgpu__event *e) {
  const mgpu__capture_hooks *h = active_hooks();
  return h != NULL ? h->marked(e) : 0;
}

void mgpu__capture_drop_all(void) {
  const mgpu__capture_hooks *h = active_hooks();
  if (h != NULL) h->drop_all();
}
