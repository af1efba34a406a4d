/* The MPI examples' one helper: CHECK(call) prints the failing call, the
 * error's name and mgpu's detail message, and aborts every rank
 * (MPI_Abort), so that no rank waits for this one in a collective. */
#ifndef MGPU_EXAMPLES_MPI_CHECK_H
#define MGPU_EXAMPLES_MPI_CHECK_H

#include <mgpu.h>
#include <mgpu/mpi.h>
#include <stdio.h>

#define CHECK(call)                                                        \
  do {                                                                     \
    int rc_ = (call);                                                      \
    if (rc_ != 0) {                                                        \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,   \
              mgpu_err_name(rc_), mgpu_error_detail());                    \
      MPI_Abort(MPI_COMM_WORLD, 1);                                        \
    }                                                                      \
  } while (0)

#endif /* MGPU_EXAMPLES_MPI_CHECK_H */
