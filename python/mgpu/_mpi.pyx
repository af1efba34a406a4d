# cython: language_level=3, embedsignature=True, binding=True
"""mgpu._mpi: the MPI module (include/mgpu/mpi.h, libmgpu_mpi) for mgpu.mpi.

An extension of its own, built where the build found MPI, so that only
``import mgpu.mpi`` loads MPI: mgpu._core links none. It links the shared
libmgpu_mpi and libmgpu shipped beside it, the same libmgpu as _core, so
both drive one copy of the library; it takes _core's types, checks and
error mapping through _core.pxd. Import it through mgpu.mpi.

Communicators come from mpi4py: MPI._addressof(comm) is the address of the
communicator's MPI_Comm, which must be of the MPI library linked here
(checked once by comparing the library version strings). The MPI calls are
made by one thread at a time (mgpu/mpi.h); mpi4py asks for
MPI_THREAD_MULTIPLE by default, more than enough.
"""
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

from mgpu._capi cimport *
from mgpu._core cimport (Array, Stream, Comm, Dist, _check, _fill_config,
                         _index, _devno, _default_stream, _same_type,
                         _same_shape, _times, _writable, _disjoint, _dist_opts)

import threading as _threading
import weakref as _weakref

from mgpu._core import (ERRORS, Error, _opened, _state, _state_lock,
                        _before_shutdown, _OPS, _dtype_name, _as_dtype, empty,
                        device_count)

cdef extern from "mgpu/mpi.h" nogil:
    enum: MGPU_ENOINIT
    ctypedef struct _mpi_comm_t
    ctypedef _mpi_comm_t *MPI_Comm
    enum: MPI_MAX_LIBRARY_VERSION_STRING
    int MPI_Initialized(int *flag)
    int MPI_Finalized(int *flag)
    int MPI_Get_library_version(char *version, int *resultlen)

    ctypedef struct mgpu_mpi_info:
        size_t size
        int rank, nranks, local_rank, local_size, node, nnodes, ndevices
        int first_device, total_devices, shared, cuda_aware
    ctypedef struct mgpu_mpi_stats:
        size_t size
        uint64_t calls_host, calls_direct, calls_staged
        uint64_t bytes_host, bytes_direct, bytes_staged, staged_chunks
    ctypedef struct mgpu_mpi_request:
        pass

    int mgpu_mpi_init(MPI_Comm comm, const mgpu_config *cfg)
    int mgpu_mpi_finalize()
    int mgpu_mpi_get_info(mgpu_mpi_info *info)
    int mgpu_mpi_get_stats(mgpu_mpi_stats *stats)
    int mgpu_mpi_reset_stats()
    int mgpu_mpi_isend(const mgpu_buffer *buf, size_t offset, size_t count,
                       mgpu_dtype dtype, int dest, int tag, MPI_Comm comm,
                       mgpu_stream *stream, mgpu_mpi_request **req)
    int mgpu_mpi_irecv(mgpu_buffer *buf, size_t offset, size_t count,
                       mgpu_dtype dtype, int source, int tag, MPI_Comm comm,
                       mgpu_stream *stream, mgpu_mpi_request **req)
    int mgpu_mpi_wait(mgpu_mpi_request *req)
    int mgpu_mpi_bcast(mgpu_buffer *buf, size_t offset, size_t count,
                       mgpu_dtype dtype, int root, MPI_Comm comm,
                       mgpu_stream *stream)
    int mgpu_mpi_reduce(const mgpu_buffer *send, size_t send_offset,
                        mgpu_buffer *recv, size_t recv_offset, size_t count,
                        mgpu_dtype dtype, mgpu_op op, int root, MPI_Comm comm,
                        mgpu_stream *stream)
    int mgpu_mpi_allreduce(const mgpu_buffer *send, size_t send_offset,
                           mgpu_buffer *recv, size_t recv_offset, size_t count,
                           mgpu_dtype dtype, mgpu_op op, MPI_Comm comm,
                           mgpu_stream *stream)
    int mgpu_mpi_reduce_scatter(const mgpu_buffer *send, size_t send_offset,
                                mgpu_buffer *recv, size_t recv_offset,
                                size_t count, mgpu_dtype dtype, mgpu_op op,
                                MPI_Comm comm, mgpu_stream *stream)
    int mgpu_mpi_allgather(const mgpu_buffer *send, size_t send_offset,
                           mgpu_buffer *recv, size_t recv_offset, size_t count,
                           mgpu_dtype dtype, MPI_Comm comm,
                           mgpu_stream *stream)
    int mgpu_mpi_scatter(const mgpu_buffer *send, size_t send_offset,
                         mgpu_buffer *recv, size_t recv_offset, size_t count,
                         mgpu_dtype dtype, int root, MPI_Comm comm,
                         mgpu_stream *stream)
    int mgpu_mpi_gather(const mgpu_buffer *send, size_t send_offset,
                        mgpu_buffer *recv, size_t recv_offset, size_t count,
                        mgpu_dtype dtype, int root, MPI_Comm comm,
                        mgpu_stream *stream)
    int mgpu_mpi_comm_create(MPI_Comm comm, int ndev, const int *devs,
                             mgpu_comm **out)
    int mgpu_mpi_dist_create(MPI_Comm comm, size_t n,
                             const mgpu_dist_opts *opts, mgpu_dist **dist)
    int mgpu_mpi_dist_scatter(const mgpu_dist *dist, const mgpu_buffer *src,
                              size_t src_offset, size_t elem_size, int root,
                              mgpu_buffer *const *bufs, MPI_Comm comm)
    int mgpu_mpi_dist_gather(const mgpu_dist *dist, mgpu_buffer *dst,
                             size_t dst_offset, size_t elem_size, int root,
                             mgpu_buffer *const *bufs, MPI_Comm comm)


