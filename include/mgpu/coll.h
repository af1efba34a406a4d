/* mgpu coll: (being written). */
#ifndef MGPU_COLL_H
#define MGPU_COLL_H

#include "mgpu/core.h"

#endif /* MGPU_COLL_H */
