/* Shared by the host backend's streams (host.c) and its built-in kernels
 * (kernels.c). */
#ifndef MGPU_BACKEND_HOST_H
#define MGPU_BACKEND_HOST_H

#include "backend/backend.h"

/* Runs a built-in kernel on the calling thread (kernels.c). */
void mgpu__host_builtin_run(const mgpu__builtin *b);

#endif /* MGPU_BACKEND_HOST_H */
