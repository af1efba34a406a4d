/* The direct algorithm, for host devices that read each other's memory.
 *
 * Every collective becomes one job per rank: reduce a range from a list of
 * sources (every rank's input) and write the result to a list of
 * destinations (every rank's output). Rank r owns slice r of the data, so
 * each input byte is read once and each output byte written once: exactly
 * the 2 * n * size bytes an all-reduce cannot avoid, where a ring moves
 * about 5 * (n - 1) * size. The reduction runs through a small per-thread
 * buffer that stays in cache, and large results leave through non-temporal
 * stores, which skip the read-for-ownership of the destination lines.
 *
 * Ordering: an entry stream barrier (every stream waits for every other's
 * event) makes every input ready before any rank reads, and an exit barrier
 * keeps every stream from running on while a peer still reads its buffers
 * or writes its output. Both are events and stream waits: the host never
 * blocks. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "coll/coll-internal.h"
#include "util/elementwise.h"
#include "util/fault.h"

/* Elements of one pass through the cache-resident buffer. */
#define TILE_BYTES (16u << 10)
/* Below this many bytes written per job, plain stores: the result is likely
 * read again soon and should stay in cache. */
#define NT_THRESHOLD (2u << 20)
/* Bytes per kernel block below which one block does the whole job. */
#define BLOCK_MIN (256u << 10)

typedef struct job_args {
  int nsrc, ndst;
  mgpu_dtype dtype;
  mgpu_op op;
  size_t count; /* elements */
  int nt;       /* 1: non-temporal stores */
  /* ptr[0 .. nsrc) are the sources, ptr[nsrc .. nsrc + ndst) the
   * destinations; only the used prefix travels with the launch. */
  void *ptr[2 * MGPU_MAX_DEVICES];
} job_args;

#define SRC(j, k) ((j)->ptr[(k)])
#define DST(j, k) ((j)->ptr[(j)->nsrc + (k)])

/* Copies size bytes, with non-temporal stores where asked and possible. */
static void copy_out(void *dst, const void *src, size_t size, int nt) {
#if defined(__SSE2__)
  if (nt) {
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > size) head = size;
    memcpy(d, s, head);
    d += head, s += head, size -= head;
    size_t vec = size & ~(size_t)63;
    for (size_t i = 0; i < vec; i += 64) {
      __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
      __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
      __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
      __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
      _mm_stream_si128((__m128i *)(d + i), x0);
      _mm_stream_si128((__m128i *)(d + i + 16), x1);
      _mm_stream_si128((__m128i *)(d + i + 32), x2);
      _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    memcpy(d + vec, s + vec, size - vec);
    return;
  }
#endif
  (void)nt;
  memcpy(dst, src, size);
}

/* The cache-resident buffer each worker thread reduces through. */
static _Thread_local _Alignas(64) unsigned char tile[TILE_BYTES];

static void job_kernel(const mgpu_kernel_ctx *ctx, const void *argp) {
  const job_args *a = argp;
  size_t esz = mgpu_dtype_size(a->dtype);
  size_t nb = ctx->grid_dim.x, b = ctx->block_idx.x;
  size_t lo = mgpu__coll_slice(a->count, (int)nb, (int)b);
  size_t hi = mgpu__coll_slice(a->count, (int)nb, (int)b + 1);
  size_t step = TILE_BYTES / esz;
  for (size_t i = lo; i < hi; i += step) {
    size_t m = hi - i < step ? hi - i : step;
    size_t off = i * esz, bytes = m * esz;
    const void *res;
    if (a->nsrc == 1) {
      res = (const char *)SRC(a, 0) + off;
    } else {
      mgpu__elementwise_host(tile, (const char *)SRC(a, 0) + off,
                             (const char *)SRC(a, 1) + off, m, a->dtype, a->op);
      for (int k = 2; k < a->nsrc; k++)
        mgpu__elementwise_host(tile, tile, (const char *)SRC(a, k) + off, m,
                               a->dtype, a->op);
      res = tile;
    }
    /* Every source of this tile was read before any destination is written,
     * so in-place operation is safe. */
    for (int k = 0; k < a->ndst; k++) {
      char *d = (char *)DST(a, k) + off;
      if (d != res) copy_out(d, res, bytes, a->nt);
    }
  }
#if defined(__SSE2__)
  if (a->nt) _mm_sfence();
#endif
}

static const mgpu_kernel job = {"mgpu_coll_direct", job_kernel, NULL,
                                NULL};

