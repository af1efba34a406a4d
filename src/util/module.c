/* The core's error detail, logger and allocator, exported for modules
 * built on libmgpu (include/mgpu/module.h). */
#include <stdio.h>

#include "util/fault.h"
#include "util/log.h"
#include "mgpu/module.h"

int mgpu_module_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mgpu__verror(code, fmt, ap);
  va_end(ap);
  return code;
}

void mgpu_module_log(int level, const char *fmt, ...) {
  if (level > mgpu__log_level() || level <= MGPU_LOG_NONE) return;
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  mgpu__log(level, "%s", line);
}

int mgpu_module_log_level(void) { return mgpu__log_level(); }

void *mgpu_module_malloc(size_t size) { return mgpu__malloc(size); }

void *mgpu_module_calloc(size_t count, size_t size) {
  return mgpu__calloc(count, size);
}

void mgpu_module_free(void *ptr) { mgpu__free(ptr); }
