/* mgpu metrics: per-device counters that every layer records into.
 *
 * Counters only grow until mgpu_metrics_reset(); gauges (memory in use) follow
 * the state. Recording never steers the runtime. A snapshot is a plain struct
 * the caller owns.
 */
#ifndef MGPU_METRICS_H
#define MGPU_METRICS_H

#include <stdint.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The counters, each a uint64_t field of mgpu_device_metrics. One list, so
 * that the struct, the recorder and the printers stay in step. */
#define MGPU_METRICS_MAP(XX)                                                  \
  XX(bytes_h2d, "bytes copied host to device")                                \
  XX(bytes_d2h, "bytes copied device to host")                                \
  XX(bytes_d2d, "bytes copied within the device")                             \
  XX(bytes_peer_direct, "bytes sent to another device directly")             \
  XX(bytes_peer_staged, "bytes sent to another device through the host")    \
  XX(copies_h2d, "host to device copies")                                     \
  XX(copies_d2h, "device to host copies")                                     \
  XX(copies_d2d, "copies within the device")                                  \
  XX(copies_peer_direct, "direct copies to another device")                  \
  XX(copies_peer_staged, "host-staged copies to another device")             \
  XX(kernels_launched, "kernels launched")                                    \
  XX(busy_ns, "nanoseconds the device spent running work")                   \
  XX(tasks_run, "pool tasks run")                                             \
  XX(tasks_stolen, "pool tasks this device stole from another")              \
  XX(coll_ops, "collectives this device took part in")                       \
  XX(coll_ring, "collectives run by mgpu's ring")                             \
  XX(coll_nccl, "collectives run by NCCL")                                    \
  XX(chan_msgs_sent, "channel messages sent")                                 \
  XX(chan_msgs_received, "channel messages received")                         \
  XX(mpi_host, "MPI transfers handing this device's memory to MPI as is")     \
  XX(mpi_direct, "MPI transfers of device pointers to a CUDA-aware MPI")      \
  XX(mpi_staged, "MPI transfers staged through pinned bounce buffers")        \
  XX(bytes_mpi, "bytes of this device's memory moved by MPI")

typedef struct mgpu_device_metrics {
  uint64_t mem_in_use; /* bytes currently allocated on the device (gauge) */
  uint64_t mem_peak;   /* largest mem_in_use since init or reset */
#define MGPU__METRIC_FIELD(name, doc) uint64_t name;
  MGPU_METRICS_MAP(MGPU__METRIC_FIELD)
#undef MGPU__METRIC_FIELD
} mgpu_device_metrics;

typedef struct mgpu_metrics {
  size_t size;    /* sizeof(mgpu_metrics), set by the caller */
  int ndevices;
  double load_imbalance; /* max busy_ns / mean busy_ns - 1; 0 when idle */
  mgpu_device_metrics dev[MGPU_MAX_DEVICES];
} mgpu_metrics;

/* Fills *out (out->size must be set). */
MGPU_EXTERN int mgpu_metrics_snapshot(mgpu_metrics *out);
/* Sets every counter to 0 and every peak to the current value. */
MGPU_EXTERN int mgpu_metrics_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_METRICS_H */