/* Every stream of the operation waits until all of them reach this point. */
static int stream_barrier(mgpu__comm *c, mgpu__coll_op *op) {
  mgpu_event *ev[MGPU_MAX_DEVICES];
  for (int r = 0; r < c->n; r++) {
    int rc = mgpu__comm_event(c, r, &ev[r]);
    if (rc == 0) rc = mgpu_event_record(ev[r], op->arg[r].stream_h);
    if (rc != 0) return rc;
  }
  for (int r = 0; r < c->n; r++)
    for (int q = 0; q < c->n; q++) {
      if (q == r) continue;
      int rc = mgpu_stream_wait_event(op->arg[r].stream_h, ev[q]);
      if (rc != 0) return rc;
    }
  return 0;
}

/* Fills rank r's job; returns 0 when the rank has nothing to do. nslices:
 * how many jobs share the data of an all-reduce, reduce or broadcast (c->n
 * normally; 1: one job does all of it). */
static int make_job(const mgpu__comm *c, const mgpu__coll_op *op, int r,
                    int nslices, job_args *j) {
  const mgpu__coll_arg *p0 = &op->arg[0];
  int n = c->n;
  size_t esz = mgpu_dtype_size(p0->dtype);
  size_t count = p0->count, bytes = count * esz;
  /* Straight into j->ptr: every kind lists its sources before its
   * destinations. */
  int ns = 0, nd = 0;
  j->dtype = p0->dtype;
  j->op = p0->op;
  size_t lo = mgpu__coll_slice(count, nslices, r);
  size_t hi = mgpu__coll_slice(count, nslices, r + 1);
  size_t off = lo * esz;
  j->count = hi - lo;
  switch (p0->kind) {
    case MGPU__COLL_ALLREDUCE:
      for (int q = 0; q < n; q++)
        j->ptr[ns++] = (char *)op->arg[q].send + off;
      for (int q = 0; q < n; q++)
        j->ptr[ns + nd++] = (char *)op->arg[q].recv + off;
      break;
    case MGPU__COLL_REDUCE:
      for (int q = 0; q < n; q++)
        j->ptr[ns++] = (char *)op->arg[q].send + off;
      j->ptr[ns + nd++] = (char *)op->arg[p0->root].recv + off;
      break;
    case MGPU__COLL_BROADCAST:
      j->ptr[ns++] = (char *)op->arg[p0->root].send + off;
      for (int q = 0; q < n; q++)
        j->ptr[ns + nd++] = (char *)op->arg[q].recv + off;
      break;
    case MGPU__COLL_ALLGATHER:
      j->count = count;
      j->ptr[ns++] = (char *)op->arg[r].send;
      for (int q = 0; q < n; q++)
        j->ptr[ns + nd++] = (char *)op->arg[q].recv + (size_t)r * bytes;
      break;
    case MGPU__COLL_REDUCE_SCATTER:
      j->count = count;
      for (int q = 0; q < n; q++)
        j->ptr[ns++] = (char *)op->arg[q].send + (size_t)r * bytes;
      j->ptr[ns + nd++] = op->arg[r].recv;
      break;
  }
  j->nsrc = ns;
  j->ndst = nd;
  j->nt = j->count * esz * (size_t)nd >= NT_THRESHOLD;
  return j->count > 0;
}

/* Small messages: one rank runs every rank's job in one launch. The other
 * ranks only record a start event and wait for its end event: about 3 n
 * stream operations instead of the 2 n^2 of two stream barriers, and one
 * kernel, which is what the latency of a small collective is made of. */
#define ONE_SHOT_BYTES (64u << 10)
#define ONE_SHOT_RANKS 8
/* Up to this many bytes the issuing thread runs the jobs itself when it
 * can (inline_issue): at 128 KiB on the 2-core build machine one thread
 * alone was still as fast as sharing with a woken worker (docs/coll.md). */
#define INLINE_BYTES (128u << 10)
/* Up to this many bytes, claimed_parallel_issue serves a collective whose
 * streams are idle. */
#define CLAIMED_MAX_BYTES (4u << 20)
/* Up to this many bytes per rank, the inline path runs one job over the
 * whole range of an all-reduce, reduce or broadcast. */
#define WHOLE_BYTES 4096u

typedef struct one_shot_args {
  int njobs;
  job_args jobs[ONE_SHOT_RANKS];
} one_shot_args;

static void one_shot_kernel(const mgpu_kernel_ctx *ctx, const void *argp) {
  const one_shot_args *a = argp;
  for (int j = 0; j < a->njobs; j++) job_kernel(ctx, &a->jobs[j]);
}

static const mgpu_kernel one_shot = {"mgpu_coll_one_shot", one_shot_kernel,
                                     NULL, NULL};

