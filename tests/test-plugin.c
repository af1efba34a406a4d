/* Tests of the plugin loader (src/backend/plugin.c) with plugins planted in
 * a folder of the build (tests/plugins/planted.c), named by the config's
 * plugin path, so that they run on every machine, with or without the real
 * plugins. */
#include <string.h>

#include "backend/backend.h"
#include "task.h"

#ifndef MGPU_PLANTED_DIR
#error "MGPU_PLANTED_DIR names the folder of the planted plugins"
#endif

/* Initializes on devices with the planted plugins first in the search: a
 * plugin of ABI 6 is refused with MGPU_EPLUGIN, naming the entry it exports
 * (and its ABI) and the one this libmgpu looks up. */
static int refused(const char *devices, const char *file) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = devices;
  cfg.plugin_path = MGPU_PLANTED_DIR;
  ASSERT_ERR(MGPU_EPLUGIN, mgpu_init(&cfg));
  ASSERT(!mgpu_is_initialized());
  ASSERT_DETAIL_HAS(file);
  ASSERT_DETAIL_HAS("exports mgpu_backend_plugin_v1 (backend ABI 6)");
  ASSERT_DETAIL_HAS("needs " MGPU__PLUGIN_ENTRY " (backend ABI");
  /* The entry looked up is named after the ABI the core serves. */
  char want[64];
  snprintf(want, sizeof want, "mgpu_backend_plugin_v%d", MGPU__BACKEND_ABI);
  ASSERT(strcmp(MGPU__PLUGIN_ENTRY, want) == 0);
  /* The refusal leaves nothing behind: host devices still open. */
  cfg.devices = "host:2";
  cfg.plugin_path = NULL;
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_device_count(), 2);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(old_abi_opencl_refused) {
  return refused("opencl", "libmgpu-opencl.so");
}

TEST_IMPL(old_abi_cuda_refused) {
  return refused("cuda", "libmgpu-cuda.so");
}

TEST_LIST_BEGIN
TEST_ENTRY(old_abi_opencl_refused)
TEST_ENTRY(old_abi_cuda_refused)
TEST_LIST_END
