/* Cycles of device functions: device functions that call mgpu_run_on_device
 * on each other in a cycle get MGPU_EDEADLK naming the cycle instead of
 * hanging; a chain without a cycle runs (test-waits.c has the rest). */
#include "task.h"

typedef struct hop {
  int path[4]; /* devices to visit in turn, -1 ends */
  int at;
  char detail[256];
} hop;

/* Runs the next hop of the path from this device's host thread; the last
 * device returns its id + 100. */
static int next_hop(int dev, void *arg) {
  hop *h = arg;
  int next = h->path[++h->at];
  if (next < 0) return dev + 100;
  int rc = mgpu_run_on_device(next, next_hop, h);
  if (rc == MGPU_EDEADLK && h->detail[0] == '\0')
    snprintf(h->detail, sizeof h->detail, "%s", mgpu_error_detail());
  return rc;
}

static int run_path(hop *h) {
  h->at = 0;
  h->detail[0] = '\0';
  return mgpu_run_on_device(h->path[0], next_hop, h);
}

TEST_IMPL(run_on_device_cycle_is_edeadlk) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  /* No cycle: 0 -> 1 -> 2 runs, and 0 -> 1 -> 1 runs inline. */
  hop chain = {{0, 1, 2, -1}, 0, ""};
  ASSERT_EQ(run_path(&chain), 102);
  hop self = {{0, 1, 1, -1}, 0, ""};
  ASSERT_EQ(run_path(&self), 101);
  /* 0 -> 1 -> 0: device 1's function would wait for device 0, which waits
   * for it. */
  hop two = {{0, 1, 0, -1}, 0, ""};
  ASSERT_EQ(run_path(&two), MGPU_EDEADLK);
  ASSERT(strstr(two.detail, "(1 -> 0 -> 1)") != NULL);
  /* 0 -> 1 -> 2 -> 0. */
  hop three = {{0, 1, 2, 0}, 0, ""};
  ASSERT_EQ(run_path(&three), MGPU_EDEADLK);
  ASSERT(strstr(three.detail, "(2 -> 0 -> 1 -> 2)") != NULL);
  /* The devices go on. */
  ASSERT_EQ(run_path(&chain), 102);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(run_on_device_cycle_is_edeadlk)
TEST_LIST_END
