/* mgpu topo: peer access between devices, the path a copy between two
 * devices takes, and the link matrix of the open devices.
 *
 * Peer access is a property of a pair of devices. mgpu turns it on for every
 * pair that supports it the first time a copy between the two needs it, so
 * the one copy call (mgpu_memcpy_async) goes direct wherever it can without
 * any setup. mgpu_peer_disable(a, b) turns it off for the pair, so that
 * copies between a and b go through the pipelined host-staged path until
 * mgpu_peer_enable(a, b). Both are harmless to repeat. docs/copy.md is the
 * guide.
 */
#ifndef MGPU_TOPO_H
#define MGPU_TOPO_H

#include <stddef.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Peer access                                                              */
/* ------------------------------------------------------------------------ */

/* *yes = 1 when devices a and b can copy directly between each other (both
 * directions), else 0. A device and itself, and two logical devices cut from
 * one GPU, always can. Host devices can unless MGPU_HOST_PEER=none (or the
 * config's host_peer = 0). */
MGPU_EXTERN int mgpu_peer_can_access(int a, int b, int *yes);

/* Turns direct copies between a and b on (both directions). MGPU_ENOTSUP with
 * a detail when the pair cannot; 0 when it already is on. */
MGPU_EXTERN int mgpu_peer_enable(int a, int b);

/* Turns direct copies between a and b off (both directions): copies between
 * them go host-staged, even between two logical devices of one GPU (which
 * otherwise copy within the GPU): that is how the staged path is measured on
 * a machine with one GPU. 0 when it already is off. Copies already queued
 * are not affected. */
MGPU_EXTERN int mgpu_peer_disable(int a, int b);

/* How a copy from one device to another travels. */
typedef enum mgpu_copy_path {
  MGPU_PATH_DEVICE = 0, /* within one device or one GPU: a device copy */
  MGPU_PATH_DIRECT = 1, /* direct peer copy */
  MGPU_PATH_STAGED = 2  /* pipelined through pinned host bounce buffers */
} mgpu_copy_path;

/* The path a copy of device buffers from src to dst takes now (turning peer
 * access on first where it is possible and was not turned off). */
MGPU_EXTERN int mgpu_copy_path_get(int src, int dst, mgpu_copy_path *path);

/* "device", "direct", "staged". */
MGPU_EXTERN const char *mgpu_copy_path_name(mgpu_copy_path path);

/* The host-staged path moves a copy in chunks of chunk bytes through depth
 * pinned bounce buffers (at least 2), so that the device-to-host half of one
 * chunk overlaps the host-to-device half of the one before. The defaults
 * come from the config (MGPU_STAGING_CHUNK, MGPU_STAGING_DEPTH); a chunk
 * left unset there is chosen per pair of devices (8 MiB between GPUs, 1 MiB
 * between host devices), and mgpu_staging_get reports it as 0. A change
 * applies to copies issued after it. chunk 0 or depth 0 leaves that value as
 * it is. A chunk lies between MGPU_STAGING_CHUNK_MIN and _MAX bytes (smaller
 * ones cut a copy into too many pieces, larger ones pin too much memory), a
 * depth between 2 and MGPU_STAGING_DEPTH_MAX: others are MGPU_EINVAL, here
 * and in the environment variables. */
#define MGPU_STAGING_CHUNK_MIN ((size_t)4 << 10)
#define MGPU_STAGING_CHUNK_MAX ((size_t)64 << 20)
#define MGPU_STAGING_DEPTH_MAX 64
MGPU_EXTERN int mgpu_staging_set(size_t chunk, int depth);
MGPU_EXTERN int mgpu_staging_get(size_t *chunk, int *depth);

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
