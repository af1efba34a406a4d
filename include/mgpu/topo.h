/* mgpu topo: (being written). */
#ifndef MGPU_TOPO_H
#define MGPU_TOPO_H

#include "mgpu/core.h"

#endif /* MGPU_TOPO_H */
