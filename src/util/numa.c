/* NUMA locality: a platform service below the core (see util/numa.h).
 *
 * Where hwloc was found at build time (MGPU_HAVE_HWLOC) the machine's
 * topology is loaded once to count the nodes and to bind threads to a node's
 * cores (hwloc_set_cpubind), and a GPU's node is the node of the first
 * non-I/O ancestor of its PCI device. That needs hwloc's PCI discovery, which
 * is slow and leaks inside libpciaccess, so it is a second topology, loaded
 * only when a device with a PCI bus id asks. Without hwloc the nodes are
 * counted in sysfs, a GPU's node is /sys/bus/pci/devices/<bus id>/numa_node
 * and threads stay where the OS puts them.
 *
 * This is the one place that reads NUMA from hwloc or sysfs; the core asks
 * it for the node of each device (core/device.c) and the CUDA plugin gets
 * the bus-id lookup through its backend environment.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/numa.h"
#include "util/thread.h"

#ifdef MGPU_HAVE_HWLOC
#include <hwloc.h>
#endif

/* numa_lock guards the topologies and node_count. */
static mgpu__mutex numa_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_NUMA);
static int node_count; /* 0: not counted yet */
#ifdef MGPU_HAVE_HWLOC
/* [0]: without I/O objects, [1]: with PCI devices. NULL: not loaded. */
static hwloc_topology_t hwloc_topo[2];
static int hwloc_failed[2];

/* Called under numa_lock. */
static hwloc_topology_t hwloc_locked(int with_pci) {
  if (hwloc_topo[with_pci] != NULL || hwloc_failed[with_pci])
    return hwloc_topo[with_pci];
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) {
    hwloc_failed[with_pci] = 1;
    return NULL;
  }
  hwloc_topology_set_io_types_filter(t, with_pci
                                            ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT
                                            : HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    hwloc_failed[with_pci] = 1;
    mgpu__log(MGPU_LOG_WARN, "hwloc could not load the machine's topology: "
              "NUMA nodes come from sysfs%s", with_pci ? "" : ", threads are "
              "not bound");
    return NULL;
  }
  hwloc_topo[with_pci] = t;
  return t;
}
#endif

static int sysfs_node_count(void) {
  DIR *dir = opendir("/sys/devices/system/node");
  int n = 0;
  if (dir == NULL) return 1;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL)
    if (strncmp(e->d_name, "node", 4) == 0 && isdigit((unsigned char)e->d_name[4]))
      n++;
  closedir(dir);
  return n > 0 ? n : 1;
}

int mgpu__numa_count(void) {
  mgpu__mutex_lock(&numa_lock);
  if (node_count == 0) {
#ifdef MGPU_HAVE_HWLOC
    hwloc_topology_t t = hwloc_locked(0);
    if (t != NULL) node_count = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
#endif
    if (node_count <= 0) node_count = sysfs_node_count();
  }
  int n = node_count;
  mgpu__mutex_unlock(&numa_lock);
  return n;
}

/* "00000000:19:00.0" or "0000:19:00.0" -> "0000:19:00.0", lower case.
 * Returns 0, or -1 when the id does not look like one. */
static int normalize_bus_id(const char *in, char *out, size_t outsz) {
  const char *colon = strchr(in, ':');
  if (colon == NULL || outsz < 13) return -1;
  size_t domain_len = (size_t)(colon - in);
  if (domain_len > 4) in += domain_len - 4; /* keep the low 4 digits */
  size_t n = strlen(in);
  if (n >= outsz) return -1;
  for (size_t i = 0; i <= n; i++) out[i] = (char)tolower((unsigned char)in[i]);
  return 0;
}

int mgpu__numa_node_of_bus_id(const char *bus_id) {
  char id[32];
  if (normalize_bus_id(bus_id, id, sizeof id) != 0) return -1;
  int node = -1;
#ifdef MGPU_HAVE_HWLOC
  mgpu__mutex_lock(&numa_lock);
  hwloc_topology_t t = hwloc_locked(1);
  hwloc_obj_t pci = t != NULL ? hwloc_get_pcidev_by_busidstring(t, id) : NULL;
  hwloc_obj_t anc = pci != NULL ? hwloc_get_non_io_ancestor_obj(t, pci) : NULL;
  if (anc != NULL && anc->nodeset != NULL && !hwloc_bitmap_iszero(anc->nodeset))
    node = hwloc_bitmap_first(anc->nodeset);
  mgpu__mutex_unlock(&numa_lock);
  if (node >= 0) return node;
#endif
  char path[96];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", id);
  FILE *f = fopen(path, "r");
  if (f != NULL) {
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
  }
  /* A machine with one node says -1 in sysfs: the device is on node 0. */
  if (node < 0 && f != NULL && mgpu__numa_count() == 1) node = 0;
  return node;
}

int mgpu__numa_bind_thread(int node) {
#ifdef MGPU_HAVE_HWLOC
  if (node < 0) return -1;
  int rc = -1;
  mgpu__mutex_lock(&numa_lock);
  hwloc_topology_t t = hwloc_locked(0);
  hwloc_obj_t obj = t != NULL ? hwloc_get_numanode_obj_by_os_index(t, (unsigned)node)
                              : NULL;
  if (obj != NULL && obj->cpuset != NULL && !hwloc_bitmap_iszero(obj->cpuset))
    rc = hwloc_set_cpubind(t, obj->cpuset, HWLOC_CPUBIND_THREAD);
  mgpu__mutex_unlock(&numa_lock);
  return rc == 0 ? 0 : -1;
#else
  (void)node;
  return -1;
#endif
}

void mgpu__numa_release(void) {
  mgpu__mutex_lock(&numa_lock);
#ifdef MGPU_HAVE_HWLOC
  for (int i = 0; i < 2; i++) {
    if (hwloc_topo[i] != NULL) hwloc_topology_destroy(hwloc_topo[i]);
    hwloc_topo[i] = NULL;
    hwloc_failed[i] = 0;
  }
#endif
  node_count = 0;
  mgpu__mutex_unlock(&numa_lock);
}
