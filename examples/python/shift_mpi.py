"""shift_mpi: the scatter / shift / gather lesson of mpi4py + Numba, on mgpu.

    mpirun -np 4 python3 examples/python/shift_mpi.py [out.npy]

Rank 0 draws N x size numbers in [0, 1); mgpu.mpi.scatter puts N of them in
a buffer on each rank's device; each rank shifts its numbers by -0.5 in
place with a kernel of the library that runs there (NumPy on a host device,
CuPy or Numba on a CUDA one, through DLPack: no copy); mgpu.mpi.gather
brings them back to rank 0, which prints their mean (near 0; the lesson's
unshifted numbers average 0.5). With out.npy, rank 0 also saves what it
gathered.
"""
import sys

import numpy as np
from mpi4py import MPI

import mgpu
import mgpu.mpi

N = 100003  # numbers per rank


def shift(part, by):
    """part += by, in place, on part's device."""
    if part.__dlpack_device__()[0] == 1:    # host memory: NumPy
        x = np.from_dlpack(part)
        x += by
        return
    try:                                      # CUDA memory: CuPy ...
        import cupy
        x = cupy.from_dlpack(part)
        x += by
        cupy.cuda.get_current_stream().synchronize()
    except ImportError:                       # ... or a Numba kernel
        from numba import cuda

        @cuda.jit
        def add(x, by):
            i = cuda.grid(1)
            if i < x.size:
                x[i] += by
        x = cuda.as_cuda_array(part)
        add[(x.size + 255) // 256, 256](x, by)
        cuda.synchronize()


comm = MPI.COMM_WORLD
mgpu.mpi.init(comm)                           # this rank's device(s)
rank, size = comm.rank, comm.size
data = None
if rank == 0:
    data = mgpu.asarray(np.random.default_rng(42).random(N * size), device=0)
part = mgpu.mpi.scatter(data, mgpu.empty(N, "float64", device=0))
shift(part, -0.5)
back = mgpu.mpi.gather(part, mgpu.empty(N * size, "float64", device=0)
                       if rank == 0 else None)
if rank == 0:
    result = back.numpy()
    print("%d ranks x %d numbers: mean after the shift %.5f"
          % (size, N, result.mean()))
    if len(sys.argv) > 1:
        np.save(sys.argv[1], result)
