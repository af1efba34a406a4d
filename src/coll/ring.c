/* The ring: mgpu's collectives on every backend.
 *
 * Each rank pulls from the previous rank of the ring: a copy goes through
 * mgpu_memcpy_async (direct peer or host-staged, whichever the copy layer
 * picks), a reduction runs the backend's element-wise kernel, reading the
 * peer's chunk in place where the device can read peer memory (one pass:
 * dst = mine op peer) and from a staging chunk of a pooled scratch buffer
 * otherwise. The data is cut into chunks and each step of each chunk is its
 * own event: rank r works on chunk k + 1 while rank r + 1 works on chunk k,
 * so copies and reductions of different ranks overlap down the ring.
 *
 * All-reduce is reduce-scatter then all-gather around the ring (2 (n - 1)
 * steps); reduce-scatter and all-gather are their halves; broadcast and
 * reduce are pipelined chains from or towards the root.
 *
 * Ordering rules, beyond the obvious "wait for the previous rank's step":
 * a rank overwrites a chunk of its output only after the next rank has read
 * the old contents (all-reduce, all-gather step t waits for the next rank's
 * reduce-scatter step t), and every stream finishes by waiting for the next
 * rank's last step, so nothing later on it touches a buffer the next rank
 * still reads. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "util/fault.h"

/* Fewest bytes per chunk, and most chunks per segment: past these the event
 * traffic costs more than the pipelining gains. */
#define MAX_ROUNDS 64
/* All-reduces up to this size per rank take the flat path where every
 * device reads every other's memory. */
#define FLAT_BYTES (256u << 10)

/* A place in some rank's memory: a buffer handle, a byte offset and the
 * device pointer it designates. */
typedef struct loc {
  mgpu_buffer *h;
  size_t off;
  char *ptr;
} loc;

typedef struct ring {
  mgpu__comm *c;
  mgpu__coll_op *op;
  int n;
  size_t esz;
  size_t ce;       /* elements per chunk */
  size_t rounds;   /* chunks per segment */
  size_t partial;  /* bytes of partial results at the start of scratch */
  mgpu_buffer *scratch[MGPU_MAX_DEVICES];
  mgpu_event **ev; /* [round][step][rank] */
  int steps;
  int base;        /* chains: the rank at position 0 */
} ring;

static loc at(loc l, size_t elems, size_t esz) {
  l.off += elems * esz;
  l.ptr += elems * esz;
  return l;
}

static loc send_of(const ring *g, int r) {
  const mgpu__coll_arg *p = &g->op->arg[r];
  return (loc){p->send_h, p->send_off, (char *)p->send};
}

static loc recv_of(const ring *g, int r) {
  const mgpu__coll_arg *p = &g->op->arg[r];
  return (loc){p->recv_h, p->recv_off, (char *)p->recv};
}

static loc scratch_of(const ring *g, int r) {
  return (loc){g->scratch[r], 0, mgpu_buffer_ptr(g->scratch[r])};
}

static mgpu_stream *stream_of(const ring *g, int r) {
  return g->op->arg[r].stream_h;
}

static int record(ring *g, int r, mgpu_event **out) {
  int rc = mgpu__comm_event(g->c, r, out);
  return rc != 0 ? rc : mgpu_event_record(*out, stream_of(g, r));
}

static int wait(ring *g, int r, mgpu_event *ev) {
  return mgpu_stream_wait_event(stream_of(g, r), ev);
}

static mgpu_event **ev_at(ring *g, size_t k, int s, int r) {
  return &g->ev[(k * (size_t)g->steps + (size_t)s) * (size_t)g->n + (size_t)r];
}

/* dst (on rank r) = src (on rank r or the previous rank). */
static int copy(ring *g, int r, loc dst, loc src, size_t elems) {
  if (elems == 0 || dst.ptr == src.ptr) return 0;
  size_t bytes = elems * g->esz;
  int sdev = mgpu_buffer_device(src.h), ddev = g->c->devs[r];
  if (sdev != ddev && g->c->peer_read[r]) {
    /* The device reads the peer directly: one copy, no staging. */
    mgpu__device *dd = mgpu__device_get(ddev), *sd = mgpu__device_get(sdev);
    int rc = dd->ops->memcpy_peer_async(dd->bdev, dst.ptr, sd->bdev, src.ptr,
                                        bytes, dd->bdev,
                                        g->op->arg[r].stream->bstream);
    if (rc != 0) return rc;
    mgpu__metric_add(sdev, MGPU__M_bytes_peer_direct, bytes);
    mgpu__metric_add(sdev, MGPU__M_copies_peer_direct, 1);
    return 0;
  }
  return mgpu_memcpy_async(dst.h, dst.off, src.h, src.off, bytes,
                           stream_of(g, r));
}