/* A step after the first job was queued failed (a launch, a barrier's
 * event): the call can no longer fail, since some output may already be
 * written, so it completes here instead. Every rank's stream is waited for
 * (the jobs queued so far run to their end), then this thread runs the jobs
 * of ranks from `from` on itself, as the inline path does. Nothing after the
 * call can overtake it: its work is done before it returns. The streams'
 * waits need no allocation and no new stream operation. Returns 0, or
 * MGPU_EDEVLOST when a device was lost meanwhile. */
static int complete_here(mgpu__comm *c, mgpu__coll_op *op, int from) {
  int nslices = c->n;
  for (int r = 0; r < c->n; r++) {
    int rc = mgpu_stream_synchronize(op->arg[r].stream_h);
    if (rc == MGPU_EDEVLOST) return rc;
  }
  mgpu_kernel_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.grid_dim = ctx.block_dim = MGPU_DIM3(1, 1, 1);
  for (int r = from; r < nslices; r++) {
    job_args j;
    ctx.device = c->devs[r];
    if (make_job(c, op, r, nslices, &j)) job_kernel(&ctx, &j);
  }
  return 0;
}

int mgpu__coll_direct_complete(mgpu__comm *c, mgpu__coll_op *op) {
  return complete_here(c, op, 0);
}

static int one_shot_issue(mgpu__comm *c, mgpu__coll_op *op) {
  const mgpu__coll_arg *p0 = &op->arg[0];
  int n = c->n;
  int e = p0->kind == MGPU__COLL_REDUCE || p0->kind == MGPU__COLL_BROADCAST
              ? p0->root
              : 0;
  mgpu_stream *se = op->arg[e].stream_h;
  one_shot_args *a = mgpu__calloc(1, sizeof *a);
  if (a == NULL) return mgpu__error(MGPU_ENOMEM, "coll: out of host memory");
  int rc = 0;
  for (int r = 0; r < n && rc == 0; r++) {
    if (make_job(c, op, r, n, &a->jobs[a->njobs])) a->njobs++;
    if (r == e) continue;
    mgpu_event *start;
    rc = mgpu__comm_event(c, r, &start);
    if (rc == 0) rc = mgpu_event_record(start, op->arg[r].stream_h);
    if (rc == 0) rc = mgpu_stream_wait_event(se, start);
  }
  /* Everything the exit needs is taken before the launch, the one write. */
  mgpu_event *done;
  if (rc == 0) rc = mgpu__comm_event(c, e, &done);
  if (rc == 0)
    rc = mgpu_launch(se, &one_shot, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1), a,
                     sizeof *a);
  mgpu__free(a);
  if (rc != 0) return rc; /* nothing was written */
  rc = mgpu_event_record(done, se);
  for (int r = 0; r < n && rc == 0; r++)
    if (r != e) rc = mgpu_stream_wait_event(op->arg[r].stream_h, done);
  /* The job is queued: the call completes whatever fails now (the job
   * ran once se is waited for). */
  return rc == 0 ? 0 : complete_here(c, op, n);
}

/* The smallest path: when every rank's stream is idle, the issuing thread
 * claims them all and runs the one-shot jobs itself, then releases them. No
 * stream operation is queued and no worker wakes: the cost is the data's
 * cache lines and a lock per stream. Work queued on a claimed stream
 * meanwhile waits behind the claim, so stream order is what it would have
 * been had the jobs been queued. Returns 1 when it ran, 0 when some stream
 * was busy (nothing was run, every claim was given back). */
static int inline_issue(mgpu__comm *c, mgpu__coll_op *op) {
  int n = c->n, claimed = 0;
  /* A few cache lines: one job over all of it, not n slices. */
  mgpu__coll_kind kind = op->arg[0].kind;
  int whole = kind != MGPU__COLL_ALLGATHER &&
              kind != MGPU__COLL_REDUCE_SCATTER &&
              op->arg[0].count * mgpu_dtype_size(op->arg[0].dtype) <=
                  WHOLE_BYTES;
  mgpu_kernel_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.grid_dim = ctx.block_dim = MGPU_DIM3(1, 1, 1);
  if (whole) {
    /* Well under a microsecond of work: the devices' locks instead of
     * claims (one lock per stream instead of two, docs/coll.md). */
    int locked = 0;
    while (locked < n && mgpu__stream_lock_idle(op->arg[locked].stream))
      locked++;
    if (locked == n) {
      job_args j;
      ctx.device = c->devs[0];
      if (make_job(c, op, 0, 1, &j)) job_kernel(&ctx, &j);
    }
    for (int r = locked; r > 0; r--)
      mgpu__stream_unlock_idle(op->arg[r - 1].stream);
    if (locked == n) return 1;
  }
  while (claimed < n && mgpu__stream_claim(op->arg[claimed].stream))
    claimed++;
  int ran = claimed == n;
  if (ran) {
    int jobs = whole ? 1 : n;
    for (int r = 0; r < jobs; r++) {
      job_args j;
      ctx.device = c->devs[r];
      if (make_job(c, op, r, jobs, &j)) job_kernel(&ctx, &j);
    }
  }
  while (claimed > 0) mgpu__stream_release(op->arg[--claimed].stream);
  return ran;
}

