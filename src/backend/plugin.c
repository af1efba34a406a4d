/* Loading of the CUDA backend plugin. (Being written: until then no plugin
 * is loaded and CUDA devices are reported as unavailable.) */
#include "core/internal.h"

const mgpu__backend_ops *mgpu__cuda_backend_load(const mgpu__backend_env *env) {
  (void)env;
  mgpu__error(MGPU_EPLUGIN, "the CUDA backend plugin is not built in");
  return NULL;
}

void mgpu__cuda_backend_unload(void) {}
