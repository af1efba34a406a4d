/* The link matrix of the open devices: for each ordered pair, what the
 * hardware offers (link kind), what a copy takes now (path), and, once
 * mgpu_topology_measure has run, the bandwidth and latency of that path.
 *
 * The kind comes from the backends: the same physical GPU, peer access
 * (NVLink is not told apart from PCIe by the backend table yet, so GPU peers
 * report PCIe), host devices sharing host memory, or nothing (staged).
 * Measured figures are kept here until mgpu_shutdown; measuring copies real
 * buffers along the path each pair takes at that moment.
 */
#include <stdlib.h>
#include <string.h>

#include "copy/copy-internal.h"
#include "mgpu/topo.h"
#include "util/fault.h"
#include "util/numa.h"

typedef struct measured_link {
  double bandwidth_gbps, latency_us;
} measured_link;

/* measure_lock guards measured and is_measured; it is held through a whole
 * measurement so that two never run at once. */
static mgpu__mutex measure_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_TOPO);
static measured_link measured[MGPU_MAX_DEVICES][MGPU_MAX_DEVICES];
static int is_measured;

const char *mgpu_link_kind_name(mgpu_link_kind kind) {
  switch (kind) {
    case MGPU_LINK_SAME_DEVICE: return "same-device";
    case MGPU_LINK_SAME_GPU: return "same-gpu";
    case MGPU_LINK_NVLINK: return "nvlink";
    case MGPU_LINK_PCIE: return "pcie";
    case MGPU_LINK_HOST_MEMORY: return "host-memory";
    case MGPU_LINK_STAGED: return "staged";
  }
  return "unknown";
}

static int link_kind(int a, int b, mgpu_link_kind *kind) {
  mgpu__device *da = mgpu__device_get(a), *db = mgpu__device_get(b);
  if (a == b) {
    *kind = MGPU_LINK_SAME_DEVICE;
    return 0;
  }
  if (mgpu__same_physical(da, db)) {
    *kind = MGPU_LINK_SAME_GPU;
    return 0;
  }
  int yes = 0;
  int rc = mgpu_peer_can_access(a, b, &yes);
  if (rc != 0) return rc;
  if (!yes)
    *kind = MGPU_LINK_STAGED;
  else if (da->ops->caps.mem_model == MGPU__MEM_MODEL_HOST)
    *kind = MGPU_LINK_HOST_MEMORY;
  else
    *kind = MGPU_LINK_PCIE;
  return 0;
}

int mgpu_topology(mgpu_topo **out) {
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "topology: the result pointer is NULL");
  *out = NULL;
  int n = mgpu_device_count();
  if (n < 0) return n;
  mgpu_topo *t = mgpu__calloc(1, sizeof *t);
  if (t != NULL) {
    t->numa_node = mgpu__calloc((size_t)n ? (size_t)n : 1, sizeof *t->numa_node);
    t->links = mgpu__calloc((size_t)n * (size_t)n + 1, sizeof *t->links);
  }
  if (t == NULL || t->numa_node == NULL || t->links == NULL) {
    mgpu_topology_free(t);
    return mgpu__error(MGPU_ENOMEM, "topology of %d devices: out of memory", n);
  }
  t->ndevices = n;
  t->numa_nodes = mgpu__numa_count();
  int rc = 0;
  for (int a = 0; a < n; a++) {
    t->numa_node[a] = mgpu__device_numa_node(mgpu__device_get(a));
    for (int b = 0; b < n && rc == 0; b++) {
      mgpu_link *l = MGPU_TOPO_LINK(t, a, b);
      rc = link_kind(a, b, &l->kind);
      if (rc == 0) rc = mgpu__peer_path(a, b, &l->path);
    }
  }
  if (rc != 0) {
    mgpu_topology_free(t);
    return rc;
  }
  mgpu__mutex_lock(&measure_lock);
  t->measured = is_measured;
  for (int a = 0; is_measured && a < n; a++)
    for (int b = 0; b < n; b++) {
      MGPU_TOPO_LINK(t, a, b)->bandwidth_gbps = measured[a][b].bandwidth_gbps;
      MGPU_TOPO_LINK(t, a, b)->latency_us = measured[a][b].latency_us;
    }
  mgpu__mutex_unlock(&measure_lock);
  *out = t;
  return 0;
}

void mgpu_topology_free(mgpu_topo *topo) {
  if (topo == NULL) return;
  mgpu__free(topo->numa_node);
  mgpu__free(topo->links);
  mgpu__free(topo);
}

