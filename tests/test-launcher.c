/* MGPU_DEVICES=local: one device per process, picked by the launcher's
 * node-local rank (Open MPI, Slurm, MPICH, PMI), without MPI in the
 * program. Here (no GPU) it opens one host device; on a GPU machine it
 * opens GPU (local rank mod GPUs). */
#include "task.h"

static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                                   "SLURM_LOCALID", "MPI_LOCALRANKID",
                                   "PMI_LOCAL_RANK"};

static void clear_launcher(void) {
  for (int i = 0; i < 4; i++) unsetenv(vars[i]);
}

TEST_IMPL(local_from_each_launcher) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "local";
  for (int i = 0; i < 4; i++) {
    clear_launcher();
    setenv(vars[i], "1", 1);
    ASSERT_OK(mgpu_init(&cfg));
    ASSERT_EQ(mgpu_device_count(), 1);
    mgpu_device_props p = {.size = sizeof p};
    ASSERT_OK(mgpu_device_get_props(0, &p));
    /* local rank 1: GPU 1, or GPU 0 on a one-GPU machine */
    if (p.backend_kind == MGPU_BACKEND_CUDA)
      ASSERT(p.ordinal == 0 || p.ordinal == 1);
    ASSERT_OK(mgpu_shutdown());
  }
  clear_launcher();
  return 0;
}

TEST_IMPL(local_without_launcher_is_an_error) {
  clear_launcher();
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "local";
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("OMPI_COMM_WORLD_LOCAL_RANK");
  ASSERT_DETAIL_HAS("SLURM_LOCALID");
  ASSERT_EQ(mgpu_is_initialized(), 0);
  setenv("SLURM_LOCALID", "first", 1);
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("SLURM_LOCALID");
  ASSERT_DETAIL_HAS("first");
  clear_launcher();
  return 0;
}

TEST_IMPL(local_with_other_devices) {
  clear_launcher();
  setenv("PMI_LOCAL_RANK", "0", 1);
  setenv("MGPU_DEVICES", "local,host:2", 1);
  ASSERT_OK(mgpu_init(NULL));
  ASSERT_EQ(mgpu_device_count(), 3);
  ASSERT_OK(mgpu_shutdown());
  unsetenv("MGPU_DEVICES");
  clear_launcher();
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(local_from_each_launcher)
TEST_ENTRY(local_without_launcher_is_an_error)
TEST_ENTRY(local_with_other_devices)
TEST_LIST_END
