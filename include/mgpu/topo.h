/* mgpu topo: the link matrix of the open devices (what each pair offers,
 * the path a copy takes now, measured bandwidth and latency). Peer access,
 * copy paths and staging are the copy layer's (mgpu/copy.h).
 */
#ifndef MGPU_TOPO_H
#define MGPU_TOPO_H

#include <stddef.h>

#include "mgpu/copy.h"
#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Topology                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum mgpu_link_kind {
  MGPU_LINK_SAME_DEVICE = 0, /* a device and itself */
  MGPU_LINK_SAME_GPU = 1,    /* two logical devices cut from one GPU */
  MGPU_LINK_NVLINK = 2,      /* GPUs joined by NVLink */
  MGPU_LINK_PCIE = 3,        /* GPUs with peer access over PCIe */
  MGPU_LINK_HOST_MEMORY = 4, /* host devices: direct copies in host memory */
  MGPU_LINK_STAGED = 5       /* no direct path: copies go through the host */
} mgpu_link_kind;

/* "same-device", "same-gpu", "nvlink", "pcie", "host-memory", "staged". */
MGPU_EXTERN const char *mgpu_link_kind_name(mgpu_link_kind kind);

/* One ordered pair (src -> dst) of the matrix. */
typedef struct mgpu_link {
  mgpu_link_kind kind;  /* what the hardware offers */
  mgpu_copy_path path;  /* what a copy takes now (peer access on or off) */
  double bandwidth_gbps; /* measured by mgpu_topology_measure, else 0 */
  double latency_us;     /* measured time of a 1-byte copy, else 0 */
} mgpu_link;

/* The link matrix. Returned by mgpu_topology(), owned by the caller, freed
 * with mgpu_topology_free. */
typedef struct mgpu_topo {
  int ndevices;
  int measured;    /* 1 once mgpu_topology_measure has run */
  int numa_nodes;  /* NUMA nodes of the machine (1 when unknown) */
  int *numa_node;  /* [ndevices]: node nearest each device, -1 unknown */
  mgpu_link *links; /* [ndevices * ndevices], row = src, column = dst */
} mgpu_topo;

/* The link from src to dst in a matrix. */
#define MGPU_TOPO_LINK(topo, src, dst) \
  (&(topo)->links[(size_t)(src) * (size_t)(topo)->ndevices + (size_t)(dst)])

/* Builds the matrix of the open devices (with the last measured figures). */
MGPU_EXTERN int mgpu_topology(mgpu_topo **out);
MGPU_EXTERN void mgpu_topology_free(mgpu_topo *topo);

/* Measures bandwidth (a copy of size bytes; 0: 16 MiB) and latency (a 1-byte
 * copy) for every ordered pair of devices along the path each takes now, and
 * keeps the figures for later mgpu_topology() calls until mgpu_shutdown.
 * Takes a few buffers of size bytes on every device while it runs. A size
 * above MGPU_TOPO_MEASURE_MAX (1 GiB) is MGPU_EINVAL. */
#define MGPU_TOPO_MEASURE_MAX ((size_t)1 << 30)
MGPU_EXTERN int mgpu_topology_measure(size_t size);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_TOPO_H */
