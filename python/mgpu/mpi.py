"""mgpu.mpi: one process per rank under mpirun, device buffers moved
between ranks by MPI (the MPI module, include/mgpu/mpi.h; docs/mpi.md).

Communicators are mpi4py's; each call runs over mgpu Arrays, whole arrays,
with the GIL released:

    from mpi4py import MPI
    import mgpu, mgpu.mpi, numpy as np
    mgpu.mpi.init(MPI.COMM_WORLD)          # this rank's share of the devices
    a = mgpu.full(4, MPI.COMM_WORLD.rank, "float64", device=0)
    mgpu.mpi.allreduce(a)                  # in place, over every rank
    mgpu.mpi.finalize()                    # also done at exit

Importing this module raises ImportError when the package was built
without MPI (the build did not find an MPI library). It is the only part
of the package that loads MPI (the extension mgpu._mpi): ``import mgpu``
does not.
"""
from mgpu import _core

if getattr(_core, "_MPI_MISSING", None) is not None:
    raise ImportError("mgpu.mpi is not available: %s; install an MPI library "
                      "with its headers (apt-get install libopenmpi-dev) and "
                      "rebuild the package" % _core._MPI_MISSING,
                      name="mgpu.mpi")

from mgpu._mpi import (  # noqa: E402
    MPIComm, MPIRequest,
    mpi_init as init, mpi_finalize as finalize, mpi_info as info,
    mpi_stats as stats, _mpi_comm as comm,
    mpi_send as send, mpi_recv as recv, mpi_isend as isend,
    mpi_irecv as irecv,
    mpi_bcast as bcast, mpi_reduce as reduce, mpi_allreduce as allreduce,
    mpi_reduce_scatter as reduce_scatter, mpi_allgather as allgather,
    mpi_scatter as scatter, mpi_gather as gather,
    mpi_comm_create as comm_create, MPIDist, mpi_dist as dist,
    mpi_dist_scatter as dist_scatter, mpi_dist_gather as dist_gather,
)

__all__ = ["init", "finalize", "info", "stats", "comm", "send", "recv",
           "isend", "irecv", "bcast", "reduce", "allreduce",
           "reduce_scatter", "allgather", "scatter", "gather", "comm_create", "dist",
           "dist_scatter", "dist_gather", "MPIDist",
           "MPIComm", "MPIRequest"]