/* The backend's element-wise kernel on rank r's stream: dst = a op b, with
 * pointers the device can read (its own, or peers'). */
static int elementwise(ring *g, int r, void *dst, const void *a,
                       const void *b, size_t elems) {
  const mgpu__coll_arg *p0 = &g->op->arg[0];
  mgpu__device *d = mgpu__device_get(g->c->devs[r]);
  mgpu__builtin k;
  memset(&k, 0, sizeof k);
  k.kind = MGPU__BUILTIN_ELEMENTWISE;
  k.dtype = p0->dtype;
  k.op = p0->op;
  k.count = elems;
  k.dst = dst;
  k.a = a;
  k.b = b;
  return d->ops->builtin(d->bdev, g->op->arg[r].stream->bstream, &k);
}

/* dst = mine op peer on rank r, all three elems long. */
static int reduce(ring *g, int r, loc dst, loc mine, loc peer, size_t elems) {
  if (elems == 0) return 0;
  if (!g->c->peer_read[r]) {
    /* The device cannot read the peer's memory: stage the chunk first. */
    loc stage = scratch_of(g, r);
    stage.off += g->partial;
    stage.ptr += g->partial;
    int rc = copy(g, r, stage, peer, elems);
    if (rc != 0) return rc;
    peer = stage;
  }
  return elementwise(g, r, dst.ptr, mine.ptr, peer.ptr, elems);
}

/* Chunk k of a segment of len elements: [*a, *a + return). */
static size_t chunk(const ring *g, size_t len, size_t k, size_t *a) {
  *a = k * g->ce;
  if (*a >= len) return 0;
  return len - *a < g->ce ? len - *a : g->ce;
}

static int prepare(ring *g, size_t seg, int steps, size_t partial) {
  mgpu__comm *c = g->c;
  size_t ce = c->cfg.chunk_bytes / g->esz;
  if (ce == 0) ce = 1;
  if ((seg + ce - 1) / ce > MAX_ROUNDS)
    ce = (seg + MAX_ROUNDS - 1) / MAX_ROUNDS;
  g->ce = ce;
  g->rounds = seg == 0 ? 1 : (seg + ce - 1) / ce;
  g->steps = steps;
  g->partial = partial;
  for (int r = 0; r < g->n; r++) {
    size_t need = partial + (c->peer_read[r] ? 0 : ce * g->esz);
    g->scratch[r] = NULL;
    if (need == 0) continue;
    int rc = mgpu__comm_scratch(c, r, need, &g->scratch[r]);
    if (rc != 0) return rc;
  }
  size_t nev = g->rounds * (size_t)steps * (size_t)g->n;
  g->ev = mgpu__calloc(nev ? nev : 1, sizeof *g->ev);
  return g->ev ? 0 : mgpu__error(MGPU_ENOMEM, "ring: out of host memory");
}

/* Every stream waits for the next rank's last step (which read its
 * buffers). */
static int finish(ring *g, int (*next_of)(const ring *, int), int skip) {
  for (int r = 0; r < g->n; r++) {
    if (r == skip) continue;
    mgpu_event *last = *ev_at(g, g->rounds - 1, g->steps - 1, next_of(g, r));
    if (last == NULL) continue;
    int rc = wait(g, r, last);
    if (rc != 0) return rc;
  }
  return 0;
}

static int next_in_ring(const ring *g, int r) { return (r + 1) % g->n; }

