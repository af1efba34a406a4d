# ---------------------------------------------------------------------------
# The task pool

cdef int _task_trampoline(int dev, mgpu_stream *stream, void *arg) noexcept nogil:
    with gil:
        mgpu_py_keep_thread_state()
        call = <list>arg
        try:
            call[2] = call[0](dev, *call[1])
        except BaseException as e:
            call[3] = e
            return MGPU_ECANCELED  # the exception is raised by wait()
        finally:
            # The pool's reference (taken by submit): the task has run, so
            # what it needed may go, whatever the Task object's fate.
            (<dict>call[4]).pop(id(call), None)
            mgpu_py_waiter_post(<void *><uintptr_t>call[5])
    return 0


cdef class Task:
    """A submitted task: ``wait()`` returns its function's result or raises
    its exception."""
    cdef Pool pool
    cdef mgpu_task t
    # [fn, args, result, exception, the pool's calls, the address of the
    # waiter the task posts once it has run]
    cdef list call
    cdef mgpu_py_waiter *ran  # the Task's end of that waiter
    cdef bint done

    def wait(self):
        cdef int rc
        if self.done:
            raise ValueError("the task was already waited for")
        if self.call is None:
            raise ValueError("not a task made by Pool.submit")
        if self.pool.p == NULL:
            # Closed: the pool ran every task before it stopped.
            self.done = True
            if self.call[3] is not None:
                raise self.call[3]
            return self.call[2]
        if _on_main():
            # In slices: Ctrl-C ends the wait, and the task can be waited
            # for again after. A pool shut down under it never runs it.
            while not _slice(self.ran):
                if self.pool.p == NULL or not mgpu_is_initialized():
                    break
        self.done = True
        with nogil:
            rc = mgpu_pool_wait(self.pool.p, self.t)
        if self.call[3] is not None:
            raise self.call[3]
        _check(rc)
        return self.call[2]

    def __dealloc__(self):
        if self.ran != NULL:
            mgpu_py_waiter_unref(self.ran)
        # A task dropped unwaited still runs (its call is held by the
        # pool); only its handle is given back.
        if (not self.done and self.call is not None and self.pool is not None
                and self.pool.p != NULL and mgpu_is_initialized()):
            mgpu_pool_release(self.pool.p, self.t)
            mgpu_error_clear()


cdef class Pool:
    """The task pool (``mgpu_pool``): Python functions run on the devices'
    threads, spread by work stealing. ``submit(fn, *args)`` calls
    ``fn(device, *args)`` on some device."""
    cdef mgpu_pool *p
    # The calls of the tasks submitted and not run yet, by id: what a task
    # needs stays alive until it has run, also when Python drops its Task.
    # Touched with the GIL held.
    cdef dict calls

    def __init__(self, devices=None):
        cdef mgpu_pool_opts o = mgpu_py_pool_opts_init()
        cdef int devs[64]
        if devices is not None:
            devices = [_devno(d) for d in devices]
            if not 1 <= len(devices) <= 64:
                raise ValueError("a pool spans 1 to 64 devices")
            for i, d in enumerate(devices):
                devs[i] = d
            o.ndevices = len(devices)
            o.devices = devs
        _check(mgpu_pool_create(&self.p, &o))
        self.calls = {}

    def submit(self, fn, *args):
        """Queues fn(device, *args); returns a Task."""
        cdef int rc
        if not callable(fn):
            raise TypeError("fn must be callable")
        if self.p == NULL:
            raise ValueError("the pool was closed")
        cdef Task t = Task.__new__(Task)
        t.pool = self
        t.ran = _waiter()
        t.call = [fn, args, None, None, self.calls, <uintptr_t>t.ran]
        self.calls[id(t.call)] = t.call
        rc = mgpu_pool_submit_fn(self.p, _task_trampoline, <void *>t.call, &t.t)
        if rc < 0:
            del self.calls[id(t.call)]
            t.call = None
            mgpu_py_waiter_unref(t.ran)  # the task's end: it never runs
            _check(rc)
        return t

    def map(self, fn, iterable):
        """[fn(device, x) for x in iterable], run on the pool."""
        tasks = [self.submit(fn, x) for x in iterable]
        return [t.wait() for t in tasks]

    def close(self):
        """Runs the tasks submitted, then stops the pool."""
        cdef int rc = 0
        if self.p != NULL and mgpu_is_initialized():
            with nogil:
                rc = mgpu_pool_destroy(self.p)
        self.p = NULL
        self._drop_unrun()
        if rc != 0 and rc != MGPU_ECANCELED:
            _check(rc)

    cdef _drop_unrun(self):
        """Lets go of the calls of tasks that never ran (canceled), and of
        their ends of the waiters."""
        for call in self.calls.values():
            mgpu_py_waiter_unref(<mgpu_py_waiter *><uintptr_t>call[5])
        self.calls.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __dealloc__(self):
        if self.p != NULL and mgpu_is_initialized():
            with nogil:
                mgpu_pool_destroy(self.p)
        if self.calls:
            self._drop_unrun()