/* Medium messages, when every rank's stream is idle: the issuing thread
 * claims them all and cuts the data into shares (at least one per rank,
 * about SHARE_BYTES each, at most MAX_SHARES). Whoever comes first takes
 * the next share by an atomic index: the issuing thread from the start, and
 * the workers of ranks 1 .. n-1 (no more than there are shares besides the
 * first), each woken by one launch on the communicator's internal stream
 * of its rank (idle while comm->lock is held). A worker that wakes late finds every share taken and
 * leaves at once, so the call never waits for a wake-up: at worst the
 * issuing thread runs every share itself. It then waits (spinning first)
 * only for shares still running on a worker, and releases the streams. No
 * event, and no stream barrier (2 n^2 stream operations, each a possible
 * wake-up, on the queued path). The call returns once the data moved.
 * Returns 1 when it ran, 0 when a stream was busy or no work list was free
 * (nothing ran), or a negative error. */
#define SHARE_BYTES (64u << 10)
#define MAX_SHARES 16

typedef struct mgpu__coll_shares {
  _Atomic int next; /* the next share to take */
  _Atomic int done; /* shares finished */
  _Atomic int refs; /* launched workers that have not left yet */
  int nshares;
  job_args job[MAX_SHARES];
} shares_t;

/* Takes and runs shares until none is left. */
static void run_shares(const mgpu_kernel_ctx *ctx, shares_t *sh) {
  for (;;) {
    int i = atomic_fetch_add_explicit(&sh->next, 1, memory_order_relaxed);
    if (i >= sh->nshares) return;
    job_kernel(ctx, &sh->job[i]);
    atomic_fetch_add_explicit(&sh->done, 1, memory_order_release);
  }
}

static void share_kernel(const mgpu_kernel_ctx *ctx, const void *argp) {
  shares_t *sh = *(shares_t *const *)argp;
  run_shares(ctx, sh);
  /* The last look at the list: from here the issuer may reuse it. */
  atomic_fetch_sub_explicit(&sh->refs, 1, memory_order_release);
}

static const mgpu_kernel share_job = {"mgpu_coll_shares", share_kernel, NULL,
                                      NULL};

static int all_done(const void *arg) {
  const shares_t *sh = arg;
  return atomic_load_explicit(&sh->done, memory_order_acquire) == sh->nshares;
}

/* A work list no worker looks at any more, or NULL (comm->lock held). */
static shares_t *free_shares(mgpu__comm *c) {
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < 4; i++) {
      if (c->shares[i] == NULL)
        c->shares[i] = mgpu__calloc(1, sizeof(shares_t));
      if (c->shares[i] != NULL &&
          atomic_load_explicit(&c->shares[i]->refs, memory_order_acquire) ==
              0)
        return c->shares[i];
    }
    /* Workers woke late for every list: wait until they have looked
     * (rare; the alternative, the queued path, waits for wake-ups too). */
    for (int r = 1; pass == 0 && r < c->n; r++)
      if (c->streams[r] != NULL) mgpu_stream_synchronize(c->streams[r]);
  }
  return NULL;
}