def _mpi_library_version():
    """MPI_Get_library_version of the MPI library linked into the package."""
    cdef char buf[MPI_MAX_LIBRARY_VERSION_STRING]
    cdef int n = 0
    MPI_Get_library_version(buf, &n)
    return buf[:n].decode("utf-8", "replace")


# State of the MPI part (one thread at a time, as the MPI calls; the
# interpreter's lock serializes the Python side): the communicator given to
# mpi_init (the default of every call) and the requests not yet waited on.
_mpi = {"comm": None, "checked": False, "requests": None, "comms": None}
# Held around every call of the MPI module, which takes one thread at a
# time (mgpu/mpi.h); reentrant, as a request may be waited on by its
# finalizer while its thread holds it.
_mpi_lock = _threading.RLock()


cdef class MPIComm:
    """An mpi4py communicator as the MPI module takes it: the MPI_Comm
    handle read once through ``MPI._addressof(comm)``, and the mpi4py
    object, kept alive so that the handle stays valid."""
    cdef MPI_Comm c
    cdef readonly object comm
    cdef readonly int rank, size

    def __init__(self):
        raise TypeError("use mgpu.mpi.comm(mpi4py_comm)")

    def __repr__(self):
        return "<mgpu.mpi comm rank %d of %d>" % (self.rank, self.size)


def _mpi_comm(comm):
    """The MPIComm of an mpi4py communicator (None: the one mpi_init got)."""
    cdef MPIComm m
    if comm is None:
        m = _mpi["comm"]
        if m is None:
            raise ERRORS[MGPU_ENOINIT]("MGPU_ENOINIT: mgpu.mpi.init() was "
                                       "not called")
        return m
    if isinstance(comm, MPIComm):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise TypeError("comm must be an mpi4py communicator, and mpi4py "
                        "cannot be imported (%s)" % e)
    if not isinstance(comm, MPI.Comm):
        raise TypeError("comm must be an mpi4py communicator (mpi4py.MPI.Comm)"
                        ", not %s" % type(comm).__name__)
    if not _mpi["checked"]:
        mine, theirs = _mpi_library_version(), MPI.Get_library_version()
        if mine.strip() != theirs.strip():
            raise RuntimeError(
                "mpi4py runs on another MPI library than mgpu was built "
                "with, so their communicators cannot be shared:\n  mgpu:   "
                "%s\n  mpi4py: %s" % (mine.splitlines()[0],
                                      theirs.splitlines()[0]))
        _mpi["checked"] = True
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    cdef uintptr_t addr = MPI._addressof(comm)
    m = MPIComm.__new__(MPIComm)
    m.c = (<MPI_Comm *>addr)[0]
    m.comm = comm
    m.rank = comm.Get_rank()
    m.size = comm.Get_size()
    return m


