/* mgpu module: what libraries built on top of libmgpu (libmgpu_mpi) and the
 * mgpu tools use to reach the seams the core itself uses: the error detail,
 * the logger, the allocator (a fault site, docs/faults.md), the one table of
 * environment variables, and a resolved view of a buffer. A module calls
 * these, never malloc or getenv of its own. Applications do not need it;
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

/* The value of the environment variable name, read through libmgpu's one
 * table of variables (src/core/config.c; docs/ARCHITECTURE.md,
 * "Configuration"): the environment's value, else the table's default for a
 * variable that has one as text (MGPU_MPI_TIMEOUT_MS: "30000"), else NULL.
 * An empty value counts as unset. A name that is not in the table is a bug:
 * NULL, with an MGPU_EINVAL detail naming it, whatever the environment
 * holds. The string belongs to the environment or the library: do not free
 * it; a later setenv may replace it. */
MGPU_EXTERN const char *mgpu_module_getenv(const char *name);

/* libmgpu's allocator, as malloc, calloc and free: every call is a fault
 * site of kind "alloc" (MGPU_FAULT=alloc:N, the fault sweep), so a module's
 * allocations fail on purpose like the core's. NULL when the allocation
 * fails (no detail is written: the caller names what it was for). Memory
 * from mgpu_module_malloc and mgpu_module_calloc is released with
 * mgpu_module_free (NULL does nothing). */
MGPU_EXTERN void *mgpu_module_malloc(size_t size);
MGPU_EXTERN void *mgpu_module_calloc(size_t count, size_t size);
MGPU_EXTERN void mgpu_module_free(void *ptr);

/* A buffer resolved once: what the accessors of mgpu/core.h return one
 * handle lookup each (mgpu_buffer_ptr, _size, _device, _kind), in one. The
 * view is a copy taken at the call: it stays true while the buffer is not
 * freed, and holds no reference (the caller keeps the buffer alive). */
typedef struct mgpu_buffer_view {
  const mgpu_buffer *handle; /* the buffer viewed */
  void *ptr;                 /* mgpu_buffer_ptr */
  size_t size;               /* bytes */
  int device;                /* the device index */
  int kind;                  /* an mgpu_mem_kind */
  int readonly;              /* 1 for MGPU_BUFFER_READONLY */
} mgpu_buffer_view;

/* Fills *view from buf with one handle lookup. 0, or (the detail names buf,
 * *view left as it was) MGPU_EINVAL for a NULL view, MGPU_EBADHANDLE for a
 * NULL or invalid buf, MGPU_EFREED for a freed one, MGPU_ENOINIT before
 * mgpu_init. */
MGPU_EXTERN int mgpu_module_buffer_view(const mgpu_buffer *buf,
                                        mgpu_buffer_view *view);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_MODULE_H */
