/* Distributions of [0, n) over parts (devices): block, cyclic, block-cyclic
 * and weighted block.
 *
 * Nothing is stored per range. Block and weighted keep P+1 boundaries (part
 * p owns [bound[p], bound[p+1])); block-cyclic computes its ranges from
 * (n, b, P): block k = [k*b, min((k+1)*b, n)) belongs to part k % P and is
 * that part's range k / P. Cyclic is block-cyclic with b = 1, and a
 * block-cyclic over one part is a block, so each query has one formula per
 * shape. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "mgpu/part.h"
#include "part/part-internal.h"
#include "util/fault.h"

static int check_opts(const mgpu_dist_opts *o, int ndev, int *nparts) {
  if (o->size < sizeof(mgpu_dist_opts))
    return mgpu__error(MGPU_EINVAL, "distribution: opts.size %zu is not "
                       "sizeof(mgpu_dist_opts)", o->size);
  if (o->kind < MGPU_DIST_BLOCK || o->kind > MGPU_DIST_WEIGHTED)
    return mgpu__error(MGPU_EINVAL, "distribution: unknown kind %d", o->kind);
  if (o->kind == MGPU_DIST_BLOCK_CYCLIC && o->block == 0)
    return mgpu__error(MGPU_EINVAL, "distribution: block-cyclic block size "
                       "is 0");
  int P = o->ndevices ? o->ndevices : ndev;
  if (P < 1 || P > 65536)
    return mgpu__error(MGPU_EINVAL, "distribution: %d parts asked for",
                       o->ndevices);
  for (int p = 0; p < P; p++) {
    int d = o->devices ? o->devices[p] : p;
    if (d < 0 || d >= ndev)
      return mgpu__error(MGPU_ENODEV, "distribution: device %d of part %d is "
                         "not open (%d devices)", d, p, ndev);
  }
  if (o->kind == MGPU_DIST_WEIGHTED && o->weights != NULL) {
    double total = 0;
    for (int p = 0; p < P; p++) {
      if (!(o->weights[p] >= 0) || isinf(o->weights[p]))
        return mgpu__error(MGPU_EINVAL, "distribution: weight of part %d is "
                           "%g", p, o->weights[p]);
      total += o->weights[p];
    }
    if (!(total > 0))
      return mgpu__error(MGPU_EINVAL, "distribution: the %d weights sum to "
                         "%g", P, total);
  }
  *nparts = P;
  return 0;
}

/* Boundaries in proportion to the weights: bound[p] = floor(n * W_p / W),
 * W_p the sum of the first p weights. Monotone by construction and exact at
 * both ends, so the parts tile [0, n). long double keeps n * W_p exact
 * enough for any size_t n. */
static void weighted_bounds(mgpu__dist *d, const double *w) {
  long double total = 0, prefix = 0;
  for (int p = 0; p < d->nparts; p++) total += w[p];
  d->bound[0] = 0;
  for (int p = 1; p < d->nparts; p++) {
    prefix += w[p - 1];
    long double x = floorl((long double)d->n * prefix / total);
    size_t b = x >= (long double)d->n ? d->n : (size_t)x;
    d->bound[p] = b < d->bound[p - 1] ? d->bound[p - 1] : b;
  }
  d->bound[d->nparts] = d->n;
}

/* The part bounds of a block or weighted distribution (d->nparts parts of
 * d->n elements over d->devices). MGPU_ENOMEM without a detail, or the
 * device speed lookup's code and detail. */
static int set_bounds(mgpu__dist *d, const mgpu_dist_opts *o) {
  int P = d->nparts;
  d->bound = mgpu__malloc(((size_t)P + 1) * sizeof *d->bound);
  if (d->bound == NULL) return MGPU_ENOMEM;
  if (o->kind != MGPU_DIST_WEIGHTED) {
    size_t q = d->n / (size_t)P, r = d->n % (size_t)P;
    for (int p = 0; p <= P; p++)
      d->bound[p] = (size_t)p * q + ((size_t)p < r ? (size_t)p : r);
    return 0;
  }
  if (o->weights != NULL) {
    weighted_bounds(d, o->weights);
    return 0;
  }
  double *speed = mgpu__malloc((size_t)P * sizeof *speed);
  if (speed == NULL) return MGPU_ENOMEM;
  int rc = mgpu_device_speed(P, d->devices, speed);
  if (rc == 0) weighted_bounds(d, speed);
  mgpu__free(speed);
  return rc;
}

int mgpu_dist_create(mgpu_dist **out, size_t n, const mgpu_dist_opts *opts) {
  mgpu_dist_opts defaults = MGPU_DIST_OPTS_INITIALIZER;
  const mgpu_dist_opts *o = opts ? opts : &defaults;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "distribution: out pointer is NULL");
  int ndev = mgpu_device_count();
  if (ndev < 0) return ndev;
  int P = 0, rc = check_opts(o, ndev, &P);
  if (rc != 0) return rc;

  rc = MGPU_ENOMEM;
  mgpu__dist *d = mgpu__calloc(1, sizeof *d);
  if (d == NULL) goto fail;
  d->devices = mgpu__malloc((size_t)P * sizeof *d->devices);
  if (d->devices == NULL) goto fail;
  d->n = n;
  d->nparts = P;
  d->kind = o->kind;
  for (int p = 0; p < P; p++) d->devices[p] = o->devices ? o->devices[p] : p;
  d->block = o->kind == MGPU_DIST_CYCLIC ? 1 : o->block;
  d->cyclic = (o->kind == MGPU_DIST_CYCLIC ||
               o->kind == MGPU_DIST_BLOCK_CYCLIC) && P > 1;
  if (!d->cyclic && (rc = set_bounds(d, o)) != 0) goto fail;
  d->handle = mgpu__handle_new(MGPU__H_DIST, d);
  if (d->handle == 0) {
    rc = mgpu__error(MGPU_ENOMEM, "distribution: no handles left");
    goto fail;
  }
  *out = (mgpu_dist *)d->handle;
  return 0;

