/* Communicators: creation (which provider and algorithm serve them), queries,
 * destruction, and the resources they pool for their operations (events,
 * scratch buffers, internal streams), so that no collective allocates once
 * the pools are warm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll-internal.h"
#include "util/fault.h"

#define DEFAULT_CHUNK (1u << 20)

int mgpu__comm_get(const mgpu_comm *h, mgpu__comm **out) {
  int err = 0;
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_COMM, "comm", &err);
  return *out ? 0 : err;
}

void mgpu__comm_put(mgpu__comm *c) {
  if (c != NULL) mgpu__handle_put(c->handle);
}

/* NCCL serves a communicator when every device is a whole GPU of one backend
 * that offers it, each GPU at most once (NCCL refuses two ranks on one GPU). */
static int nccl_possible(const int *devs, int n,
                         const mgpu__backend_ops **ops_out) {
  const mgpu__backend_ops *ops = NULL;
  for (int r = 0; r < n; r++) {
    mgpu__device *d = mgpu__device_get(devs[r]);
    if (d == NULL || d->ops->coll == NULL || d->spec.split_count != 1)
      return 0;
    if (ops != NULL && d->ops != ops) return 0;
    ops = d->ops;
    for (int q = 0; q < r; q++)
      if (mgpu__device_get(devs[q])->spec.ordinal == d->spec.ordinal) return 0;
  }
  *ops_out = ops;
  return n > 0;
}

/* Whether rank r's device can read device peer's memory in its kernels. */
static int can_read(int dev, int peer) {
  if (dev == peer) return 1;
  mgpu__device *d = mgpu__device_get(dev), *p = mgpu__device_get(peer);
  if (d->ops != p->ops || d->ops->peer_can_access == NULL) return 0;
  int yes = 0;
  if (d->ops->peer_can_access(d->bdev, p->bdev, &yes) != 0 || !yes) return 0;
  if (d->ops->peer_enable != NULL && d->ops->peer_enable(d->bdev, p->bdev) != 0) {
    mgpu_error_clear();
    return 0;
  }
  return 1;
}

/* 1 when the direct algorithm can serve every device of the list. */
static int direct_possible(const int *devs, int n) {
  for (int r = 0; r < n; r++) {
    mgpu__device *d = mgpu__device_get(devs[r]);
    if (d == NULL || !mgpu__device_host_visible(d, MGPU_MEM_DEVICE)) return 0;
    for (int q = 0; q < n; q++)
      if (!can_read(devs[r], devs[q])) return 0;
  }
  return 1;
}

static int resolve_config(const mgpu_comm_config *in, mgpu_comm_config *out) {
  mgpu_comm_config def = MGPU_COMM_CONFIG_INITIALIZER;
  if (in == NULL) in = &def;
  if (in->size < sizeof(mgpu_comm_config))
    return mgpu__error(MGPU_EINVAL,
                       "comm config: size %zu is smaller than "
                       "sizeof(mgpu_comm_config) = %zu",
                       in->size, sizeof(mgpu_comm_config));
  *out = *in;
  if (out->provider < MGPU_COLL_PROVIDER_AUTO ||
      out->provider > MGPU_COLL_PROVIDER_NCCL)
    return mgpu__error(MGPU_EINVAL, "comm config: unknown provider %d",
                       out->provider);
  if (out->algo < MGPU_COLL_ALGO_AUTO || out->algo > MGPU_COLL_ALGO_DIRECT)
    return mgpu__error(MGPU_EINVAL, "comm config: unknown algorithm %d",
                       out->algo);
  if (out->chunk_bytes == 0) out->chunk_bytes = DEFAULT_CHUNK;
  if (out->chunk_bytes < 64) out->chunk_bytes = 64;
  if (out->timeout_ms == 0) out->timeout_ms = mgpu__timeout_ms(0);
  if (out->timeout_ms < -1)
    return mgpu__error(MGPU_EINVAL, "comm config: timeout %d ms",
                       out->timeout_ms);
  return 0;
}