static int allreduce(ring *g) {
  int n = g->n;
  size_t count = g->op->arg[0].count;
  mgpu_event *start[MGPU_MAX_DEVICES];
  size_t seg = count / (size_t)n + (count % (size_t)n != 0);
  int rc = prepare(g, seg, 2 * n - 2, 0);
  for (int r = 0; r < n && rc == 0; r++) rc = record(g, r, &start[r]);
  for (size_t k = 0; k < g->rounds && rc == 0; k++)
    for (int s = 0; s < 2 * n - 2 && rc == 0; s++)
      for (int r = 0; r < n && rc == 0; r++) {
        int prev = (r + n - 1) % n, next = (r + 1) % n;
        int reducing = s < n - 1;
        int t = reducing ? s : s - (n - 1);
        int c = ((r - t - (reducing ? 1 : 0)) % n + n) % n;
        size_t lo = mgpu__coll_slice(count, n, c);
        size_t a, len = chunk(g, mgpu__coll_slice(count, n, c + 1) - lo, k, &a);
        rc = wait(g, r, s == 0 ? start[prev] : *ev_at(g, k, s - 1, prev));
        if (rc == 0 && reducing) {
          loc peer = s == 0 ? send_of(g, prev) : recv_of(g, prev);
          rc = reduce(g, r, at(recv_of(g, r), lo + a, g->esz),
                      at(send_of(g, r), lo + a, g->esz),
                      at(peer, lo + a, g->esz), len);
        } else if (rc == 0) {
          rc = wait(g, r, *ev_at(g, k, t, next));
          if (rc == 0)
            rc = copy(g, r, at(recv_of(g, r), lo + a, g->esz),
                      at(recv_of(g, prev), lo + a, g->esz), len);
        }
        if (rc == 0) rc = record(g, r, ev_at(g, k, s, r));
      }
  return rc != 0 ? rc : finish(g, next_in_ring, -1);
}

static int reduce_scatter(ring *g) {
  int n = g->n;
  size_t count = g->op->arg[0].count;
  /* In place is each rank's own choice; a rank that is not keeps its
   * partial sums in scratch, never in its (const) send buffer. */
  int all_in_place = 1;
  for (int r = 0; r < n; r++) all_in_place &= g->op->arg[r].in_place;
  mgpu_event *start[MGPU_MAX_DEVICES];
  int rc = prepare(g, count, n - 1,
                   all_in_place ? 0 : (size_t)n * count * g->esz);
  for (int r = 0; r < n && rc == 0; r++) rc = record(g, r, &start[r]);
  for (size_t k = 0; k < g->rounds && rc == 0; k++)
    for (int s = 0; s < n - 1 && rc == 0; s++)
      for (int r = 0; r < n && rc == 0; r++) {
        int prev = (r + n - 1) % n;
        int c = ((r - s - 2) % n + n) % n;
        size_t a, len = chunk(g, count, k, &a);
        size_t e = (size_t)c * count + a;
        /* Partial sums live in the send buffer itself when in place (the
         * chunk is this rank's own, read by nobody else), else in scratch. */
        loc acc_mine = g->op->arg[r].in_place
                           ? at(send_of(g, r), e, g->esz)
                           : at(scratch_of(g, r), e, g->esz);
        loc acc_prev = g->op->arg[prev].in_place
                           ? at(send_of(g, prev), e, g->esz)
                           : at(scratch_of(g, prev), e, g->esz);
        loc dst = s == n - 2 ? at(recv_of(g, r), a, g->esz) : acc_mine;
        loc peer = s == 0 ? at(send_of(g, prev), e, g->esz) : acc_prev;
        rc = wait(g, r, s == 0 ? start[prev] : *ev_at(g, k, s - 1, prev));
        if (rc == 0)
          rc = reduce(g, r, dst, at(send_of(g, r), e, g->esz), peer, len);
        if (rc == 0) rc = record(g, r, ev_at(g, k, s, r));
      }
  return rc != 0 ? rc : finish(g, next_in_ring, -1);
}

