/* The pipelined host-staged copy between two devices.
 *
 * A staged copy cuts the bytes into pieces and moves each through one of k
 * pinned bounce buffers (k = the staging depth, at least 2): the source
 * device copies piece i into bounce[i % k] on a stream of its own
 * (device-to-host) and records an event; a stream of the destination device
 * waits for that event, copies the piece out (host-to-device) and records
 * another event, which the source side waits for before it reuses the bounce
 * buffer for piece i + k. So while the destination drains piece i, the
 * source already fills piece i + 1: the two halves overlap.
 *
 * The chunk adapts to the copy (copy_chunk): a tiny setting grows so that
 * the copy has at most MAX_PIECES pieces (up to 64 KiB), a copy smaller
 * than 2 x depth chunks is cut into 2 x depth pieces, and no chunk is
 * longer than the copy.
 *
 * Pieces are one chunk long, except that a copy of four chunks or more ramps
 * up and down: it starts with an eighth, a quarter and a half chunk and ends
 * with a half, a quarter and an eighth, because the first piece's D2H and the
 * last piece's H2D run alone, and short ones there shorten the time nothing
 * overlaps.
 *
 * Stream order: the copy runs on the caller's stream s, which belongs to
 * one of the two devices; that device's half runs on s itself, the other
 * half on a helper stream of the other device. When s is the destination's,
 * the source's helper first waits for an event recorded on s (so the copy
 * starts after earlier work on s); when s is the source's, s finally waits
 * for the destination's last event (so later work on s, and events recorded
 * on s after the copy, see the data). Either way the copy is one step of s.
 *
 * Nothing is allocated per call in the steady state: helper streams are
 * created once per device; events, bounce buffers and the records of copies
 * in flight are reused from free lists under staging_lock. A copy records
 * a "done" event on s after itself and goes on a pending list; later copies
 * (and shutdown) give back what finished copies borrowed once their done
 * event has completed. That costs one event record per copy, where a
 * host callback would cost a trip through the driver's callback thread.
 * Bounce buffers are pre-touched when they are made, because the first touch
 * of fresh pages costs more than the copy itself.
 *
 * Event re-recording: each bounce slot's events are recorded once per piece
 * that uses the slot. A wait takes the event's most recent record at the
 * time it is queued (the backends' contract, as in CUDA), so a later record
 * does not move an earlier wait.
 */
#include <stdlib.h>
#include <string.h>

#include "copy/copy-internal.h"
#include "util/fault.h"

#define HELPERS_PER_DEVICE 4
#define MAX_DEPTH MGPU_STAGING_DEPTH_MAX
#define DEFAULT_DEPTH 3
/* How the chunk adapts to the copy (copy_chunk): a chunk below ADAPT_MIN
 * grows (up to ADAPT_MIN) until the copy has at most MAX_PIECES pieces (a
 * tiny setting would cut a large copy into too many); a copy smaller than
 * 2 x depth chunks gets 2 x depth pieces of at least ADAPT_MIN bytes (so
 * its halves still overlap). */
#define MAX_PIECES 64
#define ADAPT_MIN ((size_t)64 << 10)
/* Bounce buffers kept alive at most (before waiting for one to come back). */
#define BOUNCE_CAP_MIN 16

typedef struct bounce {
  struct bounce *next;
  mgpu__device *owner; /* whose mem_alloc made it */
  size_t size;
  void *ptr;
} bounce;

typedef struct pooled_event {
  mgpu__device *dev;
  mgpu__bevent *ev;
} pooled_event;

/* What one copy borrowed. events[0] is its done event once it is queued. */
typedef struct copy_op {
  struct copy_op *next; /* in the pending list */
  int nevents;
  pooled_event events[2 * MAX_DEPTH + 2];
  int nbounce;
  bounce *bounce[MAX_DEPTH];
} copy_op;

/* staging_lock guards everything in this block. */
static mgpu__mutex staging_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_STAGING);
static bounce *bounce_free;     /* idle bounce buffers */
static int bounce_alive;        /* idle + lent */
static copy_op *pending;        /* queued copies, newest first */
static copy_op *op_records;     /* idle copy_op records */
/* Helper streams are ordinary mgpu streams (handles only this file knows),
 * so that mgpu_device_synchronize, and so mgpu_free, wait for the half of a
 * staged copy that runs on them. */
