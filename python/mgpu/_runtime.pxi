# ---------------------------------------------------------------------------
# Life cycle and devices

__version__ = mgpu_version_string().decode()
_here = _os.path.dirname(_os.path.abspath(__file__))
_state = {"streams": {}, "comms": {}, "generation": 0}
_state_lock = _threading.Lock()


def version():
    """The version of the mgpu library inside the package ("0.1.0")."""
    return mgpu_version_string().decode()


def init(devices=None, *, host_mem=None, host_workers=None, host_peer=None,
         log=None, trace=None):
    """Opens the devices (``mgpu_init``).

    ``devices`` is an ``MGPU_DEVICES`` spec: ``"host:4"``, ``"cuda"``,
    ``"cuda:0/4"``...; None takes ``MGPU_DEVICES`` from the environment,
    else every GPU, else ``"host:4"``. ``host_mem`` is each host device's
    budget in bytes; ``trace`` a file to record a trace into until
    shutdown (see mgpu.trace). The CUDA plugin is looked for beside the package
    first. Raises AlreadyInitializedError if already open.
    """
    cdef mgpu_config cfg = mgpu_py_config_init()
    keep = _fill_config(&cfg, devices, host_mem, host_workers, host_peer,
                        log, trace)
    cdef int rc
    with nogil:
        rc = mgpu_init(&cfg)
    _check(rc)
    _opened()


cdef list _fill_config(mgpu_config *cfg, devices, host_mem, host_workers,
                       host_peer, log, trace):
    """Fills cfg from init's arguments; returns the bytes objects cfg points
    into, which the caller keeps until the library has read them."""
    if devices is not None and not isinstance(devices, str):
        raise TypeError("devices must be a str such as 'host:4', not %s"
                        % type(devices).__name__)
    spec = devices.encode() if devices is not None else None
    plugin = (_os.environ.get("MGPU_PLUGIN_PATH", "") + ":" + _here).strip(":").encode()
    if spec is not None:
        cfg.devices = spec
    trace_path = _os.fsencode(trace) if trace is not None else None
    if trace_path is not None:
        cfg.trace = trace_path
    cfg.plugin_path = plugin
    if host_mem is not None:
        cfg.host_mem = _index(host_mem, "host_mem")
    if host_workers is not None:
        cfg.host_workers = _index(host_workers, "host_workers")
    if host_peer is not None:
        cfg.host_peer = 1 if host_peer else 0
    if log is not None:
        levels = {"none": 0, "warn": 1, "info": 2, "debug": 3}
        if log not in levels:
            raise ValueError("log must be one of %s" % ", ".join(levels))
        cfg.log_level = levels[log]
    return [spec, plugin, trace_path]


def _opened():
    """The package's state after the library opened its devices."""
    with _state_lock:
        _state["streams"] = {}
        _state["comms"] = {}
        _state["generation"] += 1


# Called (without arguments) before the library shuts down: the run_on_device
# calls a Ctrl-C left are waited for, and the MPI part finalizes its module.
_before_shutdown = [_reap_abandoned]


def shutdown():
    """Waits for all work and closes every device (``mgpu_shutdown``).

    Arrays still alive keep their memory where it is host memory: NumPy
    arrays over them stay valid, and mgpu calls on them raise
    NotInitializedError (or FreedError after a new init). Safe to call when
    not initialized.
    """
    for fn in _before_shutdown:
        fn()
    with _state_lock:
        _state["streams"] = {}
        _state["comms"] = {}
    cdef int rc
    with nogil:
        rc = mgpu_shutdown()
    _check(rc)


def is_initialized():
    """True between init() and shutdown()."""
    return bool(mgpu_is_initialized())


@_atexit.register
def _shutdown_at_exit():
    # Device threads must not run Python while the interpreter finalizes.
    for fn in _before_shutdown:
        fn()
    if mgpu_is_initialized():
        with nogil:
            mgpu_shutdown()


cdef size_t _index(object v, str what) except? 0:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    v = v.__index__()
    if v < 0:
        raise ValueError("%s must be >= 0, got %d" % (what, v))
    return v


cdef int _devno(object device) except -2:
    """A device number from an int, a Device or None (the current one)."""
    cdef int cur
    if device is None:
        _check(mgpu_get_device(&cur))
        return cur
    if isinstance(device, Device):
        return (<Device>device).index
    if isinstance(device, bool) or not hasattr(device, "__index__"):
        raise TypeError("device must be an int or an mgpu.Device, not %s"
                        % type(device).__name__)
    d = device.__index__()
    if d < 0 or d >= 1 << 30:
        raise ERRORS[MGPU_ENODEV]("MGPU_ENODEV: device %d does not exist" % d)
    return d


def device_count():
    """Number of open devices."""
    return _check(mgpu_device_count())


