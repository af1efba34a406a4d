/* mgpu module: what libraries built on top of libmgpu (libmgpu_mpi) use to
 * report errors and log like the core does. Applications do not need it;
 * mgpu.h does not include it.
 */
#ifndef MGPU_MODULE_H
#define MGPU_MODULE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "mgpu/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the calling thread's error detail (what mgpu_error_detail()
 * returns) from a printf format and returns code, so a module's failure
 * reads like the core's: return mgpu_module_error(MGPU_EINVAL, "rank %d:
 * ...", r). */
MGPU_EXTERN int mgpu_module_error(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints one line on stderr, "mgpu <level>: ...", when the level set by
 * mgpu_init (MGPU_LOG) allows it. level is an mgpu_log_level. */
MGPU_EXTERN void mgpu_module_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Parses a size as the MGPU_* variables take it ("512M", "2G", "4096",
 * K/M/G/T with an optional i and B): 0 or MGPU_EINVAL. */
MGPU_EXTERN int mgpu_module_parse_size(const char *s, size_t *out);

/* Parses a decimal int in [lo, hi] (the whole string): 0 or MGPU_EINVAL. */
MGPU_EXTERN int mgpu_module_parse_int(const char *s, int lo, int hi,
                                      int *out);

/* Adds value to device dev's counter named name (a field of
 * mgpu_device_metrics from MGPU_METRICS_MAP, e.g. "mpi_staged"), so that a
 * module's work shows in mgpu_metrics_snapshot. MGPU_EINVAL for an unknown
 * name; a device outside the open range is ignored, as in the core. */
MGPU_EXTERN int mgpu_module_metric_add(int dev, const char *name,
                                       uint64_t value);

/* The log level mgpu_init set (an mgpu_log_level). */
MGPU_EXTERN int mgpu_module_log_level(void);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_MODULE_H */