def mpi_init(comm=None, devices=None, *, host_mem=None, host_workers=None,
             host_peer=None, log=None, trace=None):
    """Opens this rank's share of the devices (``mgpu_mpi_init``).

    ``comm`` is an mpi4py communicator (default ``MPI.COMM_WORLD``); it is
    the default communicator of every later call. The other arguments are
    mgpu.init's. Collective over comm. Finalized by ``mgpu.mpi.finalize()``
    or ``mgpu.shutdown()``, and at interpreter exit (before mpi4py finalizes
    MPI).
    """
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    cdef MPIComm m = _mpi_comm(comm)
    cdef mgpu_config cfg = mgpu_py_config_init()
    keep = _fill_config(&cfg, devices, host_mem, host_workers, host_peer,
                        log, trace)
    cdef int rc
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_init(m.c, &cfg)
    _check(rc)
    _mpi["comm"] = m
    _mpi["requests"] = _weakref.WeakSet()
    _mpi["comms"] = _weakref.WeakSet()
    _opened()


def mpi_finalize():
    """Waits for the requests still open, closes the communicators of
    comm_create still alive, then frees the module's state and
    shuts mgpu down (``mgpu_mpi_finalize``); MPI itself stays initialized
    (mpi4py finalizes it). Safe when not initialized."""
    cdef int rc
    if _mpi["comm"] is None:
        return
    reqs = _mpi["requests"]
    for r in list(reqs):
        if (<MPIRequest>r).r == NULL:
            continue  # waited on already (the object is still alive)
        try:
            (<MPIRequest>r).wait()
        except Error:
            pass
    for c in list(_mpi["comms"]):
        try:
            c.close()
        except Error:
            pass
    _mpi["comm"] = None
    with _state_lock:
        _state["streams"] = {}
        _state["comms"] = {}
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_finalize()
    _check(rc)


_before_shutdown.append(mpi_finalize)


def mpi_info():
    """What mpi_init decided for this rank (``mgpu_mpi_get_info``): a dict
    of rank, nranks, local_rank, local_size, node, nnodes, ndevices,
    first_device, total_devices, shared, cuda_aware."""
    cdef mgpu_mpi_info i
    i.size = sizeof(mgpu_mpi_info)
    _check(mgpu_mpi_get_info(&i))
    return {"rank": i.rank, "nranks": i.nranks, "local_rank": i.local_rank,
            "local_size": i.local_size, "node": i.node, "nnodes": i.nnodes,
            "ndevices": i.ndevices, "first_device": i.first_device,
            "total_devices": i.total_devices, "shared": bool(i.shared),
            "cuda_aware": bool(i.cuda_aware)}


def mpi_stats(reset=False):
    """Which path moved the data since mpi_init (``mgpu_mpi_get_stats``):
    calls and bytes per path (host, direct, staged) and staged chunks.
    reset=True zeroes the counters after reading them."""
    cdef mgpu_mpi_stats s
    s.size = sizeof(mgpu_mpi_stats)
    _check(mgpu_mpi_get_stats(&s))
    if reset:
        _check(mgpu_mpi_reset_stats())
    return {"calls_host": s.calls_host, "calls_direct": s.calls_direct,
            "calls_staged": s.calls_staged, "bytes_host": s.bytes_host,
            "bytes_direct": s.bytes_direct, "bytes_staged": s.bytes_staged,
            "staged_chunks": s.staged_chunks}


