# ---------------------------------------------------------------------------
# Collectives

_OPS = {"sum": MGPU_SUM, "prod": MGPU_PROD, "min": MGPU_MIN, "max": MGPU_MAX}


cdef mgpu_dtype _mgpu_dtype(Array a) except *:
    if a.mdt < 0:
        raise TypeError("collectives take float32, float64, int32, int64, "
                        "float16 or bfloat16, not %s" % _dtype_name(a.dtype))
    return <mgpu_dtype>a.mdt


cdef _agree(str what, list arrays, str name):
    """Every arrays[r] has arrays[0]'s dtype and shape."""
    cdef int r
    cdef Array a = arrays[0], b
    for r in range(1, len(arrays)):
        b = arrays[r]
        if a.dtype is not b.dtype or a.shape != b.shape:
            _same_shape(what, (name, 0), a, (name, r), b)


cdef _all_writable(str what, list arrays, str name):
    """Each arrays[r] takes writes."""
    cdef int r
    for r in range(len(arrays)):
        if (<Array>arrays[r]).readonly:
            _writable(what, (name, r), arrays[r])


cdef _pairs(str what, list send, list recv, int mode, size_t n):
    """Rank by rank, recv[r] against send[r]: the same dtype and shape
    (mode 0), n times send[r]'s elements (1), or send[r] n times recv[r]'s
    (2); and not two arrays over overlapping memory."""
    cdef int r
    for r in range(len(send)):
        if mode == 0:
            _same_shape(what, ("arrays", r), send[r], ("out", r), recv[r])
        elif mode == 1:
            _times(what, ("arrays", r), send[r], ("out", r), recv[r], n)
        else:
            _times(what, ("out", r), recv[r], ("arrays", r), send[r], n)
        _disjoint(what, ("arrays", r), send[r], ("out", r), recv[r])