static int allgather(ring *g) {
  int n = g->n;
  size_t count = g->op->arg[0].count;
  mgpu_event *start[MGPU_MAX_DEVICES];
  int rc = prepare(g, count, n - 1, 0);
  for (int r = 0; r < n && rc == 0; r++) {
    rc = copy(g, r, at(recv_of(g, r), (size_t)r * count, g->esz),
              send_of(g, r), count);
    if (rc == 0) rc = record(g, r, &start[r]);
  }
  for (size_t k = 0; k < g->rounds && rc == 0; k++)
    for (int s = 0; s < n - 1 && rc == 0; s++)
      for (int r = 0; r < n && rc == 0; r++) {
        int prev = (r + n - 1) % n;
        int c = ((r - s - 1) % n + n) % n;
        size_t a, len = chunk(g, count, k, &a);
        size_t e = (size_t)c * count + a;
        rc = wait(g, r, s == 0 ? start[prev] : *ev_at(g, k, s - 1, prev));
        if (rc == 0)
          rc = copy(g, r, at(recv_of(g, r), e, g->esz),
                    at(recv_of(g, prev), e, g->esz), len);
        if (rc == 0) rc = record(g, r, ev_at(g, k, s, r));
      }
  return rc != 0 ? rc : finish(g, next_in_ring, -1);
}

/* Chains: position p of the chain is rank (base + p) % n; the step of
 * chunk k on rank r is ev[k][0][r]. */
static int chain_rank(const ring *g, int p) { return (g->base + p) % g->n; }

static int next_in_chain(const ring *g, int r) { return (r + 1) % g->n; }

static int broadcast(ring *g) {
  int n = g->n, root = g->op->arg[0].root;
  size_t count = g->op->arg[0].count;
  mgpu_event *start;
  int rc = prepare(g, count, 1, 0);
  g->base = root;
  if (rc == 0) rc = record(g, root, &start);
  if (rc == 0) rc = copy(g, root, recv_of(g, root), send_of(g, root), count);
  for (size_t k = 0; k < g->rounds && rc == 0; k++)
    for (int p = 1; p < n && rc == 0; p++) {
      int r = chain_rank(g, p), prev = chain_rank(g, p - 1);
      size_t a, len = chunk(g, count, k, &a);
      rc = wait(g, r, p == 1 ? start : *ev_at(g, k, 0, prev));
      loc src = p == 1 ? send_of(g, root) : recv_of(g, prev);
      if (rc == 0)
        rc = copy(g, r, at(recv_of(g, r), a, g->esz), at(src, a, g->esz), len);
      if (rc == 0) rc = record(g, r, ev_at(g, k, 0, r));
    }
  /* The root records no step: the chain's last rank has nobody to wait
   * for. */
  return rc != 0 ? rc : finish(g, next_in_chain, (root + n - 1) % n);
}

static int reduce_chain(ring *g) {
  int n = g->n, root = g->op->arg[0].root;
  size_t count = g->op->arg[0].count;
  mgpu_event *start;
  int rc = prepare(g, count, 1, count * g->esz);
  g->base = (root + 1) % n; /* the chain ends at the root */
  int first = chain_rank(g, 0);
  if (rc == 0) rc = record(g, first, &start);
  for (size_t k = 0; k < g->rounds && rc == 0; k++)
    for (int p = 1; p < n && rc == 0; p++) {
      int r = chain_rank(g, p), prev = chain_rank(g, p - 1);
      size_t a, len = chunk(g, count, k, &a);
      loc peer = p == 1 ? send_of(g, prev) : scratch_of(g, prev);
      loc dst = p == n - 1 ? recv_of(g, root) : scratch_of(g, r);
      rc = wait(g, r, p == 1 ? start : *ev_at(g, k, 0, prev));
      if (rc == 0)
        rc = reduce(g, r, at(dst, a, g->esz), at(send_of(g, r), a, g->esz),
                    at(peer, a, g->esz), len);
      if (rc == 0) rc = record(g, r, ev_at(g, k, 0, r));
    }
  /* The first rank of the chain waits on the second: its send buffer is
   * read there. The root reads nobody's buffer after its last step. */
  return rc != 0 ? rc : finish(g, next_in_chain, root);
}

/* Every stream waits for every other's event, recorded now. */
static int stream_barrier(ring *g) {
  mgpu_event *ev[MGPU_MAX_DEVICES];
  int rc = 0;
  for (int r = 0; r < g->n && rc == 0; r++) rc = record(g, r, &ev[r]);
  for (int r = 0; r < g->n && rc == 0; r++)
    for (int q = 0; q < g->n && rc == 0; q++)
      if (q != r) rc = wait(g, r, ev[q]);
  return rc;
}