cdef class _Moved:
    """How an array goes to the MPI module: its buffer, an mgpu_dtype and
    the count of elements of that type."""
    cdef mgpu_buffer *buf
    cdef mgpu_dtype dt
    cdef size_t count
    cdef size_t unit     # bytes per element of dt


# The MPI module's element types beyond mgpu_dtype (MGPU_MPI_INT8 ... in
# mgpu/mpi.h), by NumPy kind and item size.
cdef dict _MPI_EXTRA = {("i", 1): 32, ("u", 1): 33, ("i", 2): 34,
                        ("u", 2): 35, ("u", 4): 36, ("u", 8): 37,
                        ("b", 1): 38}
cdef int _MPI_BOOL = 38
cdef int _MPI_BYTES = 39


cdef _Moved _moved(object a, str what, bint reduce, str op=None):
    """a as data to move: its own mgpu dtype, one of the module's own types
    (NumPy's other integers and bool), or (data movement only) raw bytes,
    so that every dtype an mgpu.Array holds moves (complex, 'S', 'V', ...)."""
    if not isinstance(a, Array):
        raise TypeError("%s: expected mgpu.Array, got %s" %
                        (what, type(a).__name__))
    cdef Array x = <Array>a
    cdef _Moved m = _Moved.__new__(_Moved)
    cdef size_t isz = x.dtype.itemsize
    m.buf = x.buf
    m.count = x.count
    m.unit = isz
    if x.mdt >= 0:
        m.dt = <mgpu_dtype>x.mdt
        return m
    extra = _MPI_EXTRA.get((x.dtype.kind, isz))
    if extra is not None:
        if reduce and extra == _MPI_BOOL and op not in ("min", "max"):
            raise TypeError("%s: bool arrays reduce by 'min' (and) or 'max' "
                            "(or), not %r" % (what, op))
        m.dt = <mgpu_dtype><int>extra
        return m
    if reduce:
        raise TypeError("%s: reductions take bool, integer, float16, "
                        "float32 or float64 arrays, not %s" % (what, x.dtype))
    m.dt = <mgpu_dtype>_MPI_BYTES
    m.count = x.count * isz
    m.unit = 1
    return m


cdef mgpu_stream *_mpi_stream(object stream) except? NULL:
    if stream is None:
        return NULL
    if not isinstance(stream, Stream):
        raise TypeError("stream must be an mgpu.Stream or None, not %s"
                        % type(stream).__name__)
    return (<Stream>stream).s


cdef int _rank_arg(object v, str what) except? -1:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    v = v.__index__()
    if not -(1 << 31) <= v < (1 << 31):
        raise ValueError("%s %d is out of range" % (what, v))
    return v


cdef class MPIRequest:
    """A send or receive in flight (``mgpu_mpi_isend/irecv``): ``wait()``
    completes it and raises its error. The array stays referenced until
    then; a request dropped without wait() is waited on when it goes."""
    cdef mgpu_mpi_request *r
    cdef object array
    cdef object __weakref__

    def __init__(self):
        raise TypeError("use mgpu.mpi.isend or mgpu.mpi.irecv")

    def wait(self):
        """Completes the request (GIL released). Once."""
        cdef int rc
        cdef mgpu_mpi_request *r = self.r
        if r == NULL:
            raise ValueError("the request was already waited on")
        self.r = NULL
        with _mpi_lock:
            with nogil:
                rc = mgpu_mpi_wait(r)
        self.array = None
        _check(rc)

    @property
    def done(self):
        """True once wait() returned."""
        return self.r == NULL

    def __dealloc__(self):
        if self.r != NULL and mgpu_is_initialized():
            with _mpi_lock:
                with nogil:
                    mgpu_mpi_wait(self.r)
            mgpu_error_clear()


