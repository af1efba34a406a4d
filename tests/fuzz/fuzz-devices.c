/* Fuzz target: the MGPU_DEVICES parser. Every input is either accepted with
 * entries inside their documented ranges, or refused with MGPU_EINVAL and a
 * detail; nothing reads or writes out of bounds. */
#include <string.h>

#include "core/core-internal.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

static void check(const char *spec, int max) {
  mgpu__devspec_entry e[MGPU_MAX_DEVICES];
  int n = -1;
  mgpu_error_clear();
  int rc = mgpu__parse_devices(spec, e, max, &n);
  if (rc != 0) {
    FUZZ_CHECK(rc == MGPU_EINVAL);
    FUZZ_CHECK(mgpu_error_detail()[0] != '\0');
    FUZZ_CHECK(strstr(mgpu_error_detail(), "MGPU_DEVICES") != NULL);
    return;
  }
  FUZZ_CHECK(n >= 1 && n <= max);
  for (int i = 0; i < n; i++) {
    if (e[i].backend == MGPU_BACKEND_HOST) {
      FUZZ_CHECK(e[i].count >= 1 && e[i].count <= MGPU_MAX_DEVICES);
    } else {
      FUZZ_CHECK(e[i].backend == MGPU_BACKEND_CUDA ||
                 e[i].backend == MGPU_BACKEND_OPENCL);
      FUZZ_CHECK(e[i].split >= 1 && e[i].split <= MGPU_MAX_DEVICES);
      FUZZ_CHECK(e[i].all || (e[i].ordinal >= 0 && e[i].ordinal <= 1023));
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *spec = malloc(size + 1);
  if (spec == NULL) return 0;
  memcpy(spec, data, size);
  spec[size] = '\0';
  check(spec, MGPU_MAX_DEVICES);
  check(spec, 1);
  check(spec, 2);
  free(spec);
  return 0;
}