# ---------------------------------------------------------------------------
# Distributions (mgpu.dist)

_DIST_KINDS = {"block": MGPU_DIST_BLOCK, "cyclic": MGPU_DIST_CYCLIC,
               "block_cyclic": MGPU_DIST_BLOCK_CYCLIC,
               "weighted": MGPU_DIST_WEIGHTED}


cdef object _dist_opts(mgpu_dist_opts *o, kind, block, weights,
                       size_t nparts):
    """Fills kind, block and weights (one per part, nparts) of o; returns
    what o points into, which the caller keeps until the create call."""
    cdef double[::1] w
    if kind not in _DIST_KINDS:
        raise ValueError("kind must be one of %s" % ", ".join(_DIST_KINDS))
    o.kind = _DIST_KINDS[kind]
    o.block = _index(block, "block")
    if weights is None:
        return None
    w = _np.array([float(x) for x in weights], dtype=_np.float64)
    if w.shape[0] != nparts:
        raise ValueError("one weight per part (%d), got %d" %
                         (nparts, w.shape[0]))
    o.weights = &w[0]
    return w


cdef class Dist:
    """A partition of the indices [0, n) over devices (``mgpu_dist``).

    ``kind``: "block", "cyclic", "block_cyclic" (with ``block``) or
    "weighted" (with ``weights``). ``parts`` lists, per part, its device and
    its index ranges; ``scatter`` and ``gather`` move a host array to and
    from per-part arrays.
    """
    # Its attributes are declared in _core.pxd (shared with mgpu._mpi).

    def __init__(self, n, kind="block", devices=None, block=1, weights=None):
        cdef mgpu_dist_opts o = mgpu_py_dist_opts_init()
        cdef int devs[64]
        if devices is not None:
            devices = [_devno(x) for x in devices]
            if not 1 <= len(devices) <= 64:
                raise ValueError("a distribution has 1 to 64 parts")
            for i, x in enumerate(devices):
                devs[i] = x
            o.ndevices = len(devices)
            o.devices = devs
        keep = _dist_opts(&o, kind, block, weights,
                          o.ndevices or device_count())
        self.n = _index(n, "n")
        _check(mgpu_dist_create(&self.d, self.n, &o))

    def __dealloc__(self):
        if self.d != NULL:
            mgpu_dist_destroy(self.d)

    cdef _live(self):
        if self.d == NULL:
            raise ValueError("not a distribution made by Dist(...)")

    @property
    def nparts(self):
        self._live()
        return mgpu_dist_nparts(self.d)

    @property
    def parts(self):
        """One (device, count, [(begin, end), ...]) per part."""
        self._live()
        out = []
        cdef mgpu_range r
        for p in range(mgpu_dist_nparts(self.d)):
            ranges = []
            for k in range(mgpu_dist_nranges(self.d, p)):
                r = mgpu_dist_range(self.d, p, k)
                ranges.append((r.begin, r.end))
            out.append((mgpu_dist_device(self.d, p), mgpu_dist_count(self.d, p), ranges))
        return out

    def scatter(self, host):
        """Per-part arrays holding each part's elements of the host array
        (1-d, n elements), in index order within each part."""
        host = _np.ascontiguousarray(host)
        if host.ndim != 1 or host.shape[0] != self.n:
            raise ValueError("scatter: a 1-d array of %d elements" % self.n)
        dt = _as_dtype(host.dtype)
        arrays = []
        for dev, count, _ in self.parts:
            arrays.append(empty(count, dt, dev))
        for a, (_, _, ranges) in zip(arrays, self.parts):
            a.copy_from(_np.concatenate([host[b:e] for b, e in ranges]) if ranges
                        else host[:0])
        return arrays

    def gather(self, arrays, out=None):
        """The reverse of scatter: a host array of n elements."""
        arrays = list(arrays)
        parts = self.parts
        if len(arrays) != len(parts):
            raise ValueError("gather: one array per part")
        for i, (a, (_, count, _)) in enumerate(zip(arrays, parts)):
            if not isinstance(a, Array):
                raise TypeError("gather: expected mgpu.Array")
            _same_type("gather", ("arrays", 0), arrays[0], ("arrays", i), a)
            if (<Array>a).count != count:
                raise ValueError("gather: arrays[%d] has %d elements, its part "
                                 "%d" % (i, (<Array>a).count, count))
        dt = (<Array>arrays[0]).dtype if arrays else _np.float32
        if out is None:
            out = _np.empty(self.n, dt)
        elif _np.asarray(out).dtype != dt:
            raise TypeError("gather: out is %s, the arrays %s" %
                            (_np.asarray(out).dtype, dt))
        elif _np.shape(out) != (self.n,):
            raise ValueError("gather: out has shape %s, (%d,) wanted" %
                             (_np.shape(out), self.n))
        for a, (_, count, ranges) in zip(arrays, parts):
            vals = (<Array>a).numpy(copy=True)
            k = 0
            for b, e in ranges:
                out[b:e] = vals[k:k + e - b]
                k += e - b
        return out


