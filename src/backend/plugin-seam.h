/* The core's seams as a backend plugin spells them.
 *
 * A plugin (libmgpu-cuda.so, libmgpu-opencl.so) links nothing of libmgpu:
 * the allocator and the error setter reach it through the environment its
 * entry was handed (mgpu__backend_env). So that plugin code reads like the
 * core's, this header gives them the core's names: mgpu__malloc,
 * mgpu__calloc, mgpu__realloc, mgpu__aligned_alloc and mgpu__free
 * (util/fault.h) and mgpu__error (util/log.h), each forwarding to the
 * environment. Nothing here references an mgpu__ symbol across the link
 * boundary: the functions are static inline, and mgpu__error is a macro
 * because C cannot forward a variable argument list through a function
 * (the table's set_error is checked as a printf format instead).
 *
 * The including header defines MGPU__PLUGIN_ENV first: the expression that
 * names the plugin's environment pointer (set by the entry function, before
 * any of these is called). Code linked into libmgpu (the host backend)
 * includes util/fault.h and util/log.h instead, never this header.
 */
#ifndef MGPU_BACKEND_PLUGIN_SEAM_H
#define MGPU_BACKEND_PLUGIN_SEAM_H

#include <stddef.h>

#include "backend/backend.h"

#ifndef MGPU__PLUGIN_ENV
#error "define MGPU__PLUGIN_ENV (the plugin's environment) before this header"
#endif

/* Memory from any of these is released with mgpu__free; each call is a
 * fault site of kind alloc in the core. */
static inline void *mgpu__malloc(size_t size) {
  return MGPU__PLUGIN_ENV->malloc_fn(size);
}

static inline void *mgpu__calloc(size_t count, size_t size) {
  return MGPU__PLUGIN_ENV->calloc_fn(count, size);
}

static inline void *mgpu__realloc(void *ptr, size_t size) {
  return MGPU__PLUGIN_ENV->realloc_fn(ptr, size);
}

static inline void *mgpu__aligned_alloc(size_t align, size_t size) {
  return MGPU__PLUGIN_ENV->aligned_alloc_fn(align, size);
}

static inline void mgpu__free(void *ptr) { MGPU__PLUGIN_ENV->free_fn(ptr); }

/* Sets the calling thread's error detail and returns code. */
#define mgpu__error(...) (MGPU__PLUGIN_ENV->set_error(__VA_ARGS__))

#endif /* MGPU_BACKEND_PLUGIN_SEAM_H */