static int check_devices(const int *devs, int n) {
  if (devs == NULL || n < 1 || n > MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL,
                       "comm: %d devices (need 1 to %d and a device list)", n,
                       MGPU_MAX_DEVICES);
  for (int r = 0; r < n; r++) {
    mgpu__device *d;
    int rc = mgpu__device_check(devs[r], &d);
    if (rc != 0) return rc;
    for (int q = 0; q < r; q++)
      if (devs[q] == devs[r])
        return mgpu__error(MGPU_EINVAL,
                           "comm: device %d is listed twice (ranks %d and %d)",
                           devs[r], q, r);
  }
  return mgpu__coll_same_backend("comm", devs, n);
}

int mgpu__coll_same_backend(const char *what, const int *devs, int n) {
  /* Streams wait only on events of their own backend, so work ordered
   * across devices of two backends cannot be queued without the host. */
  mgpu__device *first = mgpu__device_get(devs[0]);
  for (int r = 1; r < n; r++) {
    mgpu__device *d = mgpu__device_get(devs[r]);
    if (d->ops != first->ops)
      return mgpu__error(MGPU_ENOTSUP,
                         "%s: device %d (%s) and device %d (%s) are of "
                         "different backends; it must span devices of one",
                         what, devs[0], first->ops->name, devs[r],
                         d->ops->name);
  }
  return 0;
}

/* Picks c's provider (NCCL where asked for or possible, else mgpu) and,
 * for mgpu's, its algorithm and which ranks read each other; part of
 * create. */
static int choose_provider(mgpu__comm *c, const int *devs, int n) {
  int rc;
  const mgpu__backend_ops *nccl_ops = NULL;
  int want_nccl = c->cfg.provider != MGPU_COLL_PROVIDER_MGPU;
  if (want_nccl && n > 1 && nccl_possible(devs, n, &nccl_ops)) {
    mgpu__bdevice *bdevs[MGPU_MAX_DEVICES];
    for (int r = 0; r < n; r++) bdevs[r] = mgpu__device_get(devs[r])->bdev;
    rc = nccl_ops->coll->comm_create(bdevs, n, &c->nccl);
    if (rc == 0) {
      c->provider = MGPU_COLL_PROVIDER_NCCL;
      c->nccl_ops = nccl_ops;
    } else if (c->cfg.provider == MGPU_COLL_PROVIDER_NCCL) {
      return rc;
    } else {
      mgpu__log(MGPU_LOG_INFO, "comm: NCCL refused (%s); using mgpu's ring",
                mgpu_error_detail());
      mgpu_error_clear();
    }
  } else if (c->cfg.provider == MGPU_COLL_PROVIDER_NCCL && n > 1) {
    rc = mgpu__error(MGPU_ENOTSUP,
                     "comm: NCCL needs whole GPUs of a backend that has it, "
                     "each at most once");
    return rc;
  }
  if (c->nccl == NULL) {
    c->provider = MGPU_COLL_PROVIDER_MGPU;
    int direct = direct_possible(devs, n);
    if (c->cfg.algo == MGPU_COLL_ALGO_DIRECT && !direct) {
      rc = mgpu__error(MGPU_ENOTSUP,
                       "comm: the direct algorithm needs host devices that "
                       "read each other's memory");
      return rc;
    }
    c->algo = c->cfg.algo == MGPU_COLL_ALGO_RING ? MGPU_COLL_ALGO_RING
              : direct                            ? MGPU_COLL_ALGO_DIRECT
                                                  : MGPU_COLL_ALGO_RING;
    c->all_read = 1;
    for (int r = 0; r < n; r++) {
      c->peer_read[r] = can_read(devs[r], devs[(r + n - 1) % n]);
      for (int q = 0; q < n && c->all_read; q++)
        c->all_read = can_read(devs[r], devs[q]);
    }
  }
  return 0;
}