static mgpu_stream *helpers[MGPU_MAX_DEVICES][HELPERS_PER_DEVICE];
static unsigned helper_next[MGPU_MAX_DEVICES];
static mgpu__bevent **event_free[MGPU_MAX_DEVICES]; /* idle events */
static int event_nfree[MGPU_MAX_DEVICES], event_cap[MGPU_MAX_DEVICES];

/* Set at run time by mgpu_staging_set; 0: the config's value. */
static _Atomic size_t staging_chunk_set;
static _Atomic int staging_depth_set;

/* ---- parameters ---- */

/* The staging parameters in force for copies from device src: set at run
 * time, or the config's, or (chunk) chosen by src's backend. src NULL: the
 * chunk is 0 when it is chosen per backend. */
static void staging_params(const mgpu__device *src, size_t *chunk,
                           int *depth) {
  const mgpu_config *cfg = mgpu__config();
  size_t c = staging_chunk_set;
  int d = staging_depth_set;
  if (c == 0 && cfg != NULL) c = cfg->staging_chunk;
  /* automatic: the source backend's (its table's caps, docs/PERF.md) */
  if (c == 0 && src != NULL)
    c = src->ops->caps.staging_chunk;
  if (d == 0) d = cfg != NULL && cfg->staging_depth > 0 ? cfg->staging_depth
                                                         : DEFAULT_DEPTH;
  if (d < 2) d = 2;
  if (d > MAX_DEPTH) d = MAX_DEPTH;
  *chunk = c;
  *depth = d;
}

int mgpu_staging_set(size_t chunk, int depth) {
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "staging parameters: mgpu is not "
                       "initialized");
  if (depth != 0 && (depth < 2 || depth > MAX_DEPTH))
    return mgpu__error(MGPU_EINVAL, "staging depth %d: it must lie between 2 "
                       "and %d bounce buffers", depth, MAX_DEPTH);
  if (chunk != 0 &&
      (chunk < MGPU_STAGING_CHUNK_MIN || chunk > MGPU_STAGING_CHUNK_MAX))
    return mgpu__error(MGPU_EINVAL, "staging chunk of %zu bytes: it must lie "
                       "between %zu and %zu bytes", chunk,
                       MGPU_STAGING_CHUNK_MIN, MGPU_STAGING_CHUNK_MAX);
  if (chunk != 0) staging_chunk_set = chunk;
  if (depth != 0) staging_depth_set = depth;
  return 0;
}

int mgpu_staging_get(size_t *chunk, int *depth) {
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "staging parameters: mgpu is not "
                       "initialized");
  size_t c;
  int d;
  staging_params(NULL, &c, &d);
  if (chunk != NULL) *chunk = c;
  if (depth != NULL) *depth = d;
  return 0;
}

/* ---- staging resources ---- */

static int helper_get(mgpu__device *d, mgpu__bstream **out) {
  int rc = 0;
  mgpu__stream *hs = NULL;
  mgpu__mutex_lock(&staging_lock);
  unsigned i = helper_next[d->id]++ % HELPERS_PER_DEVICE;
  if (helpers[d->id][i] == NULL)
    rc = mgpu_stream_create(&helpers[d->id][i], d->id);
  if (rc == 0) rc = mgpu__stream_get(helpers[d->id][i], &hs);
  mgpu__mutex_unlock(&staging_lock);
  if (rc == 0) {
    *out = hs->bstream; /* staging owns the stream until its shutdown hook */
    mgpu__stream_put(hs);
  }
  return rc;
}

/* Takes an idle event of device d or makes one; appends it to op. */
static int event_take(copy_op *op, mgpu__device *d, mgpu__bevent **out) {
  mgpu__bevent *e = NULL;
  mgpu__mutex_lock(&staging_lock);
  if (event_nfree[d->id] > 0) e = event_free[d->id][--event_nfree[d->id]];
  mgpu__mutex_unlock(&staging_lock);
  if (e == NULL) {
    int rc = d->ops->event_create(d->bdev, &e);
    if (rc != 0) return rc;
  }
  op->events[op->nevents].dev = d;
  op->events[op->nevents].ev = e;
  op->nevents++;
  *out = e;
  return 0;
}