/* Small all-reduces where every device reads every other's memory: each
 * rank reduces the whole vector straight from the peers' buffers, in rank
 * order (so every rank gets the same bits), between two stream barriers.
 * Three dependent phases instead of the ring's 2 (n - 1) hops; the work is
 * n times the ring's, which is nothing at these sizes. In place, the sum
 * goes to scratch and is copied over the input after the second barrier,
 * once no peer reads it. */
static int allreduce_flat(ring *g) {
  int n = g->n;
  size_t count = g->op->arg[0].count, bytes = count * g->esz;
  int rc = 0;
  /* In place is each rank's own choice: only those ranks need scratch. */
  for (int r = 0; r < n; r++) g->scratch[r] = NULL;
  for (int r = 0; r < n && rc == 0; r++)
    if (g->op->arg[r].in_place)
      rc = mgpu__comm_scratch(g->c, r, bytes, &g->scratch[r]);
  if (rc == 0) rc = stream_barrier(g);
  for (int r = 0; r < n && rc == 0; r++) {
    loc acc = g->op->arg[r].in_place ? scratch_of(g, r) : recv_of(g, r);
    rc = elementwise(g, r, acc.ptr, send_of(g, 0).ptr, send_of(g, 1).ptr,
                     count);
    for (int q = 2; q < n && rc == 0; q++)
      rc = elementwise(g, r, acc.ptr, acc.ptr, send_of(g, q).ptr, count);
  }
  if (rc == 0) rc = stream_barrier(g);
  /* Nobody reads the inputs any more: in place, the sum may land now. */
  for (int r = 0; r < n && rc == 0; r++)
    if (g->op->arg[r].in_place)
      rc = copy(g, r, recv_of(g, r), scratch_of(g, r), count);
  return rc;
}

static int single(ring *g) {
  const mgpu__coll_arg *p = &g->op->arg[0];
  return copy(g, 0, recv_of(g, 0), send_of(g, 0), p->count);
}

/* 1 when a ring that failed part-way can be completed on the calling thread
 * instead (mgpu__coll_direct_complete): host devices, whose memory the CPU
 * reads, and no rank in place (the ring writes only the receive buffers and
 * its scratch, so the inputs are still there to start again from). */
static int completes_on_host(const mgpu__comm *c, const mgpu__coll_op *op) {
  for (int r = 0; r < c->n; r++)
    if (op->arg[r].in_place ||
        !mgpu__device_host_visible(mgpu__device_get(c->devs[r]),
                                   MGPU_MEM_DEVICE))
      return 0;
  return 1;
}

int mgpu__coll_ring_issue(mgpu__comm *c, mgpu__coll_op *op) {
  ring g;
  memset(&g, 0, sizeof g);
  g.c = c;
  g.op = op;
  g.n = c->n;
  g.esz = mgpu_dtype_size(op->arg[0].dtype);
  if (op->arg[0].count == 0) return 0;
  int rc;
  if (c->n == 1) {
    rc = single(&g);
  } else {
    size_t bytes = op->arg[0].count * g.esz;
    switch (op->arg[0].kind) {
      case MGPU__COLL_ALLREDUCE:
        rc = c->all_read && bytes <= FLAT_BYTES ? allreduce_flat(&g)
                                                : allreduce(&g);
        break;
      case MGPU__COLL_REDUCE_SCATTER: rc = reduce_scatter(&g); break;
      case MGPU__COLL_ALLGATHER: rc = allgather(&g); break;
      case MGPU__COLL_BROADCAST: rc = broadcast(&g); break;
      default: rc = reduce_chain(&g); break;
    }
  }
  mgpu__free(g.ev);
  /* Out of memory or a refused backend call part-way: some chunks may be
   * queued already, and a failed call must leave its outputs as they were.
   * Where it can, the call completes here instead (one CPU pass over the
   * inputs); elsewhere (CUDA devices, in place) the failure stands and the
   * outputs may hold part of the result: docs/faults.md says so. */
  if ((rc == MGPU_ENOMEM || rc == MGPU_EBACKEND) && completes_on_host(c, op))
    rc = mgpu__coll_direct_complete(c, op);
  return rc;
}
