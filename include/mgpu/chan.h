/* mgpu chan: (being written). */
#ifndef MGPU_CHAN_H
#define MGPU_CHAN_H

#include "mgpu/core.h"

#endif /* MGPU_CHAN_H */
