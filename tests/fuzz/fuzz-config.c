/* Fuzz target: the size and number parsers of the environment variables.
 * The first byte picks a variable, the rest is its value; mgpu's
 * configuration is resolved from it as mgpu_init would. An accepted value
 * lies inside the variable's documented range; a refused one is MGPU_EINVAL
 * with a detail naming the variable. The size parser is also checked against
 * a reference written here from its documentation. */
#include <ctype.h>
#include <string.h>

#include "core/core-internal.h"
#include "fuzz.h"
#include "mgpu.h"

static const char *const vars[] = {
    "MGPU_HOST_MEM",       "MGPU_LOG",          "MGPU_HOST_WORKERS",
    "MGPU_HOST_PEER",      "MGPU_STAGING_CHUNK", "MGPU_STAGING_DEPTH",
    "MGPU_CUDA_GREEN",     "MGPU_CUDA_BUSY",     "MGPU_OPENCL_BUSY"};
#define NVARS (sizeof vars / sizeof *vars)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (size_t i = 0; i < NVARS; i++) unsetenv(vars[i]);
  return 0;
}

/* Digits, then optionally K, M, G or T (either case), then optionally i,
 * then optionally B, only after a unit; the value must fit in size_t. */
static int reference_size(const char *s, size_t *out) {
  const char *p = s;
  unsigned __int128 v = 0;
  if (!isdigit((unsigned char)*p)) return -1;
  for (; isdigit((unsigned char)*p); p++) {
    v = v * 10 + (unsigned)(*p - '0');
    if (v > UINT64_MAX) return -1;
  }
  unsigned shift = 0;
  const char *units = "KMGT";
  const char *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
  if (u != NULL) {
    shift = 10 * (unsigned)(u - units + 1);
    p++;
    if (*p == 'i' || *p == 'I') p++;
    if (*p == 'B' || *p == 'b') p++;
  }
  if (*p != '\0') return -1;
  v <<= shift;
  if (v > SIZE_MAX) return -1;
  *out = (size_t)v;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 256) return 0;
  char value[256];
  memcpy(value, data + 1, size - 1);
  value[size - 1] = '\0';

  size_t parsed = 0, expect = 0;
  int rc = mgpu__parse_size(value, &parsed);
  int ref = reference_size(value, &expect);
  FUZZ_CHECK((rc == 0) == (ref == 0));
  FUZZ_CHECK(rc == 0 || rc == MGPU_EINVAL);
  if (rc == 0) FUZZ_CHECK(parsed == expect);

  const char *var = vars[data[0] % NVARS];
  if (value[0] == '\0') return 0; /* an empty variable means unset */
  setenv(var, value, 1);
  mgpu_config cfg;
  mgpu_error_clear();
  rc = mgpu__config_resolve(NULL, &cfg);
  unsetenv(var);
  if (rc != 0) {
    FUZZ_CHECK(rc == MGPU_EINVAL);
    FUZZ_CHECK(strstr(mgpu_error_detail(), var) != NULL);
    return 0;
  }
  FUZZ_CHECK(cfg.size == sizeof cfg);
  FUZZ_CHECK(cfg.host_mem > 0);
  FUZZ_CHECK(cfg.log_level >= MGPU_LOG_NONE && cfg.log_level <= MGPU_LOG_DEBUG);
  FUZZ_CHECK(cfg.host_workers >= 1 && cfg.host_workers <= 64);
  FUZZ_CHECK(cfg.host_peer == 0 || cfg.host_peer == 1);
  FUZZ_CHECK(cfg.staging_chunk == 0 ||
             (cfg.staging_chunk >= MGPU_STAGING_CHUNK_MIN &&
              cfg.staging_chunk <= MGPU_STAGING_CHUNK_MAX));
  FUZZ_CHECK(cfg.staging_depth >= 2 &&
             cfg.staging_depth <= MGPU_STAGING_DEPTH_MAX);
  FUZZ_CHECK(cfg.cuda_green == 0 || cfg.cuda_green == 1);
  FUZZ_CHECK(cfg.cuda_busy == 0 || cfg.cuda_busy == 1);
  FUZZ_CHECK(cfg.opencl_busy == 0 || cfg.opencl_busy == 1);
  return 0;
}