cdef class Device:
    """An open device, by its mgpu number.

    ``with mgpu.Device(1):`` makes device 1 the calling thread's current
    device (the default of ``device=`` arguments) and restores the previous
    one after. The properties are read when the object is made.
    """
    cdef readonly int index
    cdef readonly str name, backend, pci_bus_id, uuid
    cdef readonly int ordinal, split_index, split_count
    cdef readonly object total_mem, compute_capability
    cdef readonly int multiprocessors, numa_node
    cdef readonly bint peer_capable
    cdef list _prev

    def __init__(self, index):
        cdef mgpu_device_props p
        p.size = sizeof(p)
        self.index = _devno(index)
        _check(mgpu_device_get_props(self.index, &p))
        self.name = p.name.decode("utf-8", "replace")
        self.backend = p.backend.decode()
        self.ordinal = p.ordinal
        self.split_index = p.split_index
        self.split_count = p.split_count
        self.total_mem = p.total_mem
        self.compute_capability = (p.cc_major, p.cc_minor)
        self.multiprocessors = p.multiprocessors
        self.numa_node = p.numa_node
        self.peer_capable = p.peer_capable
        self.pci_bus_id = p.pci_bus_id.decode()
        self.uuid = p.uuid.decode()
        self._prev = []

    @property
    def free_mem(self):
        """Bytes of the device's budget not in use now."""
        cdef mgpu_device_props p
        p.size = sizeof(p)
        _check(mgpu_device_get_props(self.index, &p))
        return p.free_mem

    def properties(self):
        """Every property as a dict."""
        return {k: getattr(self, k) for k in (
            "index", "name", "backend", "ordinal", "split_index",
            "split_count", "total_mem", "free_mem", "compute_capability",
            "multiprocessors", "numa_node", "peer_capable", "pci_bus_id",
            "uuid")}

    def synchronize(self):
        """Waits for all work on the device's streams."""
        cdef int rc, d = self.index
        with nogil:
            rc = mgpu_device_synchronize(d)
        _check(rc)

    def __enter__(self):
        cdef int cur
        _check(mgpu_get_device(&cur))
        _check(mgpu_set_device(self.index))
        self._prev.append(cur)
        return self

    def __exit__(self, *exc):
        mgpu_set_device(self._prev.pop())
        return False

    def __index__(self):
        return self.index

    def __int__(self):
        return self.index

    def __eq__(self, other):
        return isinstance(other, Device) and (<Device>other).index == self.index

    def __hash__(self):
        return self.index

    def __repr__(self):
        return "<mgpu.Device %d: %s>" % (self.index, self.name)


def devices():
    """The open devices, as Device objects."""
    return [Device(i) for i in range(device_count())]


def get_device():
    """The calling thread's current device number."""
    cdef int d
    _check(mgpu_get_device(&d))
    return d


def set_device(device):
    """Makes device current on the calling thread."""
    _check(mgpu_set_device(_devno(device)))


cdef extern from *:
    """
    /* run_on_device's call, made on the device's thread without Cython's
     * `with gil` (PyGILState_Ensure/Release each time): the thread's
     * Python state is made once and kept (as mgpu_py_keep_thread_state
     * does), then only the GIL is taken and dropped around the call.
     *
     * A caller that waits in one piece keeps the call on its stack with fn
     * and args borrowed (done NULL). One that waits in slices (the main
     * thread, see _wait.pxi) allocates it and owns fn and args; if it stops
     * waiting (Ctrl-C) it sets abandoned, and the device's thread frees the
     * call once it has run. finished and abandoned are touched with the GIL
     * held, which orders the two sides. */
    typedef struct {
      PyObject *fn, *args;
      PyObject *result;             /* new reference, NULL on error */
      PyObject *et, *ev, *tb;       /* the error, as PyErr_Fetch gives it */
      mgpu_py_waiter *done;         /* posted once the call has run */
      int finished, abandoned;
    } mgpu_py_call;
    static __thread PyThreadState *mgpu_py_tstate;
    /* Drops what an allocated call holds, and the call. */
    static void mgpu_py_call_free(mgpu_py_call *c) {
      Py_XDECREF(c->result); Py_XDECREF(c->et); Py_XDECREF(c->ev);
      Py_XDECREF(c->tb); Py_XDECREF(c->fn); Py_XDECREF(c->args);
      free(c);
    }
    static int mgpu_py_run_call(int dev, void *arg) {
      mgpu_py_call *c = (mgpu_py_call *)arg;
      (void)dev;
      if (mgpu_py_tstate == NULL) {
        (void)PyGILState_Ensure();  /* never released: the state stays */
        mgpu_py_kept = 1;
        mgpu_py_tstate = PyThreadState_Get();
      } else {
        PyEval_RestoreThread(mgpu_py_tstate);
      }
      c->result = PyObject_Call(c->fn, c->args, NULL);
      if (c->result == NULL) PyErr_Fetch(&c->et, &c->ev, &c->tb);
      c->finished = 1;
      if (c->abandoned) {
        mgpu_py_waiter_unref(c->done);
        mgpu_py_call_free(c);
      } else if (c->done != NULL) {
        mgpu_py_waiter_post(c->done);
      }
      (void)PyEval_SaveThread();
      return 0;
    }
    /* Drops the error a call left. */
    static void mgpu_py_call_clear(mgpu_py_call *c) {
      Py_XDECREF(c->et); Py_XDECREF(c->ev); Py_XDECREF(c->tb);
      c->et = c->ev = c->tb = NULL;
    }
    /* Raises the error a call left (returns -1 for Cython's except). */
    static int mgpu_py_call_raise(mgpu_py_call *c) {
      PyErr_Restore(c->et, c->ev, c->tb);
      c->et = c->ev = c->tb = NULL;
      return -1;
    }
    """
    ctypedef struct mgpu_py_call:
        PyObject *fn
        PyObject *args
        PyObject *result
        PyObject *et
        PyObject *ev
        PyObject *tb
        mgpu_py_waiter *done
        int finished
        int abandoned
    int mgpu_py_run_call(int dev, void *arg) noexcept nogil
    int mgpu_py_call_raise(mgpu_py_call *c) except -1
    void mgpu_py_call_clear(mgpu_py_call *c)
    void mgpu_py_call_free(mgpu_py_call *c)