def _mpi_post(bint send, a, int peer, int tag, comm, stream):
    cdef MPIComm c = _mpi_comm(comm)
    cdef _Moved m = _moved(a, "isend" if send else "irecv", False)
    cdef mgpu_stream *s = _mpi_stream(stream)
    cdef mgpu_mpi_request *r = NULL
    cdef int rc
    with _mpi_lock:
        with nogil:
            if send:
                rc = mgpu_mpi_isend(m.buf, 0, m.count, m.dt, peer, tag, c.c, s, &r)
            else:
                rc = mgpu_mpi_irecv(m.buf, 0, m.count, m.dt, peer, tag, c.c, s, &r)
    _check(rc)
    cdef MPIRequest req = MPIRequest.__new__(MPIRequest)
    req.r = r
    req.array = a
    _mpi["requests"].add(req)
    return req


def mpi_isend(a, dest, tag=0, *, comm=None, stream=None):
    """Posts a send of the whole array a to rank dest; returns an
    MPIRequest. a must stay unchanged until its wait()."""
    return _mpi_post(True, a, _rank_arg(dest, "dest"), _rank_arg(tag, "tag"),
                     comm, stream)


def mpi_irecv(a, source, tag=0, *, comm=None, stream=None):
    """Posts a receive into the whole array a from rank source; returns an
    MPIRequest. a must stay untouched until its wait()."""
    return _mpi_post(False, a, _rank_arg(source, "source"),
                     _rank_arg(tag, "tag"), comm, stream)


def mpi_send(a, dest, tag=0, *, comm=None, stream=None):
    """Sends the whole array a to rank dest (``mgpu_mpi_send``): the
    receiver's array must have as many elements of the same dtype. Returns
    once the data has left a (GIL released)."""
    mpi_isend(a, dest, tag, comm=comm, stream=stream).wait()


def mpi_recv(a, source, tag=0, *, comm=None, stream=None):
    """Receives into the whole array a from rank source (``mgpu_mpi_recv``);
    returns a once the data is in it."""
    mpi_irecv(a, source, tag, comm=comm, stream=stream).wait()
    return a


# Which collective _mpi_coll runs.
cdef enum:
    _BCAST, _REDUCE, _ALLREDUCE, _REDUCE_SCATTER, _ALLGATHER, _SCATTER, _GATHER


cdef _mpi_coll(int which, str what, object send, object recv, object count_of,
               str op, int root, object comm, object stream):
    """Runs one collective with the GIL released. send or recv may be None
    where the call ignores it on this rank; count_of is the array whose
    element count is the call's count."""
    cdef MPIComm c = _mpi_comm(comm)
    cdef bint red = which in (_REDUCE, _ALLREDUCE, _REDUCE_SCATTER)
    cdef _Moved ms = None, mr = None, mc
    cdef mgpu_buffer *sb = NULL
    cdef mgpu_buffer *rb = NULL
    cdef mgpu_stream *s = _mpi_stream(stream)
    cdef mgpu_op mop = MGPU_SUM
    cdef int rc
    if red:
        if op not in _OPS:
            raise ValueError("op must be one of %s, not %r" %
                             (", ".join(_OPS), op))
        mop = _OPS[op]
    if send is not None:
        ms = _moved(send, what, red, op)
        sb = ms.buf
    if recv is not None:
        mr = _moved(recv, what, red, op)
        rb = mr.buf
    _mpi_agree(which, what, send, recv, c.size)
    mc = ms if count_of is send else mr
    cdef size_t count = mc.count
    cdef mgpu_dtype dt = mc.dt
    with _mpi_lock:
        with nogil:
            if which == _BCAST:
                rc = mgpu_mpi_bcast(rb, 0, count, dt, root, c.c, s)
            elif which == _REDUCE:
                rc = mgpu_mpi_reduce(sb, 0, rb, 0, count, dt, mop, root, c.c, s)
            elif which == _ALLREDUCE:
                rc = mgpu_mpi_allreduce(sb, 0, rb, 0, count, dt, mop, c.c, s)
            elif which == _REDUCE_SCATTER:
                rc = mgpu_mpi_reduce_scatter(sb, 0, rb, 0, count, dt, mop, c.c, s)
            elif which == _ALLGATHER:
                rc = mgpu_mpi_allgather(sb, 0, rb, 0, count, dt, c.c, s)
            elif which == _SCATTER:
                rc = mgpu_mpi_scatter(sb, 0, rb, 0, count, dt, root, c.c, s)
            else:
                rc = mgpu_mpi_gather(sb, 0, rb, 0, count, dt, root, c.c, s)
    _check(rc)