/* ---- measurement ---- */

#define MEASURE_REPS 5
#define LATENCY_REPS 21

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Median seconds of reps copies of size bytes from src to dst on s (after
 * one warm-up copy). */
static int time_copy(mgpu_buffer *dst, mgpu_buffer *src, size_t size,
                     mgpu_stream *s, int reps, double *seconds) {
  double t[LATENCY_REPS];
  for (int i = -1; i < reps; i++) {
    uint64_t t0 = mgpu__now_ns();
    int rc = mgpu_memcpy_async(dst, 0, src, 0, size, s);
    if (rc == 0) rc = mgpu_stream_synchronize(s);
    if (rc != 0) return rc;
    if (i >= 0) t[i] = (double)(mgpu__now_ns() - t0) * 1e-9;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  *seconds = t[reps / 2];
  return 0;
}

typedef struct measure_bufs {
  mgpu_buffer *src[MGPU_MAX_DEVICES], *dst[MGPU_MAX_DEVICES];
  mgpu_stream *stream[MGPU_MAX_DEVICES];
} measure_bufs;

static void bufs_free(measure_bufs *m, int n) {
  for (int i = 0; i < n; i++) {
    if (m->stream[i] != NULL) mgpu_stream_destroy(m->stream[i]);
    if (m->src[i] != NULL) mgpu_free(m->src[i]);
    if (m->dst[i] != NULL) mgpu_free(m->dst[i]);
  }
}

static int bufs_make(measure_bufs *m, int n, size_t size) {
  for (int i = 0; i < n; i++) {
    int rc = mgpu_malloc(&m->src[i], i, size);
    if (rc == 0) rc = mgpu_malloc(&m->dst[i], i, size);
    if (rc == 0) rc = mgpu_stream_create(&m->stream[i], i);
    /* Touch both once, so that the first timed copy pays no page faults. */
    if (rc == 0) rc = mgpu_memset_async(m->src[i], 0, 1, size, m->stream[i]);
    if (rc == 0) rc = mgpu_memset_async(m->dst[i], 0, 2, size, m->stream[i]);
    if (rc == 0) rc = mgpu_stream_synchronize(m->stream[i]);
    if (rc != 0) return rc;
  }
  return 0;
}

int mgpu_topology_measure(size_t size) {
  if (size == 0) size = (size_t)16 << 20;
  if (size > MGPU_TOPO_MEASURE_MAX)
    return mgpu__error(MGPU_EINVAL, "topology measurement: %zu bytes per copy "
                       "is more than the %zu allowed", size,
                       MGPU_TOPO_MEASURE_MAX);
  int n = mgpu_device_count();
  if (n < 0) return n;
  measure_bufs *m = mgpu__calloc(1, sizeof *m);
  measured_link (*result)[MGPU_MAX_DEVICES] = mgpu__calloc(MGPU_MAX_DEVICES, sizeof *result);
  if (m == NULL || result == NULL) {
    mgpu__free(m);
    mgpu__free(result);
    return mgpu__error(MGPU_ENOMEM, "topology measurement: out of memory");
  }
  mgpu__mutex_lock(&measure_lock);
  int rc = bufs_make(m, n, size);
  for (int a = 0; a < n && rc == 0; a++) {
    for (int b = 0; b < n && rc == 0; b++) {
      double sec = 0, lat = 0;
      rc = time_copy(m->dst[b], m->src[a], size, m->stream[a], MEASURE_REPS, &sec);
      if (rc == 0)
        rc = time_copy(m->dst[b], m->src[a], 1, m->stream[a], LATENCY_REPS, &lat);
      if (rc != 0) break;
      result[a][b].bandwidth_gbps = sec > 0 ? (double)size / sec / 1e9 : 0;
      result[a][b].latency_us = lat * 1e6;
    }
  }
  if (rc == 0) {
    memcpy(measured, result, sizeof measured);
    is_measured = 1;
  }
  mgpu__mutex_unlock(&measure_lock);
  bufs_free(m, n);
  mgpu__free(m);
  mgpu__free(result);
  return rc;
}

/* mgpu_shutdown's hook: forgets the measured figures. */
static void topo_shutdown(void) {
  mgpu__mutex_lock(&measure_lock);
  memset(measured, 0, sizeof measured);
  is_measured = 0;
  mgpu__mutex_unlock(&measure_lock);
}
MGPU__ON_SHUTDOWN(topo_shutdown, MGPU__LAYER_TOPO)
