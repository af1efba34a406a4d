# cython: language_level=3
# What mgpu._core shares with the package's other extension, mgpu._mpi:
# the C layout of the extension types the MPI bindings take apart and
# build (Array, Stream, Comm, Dist), and the checks and helpers they run,
# so that an array handed to mgpu.mpi is checked, and its errors raised,
# exactly as by the rest of the package. _mpi cimports them; Cython passes
# the functions through the module's __pyx_capi__ and the types through
# the module itself. Both extensions link the one shared libmgpu shipped
# beside them, so they drive one copy of the library's state.
#
# The attributes of these types are declared here only (Cython's rule for a
# type in a .pxd); the types themselves are defined in the .pxi files
# named below.
from libc.stdint cimport uintptr_t

from mgpu._capi cimport *


# _stream.pxi
cdef class Stream:
    cdef mgpu_stream *s
    cdef readonly int device
    cdef bint owned


# _array.pxi
cdef class Array:
    cdef mgpu_buffer *buf
    # The array's own export of its buffer: keeps the memory alive while the
    # array is, even past mgpu_shutdown (the C library then leaves exported
    # memory in place).
    cdef DLManagedTensorVersioned *pin
    cdef void *ptr
    cdef size_t nbytes_alloc
    cdef readonly int device
    cdef readonly tuple shape
    cdef readonly object dtype
    cdef readonly str kind
    cdef int dl_type, dl_id
    cdef object owner  # the object an imported array's memory belongs to
    cdef size_t count  # elements
    cdef int mdt       # the mgpu_dtype of dtype, -1 if it has none
    # Imported from read-only memory (a read-only NumPy array or DLPack
    # tensor): every mgpu call that would write it raises ReadOnlyError,
    # and its NumPy views and exports are read-only.
    cdef bint readonly
    # Streams with queued work that reads or writes the array (the copies
    # queued with stream=): what an export orders a consumer after. Cleared
    # by a host wait for the device. Touched with the GIL held.
    cdef list pending
    cdef object __weakref__

    cdef _order_after(self, uintptr_t consumer)
    cdef _touch(self, Stream st)
    cdef _to_host(self, object out)


# _coll.pxi
cdef class Comm:
    cdef mgpu_comm *c
    cdef readonly tuple devices
    cdef readonly int first_rank  # the global rank of devices[0]
    cdef readonly int nranks      # ranks over every process
    cdef list streams        # the package's stream of each rank's device
    cdef mgpu_stream *ss[64]  # their handles, in rank order
    cdef object __weakref__

    cdef list _arrays(self, object arrays, str what)
    cdef _run(self, int which, list send, list recv, size_t count,
              mgpu_dtype dt, mgpu_op op, int root, object streams=*)


# _pool.pxi
cdef class Dist:
    cdef mgpu_dist *d
    cdef readonly size_t n

    cdef _live(self)


# _errors.pxi: raises the package's exception for a negative code.
cdef int _check(int rc) except -1

# _runtime.pxi
cdef list _fill_config(mgpu_config *cfg, devices, host_mem, host_workers,
                       host_peer, log, trace)
cdef size_t _index(object v, str what) except? 0
cdef int _devno(object device) except -2

# _stream.pxi
cdef Stream _default_stream(int dev)

# _array.pxi: the checks of two arrays of one call.
cdef _same_type(str what, object an, Array a, object bn, Array b)
cdef _same_shape(str what, object an, Array a, object bn, Array b)
cdef _times(str what, object an, Array a, object bn, Array b, size_t n)
cdef _writable(str what, object name, Array a)
cdef _disjoint(str what, object an, Array a, object bn, Array b)

# _pool.pxi
cdef object _dist_opts(mgpu_dist_opts *o, kind, block, weights,
                       size_t nparts)
