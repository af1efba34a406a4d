/* mgpu_config.size: a caller built against an older header passes a
 * shorter struct, which must end at a field (padding to the struct's
 * alignment aside); its fields beyond take their defaults and are never
 * read. A size that cuts a field, or is larger than this library's struct,
 * is MGPU_EINVAL naming the size. */
#include <stddef.h>

#include "core/core-internal.h"
#include "task.h"

/* A config whose fields after `devices` would all be refused if read. */
static mgpu_config poisoned(size_t size) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.size = size;
  cfg.devices = "host:2";
  cfg.host_mem = 1;
  cfg.log_level = 99;
  cfg.host_workers = 1000;
  cfg.host_peer = 7;
  cfg.staging_chunk = 1;
  cfg.staging_depth = 1000;
  cfg.cuda_green = 9;
  cfg.timeout_ms = -5;
  cfg.fault = "not a rule";
  cfg.cuda_ipc_legacy = 9;
  cfg.reserved = 12345;
  cfg.opencl_busy = 9;
  return cfg;
}

TEST_IMPL(older_header_sizes_take_defaults) {
  /* Ends after devices: everything after is the defaults. */
  mgpu_config cfg = poisoned(offsetof(mgpu_config, host_mem));
  ASSERT_OK(mgpu_init(&cfg));
  const mgpu_config *r = mgpu__config();
  ASSERT_EQ(mgpu_device_count(), 2);
  ASSERT(r->host_workers >= 1 && r->host_workers <= 64);
  ASSERT(r->log_level >= MGPU_LOG_NONE && r->log_level <= MGPU_LOG_DEBUG);
  ASSERT(r->host_mem > 1);
  ASSERT(r->staging_depth >= 2 && r->staging_depth <= MGPU_STAGING_DEPTH_MAX);
  ASSERT(r->timeout_ms > 0);
  ASSERT_EQ(r->size, sizeof(mgpu_config));
  ASSERT_OK(mgpu_shutdown());

  /* Only the size field: every field is a default. */
  cfg = poisoned(sizeof(size_t));
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_shutdown());

  /* Ends after host_workers, which is read (and held to its bounds). */
  cfg = poisoned(offsetof(mgpu_config, host_workers) + sizeof(int));
  cfg.host_mem = 64u << 20;
  cfg.log_level = MGPU_LOG_NONE;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("host_workers is 1000");
  cfg.host_workers = 3;
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu__config()->host_workers, 3);
  ASSERT(mgpu__config()->staging_depth != 1000);
  ASSERT_OK(mgpu_shutdown());

  /* An older struct ending at an int with padding after it, as its sizeof
   * says, where this layout has only padding too. */
  size_t peer_end = offsetof(mgpu_config, host_peer) + sizeof(int);
  size_t padded = (peer_end + _Alignof(mgpu_config) - 1) /
                  _Alignof(mgpu_config) * _Alignof(mgpu_config);
  if (padded != peer_end && padded <= offsetof(mgpu_config, staging_chunk)) {
    cfg = poisoned(padded);
    cfg.host_mem = 64u << 20;
    cfg.log_level = MGPU_LOG_NONE;
    cfg.host_workers = 2;
    cfg.host_peer = 1;
    ASSERT_OK(mgpu_init(&cfg));
    ASSERT(mgpu__config()->staging_chunk != 1);
    ASSERT_OK(mgpu_shutdown());
  }
  return 0;
}

/* The header before opencl_busy ended at cuda_ipc_legacy, an int, padded
 * to the struct's alignment: a program built against it passes that size,
 * and the bytes of its padding are not a value (here: poison). That size
 * ends before opencl_busy, which takes its default. */
TEST_IMPL(size_before_opencl_busy_takes_its_default) {
  size_t legacy_end = offsetof(mgpu_config, cuda_ipc_legacy) + sizeof(int);
  size_t old_size = (legacy_end + _Alignof(mgpu_config) - 1) /
                    _Alignof(mgpu_config) * _Alignof(mgpu_config);
  ASSERT(old_size <= offsetof(mgpu_config, opencl_busy));
  ASSERT(sizeof(mgpu_config) > old_size);
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.size = old_size;
  cfg.devices = "host:1";
  memset((char *)&cfg + legacy_end, 0x5a, sizeof cfg - legacy_end);
  unsetenv("MGPU_OPENCL_BUSY");
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu__config()->opencl_busy, 1);
  ASSERT_OK(mgpu_shutdown());
  /* The caller's own value, with the whole struct, is read and checked. */
  cfg = (mgpu_config)MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  cfg.opencl_busy = 0;
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu__config()->opencl_busy, 0);
  ASSERT_OK(mgpu_shutdown());
  cfg.opencl_busy = 2;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("opencl_busy is 2");
  return 0;
}

/* A device count past the limit says the limit (it said only "bad
 * token"). */
TEST_IMPL(device_count_past_the_limit_names_it) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  char many[32];
  snprintf(many, sizeof many, "host:%d", MGPU_MAX_DEVICES + 1);
  cfg.devices = many;
  ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
  char limit[48];
  snprintf(limit, sizeof limit, "N and S from 1 to %d", MGPU_MAX_DEVICES);
  ASSERT_DETAIL_HAS(limit);
  return 0;
}

TEST_IMPL(sizes_that_cut_a_field_are_refused) {
  const size_t bad[] = {0, 3, sizeof(size_t) + 1,
                        offsetof(mgpu_config, host_mem) + 4,
                        offsetof(mgpu_config, fault) + 1,
                        sizeof(mgpu_config) - 1, sizeof(mgpu_config) + 8};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mgpu_config cfg = poisoned(bad[i]);
    ASSERT_ERR(MGPU_EINVAL, mgpu_init(&cfg));
    char want[64];
    snprintf(want, sizeof want, "mgpu_config.size is %zu", bad[i]);
    ASSERT_DETAIL_HAS(want);
  }
  /* The whole struct is of course fine. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(older_header_sizes_take_defaults)
TEST_ENTRY(size_before_opencl_busy_takes_its_default)
TEST_ENTRY(sizes_that_cut_a_field_are_refused)
TEST_ENTRY(device_count_past_the_limit_names_it)
TEST_LIST_END
