/* mgpu sched: (being written). */
#ifndef MGPU_SCHED_H
#define MGPU_SCHED_H

#include "mgpu/core.h"

#endif /* MGPU_SCHED_H */