cdef _mpi_agree(int which, str what, object send, object recv, int size):
    """The arrays of one collective checked against each other on this
    rank, with the package's shared checks (_array.pxi), before any MPI
    call: the same dtype (never reinterpreted), matching counts, out
    writable, a and out not two views of overlapping memory."""
    if recv is not None and which != _BCAST:  # the root's a is only read
        _writable(what, "out", recv)
    if send is None or recv is None or send is recv:
        return
    if which == _REDUCE or which == _ALLREDUCE:
        _same_shape(what, "a", send, "out", recv)
    elif which == _ALLGATHER or which == _GATHER:
        _times(what, "a", send, "out", recv, size)
    else:  # reduce_scatter, scatter: out is one rank's share of a
        _times(what, "out", recv, "a", send, size)
    _disjoint(what, "a", send, "out", recv)


cdef bint _is_root(int root, object comm) except -1:
    cdef MPIComm c = _mpi_comm(comm)
    return c.rank == root


def mpi_bcast(a, root=0, *, comm=None, stream=None):
    """Every rank's a = root's a (``mgpu_mpi_bcast``). Returns a."""
    _mpi_coll(_BCAST, "bcast", None, a, a, "sum", _rank_arg(root, "root"),
              comm, stream)
    return a


def mpi_reduce(a, out=None, op="sum", root=0, *, comm=None, stream=None):
    """root's out = op over every rank's a (``mgpu_mpi_reduce``); out
    (default: a, in place) only matters on root. Returns out on root, None
    elsewhere."""
    cdef int r = _rank_arg(root, "root")
    here = _is_root(r, comm)
    if out is None and here:
        out = a
    _mpi_coll(_REDUCE, "reduce", a, out if here else None, a, op, r, comm,
              stream)
    return out if here else None


def mpi_allreduce(a, out=None, op="sum", *, comm=None, stream=None):
    """Every rank's out = op over every rank's a (``mgpu_mpi_allreduce``;
    in place when out is None). op: "sum", "prod", "min" or "max". Returns
    out."""
    if out is None:
        out = a
    _mpi_coll(_ALLREDUCE, "allreduce", a, out, a, op, 0, comm, stream)
    return out


def mpi_reduce_scatter(a, out, op="sum", *, comm=None, stream=None):
    """Rank r's out (k elements) = op over elements [r*k, (r+1)*k) of every
    rank's a (nranks*k elements) (``mgpu_mpi_reduce_scatter``). Returns
    out."""
    _mpi_coll(_REDUCE_SCATTER, "reduce_scatter", a, out, out, op, 0, comm,
              stream)
    return out


def mpi_allgather(a, out, *, comm=None, stream=None):
    """out (nranks times a's elements) = every rank's a, in rank order
    (``mgpu_mpi_allgather``). Returns out."""
    _mpi_coll(_ALLGATHER, "allgather", a, out, a, "sum", 0, comm, stream)
    return out


def mpi_scatter(a, out, root=0, *, comm=None, stream=None):
    """Rank r's out (k elements) = elements [r*k, (r+1)*k) of root's a
    (``mgpu_mpi_scatter``); a is ignored (may be None) on the other ranks.
    Returns out."""
    cdef int r = _rank_arg(root, "root")
    _mpi_coll(_SCATTER, "scatter", a if _is_root(r, comm) else None, out, out,
              "sum", r, comm, stream)
    return out


