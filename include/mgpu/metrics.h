/* mgpu metrics: per-device counters that every layer records into.
 *
 * Counters only grow until mgpu_metrics_reset(); gauges (memory in use) follow
 * the state. Recording never steers the runtime. A snapshot is a plain struct
 * the caller owns.
 */
#ifndef MGPU_METRICS_H
#define MGPU_METRICS_H

#include <stdint.h>
#include <stdio.h>

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
  XX(bytes_mpi, "bytes of this device's memory moved by MPI")                \
  XX(graph_launches, "graph launches on this device's streams")

/* The paths a copy takes, as the metrics time them. */
typedef enum mgpu_metric_path {
  MGPU_METRIC_PATH_H2D = 0,         /* host to device */
  MGPU_METRIC_PATH_D2H = 1,         /* device to host */
  MGPU_METRIC_PATH_D2D = 2,         /* within one device (or one GPU) */
  MGPU_METRIC_PATH_PEER_DIRECT = 3, /* device to device, directly */
  MGPU_METRIC_PATH_PEER_STAGED = 4, /* device to device through the host */
  MGPU_METRIC_PATHS = 5
} mgpu_metric_path;

typedef struct mgpu_device_metrics {
  uint64_t mem_in_use; /* bytes currently allocated on the device (gauge),
                          the pool's cached blocks included */
  uint64_t mem_peak;   /* largest mem_in_use since init or reset */
  uint64_t mem_pool_cached; /* of mem_in_use, bytes the stream-ordered pool
                               keeps free for reuse (gauge) */
#define MGPU__METRIC_FIELD(name, doc) uint64_t name;
  MGPU_METRICS_MAP(MGPU__METRIC_FIELD)
#undef MGPU__METRIC_FIELD
  /* Time this device spent running copies of each path (a host-staged
   * copy's chunks count on the device that moved them), the bytes those
   * copies moved, and their ratio in GB/s (0 when no copy ran). */
  uint64_t copy_ns[MGPU_METRIC_PATHS];
  uint64_t copy_bytes[MGPU_METRIC_PATHS];
  double copy_gbps[MGPU_METRIC_PATHS];
  /* busy_ns / wall_ns. Work of several streams of one device that ran at
   * once counts once per stream, so a host device (two workers) can pass
   * 1.0. */
  double utilization;
} mgpu_device_metrics;

typedef struct mgpu_metrics {
  size_t size;    /* sizeof(mgpu_metrics), set by the caller */
  int ndevices;
  double load_imbalance; /* max busy_ns / mean busy_ns - 1; 0 when idle */
  uint64_t wall_ns;      /* since mgpu_init or the last mgpu_metrics_reset */
  mgpu_device_metrics dev[MGPU_MAX_DEVICES];
} mgpu_metrics;

typedef enum mgpu_metrics_format {
  MGPU_METRICS_TABLE = 0, /* one line per device, for people */
  MGPU_METRICS_JSON = 1   /* one JSON object, for scripts */
} mgpu_metrics_format;

/* Fills *out (out->size must be set). */
MGPU_EXTERN int mgpu_metrics_snapshot(mgpu_metrics *out);
/* Sets every counter to 0, every peak to the current value, and the wall
 * clock of utilization to now. */
MGPU_EXTERN int mgpu_metrics_reset(void);

/* Prints a snapshot to out: per device utilization, busy time, memory in
 * use, cached by the pool and peak, copies per path with their time and
 * bandwidth, kernels, tasks, collectives; then the load imbalance. Errors:
 * MGPU_EINVAL (out NULL, format unknown), MGPU_ENOINIT, MGPU_EIO (the
 * write failed). MGPU_METRICS=stderr|path prints them at mgpu_shutdown
 * (JSON for a path ending in .json, else the table). */
MGPU_EXTERN int mgpu_metrics_print(FILE *out, mgpu_metrics_format format);

/* "h2d", "d2h", "d2d", "peer_direct", "peer_staged"; "?" otherwise. */
MGPU_EXTERN const char *mgpu_metric_path_name(int path);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_METRICS_H */