cdef class Comm:
    """A communicator over a list of devices (``mgpu_comm``): rank r is
    ``devices[r]``. Its collectives take one array per rank, in rank order,
    and return once the data has moved (the GIL is released meanwhile).

    One made by ``mgpu.mpi.comm_create`` spans the devices of every MPI
    rank: this process's ``devices[i]`` is rank ``first_rank + i`` of
    ``nranks``, its collectives take this process's arrays only, and roots
    are global ranks."""
    # Its attributes are declared in _core.pxd (shared with mgpu._mpi).

    def __init__(self, devices=None):
        cdef int devs[64]
        if devices is None:
            devices = range(device_count())
        devices = tuple(_devno(d) for d in devices)
        if not 1 <= len(devices) <= 64:
            raise ValueError("a communicator spans 1 to 64 devices")
        for i, d in enumerate(devices):
            devs[i] = d
        _check(mgpu_comm_create(devs, len(devices), &self.c))
        self.devices = devices
        self.first_rank = 0
        self.nranks = len(devices)
        self.streams = [_default_stream(d) for d in devices]
        for i, st in enumerate(self.streams):
            self.ss[i] = (<Stream>st).s

    def __dealloc__(self):
        if self.c != NULL and mgpu_is_initialized():
            with nogil:
                mgpu_comm_destroy(self.c)

    def close(self):
        """Destroys the communicator."""
        cdef int rc = 0
        if self.c != NULL and mgpu_is_initialized():
            with nogil:
                rc = mgpu_comm_destroy(self.c)
        self.c = NULL
        _check(rc)

    def abort(self):
        """Aborts the communicator (``mgpu_comm_abort``): every collective
        still waiting in it, in any thread or rank, ends with
        ``mgpu.CanceledError``, and the communicator is freed once they have
        left. Use it where a rank will never arrive (its process or device
        is gone); ``close()`` is the orderly end. Raises the first error of
        the ranks' devices (``mgpu.DeviceLostError`` for a lost one); the
        communicator is closed either way."""
        cdef int rc = 0
        if self.c == NULL:
            raise ValueError("the communicator was closed")
        if mgpu_is_initialized():
            with nogil:
                rc = mgpu_comm_abort(self.c)
        self.c = NULL
        _check(rc)

    cdef list _arrays(self, object arrays, str what):
        if isinstance(arrays, Array):
            raise TypeError("%s: pass a list of arrays, one per rank" % what)
        if not isinstance(arrays, list):
            arrays = list(arrays)
        if len(arrays) != len(self.devices):
            raise ValueError("%s: %d arrays for %d ranks" %
                             (what, len(arrays), len(self.devices)))
        for a in arrays:
            if not isinstance(a, Array):
                raise TypeError("%s: expected mgpu.Array, got %s" %
                                (what, type(a).__name__))
        return arrays

    cdef _run(self, int which, list send, list recv, size_t count,
              mgpu_dtype dt, mgpu_op op, int root, object streams=None):
        """The collective over every rank in one group: on the package's
        streams, waited for; or on streams (one per rank), not waited for
        (recorded when they capture a graph)."""
        cdef int n = len(self.devices), r, rc = 0, rc2, f = self.first_rank
        cdef mgpu_buffer *sb[64]
        cdef mgpu_buffer *rb[64]
        cdef mgpu_stream *given[64]
        cdef mgpu_stream **ss = self.ss
        cdef bint wait = streams is None
        if self.c == NULL:
            raise ValueError("the communicator was closed")
        if streams is not None:
            what = ("allreduce", "broadcast", "allgather", "reduce_scatter")[which]
            streams = list(streams)
            if len(streams) != n:
                raise ValueError("%s: %d streams for %d ranks" %
                                 (what, len(streams), n))
            for r in range(n):
                if not isinstance(streams[r], Stream):
                    raise TypeError("%s: streams[%d] is %s, not mgpu.Stream" %
                                    (what, r, type(streams[r]).__name__))
                given[r] = (<Stream>streams[r]).s
            ss = given
        for r in range(n):
            sb[r] = (<Array>send[r]).buf
            rb[r] = (<Array>recv[r]).buf
        with nogil:
            mgpu_group_begin()
            for r in range(n):
                if which == 0:
                    rc2 = mgpu_allreduce(self.c, f + r, sb[r], rb[r], count, dt, op, ss[r])
                elif which == 1:
                    rc2 = mgpu_broadcast(self.c, f + r, sb[r], rb[r], count, dt, root, ss[r])
                elif which == 2:
                    rc2 = mgpu_allgather(self.c, f + r, sb[r], rb[r], count, dt, ss[r])
                else:
                    rc2 = mgpu_reduce_scatter(self.c, f + r, sb[r], rb[r], count, dt, op, ss[r])
                if rc == 0:
                    rc = rc2
            rc2 = mgpu_group_end()
            if rc == 0:
                rc = rc2
            for r in range(n if wait else 0):
                rc2 = mgpu_stream_synchronize(ss[r])
                if rc == 0:
                    rc = rc2
        _check(rc)

    def allreduce(self, arrays, out=None, op="sum", streams=None):
        """Every rank's out = op over every rank's array (in place when out
        is None). Every array and out has arrays[0]'s dtype and shape
        (TypeError / ValueError naming the two otherwise, before any byte
        moves). Returns out.

        streams (every collective takes it): one mgpu.Stream per rank, on
        the rank's device. The collective is then ordered on them, after
        what is queued there, and the call returns without waiting for it
        (synchronize them, or wait for an event recorded there); when they
        capture a graph (mgpu.capture, the other ranks' streams joined
        through events), the collective is recorded into it and every
        launch runs it again. Without streams, the package's streams, and
        the call returns once the data has moved."""
        send = self._arrays(arrays, "allreduce")
        recv = send if out is None else self._arrays(out, "allreduce")
        mop = _OPS.get(op)
        if mop is None:
            raise ValueError("op must be one of %s" % ", ".join(_OPS))
        _agree("allreduce", send, "arrays")
        if recv is not send:
            _pairs("allreduce", send, recv, 0, 1)
        _all_writable("allreduce", recv, "arrays" if out is None else "out")
        a = <Array>send[0]
        self._run(0, send, recv, a.count, _mgpu_dtype(a), mop, 0, streams)
        return recv

    def broadcast(self, arrays, root=0, streams=None):
        """Every rank's array = root's (in place; all of one dtype and
        shape, all writable, root's too). Returns arrays."""
        arrs = self._arrays(arrays, "broadcast")
        rt = _index(root, "root")
        _agree("broadcast", arrs, "arrays")
        _all_writable("broadcast", arrs, "arrays")  # root's too: in place
        a = <Array>arrs[0]
        self._run(1, arrs, arrs, a.size, _mgpu_dtype(a), MGPU_SUM, rt, streams)
        return arrs

    def allgather(self, arrays, out, streams=None):
        """out[r] (n times the elements, the same dtype) = every rank's
        array (all of one dtype and shape), in rank order. Returns out."""
        send = self._arrays(arrays, "allgather")
        recv = self._arrays(out, "allgather")
        _agree("allgather", send, "arrays")
        _pairs("allgather", send, recv, 1, self.nranks)
        _all_writable("allgather", recv, "out")
        a = <Array>send[0]
        self._run(2, send, recv, a.size, _mgpu_dtype(a), MGPU_SUM, 0, streams)
        return recv

    def reduce_scatter(self, arrays, out, op="sum", streams=None):
        """Rank r's out = op over every rank's elements [r*k, (r+1)*k) with
        k = out[r].size (every out of one dtype and shape, every array of
        that dtype and n times k elements). Returns out."""
        send = self._arrays(arrays, "reduce_scatter")
        recv = self._arrays(out, "reduce_scatter")
        if op not in _OPS:
            raise ValueError("op must be one of %s" % ", ".join(_OPS))
        _agree("reduce_scatter", recv, "out")
        _pairs("reduce_scatter", send, recv, 2, self.nranks)
        _all_writable("reduce_scatter", recv, "out")
        a = <Array>recv[0]
        self._run(3, send, recv, a.size, _mgpu_dtype(a), _OPS[op], 0, streams)
        return recv


cdef Comm _comm_of(list arrays):
    cdef list devs = []
    for a in arrays:
        if not isinstance(a, Array):
            raise TypeError("expected mgpu.Array, got %s" % type(a).__name__)
        devs.append((<Array>a).device)
    key = tuple(devs)
    c = _state["comms"].get(key)
    if c is None:
        c = Comm(key)
        with _state_lock:
            _state["comms"][key] = c
    return <Comm>c


def allreduce(arrays, out=None, op="sum", streams=None):
    """All-reduce over a list of per-device arrays (rank r: arrays[r]'s
    device), through a communicator kept for that list of devices
    (streams: see Comm.allreduce)."""
    if not isinstance(arrays, list):
        if isinstance(arrays, Array):
            raise TypeError("allreduce: pass a list of arrays, one per rank")
        arrays = list(arrays)
    return _comm_of(arrays).allreduce(arrays, out, op, streams)


def broadcast(arrays, root=0, streams=None):
    """Broadcast over a list of per-device arrays (see Comm.broadcast)."""
    arrays = list(arrays)
    for a in arrays:
        if not isinstance(a, Array):
            raise TypeError("broadcast: expected mgpu.Array, got %s" % type(a).__name__)
    return _comm_of(arrays).broadcast(arrays, root, streams)


