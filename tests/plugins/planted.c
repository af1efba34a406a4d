/* A backend plugin planted for tests/test-plugin.c: it exports what a plugin
 * of backend ABI 6 exported (the entry mgpu_backend_plugin_v1 and the ABI in
 * mgpu_backend_plugin_abi), so that the loader, which looks up the entry
 * named after its own ABI, must refuse it and name both. Built twice, as
 * libmgpu-cuda.so and libmgpu-opencl.so. */
#define PLANTED_EXPORT __attribute__((visibility("default")))

PLANTED_EXPORT const int mgpu_backend_plugin_abi = 6;

/* Never called: the loader refuses the plugin before its entry. */
PLANTED_EXPORT const void *mgpu_backend_plugin_v1(const void *env);
PLANTED_EXPORT const void *mgpu_backend_plugin_v1(const void *env) {
  (void)env;
  return 0;
}