static int create(const int *devs, int n, const mgpu_comm_config *config,
                  const mgpu_comm_remote *remote, mgpu_comm **comm) {
  if (comm == NULL) return mgpu__error(MGPU_EINVAL, "comm: NULL output");
  *comm = NULL;
  int rc = check_devices(devs, n);
  if (rc != 0) return rc;
  mgpu__comm *c = mgpu__calloc(1, sizeof *c);
  if (c == NULL) return mgpu__error(MGPU_ENOMEM, "comm: out of host memory");
  rc = resolve_config(config, &c->cfg);
  if (rc != 0) goto fail_free;
  c->n = n;
  c->nglobal = n;
  memcpy(c->devs, devs, (size_t)n * sizeof *devs);
  if (remote != NULL) {
    /* Across processes the module moves the data: no provider here. */
    c->has_remote = 1;
    /* A caller built against an older, shorter mgpu_comm_remote: the
     * fields it does not have stay NULL. */
    memcpy(&c->remote, remote,
           remote->size < sizeof c->remote ? remote->size : sizeof c->remote);
    c->nglobal = remote->nranks;
    c->first = remote->first_rank;
    c->cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  }

  rc = choose_provider(c, devs, n);
  if (rc != 0) goto fail_free;
  mgpu__mutex_init(&c->lock, MGPU__LOCK_COMM);
  mgpu__cond_init(&c->cond);
  uintptr_t h = mgpu__handle_new(MGPU__H_COMM, c);
  if (h == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "comm: too many open communicators");
    goto fail_sync;
  }
  mgpu__log(MGPU_LOG_INFO, "comm: %d ranks, provider %s, algorithm %s", n,
            mgpu_coll_provider_name(c->provider),
            c->provider == MGPU_COLL_PROVIDER_NCCL ? "nccl"
            : c->algo == MGPU_COLL_ALGO_DIRECT     ? "direct"
                                                   : "ring");
  c->handle = h;
  *comm = (mgpu_comm *)h;
  return 0;

fail_sync:
  mgpu__cond_destroy(&c->cond);
  mgpu__mutex_destroy(&c->lock);
  if (c->nccl != NULL) c->nccl_ops->coll->comm_destroy(c->nccl);
fail_free:
  mgpu__free(c);
  return rc;
}

int mgpu_comm_create_config(const int *devs, int n,
                            const mgpu_comm_config *config, mgpu_comm **comm) {
  return create(devs, n, config, NULL, comm);
}

int mgpu_comm_create_remote(const int *devs, int n,
                            const mgpu_comm_remote *remote, mgpu_comm **comm) {
  if (remote == NULL || remote->size < sizeof *remote ||
      remote->issue == NULL)
    return mgpu__error(MGPU_EINVAL, "comm: remote needs size set to "
                       "sizeof(mgpu_comm_remote) and an issue function");
  if (remote->first_rank < 0 || n < 1 ||
      remote->nranks < remote->first_rank + n)
    return mgpu__error(MGPU_EINVAL, "comm: ranks %d..%d do not fit %d ranks",
                       remote->first_rank, remote->first_rank + n - 1,
                       remote->nranks);
  return create(devs, n, NULL, remote, comm);
}

int mgpu_comm_create(const int *devs, int n, mgpu_comm **comm) {
  return mgpu_comm_create_config(devs, n, NULL, comm);
}

static int comm_free(mgpu__comm *c);

void mgpu__comm_fail_pending(mgpu__comm *c, int code) {
  c->aborted = code;
  for (mgpu__coll_op *op = c->ops; op != NULL; op = op->next) {
    if (op->done) continue;
    op->done = 1;
    op->rc = code;
    snprintf(op->detail, sizeof op->detail, "%s", c->abort_detail);
  }
  mgpu__cond_broadcast(&c->cond);
}