def run_on_device(device, fn, *args):
    """Runs ``fn(*args)`` on the device's own host thread (with that device
    current) and returns its result; its exception is raised here. The GIL
    is released while the call waits. On the main thread Ctrl-C ends the
    wait (KeyboardInterrupt) while fn runs on to its end."""
    cdef mgpu_py_call c
    cdef int d, rc
    if type(device) is int and 0 <= <long>device < (1 << 30):
        d = device
    else:
        d = _devno(device)
    if not callable(fn):
        raise TypeError("fn must be callable, not %s" % type(fn).__name__)
    if _on_main():
        return _run_sliced(d, fn, args)
    c.fn = <PyObject *>fn
    c.args = <PyObject *>args
    c.result = c.et = c.ev = c.tb = NULL
    c.done = NULL
    c.finished = c.abandoned = 0
    with nogil:
        rc = mgpu_run_on_device(d, <mgpu_device_fn>mgpu_py_run_call, &c)
    return _call_outcome(&c, rc)


cdef object _call_outcome(mgpu_py_call *c, int rc):
    """What a call that ran (rc 0) or failed to (rc < 0) gives: its result,
    its exception, or the library's error."""
    if c.result != NULL:
        out = <object>c.result
        Py_DECREF(out)
        c.result = NULL
        return out
    if rc == 0:
        mgpu_py_call_raise(c)
    mgpu_py_call_clear(c)
    _check(rc)


cdef object _run_sliced(int d, object fn, tuple args):
    """run_on_device from the main thread: queued, then waited for in
    slices (_wait.pxi); a Ctrl-C leaves the call to finish on its own."""
    cdef mgpu_py_call *c = <mgpu_py_call *>calloc(1, sizeof(mgpu_py_call))
    cdef mgpu_work *work = NULL
    cdef int rc
    if c == NULL:
        raise MemoryError()
    c.done = mgpu_py_waiter_new()
    if c.done == NULL:
        free(c)
        raise MemoryError()
    c.fn = <PyObject *>fn
    c.args = <PyObject *>args
    Py_INCREF(fn)
    Py_INCREF(args)
    with nogil:
        rc = mgpu_run_on_device_async(d, <mgpu_device_fn>mgpu_py_run_call, c, &work)
    if rc < 0:
        mgpu_py_waiter_unref(c.done)  # the device's end: it never runs
    else:
        try:
            while not _slice(c.done):
                pass
        except BaseException:
            if not c.finished:
                c.abandoned = 1
                mgpu_py_waiter_unref(c.done)
                _abandoned.append(<uintptr_t>work)
                raise
            with nogil:
                mgpu_work_wait(work)
            mgpu_py_waiter_unref(c.done)
            mgpu_py_call_free(c)
            raise
        with nogil:
            rc = mgpu_work_wait(work)
    mgpu_py_waiter_unref(c.done)
    try:
        return _call_outcome(c, rc)
    finally:
        mgpu_py_call_free(c)


def synchronize(device=None):
    """Waits for all work of one device, or of every device (None)."""
    cdef int rc = 0, d, n
    if device is not None:
        d = _devno(device)
        with nogil:
            rc = mgpu_device_synchronize(d)
        _check(rc)
        return
    n = _check(mgpu_device_count())
    for d in range(n):
        with nogil:
            rc = mgpu_device_synchronize(d)
        _check(rc)


