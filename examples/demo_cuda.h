/* The CUDA variants of the examples' and the demo's kernels are compiled by
 * nvcc into libmgpu-demo-cuda.so (tools/cuda/), built beside libmgpu where
 * CUDA is found. A plain C program finds one at run time, so that it builds
 * and runs where there is no CUDA: demo_cuda_fn("name") returns the host
 * stub that library's function `name` returns (for mgpu_kernel.cuda_fn), or
 * NULL when the library is not beside the program (../lib, ../lib64 or its
 * own folder). The library stays open for the life of the process, like
 * the CUDA plugin. Needs POSIX (readlink, dlopen). */
#ifndef MGPU_EXAMPLES_DEMO_CUDA_H
#define MGPU_EXAMPLES_DEMO_CUDA_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline const void *demo_cuda_fn(const char *name) {
  char dir[4096], path[4200];
  ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
  if (n <= 0) return NULL;
  dir[n] = '\0';
  char *slash = strrchr(dir, '/');
  if (slash == NULL) return NULL;
  *slash = '\0';
  const char *where[] = {"%s/../lib/libmgpu-demo-cuda.so",
                         "%s/../lib64/libmgpu-demo-cuda.so",
                         "%s/libmgpu-demo-cuda.so"};
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    snprintf(path, sizeof path, where[i], dir);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) continue;
    void *get = dlsym(lib, name);
    if (get == NULL) { /* another library of that name: not ours */
      dlclose(lib);
      continue;
    }
    const void *(*fn)(void);
    memcpy(&fn, &get, sizeof fn); /* POSIX: a dlsym result as a function */
    return fn();
  }
  return NULL;
}

#endif /* MGPU_EXAMPLES_DEMO_CUDA_H */