def mpi_gather(a, out=None, root=0, *, comm=None, stream=None):
    """root's out (nranks times a's elements) = every rank's a, in rank
    order (``mgpu_mpi_gather``); out is ignored (may be None) on the other
    ranks. Returns out on root, None elsewhere."""
    cdef int r = _rank_arg(root, "root")
    here = _is_root(r, comm)
    if here and out is None:
        raise TypeError("gather: root needs out")
    _mpi_coll(_GATHER, "gather", a, out if here else None, a, "sum", r, comm,
              stream)
    return out if here else None


def mpi_comm_create(devices=None, *, comm=None):
    """An mgpu.Comm over the devices of every rank of comm
    (``mgpu_mpi_comm_create``): this process's devices (default: all of
    them) are ranks ``first_rank`` .. ``first_rank + len(devices) - 1``,
    after those of the lower MPI ranks. Its allreduce, broadcast,
    allgather and reduce_scatter take this process's arrays (one per
    device, in order) and work across processes unchanged; roots are
    global ranks. Collective over comm. Closed by ``close()`` or by
    ``finalize()``."""
    cdef MPIComm m = _mpi_comm(comm)
    cdef Comm out
    cdef mgpu_comm *c = NULL
    cdef int n, i, rc
    cdef int *devs
    if devices is None:
        devices = range(device_count())
    devices = tuple(_devno(d) for d in devices)
    n = len(devices)
    devs = <int *>malloc(sizeof(int) * (n if n > 0 else 1))
    if devs == NULL:
        raise MemoryError()
    for i in range(n):
        devs[i] = devices[i]
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_comm_create(m.c, n, devs, &c)
    free(devs)
    _check(rc)
    # Ranks are numbered over the processes in order (as the C call does).
    counts = m.comm.allgather(n)
    out = Comm.__new__(Comm)
    out.c = c
    out.devices = devices
    out.first_rank = sum(counts[:m.rank])
    out.nranks = sum(counts)
    out.streams = [_default_stream(d) for d in devices]
    for i, st in enumerate(out.streams):
        out.ss[i] = (<Stream>st).s
    _mpi["comms"].add(out)
    return out


cdef class MPIDist(Dist):
    """A distribution of [0, n) over every device of every rank
    (``mgpu_mpi_dist_create``): rank p's local device d is part
    ``first_part(p) + d``. ``parts`` lists every part (the device is 0 for
    other ranks' parts); ``first_part`` is this rank's first. Moved by
    ``mgpu.mpi.dist_scatter`` and ``dist_gather``."""
    cdef readonly int first_part
    cdef readonly int nlocal
    cdef readonly MPIComm comm

    def __init__(self, *args, **kw):
        raise TypeError("use mgpu.mpi.dist(n, ...)")

    def scatter(self, host):
        raise TypeError("an MPIDist moves device arrays: use "
                        "mgpu.mpi.dist_scatter")

    def gather(self, arrays, out=None):
        raise TypeError("an MPIDist moves device arrays: use "
                        "mgpu.mpi.dist_gather")


def mpi_dist(n, kind="block", *, block=1, weights=None, comm=None):
    """A distribution of [0, n) whose parts are the devices of every rank of
    comm in rank order (``mgpu_mpi_dist_create``): kind "block", "cyclic",
    "block_cyclic" (with block) or "weighted" (with weights, one per part
    of every rank). Collective over comm."""
    cdef MPIComm m = _mpi_comm(comm)
    cdef mgpu_dist_opts o = mgpu_py_dist_opts_init()
    cdef mgpu_dist *d = NULL
    cdef size_t nn = _index(n, "n")
    cdef int rc
    counts = m.comm.allgather(device_count())
    keep = _dist_opts(&o, kind, block, weights, sum(counts))
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_dist_create(m.c, nn, &o, &d)
    _check(rc)
    cdef MPIDist out = MPIDist.__new__(MPIDist)
    out.d = d
    out.n = nn
    out.first_part = sum(counts[:m.rank])
    out.nlocal = counts[m.rank]
    out.comm = m
    return out


