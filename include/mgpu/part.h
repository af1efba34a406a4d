/* mgpu part: (being written). */
#ifndef MGPU_PART_H
#define MGPU_PART_H

#include "mgpu/core.h"

#endif /* MGPU_PART_H */
