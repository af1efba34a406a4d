/* Binding of device host threads to the cores near their device.
 *
 * The core calls mgpu__topo_bind_current_thread on each device's host thread
 * as it starts. With hwloc the thread is bound to the cores of the device's
 * NUMA node (numa.c says how the node is found), so that what it allocates
 * and touches lives near the device. Without hwloc it is left alone.
 */
#include "topo/topo-internal.h"

void mgpu__topo_bind_current_thread(mgpu__device *d) {
  int node = mgpu__numa_node_of(d);
  if (mgpu__numa_bind_thread(node) == 0)
    mgpu__log(MGPU_LOG_DEBUG, "device %d: host thread bound to NUMA node %d",
              d->id, node);
}