/* Called under staging_lock. Returns 0, or -1 when the free list could not grow
 * (the caller then destroys the event). */
static int event_put_locked(mgpu__device *d, mgpu__bevent *e) {
  int id = d->id;
  if (event_nfree[id] == event_cap[id]) {
    int cap = event_cap[id] ? 2 * event_cap[id] : 16;
    mgpu__bevent **grown = mgpu__realloc(event_free[id], (size_t)cap * sizeof *grown);
    if (grown == NULL) return -1;
    event_free[id] = grown;
    event_cap[id] = cap;
  }
  event_free[id][event_nfree[id]++] = e;
  return 0;
}

static int bounce_make(mgpu__device *owner, size_t size, bounce **out) {
  bounce *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: no memory for a bounce "
                       "buffer record", owner->id);
  int rc = owner->ops->mem_alloc(owner->bdev, MGPU_MEM_PINNED, size, &b->ptr);
  if (rc != 0) {
    mgpu__free(b);
    return rc;
  }
  memset(b->ptr, 0, size); /* pay the first touch once, here */
  b->owner = owner;
  b->size = size;
  *out = b;
  return 0;
}

static void bounce_destroy(bounce *b) {
  b->owner->ops->mem_free(b->owner->bdev, MGPU_MEM_PINNED, b->ptr);
  mgpu__free(b);
}

/* Gives back what op borrowed (every stream it touched is past it), and op
 * itself. Called under staging_lock. An event that cannot be pooled is
 * destroyed. */
static void release_locked(copy_op *op) {
  for (int i = 0; i < op->nbounce; i++) {
    op->bounce[i]->next = bounce_free;
    bounce_free = op->bounce[i];
  }
  for (int i = 0; i < op->nevents; i++) {
    pooled_event *pe = &op->events[i];
    if (event_put_locked(pe->dev, pe->ev) != 0)
      pe->dev->ops->event_destroy(pe->dev->bdev, pe->ev);
  }
  op->next = op_records;
  op_records = op;
}

/* An idle copy_op record, cleared, or NULL when out of memory. */
static copy_op *op_take(void) {
  mgpu__mutex_lock(&staging_lock);
  copy_op *op = op_records;
  if (op != NULL) op_records = op->next;
  mgpu__mutex_unlock(&staging_lock);
  if (op == NULL) return mgpu__calloc(1, sizeof *op);
  op->next = NULL;
  op->nevents = op->nbounce = 0;
  return op;
}

static void release_op(copy_op *op) {
  mgpu__mutex_lock(&staging_lock);
  release_locked(op);
  mgpu__mutex_unlock(&staging_lock);
}

/* Gives back what finished copies borrowed. Called under staging_lock. */
static void reap_locked(void) {
  copy_op **p = &pending;
  while (*p != NULL) {
    copy_op *op = *p;
    pooled_event *done = &op->events[0];
    /* Any answer but "pending" ends it: a failed copy is over too. */
    if (done->dev->ops->event_query(done->dev->bdev, done->ev) != MGPU_EAGAIN) {
      *p = op->next;
      release_locked(op);
    } else {
      p = &op->next;
    }
  }
}

/* Waits for the oldest pending copy (outside the lock), then reaps. Returns
 * 0 when nothing was pending. Called under staging_lock. */
static int wait_oldest_locked(void) {
  copy_op *oldest = pending;
  if (oldest == NULL) return 0;
  while (oldest->next != NULL) oldest = oldest->next;
  pooled_event done = oldest->events[0];
  mgpu__mutex_unlock(&staging_lock);
  /* The event stays alive while pooled. Another thread may reap the copy
   * meanwhile and a third reuse the event; then this waits for that later
   * copy too, which only costs time. */
  done.dev->ops->event_synchronize(done.dev->bdev, done.ev);
  mgpu__mutex_lock(&staging_lock);
  reap_locked();
  return 1;
}

/* Lends n bounce buffers of at least size bytes to op. Idle buffers that
 * are smaller (the chunk grew) are freed on the way. With max(16, 4n)
 * buffers lent already, it first waits for copies in flight to finish. */
