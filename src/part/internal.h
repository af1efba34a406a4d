/* Internal layout of a distribution (dist.c; read by scatter.c). Immutable
 * after mgpu_dist_create, so any thread may read it. */
#ifndef MGPU_PART_INTERNAL_H
#define MGPU_PART_INTERNAL_H

#include <stddef.h>

#include "mgpu/copy.h"
#include "mgpu/part.h"

struct mgpu_dist {
  mgpu_dist_kind kind; /* as asked */
  size_t n;
  int nparts;
  int *devices;        /* device of each part */
  int cyclic;          /* 1: ranges computed from block (cyclic or
                          block-cyclic over more than one part) */
  size_t block;        /* block size of a cyclic layout (1 for cyclic) */
  size_t *bound;       /* otherwise: nparts + 1 boundaries */
};

#endif /* MGPU_PART_INTERNAL_H */
