/* The topology matrix: link kinds and paths agree with the peer state and
 * the backend, NUMA nodes are sane, measured figures appear once measured
 * and are gone after a shutdown. */
#include "task.h"

static int init_peer(int host_peer) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.host_peer = host_peer;
  ASSERT_OK(mgpu_init(&cfg));
  return mgpu_device_count();
}

static int is_host(void) {
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  return p.backend_kind == MGPU_BACKEND_HOST;
}

/* Every entry of the matrix against what the peer calls say. */
static void check_matrix(const mgpu_topo *t) {
  ASSERT_EQ(t->ndevices, mgpu_device_count());
  ASSERT(t->numa_nodes >= 1);
  for (int a = 0; a < t->ndevices; a++) {
    ASSERT(t->numa_node[a] >= -1 && t->numa_node[a] < t->numa_nodes);
    /* The properties say the node the topology says (mgpu devices said -1
     * for host devices where mgpu topo said 0). */
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(a, &p));
    ASSERT_EQ(p.numa_node, t->numa_node[a]);
    for (int b = 0; b < t->ndevices; b++) {
      const mgpu_link *l = MGPU_TOPO_LINK(t, a, b);
      int yes = -1;
      mgpu_copy_path path;
      ASSERT_OK(mgpu_peer_can_access(a, b, &yes));
      ASSERT_OK(mgpu_copy_path_get(a, b, &path));
      ASSERT_EQ(l->path, path);
      if (a == b) {
        ASSERT_EQ(l->kind, MGPU_LINK_SAME_DEVICE);
        ASSERT_EQ(l->path, MGPU_PATH_DEVICE);
      } else if (l->kind == MGPU_LINK_SAME_GPU) {
        ASSERT_EQ(yes, 1); /* a device copy, or staged when turned off */
        ASSERT(l->path == MGPU_PATH_DEVICE || l->path == MGPU_PATH_STAGED);
      } else if (l->kind == MGPU_LINK_STAGED) {
        ASSERT_EQ(yes, 0);
        ASSERT_EQ(l->path, MGPU_PATH_STAGED);
      } else {
        ASSERT_EQ(yes, 1);
      }
      ASSERT(strcmp(mgpu_link_kind_name(l->kind), "unknown") != 0);
    }
  }
}

TEST_IMPL(matrix_host_peer) {
  int n = init_peer(1);
  mgpu_topo *t;
  ASSERT_OK(mgpu_topology(&t));
  check_matrix(t);
  ASSERT_EQ(t->measured, 0);
  if (is_host()) {
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++) {
        if (a == b) continue;
        ASSERT_EQ(MGPU_TOPO_LINK(t, a, b)->kind, MGPU_LINK_HOST_MEMORY);
        ASSERT_EQ(MGPU_TOPO_LINK(t, a, b)->path, MGPU_PATH_DIRECT);
        ASSERT(MGPU_TOPO_LINK(t, a, b)->bandwidth_gbps == 0);
      }
    for (int a = 0; a < n; a++) ASSERT(t->numa_node[a] >= 0);
  }
  mgpu_topology_free(t);
  /* Turning a pair off shows in the matrix as the path, not the kind. */
  if (n >= 2) {
    ASSERT_OK(mgpu_peer_disable(1, 0));
    ASSERT_OK(mgpu_topology(&t));
    check_matrix(t);
    ASSERT_EQ(MGPU_TOPO_LINK(t, 0, 1)->path, MGPU_PATH_STAGED);
    ASSERT_EQ(MGPU_TOPO_LINK(t, 1, 0)->path, MGPU_PATH_STAGED);
    mgpu_topology_free(t);
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(matrix_host_peer_none) {
  int n = init_peer(0);
  mgpu_topo *t;
  ASSERT_OK(mgpu_topology(&t));
  check_matrix(t);
  if (is_host())
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        if (a != b) {
          ASSERT_EQ(MGPU_TOPO_LINK(t, a, b)->kind, MGPU_LINK_STAGED);
          ASSERT_EQ(MGPU_TOPO_LINK(t, a, b)->path, MGPU_PATH_STAGED);
        }
  mgpu_topology_free(t);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(measure) {
  int n = init_peer(-1);
  if (n > 4) n = 4;
  ASSERT_ERR(MGPU_EINVAL, mgpu_topology_measure(MGPU_TOPO_MEASURE_MAX + 1));
  ASSERT_DETAIL_HAS("bytes per copy");
  ASSERT_OK(mgpu_topology_measure((size_t)1 << 20));
  mgpu_topo *t;
  ASSERT_OK(mgpu_topology(&t));
  ASSERT_EQ(t->measured, 1);
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      ASSERT(MGPU_TOPO_LINK(t, a, b)->bandwidth_gbps > 0);
      ASSERT(MGPU_TOPO_LINK(t, a, b)->latency_us > 0);
    }
  mgpu_topology_free(t);
  ASSERT_OK(mgpu_shutdown());
  /* Measured figures belong to one session. */
  init_peer(-1);
  ASSERT_OK(mgpu_topology(&t));
  ASSERT_EQ(t->measured, 0);
  ASSERT(MGPU_TOPO_LINK(t, 0, 0)->bandwidth_gbps == 0);
  mgpu_topology_free(t);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(errors) {
  mgpu_topo *t = NULL;
  ASSERT_ERR(MGPU_ENOINIT, mgpu_topology(&t));
  ASSERT(t == NULL);
  ASSERT_ERR(MGPU_ENOINIT, mgpu_topology_measure(0));
  int yes;
  ASSERT_ERR(MGPU_ENOINIT, mgpu_peer_can_access(0, 0, &yes));
  test_init();
  ASSERT_ERR(MGPU_EINVAL, mgpu_topology(NULL));
  mgpu_topology_free(NULL);
  ASSERT(strcmp(mgpu_link_kind_name((mgpu_link_kind)99), "unknown") == 0);
  ASSERT(strcmp(mgpu_copy_path_name(MGPU_PATH_STAGED), "staged") == 0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(matrix_host_peer)
TEST_ENTRY(matrix_host_peer_none)
TEST_ENTRY(measure)
TEST_ENTRY(errors)
TEST_LIST_END