static int bounce_take(copy_op *op, mgpu__device *owner, size_t size, int n) {
  int cap = BOUNCE_CAP_MIN > 4 * n ? BOUNCE_CAP_MIN : 4 * n;
  bounce *stale = NULL;
  int rc = 0;
  mgpu__mutex_lock(&staging_lock);
  reap_locked();
  while (op->nbounce < n) {
    bounce **p = &bounce_free;
    while (*p != NULL && op->nbounce < n) {
      bounce *b = *p;
      *p = b->next;
      if (b->size >= size) {
        op->bounce[op->nbounce++] = b;
      } else {
        b->next = stale;
        stale = b;
        bounce_alive--;
      }
    }
    if (op->nbounce == n) break;
    if (bounce_alive >= cap && wait_oldest_locked()) continue;
    bounce_alive++;
    mgpu__mutex_unlock(&staging_lock);
    bounce *b = NULL;
    rc = bounce_make(owner, size, &b);
    mgpu__mutex_lock(&staging_lock);
    if (rc != 0) {
      bounce_alive--;
      break;
    }
    op->bounce[op->nbounce++] = b;
  }
  mgpu__mutex_unlock(&staging_lock);
  while (stale != NULL) {
    bounce *next = stale->next;
    bounce_destroy(stale);
    stale = next;
  }
  return rc;
}

/* Error path: waits until the streams the copy touched are idle, then gives
 * everything back. */
static void abandon_op(copy_op *op, mgpu__stream *s, mgpu__device *hd,
                       mgpu__bstream *h) {
  if (h != NULL) hd->ops->stream_synchronize(hd->bdev, h);
  mgpu__stream_wait_keep(s); /* its error stays the caller's next report */
  release_op(op);
}

/* A step failed after pieces may have been queued (abandon_op waited for
 * them): some of dst may be written, and a failed copy must leave it as it
 * was. Host devices' memory is the CPU's, so the copy completes here with
 * one memcpy, after everything queued before it on s (abandon_op waited for
 * s too); elsewhere the failure stands (docs/faults.md). Returns the code
 * of the call. */
static int complete_or_fail(int rc, mgpu__device *dd, void *dst,
                            const mgpu__device *sd, const void *src,
                            size_t size) {
  if ((rc != MGPU_ENOMEM && rc != MGPU_EBACKEND) ||
      !mgpu__device_host_visible(sd, MGPU_MEM_DEVICE) ||
      !mgpu__device_host_visible(dd, MGPU_MEM_DEVICE))
    return rc;
  memcpy(dst, src, size);
  return 0;
}

/* Records op's done event (events[0], taken first) on s and puts op on the
 * pending list. */
static int finish_op(copy_op *op, mgpu__device *xd, mgpu__stream *s,
                     mgpu__device *hd, mgpu__bstream *h) {
  int rc = xd->ops->event_record(xd->bdev, op->events[0].ev, s->bstream);
  if (rc != 0) {
    abandon_op(op, s, hd, h);
    return rc;
  }
  mgpu__mutex_lock(&staging_lock);
  op->next = pending;
  pending = op;
  mgpu__mutex_unlock(&staging_lock);
  return 0;
}

/* ---- the staged copy ---- */

static size_t round_4k(size_t n) { return (n + 4095) & ~(size_t)4095; }

/* The chunk one copy of size bytes uses, from the configured chunk: a
 * small one raised (to ADAPT_MIN at most) so that the copy has at most
 * MAX_PIECES pieces; one that would leave a copy fewer than 2 x depth
 * pieces lowered to make them (to ADAPT_MIN at least); never longer than
 * the copy (a 64 MiB setting lends a 1 MiB copy bounce buffers of 1 MiB).
 * Settings of ADAPT_MIN and more are never raised, so the automatic chunks
 * (sized for the cache or a DMA's cost) stand for large copies. */
static size_t copy_chunk(size_t chunk, size_t size, int depth) {
  size_t lo = round_4k(size / MAX_PIECES + 1);
  if (lo > ADAPT_MIN) lo = ADAPT_MIN;
  size_t hi = round_4k(size / (2 * (size_t)depth));
  if (hi < ADAPT_MIN) hi = ADAPT_MIN;
  if (chunk < lo) chunk = lo;
  if (chunk > hi) chunk = hi; /* hi >= ADAPT_MIN >= lo */
  if (chunk > round_4k(size)) chunk = round_4k(size);
  return chunk;
}