int mgpu_comm_abort(mgpu_comm *comm) {
  /* Three steps, in this order, so that no rank waits for another that is
   * already gone (NCCL's abort of one rank after another can deadlock):
   * later lookups fail; every pending operation of every rank is failed and
   * every waiter woken, under one lock; then the calls inside leave and the
   * communicator is freed. */
  int err = 0;
  mgpu__comm *c = mgpu__handle_close((uintptr_t)comm, MGPU__H_COMM, "comm",
                                     &err);
  if (c == NULL) return err;
  mgpu__mutex_lock(&c->lock);
  uint64_t seq = UINT64_MAX;
  for (mgpu__coll_op *op = c->ops; op != NULL; op = op->next)
    if (!op->done && op->seq < seq) seq = op->seq;
  if (seq == UINT64_MAX)
    snprintf(c->abort_detail, sizeof c->abort_detail,
             "comm %p was aborted (mgpu_comm_abort)", (void *)comm);
  else
    snprintf(c->abort_detail, sizeof c->abort_detail,
             "comm %p was aborted (mgpu_comm_abort): collective #%llu and "
             "later ones did not run", (void *)comm, (unsigned long long)seq);
  mgpu__comm_fail_pending(c, MGPU_ECANCELED);
  mgpu__mutex_unlock(&c->lock);
  /* A provider's communicator is aborted for every rank before anything
   * waits for the devices (its kernels may wait for each other). */
  if (c->nccl != NULL && c->nccl_ops->coll->comm_abort != NULL) {
    c->nccl_ops->coll->comm_abort(c->nccl);
    c->nccl = NULL;
  }
  return comm_free(c);
}

int mgpu_comm_destroy(mgpu_comm *comm) {
  /* Close the handle first: calls that start from now on see EFREED. Calls
   * already inside see 'destroying' and leave; retiring waits for them. */
  int err = 0;
  mgpu__comm *c = mgpu__handle_close((uintptr_t)comm, MGPU__H_COMM, "comm",
                                     &err);
  if (c == NULL) return err;
  return comm_free(c);
}

/* The rest of a destroy, once the handle is closed. */
static int comm_free(mgpu__comm *c) {
  mgpu__mutex_lock(&c->lock);
  c->destroying = 1;
  mgpu__cond_broadcast(&c->cond);
  mgpu__mutex_unlock(&c->lock);
  mgpu__handle_retire(c->handle);

  int first = 0;
  for (int r = 0; r < c->n; r++) {
    /* Work in flight on the user's streams may still use the pooled events
     * and scratch buffers: wait for each rank's device. */
    int src = mgpu__device_drain(c->devs[r]);
    if (src != 0 && first == 0) first = src;
    for (int i = 0; i < c->nevents[r]; i++) mgpu_event_destroy(c->events[r][i]);
    mgpu__free(c->events[r]);
    if (c->scratch[r] != NULL) mgpu_free(c->scratch[r]);
    for (int i = 0; i < c->nretired[r]; i++) mgpu_free(c->retired[r][i]);
    if (c->streams[r] != NULL) mgpu_stream_destroy(c->streams[r]);
  }
  /* Every internal stream was destroyed above (after its work): no
   * worker looks at a work list any more. */
  for (int i = 0; i < 4; i++) mgpu__free(c->shares[i]);
  for (mgpu__coll_op *op = c->ops, *next; op != NULL; op = next) {
    next = op->next;
    mgpu__free(op);
  }
  mgpu__free(c->spare);
  if (c->nccl != NULL) c->nccl_ops->coll->comm_destroy(c->nccl);
  if (c->has_remote && c->remote.destroy != NULL)
    c->remote.destroy(c->remote.ctx);
  mgpu__cond_destroy(&c->cond);
  mgpu__mutex_destroy(&c->lock);
  mgpu__free(c);
  return first;
}

/* Shutdown: communicators still open are destroyed, so their handles are
 * MGPU_EFREED afterwards (and after a new mgpu_init). */
static void shutdown_comm(void *obj, void *arg) {
  (void)arg;
  comm_free(obj);
}

