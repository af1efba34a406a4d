/* What the host backend needs from the rest of the library. */
#ifndef MGPU_BACKEND_HOST_H
#define MGPU_BACKEND_HOST_H

#include "backend/backend.h"

/* Runs a built-in kernel on the calling thread (src/kernels/host_kernels.c). */
void mgpu__host_builtin_run(const mgpu__builtin *b);

#endif /* MGPU_BACKEND_HOST_H */
