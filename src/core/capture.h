/* The capture seam: how a capturing stream's entry points hand their work to
 * the graph layer (src/graph/) without the core calling up into it.
 *
 * The entry points that can be recorded (kernels, copies, memset, built-in
 * kernels, host callbacks, event records and waits) look their stream up
 * with mgpu__stream_get_capturing and, after their checks, describe the call
 * as one mgpu__graph_op and give it to mgpu__capture_record instead of the
 * backend when the stream captures. Every other call that takes a stream
 * looks it up with mgpu__stream_get, which refuses a capturing stream with
 * MGPU_ENOTSUP: a synchronize on a capturing stream fails before it
 * changes anything.
 *
 * A layer beside the graph layer records its own calls as MGPU__GOP_CALL
 * nodes (collectives: src/coll/record.c): one shared mgpu__graph_call
 * whose members are nodes on their devices' streams, issued together by
 * the call itself at each replay.
 *
 * The graph layer registers its recorder (mgpu__capture_hooks) from a
 * constructor, and counts the captures in progress in
 * mgpu__captures_active, so that event calls on streams that do not capture
 * ask it anything only while some capture is going on.
 */
#ifndef MGPU_CORE_CAPTURE_H
#define MGPU_CORE_CAPTURE_H

#include "core/core-internal.h"

/* One stream call, as a graph node replays it through the public API.
 * Fields a kind does not use are 0. Handles are the caller's (not held). */
typedef enum mgpu__graph_op_kind {
  MGPU__GOP_EMPTY = 0,
  MGPU__GOP_KERNEL,       /* mgpu_launch */
  MGPU__GOP_COPY,         /* mgpu_memcpy_async(dst, a) */
  MGPU__GOP_HTOD,         /* mgpu_memcpy_htod_async(dst, host) */
  MGPU__GOP_DTOH,         /* mgpu_memcpy_dtoh_async(host, a) */
  MGPU__GOP_MEMSET,       /* mgpu_memset_async(dst) */
  MGPU__GOP_FILL,         /* mgpu_fill(dst) */
  MGPU__GOP_SCALE,        /* mgpu_scale(dst) */
  MGPU__GOP_AXPY,         /* mgpu_axpy(dst, a) */
  MGPU__GOP_ELEMENTWISE,  /* mgpu_elementwise(dst, a, b) */
  MGPU__GOP_HOST,         /* mgpu_stream_add_callback */
  MGPU__GOP_EVENT_RECORD, /* mgpu_event_record */
  MGPU__GOP_EVENT_WAIT,   /* mgpu_stream_wait_event */
  MGPU__GOP_CALL          /* member of a mgpu__graph_call */
} mgpu__graph_op_kind;

/* A call of another layer recorded into a graph (a collective's ranks):
 * one node per member, on the member's device, all issued together by
 * issue when a replay reaches the first of them. Every member's
 * dependencies are those of all members (the graph layer merges them), so
 * that issuing them together keeps each stream's order. Reference-counted
 * by the layer that made it and by each node that names it; the last
 * unref calls release. */
typedef struct mgpu__graph_call mgpu__graph_call;
#define MGPU__GRAPH_CALL_MAX 64 /* members of one call at most */
struct mgpu__graph_call {
  _Atomic int refs;
  int nmembers;
  const char *name; /* for details: "allreduce" */
  /* Queues every member's call, member i on streams[i] (a stream of its
   * device): 0 or a code, nothing queued on failure where it can tell. */
  int (*issue)(mgpu__graph_call *c, mgpu_stream *const *streams);
  /* 0 while every handle the call names is live, else the code, with a
   * detail naming the member and the handle. */
  int (*check)(const mgpu__graph_call *c);
  void (*release)(mgpu__graph_call *c);
};

static inline void mgpu__graph_call_ref(mgpu__graph_call *c) {
  atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

static inline void mgpu__graph_call_unref(mgpu__graph_call *c) {
  if (c != NULL &&
      atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
    c->release(c);
}

typedef struct mgpu__graph_op {
  mgpu__graph_op_kind kind;
  int dev; /* the device whose order the call runs in */
  const mgpu_kernel *kernel;
  mgpu_dim3 grid, block;
  const void *args; /* the caller's; a graph keeps a copy */
  size_t args_size;
  mgpu_buffer *dst;
  const mgpu_buffer *a, *b;
  size_t dst_offset, a_offset, b_offset;
  size_t size; /* bytes (copies, memset) or elements (built-in kernels) */
  void *host;  /* the host side of _htod (read) and _dtoh (written) */
  int value;   /* memset's byte */
  mgpu_dtype dtype;
  mgpu_op op;
  double alpha;
  unsigned char fill[8]; /* fill's element, as mgpu_fill takes it */
  void (*fn)(void *arg);
  void *arg;
  mgpu_event *event;
  mgpu__graph_call *call; /* MGPU__GOP_CALL: the call, and which member */
  int member;
  /* Pairs of a call (a channel's sends and receives: pair_key the
   * channel): the j-th consumer (role 2) recorded in a capture follows the
   * j-th producer (role 1) recorded there, and producer p follows consumer
   * p - pair_depth (the channel's capacity), as a replay from one thread
   * must issue them. Role 0: none. */
  const void *pair_key;
  int pair_role, pair_depth;
} mgpu__graph_op;

typedef struct mgpu__capture_hooks {
  /* Every s[i] captures one graph: records ops[i] into it on s[i], for i
   * from 0 to n, all or none (0 or a code; nothing queued). */
  int (*record)(mgpu__stream *const *s, const mgpu__graph_op *ops, int n);
  /* s does not capture and waits for e: when e was last recorded inside a
   * capture, s joins it (later work on s is recorded after e's point) and
   * it returns 1; 0 when e is no capture's. */
  int (*join)(mgpu__stream *s, mgpu__event *e);
  /* e was recorded outside any capture: it is no capture's any more. */
  void (*forget)(mgpu__event *e);
  /* 1 when e was last recorded inside a capture in progress. */
  int (*marked)(mgpu__event *e);
  /* Ends every capture in progress, dropping its graph (mgpu_shutdown,
   * before it synchronizes the devices). */
  void (*drop_all)(void);
} mgpu__capture_hooks;

/* Set once, by the graph layer's constructor. */
void mgpu__capture_hooks_set(const mgpu__capture_hooks *hooks);
/* Captures in progress (the graph layer counts them). */
extern _Atomic int mgpu__captures_active;

/* The capture s records into (the graph layer's), or NULL. */
static inline void *mgpu__stream_capture(const mgpu__stream *s) {
  return atomic_load_explicit(&((mgpu__stream *)s)->capture,
                              memory_order_acquire);
}

/* mgpu__stream_get that lets a capturing stream through. */
int mgpu__stream_get_capturing(mgpu_stream *h, mgpu__stream **out);

/* Hands op to the recorder (s captures). */
int mgpu__capture_record(mgpu__stream *s, const mgpu__graph_op *op);
/* Hands n ops to the recorder, ops[i] on s[i] (every s[i] captures the
 * same graph: MGPU_EINVAL otherwise), recorded all or none. */
int mgpu__capture_record_all(mgpu__stream *const *s, const mgpu__graph_op *ops,
                             int n);
/* While a capture is in progress: mgpu__capture_hooks' join, forget and
 * marked, else 0 / nothing. */
int mgpu__capture_join(mgpu__stream *s, mgpu__event *e);
void mgpu__capture_forget(mgpu__event *e);
int mgpu__capture_marked(mgpu__event *e);
void mgpu__capture_drop_all(void);

#endif /* MGPU_CORE_CAPTURE_H */