cdef size_t _dist_elem(object dt, str what) except 0:
    cdef size_t es = dt.itemsize
    if es % 2:
        raise TypeError("%s: %s has odd-sized elements, which the MPI module "
                        "does not move: view the data as a wider type" %
                        (what, dt))
    return es


def mpi_dist_scatter(MPIDist dist not None, src, root=0, *, dtype=None):
    """Root's src (an mgpu.Array of dist.n elements, on any of its devices)
    cut by dist: returns this rank's parts, one new 1-d array per local
    device (part first_part + i on device i, its elements in index order).
    src is ignored (may be None) on the other ranks, which learn the dtype
    from the root unless dtype is given. Collective."""
    cdef MPIComm m = dist.comm
    cdef int r = _rank_arg(root, "root"), i, rc
    cdef mgpu_buffer *sb = NULL
    cdef mgpu_buffer *bufs[64]
    here = m.rank == r
    # The root tells every rank the dtype, or why its src is refused, so
    # that all of them fail together instead of waiting for it.
    said = None
    if here:
        if not isinstance(src, Array):
            said = ("T", "dist_scatter: root's src must be an mgpu.Array, "
                    "not %s" % type(src).__name__)
        elif (<Array>src).count != dist.n:
            said = ("V", "dist_scatter: root's src has %d elements, the "
                    "distribution %d" % ((<Array>src).count, dist.n))
        else:
            said = ("", _dtype_name(src.dtype))  # bfloat16 too
            sb = (<Array>src).buf
    said = m.comm.bcast(said, root=r)
    if said[0]:
        raise (TypeError if said[0] == "T" else ValueError)(said[1])
    dt = _as_dtype(said[1] if dtype is None else dtype)
    cdef size_t es = _dist_elem(dt, "dist_scatter")
    if dist.nlocal > 64:
        raise ValueError("dist_scatter: more than 64 local devices")
    parts = [empty(mgpu_dist_count(dist.d, dist.first_part + i), dt, i)
             for i in range(dist.nlocal)]
    for i in range(dist.nlocal):
        bufs[i] = (<Array>parts[i]).buf
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_dist_scatter(dist.d, sb, 0, es, r, bufs, m.c)
    _check(rc)
    return parts


def mpi_dist_gather(MPIDist dist not None, parts, out=None, root=0):
    """The reverse of dist_scatter: every rank's parts (one array per local
    device) back into root's out (an mgpu.Array of dist.n elements; default:
    a new one on root's device 0). Returns out on root, None elsewhere.
    Collective."""
    cdef MPIComm m = dist.comm
    cdef int r = _rank_arg(root, "root"), i, rc
    cdef mgpu_buffer *db = NULL
    cdef mgpu_buffer *bufs[64]
    parts = list(parts)
    if len(parts) != dist.nlocal or dist.nlocal > 64:
        raise ValueError("dist_gather: %d arrays for %d local devices" %
                         (len(parts), dist.nlocal))
    for i, a in enumerate(parts):
        if not isinstance(a, Array):
            raise TypeError("dist_gather: expected mgpu.Array, got %s" %
                            type(a).__name__)
        bufs[i] = (<Array>a).buf
        _same_type("dist_gather", ("parts", 0), parts[0], ("parts", i), a)
    dt = (<Array>parts[0]).dtype
    cdef size_t es = _dist_elem(dt, "dist_gather")
    here = m.rank == r
    if here:
        if out is None:
            out = empty(dist.n, dt, 0)
        if not isinstance(out, Array) or (<Array>out).count != dist.n:
            raise ValueError("dist_gather: out must be an mgpu.Array of %d "
                             "elements of %s" % (dist.n, dt))
        _same_type("dist_gather", ("parts", 0), parts[0], "out", out)
        db = (<Array>out).buf
    with _mpi_lock:
        with nogil:
            rc = mgpu_mpi_dist_gather(dist.d, db, 0, es, r, bufs, m.c)
    _check(rc)
    return out if here else None