fail:
  if (d != NULL) {
    mgpu__free(d->bound);
    mgpu__free(d->devices);
    mgpu__free(d);
  }
  return rc == MGPU_ENOMEM
             ? mgpu__error(rc, "distribution: out of memory for %d parts", P)
             : rc;
}

int mgpu__dist_get(const mgpu_dist *h, const mgpu__dist **out) {
  int err = 0;
  *out = mgpu__handle_get((uintptr_t)h, MGPU__H_DIST, "distribution", &err);
  return *out != NULL ? 0 : err;
}

void mgpu__dist_put(const mgpu__dist *d) { mgpu__handle_put(d->handle); }

int mgpu_dist_destroy(mgpu_dist *h) {
  if (h == NULL) return 0;
  int err = 0;
  mgpu__dist *d = mgpu__handle_release((uintptr_t)h, MGPU__H_DIST,
                                       "distribution", &err);
  if (d == NULL) return err;
  mgpu__free(d->bound);
  mgpu__free(d->devices);
  mgpu__free(d);
  return 0;
}

/* Blocks in total, and how many part p owns. */
static size_t nblocks(const mgpu__dist *d) {
  return d->n / d->block + (d->n % d->block != 0);
}
static size_t blocks_of(const mgpu__dist *d, int p) {
  size_t B = nblocks(d), P = (size_t)d->nparts;
  return B / P + ((size_t)p < B % P);
}

size_t mgpu__dist_count(const mgpu__dist *d, int p) {
  if (p < 0 || p >= d->nparts) return 0;
  if (!d->cyclic) return d->bound[p + 1] - d->bound[p];
  size_t k = blocks_of(d, p);
  if (k == 0) return 0;
  size_t B = nblocks(d), count = k * d->block;
  /* The last block may be short; it belongs to part (B-1) % P. */
  if ((B - 1) % (size_t)d->nparts == (size_t)p)
    count -= d->block - (d->n - (B - 1) * d->block);
  return count;
}

size_t mgpu__dist_nranges(const mgpu__dist *d, int p) {
  if (p < 0 || p >= d->nparts) return 0;
  if (!d->cyclic) return d->bound[p + 1] > d->bound[p];
  return blocks_of(d, p);
}

mgpu_range mgpu__dist_range(const mgpu__dist *d, int p, size_t r) {
  mgpu_range none = {0, 0};
  if (r >= mgpu__dist_nranges(d, p)) return none;
  if (!d->cyclic) return (mgpu_range){d->bound[p], d->bound[p + 1]};
  size_t k = r * (size_t)d->nparts + (size_t)p;
  size_t begin = k * d->block;
  size_t end = d->n - begin > d->block ? begin + d->block : d->n;
  return (mgpu_range){begin, end};
}

static int locate(const mgpu__dist *d, size_t i, int *part, size_t *local) {
  if (i >= d->n)
    return mgpu__error(MGPU_ERANGE, "distribution: index %zu is past its %zu "
                       "elements", i, d->n);
  int p;
  size_t l;
  if (d->cyclic) {
    size_t k = i / d->block;
    p = (int)(k % (size_t)d->nparts);
    l = (k / (size_t)d->nparts) * d->block + i % d->block;
  } else {
    /* The last part whose range starts at or before i. */
    int lo = 0, hi = d->nparts - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (d->bound[mid] <= i) lo = mid; else hi = mid - 1;
    }
    p = lo;
    l = i - d->bound[p];
  }
  if (part) *part = p;
  if (local) *local = l;
  return 0;
}

/* The public queries: look up, answer, put back. A stale or NULL handle
 * gives the documented "nothing" value (0, -1, an empty range) with the
 * detail set. */
#define DIST_QUERY(type, none, expr) \
  const mgpu__dist *d;               \
  if (mgpu__dist_get(h, &d) != 0) return none; \
  type v = (expr);                   \
  mgpu__dist_put(d);                 \
  return v;

size_t mgpu_dist_n(const mgpu_dist *h) { DIST_QUERY(size_t, 0, d->n) }
int mgpu_dist_nparts(const mgpu_dist *h) { DIST_QUERY(int, 0, d->nparts) }

int mgpu_dist_device(const mgpu_dist *h, int p) {
  DIST_QUERY(int, -1, p >= 0 && p < d->nparts ? d->devices[p] : -1)
}

size_t mgpu_dist_count(const mgpu_dist *h, int p) {
  DIST_QUERY(size_t, 0, mgpu__dist_count(d, p))
}

size_t mgpu_dist_nranges(const mgpu_dist *h, int p) {
  DIST_QUERY(size_t, 0, mgpu__dist_nranges(d, p))
}

mgpu_range mgpu_dist_range(const mgpu_dist *h, int p, size_t r) {
  mgpu_range none = {0, 0};
  DIST_QUERY(mgpu_range, none, mgpu__dist_range(d, p, r))
}

int mgpu_dist_locate(const mgpu_dist *h, size_t i, int *part, size_t *local) {
  const mgpu__dist *d;
  int rc = mgpu__dist_get(h, &d);
  if (rc != 0) return rc;
  rc = locate(d, i, part, local);
  mgpu__dist_put(d);
  return rc;
}
