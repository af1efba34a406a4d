/* The MPI examples' CHECK: as check.h's, but a failure aborts every rank
 * (MPI_Abort), so that no rank waits for this one in a collective. */
#ifndef MGPU_EXAMPLES_MPI_CHECK_H
#define MGPU_EXAMPLES_MPI_CHECK_H

#include <mgpu/mpi.h>

#define CHECK_FAIL() MPI_Abort(MPI_COMM_WORLD, 1)
#include "check.h"

#endif /* MGPU_EXAMPLES_MPI_CHECK_H */
