/* Internal layout of a distribution (dist.c; read by scatter.c). Immutable
 * after mgpu_dist_create, so any thread may read it. The public mgpu_dist *
 * is a handle of the core's table; a call holds it while it reads. */
#ifndef MGPU_PART_INTERNAL_H
#define MGPU_PART_INTERNAL_H

#include <stddef.h>

#include "core/core-internal.h"
#include "mgpu/copy.h"
#include "mgpu/part.h"

typedef struct mgpu__dist {
  uintptr_t handle;
  mgpu_dist_kind kind; /* as asked */
  size_t n;
  int nparts;
  int *devices;        /* device of each part */
  int cyclic;          /* 1: ranges computed from block (cyclic or
                          block-cyclic over more than one part) */
  size_t block;        /* block size of a cyclic layout (1 for cyclic) */
  size_t *bound;       /* otherwise: nparts + 1 boundaries */
} mgpu__dist;

/* Looks a public distribution up and holds it until mgpu__dist_put. */
int mgpu__dist_get(const mgpu_dist *h, const mgpu__dist **out);
void mgpu__dist_put(const mgpu__dist *d);
/* The public queries, on a distribution already looked up. */
size_t mgpu__dist_count(const mgpu__dist *d, int p);
size_t mgpu__dist_nranges(const mgpu__dist *d, int p);
mgpu_range mgpu__dist_range(const mgpu__dist *d, int p, size_t r);

#endif /* MGPU_PART_INTERNAL_H */