static int claimed_parallel_issue(mgpu__comm *c, mgpu__coll_op *op,
                                  size_t bytes) {
  int n = c->n, claimed = 0;
  shares_t *sh = free_shares(c);
  if (sh == NULL) return 0;
  while (claimed < n && mgpu__stream_claim(op->arg[claimed].stream))
    claimed++;
  int rc = 0, ran = claimed == n;
  if (ran) {
    mgpu__coll_kind kind = op->arg[0].kind;
    int per_rank = kind == MGPU__COLL_ALLGATHER ||
                   kind == MGPU__COLL_REDUCE_SCATTER;
    size_t want = bytes / SHARE_BYTES;
    int ns = per_rank ? n : want > MAX_SHARES ? MAX_SHARES
                          : (int)want < n    ? n
                                             : (int)want;
    /* Non-temporal stores as for one job per rank: by the size, not by how
     * finely it is cut. */
    job_args whole;
    make_job(c, op, 0, n, &whole);
    sh->nshares = 0;
    for (int i = 0; i < ns; i++)
      if (make_job(c, op, i, ns, &sh->job[sh->nshares])) {
        sh->job[sh->nshares].nt = whole.nt;
        sh->nshares++;
      }
    atomic_store_explicit(&sh->next, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->done, 0, memory_order_relaxed);
    int helpers = n - 1;
    if (helpers > sh->nshares - 1) helpers = sh->nshares - 1;
    mgpu_stream *helper[MGPU_MAX_DEVICES] = {NULL};
    for (int r = 1; r <= helpers; r++) {
      atomic_fetch_add_explicit(&sh->refs, 1, memory_order_relaxed);
      if (mgpu__comm_stream(c, r, &helper[r]) != 0 ||
          mgpu_launch(helper[r], &share_job, MGPU_DIM3(1, 1, 1),
                      MGPU_DIM3(1, 1, 1), &sh, sizeof sh) != 0) {
        /* No help from there (out of memory): the shares are taken by
         * whoever is left, this thread at least. */
        atomic_fetch_sub_explicit(&sh->refs, 1, memory_order_relaxed);
        helper[r] = NULL;
        break;
      }
    }
    mgpu_kernel_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.grid_dim = ctx.block_dim = MGPU_DIM3(1, 1, 1);
    ctx.device = c->devs[0];
    run_shares(&ctx, sh);
    if (!mgpu__spin_until(&c->share_spin, all_done, sh))
      for (int r = 1; r <= helpers; r++)
        if (helper[r] != NULL) {
          /* Parks until that worker is done; its share is then too. */
          int src = mgpu_stream_synchronize(helper[r]);
          if (rc == 0) rc = src;
        }
  }
  while (claimed > 0) mgpu__stream_release(op->arg[--claimed].stream);
  return rc != 0 ? rc : ran;
}

int mgpu__coll_direct_issue(mgpu__comm *c, mgpu__coll_op *op) {
  const mgpu__coll_arg *p0 = &op->arg[0];
  if (p0->count == 0) return 0;
  size_t bytes = p0->count * mgpu_dtype_size(p0->dtype);
  if (p0->kind == MGPU__COLL_ALLGATHER || p0->kind == MGPU__COLL_REDUCE_SCATTER)
    bytes *= (size_t)c->n;
  /* While tracing, the queued operations are what the trace shows. */
  int traced = mgpu__trace_enabled();
  if (!traced && c->n <= ONE_SHOT_RANKS && bytes <= INLINE_BYTES &&
      inline_issue(c, op))
    return 0;
  if (!traced && c->n > 1 && bytes > INLINE_BYTES &&
      bytes <= CLAIMED_MAX_BYTES) {
    int rc = claimed_parallel_issue(c, op, bytes);
    if (rc != 0) return rc < 0 ? rc : 0;
  }
  if (c->n > 1 && c->n <= ONE_SHOT_RANKS && bytes <= ONE_SHOT_BYTES)
    return one_shot_issue(c, op);
  int rc = c->n > 1 ? stream_barrier(c, op) : 0;
  int queued = 0; /* jobs launched: from the first, the call must complete */
  int r = 0;
  for (; r < c->n && rc == 0; r++) {
    job_args j;
    if (!make_job(c, op, r, c->n, &j)) continue;
    if (j.nsrc == 1 && j.ndst == 1 && SRC(&j, 0) == DST(&j, 0)) continue;
    size_t work =
        j.count * mgpu_dtype_size(j.dtype) * (size_t)(j.nsrc + j.ndst);
    unsigned blocks = 1;
    if (work >= 2 * BLOCK_MIN) {
      mgpu_device_props props = {.size = sizeof props};
      if (mgpu_device_get_props(c->devs[r], &props) == 0 &&
          props.multiprocessors > 1)
        blocks = (unsigned)props.multiprocessors;
    }
    size_t args_size =
        offsetof(job_args, ptr) + (size_t)(j.nsrc + j.ndst) * sizeof(void *);
    rc = mgpu_launch(op->arg[r].stream_h, &job, MGPU_DIM3(blocks, 1, 1),
                     MGPU_DIM3(1, 1, 1), &j, args_size);
    if (rc != 0) break; /* job r was not queued */
    queued = 1;
  }
  if (rc == 0 && c->n > 1) rc = stream_barrier(c, op);
  if (rc != 0 && queued) return complete_here(c, op, r);
  return rc;
}