/* The size of the bounce buffers lent for a chunk: the next power of two,
 * so that copies of nearby sizes share them. */
static size_t bounce_class(size_t chunk) {
  size_t b = 4096;
  while (b < chunk) b *= 2;
  return b;
}

typedef struct staged_plan {
  mgpu__device *sd, *dd;
  mgpu__bstream *src_stream, *dst_stream;
  size_t size, chunk;
  int ramp; /* pieces ramp up and down (see the top of the file) */
  int slots;
  mgpu__bevent *filled[MAX_DEPTH];  /* slot holds a piece (source's) */
  mgpu__bevent *drained[MAX_DEPTH]; /* slot is free again (destination's) */
} staged_plan;

/* Length of the piece that starts at off: whole chunks, or when ramping an
 * eighth, a quarter and a half chunk first, whole chunks, then a half, a
 * quarter and an eighth (so that the head and the tail are 7/8 chunk). */
static size_t piece_len(const staged_plan *p, size_t off) {
  size_t left = p->size - off, c = p->chunk;
  if (!p->ramp) return left < c ? left : c;
  const size_t ramp[3] = {c / 8, c / 4, c / 2};
  size_t head = 0, tail = 0;
  for (int k = 0; k < 3; k++) { /* head pieces: at offsets 0, c/8, 3c/8 */
    if (off == head) return ramp[k];
    head += ramp[k];
  }
  for (int k = 0; k < 3; k++) { /* tail pieces: c/8 left, 3c/8, 7c/8 */
    tail += ramp[k];
    if (left == tail) return ramp[k];
  }
  size_t middle = left - tail;
  return middle < c ? middle : c;
}

static size_t piece_count(const staged_plan *p) {
  size_t n = 0;
  for (size_t off = 0; off < p->size; off += piece_len(p, off)) n++;
  return n;
}

/* Queues every piece. Returns the slot of the last one through *last. */
static int queue_pieces(staged_plan *p, copy_op *op, char *dst,
                        const char *src, int *last) {
  mgpu__device *sd = p->sd, *dd = p->dd;
  size_t i = 0;
  for (size_t off = 0; off < p->size; i++) {
    int slot = (int)(i % (size_t)p->slots);
    size_t n = piece_len(p, off);
    void *bounce = op->bounce[slot]->ptr;
    int rc = 0;
    if (i >= (size_t)p->slots)
      rc = sd->ops->stream_wait_event(sd->bdev, p->src_stream, dd->bdev,
                                      p->drained[slot]);
    if (rc == 0)
      rc = sd->ops->memcpy_async(sd->bdev, p->src_stream, bounce, src + off, n,
                                 MGPU__COPY_D2H);
    if (rc == 0) rc = sd->ops->event_record(sd->bdev, p->filled[slot], p->src_stream);
    if (rc == 0)
      rc = dd->ops->stream_wait_event(dd->bdev, p->dst_stream, sd->bdev,
                                      p->filled[slot]);
    if (rc == 0)
      rc = dd->ops->memcpy_async(dd->bdev, p->dst_stream, dst + off, bounce, n,
                                 MGPU__COPY_H2D);
    if (rc == 0)
      rc = dd->ops->event_record(dd->bdev, p->drained[slot], p->dst_stream);
    if (rc != 0) return rc;
    *last = slot;
    off += n;
  }
  return 0;
}

/* Sizes the copy of size bytes from sd to dd: its chunk, whether it ramps
 * up, and its slots (no more than its pieces). */
static void plan_make(staged_plan *p, mgpu__device *sd, mgpu__device *dd,
                      size_t size) {
  *p = (staged_plan){.sd = sd, .dd = dd, .size = size};
  int depth;
  staging_params(sd, &p->chunk, &depth);
  p->chunk = copy_chunk(p->chunk, size, depth);
  p->ramp = p->chunk >= 32768 && size >= 4 * p->chunk;
  size_t npieces = piece_count(p);
  p->slots = npieces < (size_t)depth ? (int)npieces : depth;
}

