/* NUMA lookup and thread binding: a platform service below the core.
 *
 * hwloc when it was found at build time (MGPU_HAVE_HWLOC), sysfs otherwise.
 * Thread-safe: one lock inside numa.c guards what it loads. */
#ifndef MGPU_UTIL_NUMA_H
#define MGPU_UTIL_NUMA_H

/* NUMA nodes of the machine (at least 1). */
int mgpu__numa_count(void);

/* The NUMA node of the PCI device with this bus id ("0000:19:00.0", any
 * domain width, any case): hwloc's answer, else sysfs. -1 when unknown. */
int mgpu__numa_node_of_bus_id(const char *bus_id);

/* Binds the calling thread to the cores of NUMA node node (hwloc only).
 * Returns 0 when bound, -1 when not (no hwloc, unknown node). */
int mgpu__numa_bind_thread(int node);

/* Frees what numa.c loaded (mgpu_shutdown). */
void mgpu__numa_release(void);

#endif /* MGPU_UTIL_NUMA_H */
