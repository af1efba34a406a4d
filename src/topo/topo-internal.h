/* Internal interface of the topology layer (src/topo): NUMA locality of the
 * devices, shared by the matrix (topo.c) and the thread binding (bind.c).
 */
#ifndef MGPU_TOPO_INTERNAL_H
#define MGPU_TOPO_INTERNAL_H

#include "core/internal.h"

/* NUMA nodes of the machine (at least 1). */
int mgpu__numa_count(void);

/* The NUMA node nearest device d: the backend's answer when it has one,
 * else the node of its PCI bus id (hwloc, or sysfs), else for host devices
 * node id % mgpu__numa_count(). -1 when unknown. Works before mgpu_init has
 * returned (the device's host thread asks while it starts). */
int mgpu__numa_node_of(mgpu__device *d);

/* Binds the calling thread to the cores of NUMA node node (hwloc only).
 * Returns 0 when bound, -1 when not (no hwloc, unknown node). */
int mgpu__numa_bind_thread(int node);

/* Frees what numa.c loaded and forgets the measured figures (shutdown). */
void mgpu__numa_release(void);
void mgpu__topo_reset(void);

#endif /* MGPU_TOPO_INTERNAL_H */