int mgpu__copy_staged(mgpu__device *dd, void *dst, mgpu__device *sd,
                      const void *src, size_t size, mgpu__stream *s) {
  if (sd->ops != dd->ops)
    return mgpu__error(MGPU_ENOTSUP, "staged copy from device %d to device "
                       "%d: the devices belong to different backends",
                       sd->id, dd->id);
  staged_plan p;
  plan_make(&p, sd, dd, size);
  int on_src = s->dev == sd->id;
  mgpu__device *xd = on_src ? sd : dd; /* the stream's device */
  mgpu__device *hd = on_src ? dd : sd; /* the helper's device */

  copy_op *op = op_take();
  if (op == NULL)
    return mgpu__error(MGPU_ENOMEM, "staged copy of %zu bytes from device %d "
                       "to device %d: no memory for its record",
                       size, sd->id, dd->id);
  mgpu__bstream *h = NULL;
  mgpu__bevent *done, *start = NULL;
  int rc = event_take(op, xd, &done); /* events[0] */
  if (rc == 0) rc = helper_get(hd, &h);
  for (int i = 0; rc == 0 && i < p.slots; i++) {
    rc = event_take(op, sd, &p.filled[i]);
    if (rc == 0) rc = event_take(op, dd, &p.drained[i]);
  }
  if (rc == 0 && !on_src) rc = event_take(op, dd, &start);
  if (rc == 0) rc = bounce_take(op, sd, bounce_class(p.chunk), p.slots);
  if (rc != 0) {
    release_op(op);
    return rc;
  }
  p.src_stream = on_src ? s->bstream : h;
  p.dst_stream = on_src ? h : s->bstream;

  int last = 0;
  if (!on_src) { /* the source's helper starts after earlier work on s */
    rc = dd->ops->event_record(dd->bdev, start, s->bstream);
    if (rc == 0) rc = sd->ops->stream_wait_event(sd->bdev, h, dd->bdev, start);
  }
  if (rc == 0) {
    /* The pieces are device-to-host and host-to-device copies that the
     * metrics and the trace count as host-staged. */
    int saved = mgpu__obs_path();
    mgpu__obs_path_set(MGPU_METRIC_PATH_PEER_STAGED);
    rc = queue_pieces(&p, op, dst, src, &last);
    mgpu__obs_path_set(saved);
  }
  if (rc == 0 && on_src) /* later work on s waits for the last piece */
    rc = sd->ops->stream_wait_event(sd->bdev, s->bstream, dd->bdev, p.drained[last]);
  if (rc != 0) {
    abandon_op(op, s, hd, h);
    return complete_or_fail(rc, dd, dst, sd, src, size);
  }
  rc = finish_op(op, xd, s, hd, h);
  return rc == 0 ? 0 : complete_or_fail(rc, dd, dst, sd, src, size);
}

/* ---- shutdown ---- */

void mgpu__staged_shutdown(void) {
  mgpu__mutex_lock(&staging_lock);
  while (wait_oldest_locked()) {
  } /* every device is idle by now: this only collects */
  bounce *b = bounce_free;
  bounce_free = NULL;
  bounce_alive = 0;
  mgpu__mutex_unlock(&staging_lock);
  /* Helpers first: once they are idle, nothing uses a pooled object. */
  for (int id = 0; id < MGPU_MAX_DEVICES; id++) {
    mgpu__device *d = mgpu__device_get(id);
    for (int i = 0; i < HELPERS_PER_DEVICE; i++) {
      if (helpers[id][i] == NULL) continue;
      if (d != NULL) mgpu_stream_destroy(helpers[id][i]); /* waits first */
      helpers[id][i] = NULL;
    }
    helper_next[id] = 0;
    for (int i = 0; i < event_nfree[id]; i++)
      if (d != NULL) d->ops->event_destroy(d->bdev, event_free[id][i]);
    mgpu__free(event_free[id]);
    event_free[id] = NULL;
    event_nfree[id] = event_cap[id] = 0;
  }
  while (b != NULL) {
    bounce *next = b->next;
    bounce_destroy(b);
    b = next;
  }
  mgpu__mutex_lock(&staging_lock);
  while (op_records != NULL) {
    copy_op *next = op_records->next;
    mgpu__free(op_records);
    op_records = next;
  }
  mgpu__mutex_unlock(&staging_lock);
  staging_chunk_set = 0;
  staging_depth_set = 0;
}