static void comms_shutdown(void) {
  mgpu__handle_foreach(MGPU__H_COMM, shutdown_comm, NULL);
}
MGPU__ON_SHUTDOWN(comms_shutdown, MGPU__LAYER_WORK)

int mgpu_comm_size(const mgpu_comm *comm) {
  mgpu__comm *c;
  int rc = mgpu__comm_get(comm, &c);
  if (rc != 0) return rc;
  rc = c->nglobal;
  mgpu__comm_put(c);
  return rc;
}

int mgpu_comm_device(const mgpu_comm *comm, int rank) {
  mgpu__comm *c;
  int rc = mgpu__comm_get(comm, &c);
  if (rc != 0) return rc;
  if (rank < c->first || rank >= c->first + c->n)
    rc = mgpu__error(MGPU_EINVAL, "comm: rank %d of %d%s", rank, c->nglobal,
                     c->has_remote ? " is not in this process" : "");
  else
    rc = c->devs[rank - c->first];
  mgpu__comm_put(c);
  return rc;
}

int mgpu_comm_provider(const mgpu_comm *comm) {
  mgpu__comm *c;
  int rc = mgpu__comm_get(comm, &c);
  if (rc != 0) return rc;
  rc = c->provider;
  mgpu__comm_put(c);
  return rc;
}

const char *mgpu_coll_provider_name(int provider) {
  switch (provider) {
    case MGPU_COLL_PROVIDER_AUTO: return "auto";
    case MGPU_COLL_PROVIDER_MGPU: return "mgpu";
    case MGPU_COLL_PROVIDER_NCCL: return "nccl";
  }
  return "unknown";
}

int mgpu__comm_event(mgpu__comm *c, int r, mgpu_event **out) {
  int i = c->events_used[r];
  if (i == c->nevents[r]) {
    int cap = c->nevents[r] ? c->nevents[r] * 2 : 16;
    mgpu_event **evs = mgpu__realloc(c->events[r], (size_t)cap * sizeof *evs);
    if (evs == NULL) return mgpu__error(MGPU_ENOMEM, "comm: event pool");
    c->events[r] = evs;
    for (int k = c->nevents[r]; k < cap; k++) {
      int rc = mgpu_event_create(&evs[k], c->devs[r]);
      if (rc != 0) return rc;
      c->nevents[r] = k + 1;
    }
  }
  *out = c->events[r][c->events_used[r]++];
  return 0;
}

int mgpu__comm_scratch(mgpu__comm *c, int r, size_t size, mgpu_buffer **out) {
  if (c->scratch[r] != NULL && mgpu_buffer_size(c->scratch[r]) >= size) {
    *out = c->scratch[r];
    return 0;
  }
  /* Grow geometrically so that a sweep over sizes allocates few times. */
  size_t want = size;
  if (c->scratch[r] != NULL) {
    size_t twice = 2 * mgpu_buffer_size(c->scratch[r]);
    if (twice > want) want = twice;
  }
  mgpu_buffer *b;
  int rc = mgpu_malloc(&b, c->devs[r], want);
  if (rc != 0 && want > size) rc = mgpu_malloc(&b, c->devs[r], want = size);
  if (rc != 0) return rc;
  if (c->scratch[r] != NULL) {
    if (c->nretired[r] < 16) {
      c->retired[r][c->nretired[r]++] = c->scratch[r];
    } else {
      /* Cannot happen with geometric growth; waiting is still correct. */
      mgpu_free(c->scratch[r]);
    }
  }
  c->scratch[r] = b;
  *out = b;
  return 0;
}

int mgpu__comm_stream(mgpu__comm *c, int r, mgpu_stream **out) {
  if (c->streams[r] == NULL) {
    int rc = mgpu_stream_create(&c->streams[r], c->devs[r]);
    if (rc != 0) return rc;
  }
  *out = c->streams[r];
  return 0;
}
