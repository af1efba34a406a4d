# cython: language_level=3, embedsignature=True, binding=True
"""mgpu._core: the compiled part of the mgpu package.

Everything here is re-exported by ``mgpu`` (``mgpu/__init__.py``); import
from there. Calls that wait (synchronize, copies, collectives, channel
sends and receives, task waits) release the GIL; Python functions run on a
device's host thread (``run_on_device``, pool tasks, stream callbacks) take
it while they run.
"""
from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_GetPointer,
                                PyCapsule_IsValid, PyCapsule_SetName,
                                PyCapsule_SetDestructor)
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy

from mgpu._capi cimport *

import atexit as _atexit
import os as _os
import threading as _threading

import numpy as _np

# ---------------------------------------------------------------------------
# Pieces written in C: the X-macro lists of the library (error codes and
# metrics) turned into Python values, so they cannot drift from the headers.
cdef extern from *:
    """
    #include "mgpu.h"
    static PyObject *mgpu_py_error_codes(void) {
      PyObject *l = PyList_New(0);
      if (l == NULL) return NULL;
    #define MGPU_PY_ERR(name, value, msg) {                             \\
        PyObject *t = Py_BuildValue("(iss)", (int)(value), #name, msg);  \\
        if (t == NULL || PyList_Append(l, t) != 0) {                     \\
          Py_XDECREF(t); Py_DECREF(l); return NULL; }                    \\
        Py_DECREF(t); }
      MGPU_ERRNO_MAP(MGPU_PY_ERR)
    #undef MGPU_PY_ERR
      return l;
    }
    /* One dict per device: every counter of mgpu_metrics. */
    static PyObject *mgpu_py_metrics(const mgpu_metrics *m) {
      PyObject *devs = PyList_New(0);
      if (devs == NULL) return NULL;
      for (int d = 0; d < m->ndevices; d++) {
        const mgpu_device_metrics *x = &m->dev[d];
        PyObject *o = Py_BuildValue("{sKsK}", "mem_in_use",
            (unsigned long long)x->mem_in_use, "mem_peak",
            (unsigned long long)x->mem_peak);
        if (o == NULL) { Py_DECREF(devs); return NULL; }
    #define MGPU_PY_METRIC(name, doc) {                                 \\
          PyObject *v = PyLong_FromUnsignedLongLong(x->name);          \\
          if (v == NULL || PyDict_SetItemString(o, #name, v) != 0) {    \\
            Py_XDECREF(v); Py_DECREF(o); Py_DECREF(devs); return NULL; } \\
          Py_DECREF(v); }
        MGPU_METRICS_MAP(MGPU_PY_METRIC)
    #undef MGPU_PY_METRIC
        if (PyList_Append(devs, o) != 0) {
          Py_DECREF(o); Py_DECREF(devs); return NULL; }
        Py_DECREF(o);
      }
      return devs;
    }
    """
    object mgpu_py_error_codes()
    object mgpu_py_metrics(const mgpu_metrics *m)


cdef extern from *:
    """
    /* Called with the GIL held on a device's thread: the first time, keeps
     * the thread's Python state for good (one more PyGILState_Ensure that
     * is never released), so later callbacks on the thread only take the
     * GIL instead of building and tearing down a thread state each time
     * (about 8 us a call). The state is the thread's until it ends. */
    static __thread int mgpu_py_kept;
    static void mgpu_py_keep_thread_state(void) {
      if (!mgpu_py_kept) { (void)PyGILState_Ensure(); mgpu_py_kept = 1; }
    }
    """
    void mgpu_py_keep_thread_state()


cdef extern from *:
    """
    #include <dlfcn.h>
    #include <stddef.h>
    /* Stream order between mgpu and a consumer's CUDA stream, through the
     * CUDA driver the CUDA plugin loaded (never loaded from here: without
     * it there is no CUDA memory to order). Its handles are opaque
     * pointers, so this compiles without the toolkit. Called with the GIL
     * held, which guards the one-time lookup. */
    static struct {
      int tried;
      void *lib;
      int (*stream_get_ctx)(void *stream, void **ctx);
      int (*ctx_push)(void *ctx);
      int (*ctx_pop)(void **ctx);
      int (*event_create)(void **ev, unsigned flags);
      int (*event_record)(void *ev, void *stream);
      int (*stream_wait_event)(void *stream, void *ev, unsigned flags);
      int (*event_destroy)(void *ev);
    } mgpu_py_cu;
    static int mgpu_py_cu_loaded(void) {
      if (!mgpu_py_cu.tried) {
        mgpu_py_cu.tried = 1;
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h != NULL) {
    #define MGPU_PY_CU(field, name) \\
          *(void **)&mgpu_py_cu.field = dlsym(h, name); \\
          if (mgpu_py_cu.field == NULL) return 0;
          MGPU_PY_CU(stream_get_ctx, "cuStreamGetCtx")
          MGPU_PY_CU(ctx_push, "cuCtxPushCurrent_v2")
          MGPU_PY_CU(ctx_pop, "cuCtxPopCurrent_v2")
          MGPU_PY_CU(event_create, "cuEventCreate")
          MGPU_PY_CU(event_record, "cuEventRecord")
          MGPU_PY_CU(stream_wait_event, "cuStreamWaitEvent")
          MGPU_PY_CU(event_destroy, "cuEventDestroy_v2")
    #undef MGPU_PY_CU
          mgpu_py_cu.lib = h;
        }
      }
      return mgpu_py_cu.lib != NULL;
    }
    /* Work queued on consumer from now on waits for the work queued on
     * producer so far (both cudaStream_t / CUstream; consumer may be
     * CU_STREAM_LEGACY (1) or CU_STREAM_PER_THREAD (2)), without blocking
     * the host: an event recorded on producer, in producer's context, and
     * waited on by consumer. 0, -1 without a CUDA driver, or the driver's
     * error. */
    static int mgpu_py_cuda_order(void *producer, void *consumer) {
      if (!mgpu_py_cu_loaded()) return -1;
      void *ctx = NULL, *ev = NULL, *prev = NULL;
      int rc = mgpu_py_cu.stream_get_ctx(producer, &ctx);
      if (rc != 0) return rc;
      rc = mgpu_py_cu.ctx_push(ctx);
      if (rc != 0) return rc;
      rc = mgpu_py_cu.event_create(&ev, 2 /* CU_EVENT_DISABLE_TIMING */);
      if (rc == 0) rc = mgpu_py_cu.event_record(ev, producer);
      if (rc == 0) rc = mgpu_py_cu.stream_wait_event(consumer, ev, 0);
      /* The wait holds on to the recorded work; the event may go. */
      if (ev != NULL) mgpu_py_cu.event_destroy(ev);
      mgpu_py_cu.ctx_pop(&prev);
      return rc;
    }
    """
    int mgpu_py_cuda_order(void *producer, void *consumer)


def _cuda_order(uintptr_t producer, uintptr_t consumer):
    """mgpu_py_cuda_order(producer, consumer): 0, -1 without a CUDA driver
    loaded, or the driver's error (for the tests)."""
    return mgpu_py_cuda_order(<void *>producer, <void *>consumer)


# ---------------------------------------------------------------------------
# Errors

class Error(Exception):
    """An mgpu call failed.

    ``code`` is the negative ``MGPU_E...`` value, ``name`` its name
    (``"MGPU_EINVAL"``) and ``detail`` the library's message naming the
    device, buffer, offset or size at fault. Each code has its own subclass
    (``mgpu.InvalidArgumentError`` for ``MGPU_EINVAL`` ...).
    """
    code = 0
    name = "MGPU_OK"

    def __init__(self, message="", detail=""):
        super().__init__(message)
        self.detail = detail


# Python names of the codes; a code the library adds later gets a name made
# from its own ("MGPU_EFOO" -> "EFooError") and still its own class.
_PY_NAMES = {
    "EINVAL": ("InvalidArgumentError", ValueError),
    "ENOMEM": ("OutOfMemoryError", MemoryError),
    "ENODEV": ("NoDeviceError", None),
    "ENOTSUP": ("NotSupportedError", NotImplementedError),
    "ENOINIT": ("NotInitializedError", None),
    "EALREADY": ("AlreadyInitializedError", None),
    "EBADHANDLE": ("BadHandleError", None),
    "EFREED": ("FreedError", None),
    "EWRONGDEV": ("WrongDeviceError", None),
    "ERANGE": ("RangeError", IndexError),
    "EOVERLAP": ("OverlapError", None),
    "EBACKEND": ("BackendError", None),
    "ETIMEDOUT": ("TimeoutError", TimeoutError),
    "EAGAIN": ("NotReadyError", None),
    "ECANCELED": ("CanceledError", None),
    "ECLOSED": ("ClosedError", None),
    "EDEPFAIL": ("DependencyError", None),
    "EMISMATCH": ("MismatchError", None),
    "EIO": ("IOError", OSError),
    "EPLUGIN": ("PluginError", None),
    "EEXIST": ("ExistsError", None),
    "ENOENT": ("NotFoundError", KeyError),
    "EACCES": ("AccessError", PermissionError),
    "EREADONLY": ("ReadOnlyError", None),
    "ESTORE": ("StoreError", None),
    "EDEADLK": ("DeadlockError", None),
    "EBUSY": ("BusyError", None),
    "EFORK": ("ForkError", None),
    "EDEVLOST": ("DeviceLostError", None),
}

ERRORS = {}  # code -> class


def _make_errors():
    made = {}
    for code, name, msg in mgpu_py_error_codes():
        pyname, extra = _PY_NAMES.get(name, ("E" + name[1:].capitalize() + "Error", None))
        bases = (Error,) if extra is None else (Error, extra)
        cls = type(pyname, bases, {
            "code": code, "name": "MGPU_" + name,
            "__doc__": "MGPU_%s (%d): %s." % (name, code, msg),
            "__module__": "mgpu"})
        ERRORS[code] = cls
        made[pyname] = cls
    return made


globals().update(_make_errors())


cdef object _error(int rc):
    """The exception for code rc, carrying the calling thread's detail."""
    detail = mgpu_error_detail().decode("utf-8", "replace")
    cls = ERRORS.get(rc, Error)
    name = mgpu_err_name(rc).decode()
    msg = "%s: %s" % (name, detail) if detail else "%s (%s)" % (
        name, mgpu_strerror(rc).decode())
    e = cls(msg, detail)
    if cls is Error:
        e.code = rc
        e.name = name
    return e


cdef inline int _check(int rc) except -1:
    if rc < 0:
        raise _error(rc)
    return rc


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


# Called (without arguments) before the library shuts down: the MPI part
# finalizes its module there.
_before_shutdown = []


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
     * does), then only the GIL is taken and dropped around the call. */
    typedef struct {
      PyObject *fn, *args;          /* borrowed from the caller */
      PyObject *result;             /* new reference, NULL on error */
      PyObject *et, *ev, *tb;       /* the error, as PyErr_Fetch gives it */
    } mgpu_py_call;
    static __thread PyThreadState *mgpu_py_tstate;
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
    int mgpu_py_run_call(int dev, void *arg) noexcept nogil
    int mgpu_py_call_raise(mgpu_py_call *c) except -1
    void mgpu_py_call_clear(mgpu_py_call *c)


def run_on_device(device, fn, *args):
    """Runs ``fn(*args)`` on the device's own host thread (with that device
    current) and returns its result; its exception is raised here. The GIL
    is released while the call waits."""
    cdef mgpu_py_call c
    cdef int d, rc
    if type(device) is int and 0 <= <long>device < (1 << 30):
        d = device
    else:
        d = _devno(device)
    if not callable(fn):
        raise TypeError("fn must be callable, not %s" % type(fn).__name__)
    c.fn = <PyObject *>fn
    c.args = <PyObject *>args
    c.result = c.et = c.ev = c.tb = NULL
    with nogil:
        rc = mgpu_run_on_device(d, <mgpu_device_fn>mgpu_py_run_call, &c)
    if c.result != NULL:
        out = <object>c.result
        Py_DECREF(out)
    elif rc == 0:
        mgpu_py_call_raise(&c)
    else:
        mgpu_py_call_clear(&c)
    _check(rc)
    return out


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


# ---------------------------------------------------------------------------
# Streams and events

cdef class Stream:
    """An in-order queue of work on one device (``mgpu_stream``).

    Work on one stream runs in order; several streams of a device run
    concurrently. ``synchronize()`` waits with the GIL released.
    """
    cdef mgpu_stream *s
    cdef readonly int device
    cdef bint owned

    def __init__(self, device=None):
        self.device = _devno(device)
        _check(mgpu_stream_create(&self.s, self.device))
        self.owned = True

    def synchronize(self):
        """Waits until the work queued so far is done; raises its error."""
        cdef int rc
        with nogil:
            rc = mgpu_stream_synchronize(self.s)
        _check(rc)

    def query(self):
        """True when all work queued so far is done."""
        return _done(mgpu_stream_query(self.s))

    @property
    def native(self):
        """The backend's stream as an int (a cudaStream_t on CUDA, 0 on
        host devices)."""
        return <uintptr_t>mgpu_stream_native(self.s)

    def record(self, Event event=None):
        """Records an event at this point of the stream and returns it."""
        if event is None:
            event = Event(self.device)
        _check(mgpu_event_record(event.e, self.s))
        return event

    def wait(self, Event event not None):
        """Work queued on this stream after the call waits for event."""
        _check(mgpu_stream_wait_event(self.s, event.e))

    def add_callback(self, fn, *args):
        """Runs ``fn(*args)`` on a host thread once the work queued before
        is done (later work waits for it). fn must not call mgpu; an
        exception it raises is printed, not propagated."""
        if not callable(fn):
            raise TypeError("fn must be callable")
        call = (fn, args)
        Py_INCREF(call)
        rc = mgpu_stream_add_callback(self.s, _stream_callback, <void *>call)
        if rc < 0:
            Py_DECREF(call)
            _check(rc)

    def close(self):
        """Waits for the stream's work and destroys it."""
        cdef int rc = 0
        if self.owned and mgpu_is_initialized():
            with nogil:
                rc = mgpu_stream_destroy(self.s)
        self.owned = False
        if rc != MGPU_EFREED:
            _check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __dealloc__(self):
        if self.owned and mgpu_is_initialized():
            with nogil:
                mgpu_stream_destroy(self.s)

    def __repr__(self):
        return "<mgpu.Stream of device %d>" % self.device


cdef void _stream_callback(void *arg) noexcept nogil:
    with gil:
        mgpu_py_keep_thread_state()
        call = <tuple>arg
        try:
            call[0](*call[1])
        except BaseException:
            import traceback
            traceback.print_exc()
        Py_DECREF(call)


cdef bint _done(int rc) except -1:
    """A query's answer: True when done, False while pending (MGPU_EAGAIN),
    the exception of any other error."""
    if rc == MGPU_EAGAIN:
        return False
    _check(rc)
    return True


cdef class Event:
    """A point in a stream (``mgpu_event``)."""
    cdef mgpu_event *e
    cdef readonly int device
    cdef bint owned

    def __init__(self, device=None):
        self.device = _devno(device)
        _check(mgpu_event_create(&self.e, self.device))
        self.owned = True

    def record(self, Stream stream not None):
        """Marks the current end of stream's work; returns self."""
        _check(mgpu_event_record(self.e, stream.s))
        return self

    def synchronize(self):
        """Waits until the event completes (GIL released)."""
        cdef int rc
        with nogil:
            rc = mgpu_event_synchronize(self.e)
        _check(rc)

    def query(self):
        """True when complete (or never recorded)."""
        return _done(mgpu_event_query(self.e))

    def elapsed_ms(self, Event end not None):
        """Milliseconds from this event to end (both complete)."""
        cdef float ms = 0
        _check(mgpu_event_elapsed_ms(self.e, end.e, &ms))
        return ms

    def __dealloc__(self):
        if self.owned and mgpu_is_initialized():
            mgpu_event_destroy(self.e)


cdef Stream _default_stream(int dev):
    """The package's own stream of a device, made on first use."""
    streams = _state["streams"]
    s = streams.get(dev)
    if s is None:
        with _state_lock:
            s = _state["streams"].get(dev)
            if s is None:
                s = Stream(dev)
                _state["streams"][dev] = s
    return <Stream>s


# ---------------------------------------------------------------------------
# DLPack data types

_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_MGPU_DTYPES = {"float32": MGPU_FLOAT32, "float64": MGPU_FLOAT64,
                "int32": MGPU_INT32, "int64": MGPU_INT64,
                "float16": MGPU_FLOAT16}


def _as_dtype(dtype):
    try:
        dt = _np.dtype(dtype)
    except TypeError as e:
        raise TypeError("not a data type: %r" % (dtype,)) from e
    if dt.kind not in _DL_CODES or dt.byteorder == ">" or dt.fields is not None:
        raise TypeError("data type %s has no DLPack equivalent (bool, "
                        "int, uint, float and complex types only)" % dt)
    return dt


cdef DLDataType _dl_dtype(object dt):
    cdef DLDataType t
    t.code = _DL_CODES[dt.kind]
    t.bits = dt.itemsize * 8
    t.lanes = 1
    return t


def _np_dtype_of(int code, int bits, int lanes):
    kinds = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
    if lanes != 1 or code not in kinds or bits % 8 != 0:
        raise TypeError("DLPack data type (code %d, %d bits, %d lanes) is "
                        "not supported" % (code, bits, lanes))
    if code == 6:
        return _np.dtype(bool)
    return _np.dtype("%s%d" % (kinds[code], bits // 8))


def _as_shape(shape):
    if isinstance(shape, bool):
        raise TypeError("shape must be an int or a tuple of ints")
    if hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError("shape must be an int or a tuple of ints, not %s"
                        % type(shape).__name__) from None
    out = []
    for s in shape:
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError("shape entries must be ints, not %s" % type(s).__name__)
        s = s.__index__()
        if s < 0:
            raise ValueError("negative dimension %d in shape %r" % (s, shape))
        out.append(s)
    if len(out) > 64:
        raise ValueError("at most 64 dimensions")
    return tuple(out)


# ---------------------------------------------------------------------------
# Arrays

_KINDS = {"device": MGPU_MEM_DEVICE, "pinned": MGPU_MEM_PINNED,
          "unified": MGPU_MEM_UNIFIED}


cdef void _pin_release(DLManagedTensorVersioned *pin) noexcept nogil:
    if pin != NULL:
        pin.deleter(pin)


cdef class Array:
    """An n-dimensional array in one mgpu buffer (C order).

    Other libraries use its memory in place: ``np.from_dlpack(a)``,
    ``cupy.from_dlpack(a)``, ``torch.from_dlpack(a)`` (``__dlpack__``),
    ``np.asarray(a)`` on host memory (``__array_interface__``), CUDA
    libraries through ``__cuda_array_interface__``. The memory lives as long
    as the array or any export of it, also past ``mgpu.shutdown()``.
    """
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
    # Streams with queued work that reads or writes the array (the copies
    # queued with stream=): what an export orders a consumer after. Cleared
    # by a host wait for the device. Touched with the GIL held.
    cdef list pending
    cdef object __weakref__

    def __init__(self):
        raise TypeError("use mgpu.empty, mgpu.zeros or mgpu.asarray")

    # -- properties
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return self.count

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def strides(self):
        """Byte strides (C order)."""
        out = []
        st = self.dtype.itemsize
        for s in reversed(self.shape):
            out.append(st)
            st *= s
        return tuple(reversed(out))

    @property
    def ptr(self):
        """Address of the first element."""
        return <uintptr_t>self.ptr

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return "<mgpu.Array shape=%s dtype=%s device=%d kind=%s>" % (
            self.shape, self.dtype, self.device, self.kind)

    # -- the exchange protocols
    def __dlpack_device__(self):
        """``(device_type, device_id)``: (1, 0) for host memory, (2, n) for
        device memory of CUDA GPU n, (13, n) for its unified memory."""
        return (self.dl_type, self.dl_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """A DLPack capsule over the array's memory (array API standard).

        ``max_version >= (1, 0)`` gets a versioned, writable tensor
        (``dltensor_versioned``), otherwise a legacy one (``dltensor``).
        ``stream``: on host memory only None; on CUDA memory -1 skips
        synchronization, anything else waits for the device's work first.
        ``dl_device`` other than the array's own, or ``copy=True``, makes a
        copy (flagged IS_COPIED) when allowed; ``copy=False`` never copies.
        """
        if max_version is not None:
            try:
                major = int(max_version[0])
            except (TypeError, IndexError, ValueError):
                raise TypeError("max_version must be a (major, minor) tuple")
        else:
            major = 0
        if dl_device is not None:
            try:
                want = (int(dl_device[0]), int(dl_device[1]))
            except (TypeError, IndexError, ValueError):
                raise TypeError("dl_device must be a (device_type, id) tuple")
            if want != (self.dl_type, self.dl_id):
                if copy is False:
                    raise BufferError("the array lives on DLPack device %s, "
                                      "not %s, and copy=False" %
                                      ((self.dl_type, self.dl_id), want))
                if want[0] != 1:
                    raise BufferError("a copy to DLPack device %s is not "
                                      "supported" % (want,))
                host = self.numpy(copy=True)
                return host.__dlpack__(max_version=max_version)
        if self.dl_type == 1:
            if stream is not None:
                raise ValueError("stream must be None for host memory, got %r"
                                 % (stream,))
        elif stream is not None and (isinstance(stream, bool) or
                                     not isinstance(stream, int)):
            raise TypeError("stream must be an int or None")
        elif stream < -1:
            raise ValueError("stream %d is not a CUDA stream" % stream)
        elif stream == 0:
            raise ValueError("stream 0 is ambiguous (array API standard): "
                             "pass 1 for the legacy default stream, 2 for "
                             "the per-thread one, or a cudaStream_t")
        src = self
        if copy is True:
            src = self.copy()
        if self.dl_type == 1:
            src._sync()
        elif stream != -1:
            # The consumer's stream (None: the legacy default one) waits for
            # the array's queued work on the device, not the host.
            (<Array>src)._order_after(1 if stream is None else stream)
        return (<Array>src)._capsule(major >= 1, copy is True)

    cdef _order_after(self, uintptr_t consumer):
        """Makes CUDA stream consumer wait for the work queued on the
        array's pending streams (an event each); where that cannot be done
        (no CUDA driver loaded, a handle the driver refuses), waits on the
        host instead."""
        cdef Stream st
        cdef void *native
        cdef int rc
        if not self.pending:
            return
        for x in self.pending:
            st = <Stream>x
            if not st.owned or not mgpu_is_initialized():
                continue  # destroyed: its work is done
            native = mgpu_stream_native(st.s)
            if native == NULL:
                mgpu_error_clear()  # a stream of a closed session: done
                continue
            rc = mgpu_py_cuda_order(native, <void *>consumer)
            if rc != 0:
                self._sync()
                return

    cdef _touch(self, Stream st):
        if self.pending is None:
            self.pending = [st]
        elif not any(x is st for x in self.pending):
            self.pending.append(st)

    cdef object _capsule(self, bint versioned, bint copied):
        cdef DLManagedTensorVersioned *t = NULL
        cdef int64_t shape[64]
        cdef int nd = len(self.shape), i, rc
        for i in range(nd):
            shape[i] = self.shape[i]
        rc = mgpu_buffer_dlpack(self.buf, 0, _dl_dtype(self.dtype), nd, shape,
                                NULL, &t)
        _check(rc)
        if copied:
            t.flags |= 2  # DLPACK_FLAG_BITMASK_IS_COPIED
        return _dl_capsule(t, versioned)

    @property
    def __array_interface__(self):
        """NumPy's array interface (version 3), for host memory only."""
        if self.dl_type != 1:
            raise AttributeError("__array_interface__: the array is in device "
                                 "memory (use __cuda_array_interface__)")
        self._sync()
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (<uintptr_t>self.ptr, False), "strides": None,
                "version": 3}

    @property
    def __cuda_array_interface__(self):
        """The CUDA array interface (version 3), for CUDA memory only.
        ``stream`` is the mgpu stream (a cudaStream_t) with work queued on
        the array, which the consumer must order itself after, or None when
        there is none; with several such streams the device's work is
        waited for on the host first."""
        if self.dl_type == 1:
            raise AttributeError("__cuda_array_interface__: the array is in "
                                 "host memory (use __array_interface__)")
        live = [x for x in (self.pending or ()) if (<Stream>x).owned]
        cdef uintptr_t native = 0
        if len(live) == 1:
            native = <uintptr_t>mgpu_stream_native((<Stream>live[0]).s)
        elif live:
            self._sync()
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (<uintptr_t>self.ptr, False), "strides": None,
                "version": 3, "stream": native if native > 2 else None}

    def _sync(self):
        cdef int rc = 0, d = self.device
        if mgpu_is_initialized() and mgpu_buffer_device(self.buf) == d:
            with nogil:
                rc = mgpu_device_synchronize(d)
            _check(rc)
            self.pending = None
        else:
            mgpu_error_clear()

    # -- host views and copies
    def numpy(self, copy=False):
        """The array as a NumPy array: a view of host memory (no copy), or
        a copy for device memory (or when copy=True)."""
        if self.dl_type == 1 and not copy:
            self._sync()
            out = _np.asarray(self)
            return out
        out = _np.empty(self.shape, self.dtype)
        if self.nbytes:
            self._to_host(out)
        return out

    cdef _to_host(self, object out):
        cdef size_t n = self.nbytes
        cdef uintptr_t dst = out.__array_interface__["data"][0]
        cdef int rc
        with nogil:
            rc = mgpu_memcpy_dtoh(<void *>dst, self.buf, 0, n)
        _check(rc)

    def copy(self, device=None):
        """A new array with the same contents, on device (default: this
        array's device)."""
        dev = self.device if device is None else _devno(device)
        out = _new_array(self.shape, self.dtype, dev, "device")
        if self.nbytes:
            _copy_bytes(out, self, self.nbytes, None)
        return out

    def copy_to(self, device, stream=None):
        """Copies the array to another device (peer copy where peer access
        is on, host-staged otherwise) and returns the new array. With a
        stream the copy is queued on it (a stream of either device)."""
        if device is None:
            raise TypeError("copy_to needs a device (an int or mgpu.Device)")
        out = _new_array(self.shape, self.dtype, _devno(device), "device")
        if self.nbytes:
            _copy_bytes(out, self, self.nbytes, stream)
        return out

    def copy_from(self, src, stream=None):
        """Copies src into this array: another mgpu Array of the same size
        (any device), or anything NumPy can read (host data)."""
        cdef const unsigned char[::1] view
        cdef size_t n
        cdef int rc
        if isinstance(src, Array):
            if (<Array>src).nbytes != self.nbytes:
                raise ValueError("copy_from: %d bytes into %d" %
                                 ((<Array>src).nbytes, self.nbytes))
            if self.nbytes:
                _copy_bytes(self, src, self.nbytes, stream)
            return self
        host = _np.ascontiguousarray(src, dtype=self.dtype)
        if host.size != self.size:
            raise ValueError("copy_from: %d elements into %d" % (host.size, self.size))
        n = host.nbytes
        if n:
            view = host.reshape(-1).view(_np.uint8)
            with nogil:
                rc = mgpu_memcpy_htod(self.buf, 0, &view[0], n)
            _check(rc)
        return self

    def fill(self, value):
        """Sets every element to value."""
        if self.dl_type == 1:
            self._sync()
            _np.asarray(self)[...] = value
        else:
            self.copy_from(_np.full(self.shape, value, self.dtype))
        return self

    def free(self):
        """Frees the buffer now: later mgpu calls on the array raise
        FreedError. Its memory stays while NumPy views or other exports of
        it (and this object) are alive."""
        cdef int rc
        if mgpu_is_initialized():
            with nogil:
                rc = mgpu_free(self.buf)
            _check(rc)

    def __dealloc__(self):
        cdef mgpu_buffer *b = self.buf
        cdef DLManagedTensorVersioned *pin = self.pin
        if b != NULL and mgpu_is_initialized():
            with nogil:
                mgpu_free(b)
            mgpu_error_clear()
        with nogil:
            _pin_release(pin)


cdef void _capsule_versioned_destructor(object cap) noexcept:
    if PyCapsule_IsValid(cap, b"dltensor_versioned"):
        t = <DLManagedTensorVersioned *>PyCapsule_GetPointer(cap, b"dltensor_versioned")
        if t != NULL and t.deleter != NULL:
            t.deleter(t)


cdef void _capsule_legacy_destructor(object cap) noexcept:
    if PyCapsule_IsValid(cap, b"dltensor"):
        t = <DLManagedTensor *>PyCapsule_GetPointer(cap, b"dltensor")
        if t != NULL and t.deleter != NULL:
            t.deleter(t)


cdef void _legacy_deleter(DLManagedTensor *self) noexcept nogil:
    cdef DLManagedTensorVersioned *t = <DLManagedTensorVersioned *>self.manager_ctx
    free(self)
    t.deleter(t)


cdef object _dl_capsule(DLManagedTensorVersioned *t, bint versioned):
    """A capsule owning t: versioned, or a legacy tensor over it."""
    cdef DLManagedTensor *legacy
    if versioned:
        return PyCapsule_New(<void *>t, b"dltensor_versioned",
                             _capsule_versioned_destructor)
    legacy = <DLManagedTensor *>malloc(sizeof(DLManagedTensor))
    if legacy == NULL:
        t.deleter(t)
        raise MemoryError()
    legacy.dl_tensor = t.dl_tensor
    legacy.manager_ctx = <void *>t
    legacy.deleter = _legacy_deleter
    return PyCapsule_New(<void *>legacy, b"dltensor",
                         _capsule_legacy_destructor)


cdef Array _wrap_buffer(mgpu_buffer *b, tuple shape, object dt, str kind):
    """An Array owning buffer b (freed on error)."""
    cdef Array a = Array.__new__(Array)
    cdef DLDevice where
    cdef int64_t n = mgpu_buffer_size(b)
    cdef DLDataType u8
    u8.code = 1
    u8.bits = 8
    u8.lanes = 1
    a.buf = b
    a.ptr = mgpu_buffer_ptr(b)
    a.device = mgpu_buffer_device(b)
    a.shape = shape
    a.dtype = dt
    a.kind = kind
    a.mdt = _MGPU_DTYPES.get(dt.name, -1)
    a.count = 1
    for x in shape:
        a.count *= <size_t>x
    _check(mgpu_buffer_dlpack(b, 0, u8, 1, &n, NULL, &a.pin))
    _check(mgpu_buffer_dldevice(b, &where))
    a.dl_type = where.device_type
    a.dl_id = where.device_id
    return a


cdef Array _new_array(tuple shape, object dt, int dev, str kind):
    cdef mgpu_buffer *b = NULL
    cdef size_t n = dt.itemsize
    cdef int rc
    for s in shape:
        n *= <size_t>s
    if n == 0:
        n = 1  # mgpu has no empty buffers: one element's room
    k = _KINDS.get(kind)
    if k is None:
        raise ValueError("kind must be 'device', 'pinned' or 'unified', not %r"
                         % (kind,))
    if k == MGPU_MEM_DEVICE:
        rc = mgpu_malloc(&b, dev, n)
    elif k == MGPU_MEM_PINNED:
        rc = mgpu_malloc_host(&b, dev, n)
    else:
        rc = mgpu_malloc_unified(&b, dev, n)
    _check(rc)
    try:
        return _wrap_buffer(b, shape, dt, kind)
    except BaseException:
        mgpu_free(b)
        raise


cdef _copy_bytes(Array dst, Array src, size_t n, object stream):
    cdef int rc
    cdef mgpu_stream *s = NULL
    if stream is not None:
        if not isinstance(stream, Stream):
            raise TypeError("stream must be an mgpu.Stream or None")
        s = (<Stream>stream).s
    with nogil:
        if s == NULL:
            rc = mgpu_memcpy(dst.buf, 0, src.buf, 0, n)
        else:
            rc = mgpu_memcpy_async(dst.buf, 0, src.buf, 0, n, s)
    _check(rc)
    if s != NULL:
        dst._touch(stream)
        src._touch(stream)


def empty(shape, dtype="float32", device=None, *, kind="device"):
    """A new uninitialized array of the shape and dtype on device (default:
    the current device). kind: "device", "pinned" (host memory tied to the
    device) or "unified"."""
    return _new_array(_as_shape(shape), _as_dtype(dtype), _devno(device), kind)


def zeros(shape, dtype="float32", device=None, *, kind="device"):
    """A new array of zeros (see empty)."""
    cdef Array a = empty(shape, dtype, device, kind=kind)
    cdef Stream s = _default_stream(a.device)
    cdef size_t n = mgpu_buffer_size(a.buf)
    cdef int rc
    with nogil:
        rc = mgpu_memset_async(a.buf, 0, 0, n, s.s)
        if rc == 0:
            rc = mgpu_stream_synchronize(s.s)
    _check(rc)
    return a


def full(shape, value, dtype="float32", device=None, *, kind="device"):
    """A new array with every element set to value."""
    return empty(shape, dtype, device, kind=kind).fill(value)


# -- import: memory another library owns, through DLPack

cdef extern from *:
    """
    /* A legacy (unversioned) managed tensor seen as a versioned one: the
     * wrapper's deleter calls the legacy deleter, then frees the wrapper. */
    typedef struct mgpu_py_legacy {
      DLManagedTensorVersioned v;
      DLManagedTensor *legacy;
    } mgpu_py_legacy;
    static void mgpu_py_legacy_deleter(DLManagedTensorVersioned *self) {
      mgpu_py_legacy *w = (mgpu_py_legacy *)self->manager_ctx;
      DLManagedTensor *l = w->legacy;
      free(w);
      if (l->deleter != NULL) l->deleter(l);
    }
    static DLManagedTensorVersioned *mgpu_py_legacy_wrap(DLManagedTensor *l) {
      mgpu_py_legacy *w = (mgpu_py_legacy *)calloc(1, sizeof *w);
      if (w == NULL) return NULL;
      w->legacy = l;
      w->v.version.major = 1;
      w->v.version.minor = 0;
      w->v.manager_ctx = w;
      w->v.deleter = mgpu_py_legacy_deleter;
      w->v.dl_tensor = l->dl_tensor;
      return &w->v;
    }
    """
    DLManagedTensorVersioned *mgpu_py_legacy_wrap(DLManagedTensor *l) nogil


def from_dlpack(obj, device=None):
    """An mgpu Array over the memory of obj (anything with ``__dlpack__``:
    a NumPy or CuPy array, a PyTorch tensor), without a copy.

    The memory goes on device (default: the device it lives on: the current
    host device for host memory, a device of the same GPU for CUDA memory)
    and stays the producer's: it is released through its DLPack deleter
    when the Array and its exports are gone. Raises BufferError for a
    tensor mgpu cannot take in place (not C-contiguous, on a device mgpu did
    not open) with the library's detail."""
    cdef mgpu_buffer *b = NULL
    cdef DLManagedTensorVersioned *t = NULL
    cdef DLManagedTensor *legacy = NULL
    cdef int dev = -1 if device is None else _devno(device)
    cdef int rc
    cdef bint versioned
    if not hasattr(obj, "__dlpack__"):
        raise TypeError("from_dlpack: %s does not speak DLPack"
                        % type(obj).__name__)
    try:
        cap = obj.__dlpack__(max_version=(1, 1))
    except TypeError:
        cap = obj.__dlpack__()  # a producer from before DLPack 1.0
    versioned = PyCapsule_IsValid(cap, b"dltensor_versioned")
    if versioned:
        t = <DLManagedTensorVersioned *>PyCapsule_GetPointer(cap, b"dltensor_versioned")
    elif PyCapsule_IsValid(cap, b"dltensor"):
        legacy = <DLManagedTensor *>PyCapsule_GetPointer(cap, b"dltensor")
        t = mgpu_py_legacy_wrap(legacy)
        if t == NULL:
            raise MemoryError()
    else:
        raise TypeError("from_dlpack: __dlpack__ did not return a DLPack capsule")
    x = &t.dl_tensor
    try:
        dt = _np_dtype_of(x.dtype.code, x.dtype.bits, x.dtype.lanes)
    except TypeError:
        if not versioned:
            free(t.manager_ctx)
        raise
    shape = tuple(x.shape[i] for i in range(x.ndim))
    rc = mgpu_buffer_from_dlpack(&b, dev, t)
    if rc < 0:
        err = _error(rc)
        if not versioned:
            free(t.manager_ctx)  # the wrapper only; the capsule keeps the tensor
        raise BufferError(str(err)) from err
    # The buffer owns the tensor now: the capsule must not delete it.
    PyCapsule_SetName(cap, b"used_dltensor_versioned" if versioned else b"used_dltensor")
    cdef Array a = _wrap_buffer(b, shape, dt, "device")
    a.owner = None
    return a


def asarray(obj, dtype=None, device=None, *, copy=None):
    """An mgpu Array from obj.

    An mgpu Array on the requested device (and dtype) is returned as is.
    Anything that speaks DLPack (NumPy, CuPy, PyTorch) is taken in place
    when its memory can go on the device as it is (see from_dlpack);
    otherwise, or with copy=True, its data is copied into a new array
    (host data NumPy can read: lists, arrays). copy=False refuses to copy.
    """
    if isinstance(obj, Array):
        a = <Array>obj
        same_dev = device is None or _devno(device) == a.device
        same_type = dtype is None or _as_dtype(dtype) == a.dtype
        if same_dev and same_type and copy is not True:
            return a
        if copy is False:
            raise ValueError("asarray: a copy is needed and copy=False")
        out = a.copy(device) if same_type else asarray(a.numpy(), dtype, device)
        return out
    if hasattr(obj, "__dlpack__") and copy is not True:
        same_type = dtype is None
        if not same_type:
            try:
                same_type = _as_dtype(dtype) == _np.dtype(getattr(obj, "dtype", None))
            except TypeError:
                same_type = False
        if same_type:
            try:
                return from_dlpack(obj, device)
            except BufferError:
                if copy is False:
                    raise
    if copy is False:
        raise ValueError("asarray: %s cannot be used in place and copy=False"
                         % type(obj).__name__)
    host = _np.asarray(obj) if not hasattr(obj, "__dlpack__") else _np.from_dlpack(obj)
    dt = _as_dtype(host.dtype if dtype is None else dtype)
    host = _np.ascontiguousarray(host, dtype=dt)
    out = empty(host.shape, dt, device)
    return out.copy_from(host)


# ---------------------------------------------------------------------------
# Peer access

def peer_can_access(a, b):
    """True when device a can copy to or read device b directly."""
    cdef int yes = 0
    _check(mgpu_peer_can_access(_devno(a), _devno(b), &yes))
    return bool(yes)


def peer_enable(a, b):
    """Turns direct copies between a and b on."""
    _check(mgpu_peer_enable(_devno(a), _devno(b)))


def peer_disable(a, b):
    """Turns direct copies off: copies between a and b go host-staged."""
    _check(mgpu_peer_disable(_devno(a), _devno(b)))


def copy_path(src, dst):
    """The path a copy from src to dst takes now ("direct", "staged"...)."""
    cdef mgpu_copy_path p
    _check(mgpu_copy_path_get(_devno(src), _devno(dst), &p))
    return mgpu_copy_path_name(p).decode()


# ---------------------------------------------------------------------------
# Metrics

def metrics():
    """Every device's counters: a dict with ``ndevices``,
    ``load_imbalance`` and ``devices`` (one dict per device)."""
    cdef mgpu_metrics m
    m.size = sizeof(m)
    _check(mgpu_metrics_snapshot(&m))
    return {"ndevices": m.ndevices, "load_imbalance": m.load_imbalance,
            "devices": mgpu_py_metrics(&m)}


def reset_metrics():
    """Sets every counter to 0 (and every peak to the current value)."""
    _check(mgpu_metrics_reset())


# ---------------------------------------------------------------------------
# Collectives

_OPS = {"sum": MGPU_SUM, "prod": MGPU_PROD, "min": MGPU_MIN, "max": MGPU_MAX}


cdef mgpu_dtype _mgpu_dtype(Array a) except *:
    if a.mdt < 0:
        raise TypeError("collectives take float32, float64, int32, int64 or "
                        "float16 (CUDA), not %s" % a.dtype)
    return <mgpu_dtype>a.mdt


cdef class Comm:
    """A communicator over a list of devices (``mgpu_comm``): rank r is
    ``devices[r]``. Its collectives take one array per rank, in rank order,
    and return once the data has moved (the GIL is released meanwhile).

    One made by ``mgpu.mpi.comm_create`` spans the devices of every MPI
    rank: this process's ``devices[i]`` is rank ``first_rank + i`` of
    ``nranks``, its collectives take this process's arrays only, and roots
    are global ranks."""
    cdef mgpu_comm *c
    cdef readonly tuple devices
    cdef readonly int first_rank  # the global rank of devices[0]
    cdef readonly int nranks      # ranks over every process
    cdef list streams        # the package's stream of each rank's device
    cdef mgpu_stream *ss[64]  # their handles, in rank order
    cdef object __weakref__

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
              mgpu_dtype dt, mgpu_op op, int root):
        cdef int n = len(self.devices), r, rc = 0, rc2, f = self.first_rank
        cdef mgpu_buffer *sb[64]
        cdef mgpu_buffer *rb[64]
        cdef mgpu_stream **ss = self.ss
        if self.c == NULL:
            raise ValueError("the communicator was closed")
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
            for r in range(n):
                rc2 = mgpu_stream_synchronize(ss[r])
                if rc == 0:
                    rc = rc2
        _check(rc)

    def allreduce(self, arrays, out=None, op="sum"):
        """Every rank's out = op over every rank's array (in place when out
        is None). Returns out."""
        send = self._arrays(arrays, "allreduce")
        recv = send if out is None else self._arrays(out, "allreduce")
        mop = _OPS.get(op)
        if mop is None:
            raise ValueError("op must be one of %s" % ", ".join(_OPS))
        a = <Array>send[0]
        self._run(0, send, recv, a.count, _mgpu_dtype(a), mop, 0)
        return recv

    def broadcast(self, arrays, root=0):
        """Every rank's array = root's (in place). Returns arrays."""
        arrs = self._arrays(arrays, "broadcast")
        a = <Array>arrs[0]
        self._run(1, arrs, arrs, a.size, _mgpu_dtype(a), MGPU_SUM,
                  _index(root, "root"))
        return arrs

    def allgather(self, arrays, out):
        """out[r] (n times the elements) = every rank's array, in rank
        order. Returns out."""
        send = self._arrays(arrays, "allgather")
        recv = self._arrays(out, "allgather")
        a = <Array>send[0]
        self._run(2, send, recv, a.size, _mgpu_dtype(a), MGPU_SUM, 0)
        return recv

    def reduce_scatter(self, arrays, out, op="sum"):
        """Rank r's out = op over every rank's elements [r*k, (r+1)*k) with
        k = out[r].size. Returns out."""
        send = self._arrays(arrays, "reduce_scatter")
        recv = self._arrays(out, "reduce_scatter")
        if op not in _OPS:
            raise ValueError("op must be one of %s" % ", ".join(_OPS))
        a = <Array>recv[0]
        self._run(3, send, recv, a.size, _mgpu_dtype(a), _OPS[op], 0)
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


def allreduce(arrays, out=None, op="sum"):
    """All-reduce over a list of per-device arrays (rank r: arrays[r]'s
    device), through a communicator kept for that list of devices."""
    if not isinstance(arrays, list):
        if isinstance(arrays, Array):
            raise TypeError("allreduce: pass a list of arrays, one per rank")
        arrays = list(arrays)
    return _comm_of(arrays).allreduce(arrays, out, op)


def broadcast(arrays, root=0):
    """Broadcast over a list of per-device arrays (see Comm.broadcast)."""
    arrays = list(arrays)
    for a in arrays:
        if not isinstance(a, Array):
            raise TypeError("broadcast: expected mgpu.Array, got %s" % type(a).__name__)
    return _comm_of(arrays).broadcast(arrays, root)


# ---------------------------------------------------------------------------
# Channels

cdef class Channel:
    """A bounded queue of messages from one device's memory to another's
    (``mgpu_channel``). send and recv block (GIL released) while the channel
    is full or empty; recv raises ClosedError once it is closed and
    drained."""
    cdef mgpu_channel *ch
    cdef readonly int src, dst
    cdef readonly size_t msg_size

    def __init__(self, src, dst, msg_size, capacity=4):
        self.src = _devno(src)
        self.dst = _devno(dst)
        self.msg_size = _index(msg_size, "msg_size")
        _check(mgpu_channel_create(self.src, self.dst, self.msg_size,
                                   _index(capacity, "capacity"), &self.ch))

    def send(self, Array a not None, nbytes=None):
        """Sends the array's first nbytes (default: all) bytes."""
        cdef size_t n = a.nbytes if nbytes is None else _index(nbytes, "nbytes")
        cdef mgpu_stream *s = _default_stream(a.device).s
        cdef int rc
        with nogil:
            rc = mgpu_channel_send(self.ch, a.buf, 0, n, s)
            if rc == 0:
                rc = mgpu_stream_synchronize(s)
        _check(rc)

    def recv(self, Array a not None):
        """Receives the next message into the array; returns its size in
        bytes."""
        cdef size_t n = 0
        cdef mgpu_stream *s = _default_stream(a.device).s
        cdef int rc
        with nogil:
            rc = mgpu_channel_recv(self.ch, a.buf, 0, &n, s)
            if rc == 0:
                rc = mgpu_stream_synchronize(s)
        _check(rc)
        return n

    def close(self):
        """Ends the messages: blocked senders and receivers wake."""
        _check(mgpu_channel_close(self.ch))

    def __dealloc__(self):
        if self.ch != NULL and mgpu_is_initialized():
            mgpu_channel_close(self.ch)
            with nogil:
                mgpu_channel_destroy(self.ch)


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
    return 0


cdef class Task:
    """A submitted task: ``wait()`` returns its function's result or raises
    its exception."""
    cdef Pool pool
    cdef mgpu_task t
    cdef list call
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
        self.done = True
        with nogil:
            rc = mgpu_pool_wait(self.pool.p, self.t)
        if self.call[3] is not None:
            raise self.call[3]
        _check(rc)
        return self.call[2]


cdef class Pool:
    """The task pool (``mgpu_pool``): Python functions run on the devices'
    threads, spread by work stealing. ``submit(fn, *args)`` calls
    ``fn(device, *args)`` on some device."""
    cdef mgpu_pool *p
    cdef set calls

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
        self.calls = set()

    def submit(self, fn, *args):
        """Queues fn(device, *args); returns a Task."""
        if not callable(fn):
            raise TypeError("fn must be callable")
        if self.p == NULL:
            raise ValueError("the pool was closed")
        cdef Task t = Task.__new__(Task)
        t.pool = self
        t.call = [fn, args, None, None]
        _check(mgpu_pool_submit_fn(self.p, _task_trampoline, <void *>t.call, &t.t))
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
        if rc != 0 and rc != MGPU_ECANCELED:
            _check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __dealloc__(self):
        if self.p != NULL and mgpu_is_initialized():
            with nogil:
                mgpu_pool_destroy(self.p)


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
    cdef mgpu_dist *d
    cdef readonly size_t n

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
        dt = (<Array>arrays[0]).dtype if arrays else _np.float32
        if out is None:
            out = _np.empty(self.n, dt)
        for a, (_, count, ranges) in zip(arrays, parts):
            if not isinstance(a, Array):
                raise TypeError("gather: expected mgpu.Array")
            vals = (<Array>a).numpy(copy=True)
            k = 0
            for b, e in ranges:
                out[b:e] = vals[k:k + e - b]
                k += e - b
        return out


# ---------------------------------------------------------------------------
# Baselines for mgpu.bench: the same library calls as the Python API makes,
# looped in C, timed in the same run.

cdef extern from *:
    """
    #include <time.h>
    static int mgpu_py_noop(int dev, void *arg) { (void)dev; (void)arg; return 0; }
    static double mgpu_py_now(void) {
      struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
      return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec; }
    """
    int mgpu_py_noop(int dev, void *arg) noexcept nogil
    double mgpu_py_now() noexcept nogil


def _c_run_on_device(device, long iters):
    """Seconds per mgpu_run_on_device of a C no-op, looped in C."""
    cdef int d = _devno(device), rc = 0
    cdef long i
    cdef double t0, t1
    with nogil:
        t0 = mgpu_py_now()
        for i in range(iters):
            rc = mgpu_run_on_device(d, <mgpu_device_fn>mgpu_py_noop, NULL)
            if rc != 0:
                break
        t1 = mgpu_py_now()
    _check(rc)
    return (t1 - t0) / iters


def _c_allreduce(arrays, long iters):
    """Seconds per in-place all-reduce over the arrays (one per device),
    issued as mgpu.allreduce issues it (a group, then each rank's stream
    synchronized), looped in C."""
    arrays = list(arrays)
    cdef Comm comm = _comm_of(arrays)
    cdef int n = len(arrays), r, rc = 0
    cdef long i
    cdef mgpu_buffer *b[64]
    cdef mgpu_stream *s[64]
    cdef Array a0 = arrays[0]
    cdef size_t count = a0.size
    cdef mgpu_dtype dt = _mgpu_dtype(a0)
    cdef double t0, t1
    for r in range(n):
        b[r] = (<Array>arrays[r]).buf
        s[r] = comm.ss[r]
    with nogil:
        t0 = mgpu_py_now()
        for i in range(iters):
            mgpu_group_begin()
            for r in range(n):
                mgpu_allreduce(comm.c, r, b[r], b[r], count, dt, MGPU_SUM, s[r])
            rc = mgpu_group_end()
            for r in range(n):
                if rc == 0:
                    rc = mgpu_stream_synchronize(s[r])
            if rc != 0:
                break
        t1 = mgpu_py_now()
    _check(rc)
    return (t1 - t0) / iters


# ---------------------------------------------------------------------------
# Traces (mgpu.trace)

def trace_start(path):
    """Starts recording a trace into path (Chrome trace-event JSON, written
    when recording stops)."""
    cdef bytes p = _os.fsencode(path)
    cdef const char *cp = p
    cdef int rc
    with nogil:
        rc = mgpu_trace_start(cp)
    _check(rc)


def trace_stop():
    """Stops recording and writes the file."""
    cdef int rc
    with nogil:
        rc = mgpu_trace_stop()
    _check(rc)


def trace_active():
    """True while recording."""
    return bool(mgpu_trace_active())


def trace_stats():
    """(events, dropped, threads) of the current or last recording, as a
    dict."""
    cdef mgpu_trace_stats st
    st.size = sizeof(st)
    _check(mgpu_trace_stats_get(&st))
    return {"events": st.events, "dropped": st.dropped, "threads": st.threads}


def trace_now_ns():
    """The trace clock (monotonic nanoseconds)."""
    return mgpu_trace_now_ns()


def trace_span(name, uint64_t start_ns, uint64_t end_ns):
    """Records a span of the caller's own on its thread's track."""
    b = name.encode() if isinstance(name, str) else bytes(name)
    mgpu_trace_span(b, start_ns, end_ns)


# ---------------------------------------------------------------------------
# The store (include/mgpu/store.h): objects shared between processes through
# a daemon, got back as read-only arrays over the shared memory.

cdef extern from "Python.h":
    ctypedef int PyGILState_STATE
    PyGILState_STATE PyGILState_Ensure() noexcept nogil
    void PyGILState_Release(PyGILState_STATE) noexcept nogil
    int Py_IsInitialized() noexcept nogil
    void Py_DecRef(PyObject *) noexcept nogil

# A read-only export of a StoreArray: the inner tensor is the library's
# export of the object's buffer, owner the StoreArray (so the object stays
# held, and mapped, while any consumer holds the tensor).
ctypedef struct _store_export:
    DLManagedTensorVersioned outer
    DLManagedTensorVersioned *inner
    PyObject *owner


cdef void _store_export_deleter(DLManagedTensorVersioned *t) noexcept nogil:
    cdef _store_export *e = <_store_export *>t.manager_ctx
    cdef PyGILState_STATE g
    e.inner.deleter(e.inner)
    if Py_IsInitialized():
        g = PyGILState_Ensure()
        Py_DecRef(e.owner)
        PyGILState_Release(g)
    free(e)


cdef int _store_by_key(mgpu_store *st, object key, mgpu_store_object **got,
                      int *deferred) except -1:
    """Gets (got not NULL) or deletes the object of key: an id (int) or a
    name (str)."""
    cdef const char *cn = NULL
    cdef uint64_t oid = 0
    cdef int rc
    if isinstance(key, str):
        nm = key.encode()
        cn = <bytes>nm
    elif isinstance(key, int) and not isinstance(key, bool):
        oid = key
    else:
        raise TypeError("%s: key must be an id (int) or a name (str)" %
                        ("get" if got != NULL else "delete"))
    with nogil:
        if got != NULL:
            rc = (mgpu_store_get_by_name(st, cn, got) if cn != NULL
                  else mgpu_store_get(st, oid, got))
        else:
            rc = (mgpu_store_delete_by_name(st, cn, deferred) if cn != NULL
                  else mgpu_store_delete(st, oid, deferred))
    return _check(rc)


cdef class Store:
    """A connection to the store daemon (``mgpud`` or ``mgpu store serve``).

    ``Store.connect(path=None)`` connects to the daemon at path (None: the
    default socket). ``put`` creates, fills and seals an object and returns
    its id; ``get`` returns a read-only ``StoreArray`` over the shared memory
    (no copy) that holds the object until it and every export of it are
    gone. ``close()`` (or leaving a ``with`` block) closes the connection
    once the last array got through it is gone. mgpu must be initialized.
    """
    cdef mgpu_store *st
    cdef int live       # StoreArrays alive that were got through it
    cdef bint closing
    cdef readonly object path

    def __init__(self, path=None):
        cdef mgpu_store *st = NULL
        cdef bytes p = None if path is None else _os.fsencode(path)
        cdef const char *cp = NULL if p is None else <const char *>p
        cdef int rc
        with nogil:
            rc = mgpu_store_connect(&st, cp)
        _check(rc)
        self.st = st
        self.path = path

    @staticmethod
    def connect(path=None):
        """Connects to the daemon at path (None: the default socket)."""
        return Store(path)

    cdef mgpu_store *_open(self) except NULL:
        if self.st == NULL or self.closing:
            raise ValueError("the store connection is closed")
        return self.st

    def close(self):
        """Closes the connection: at once if no array got through it is
        alive, else when the last one goes. Idempotent."""
        self.closing = True
        self._maybe_disconnect()

    cdef _maybe_disconnect(self):
        cdef mgpu_store *st = self.st
        if self.closing and self.live == 0 and st != NULL:
            self.st = NULL
            with nogil:
                mgpu_store_disconnect(st)
            mgpu_error_clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        # Arrays hold a reference to their Store, so none is alive here.
        if self.st != NULL:
            with nogil:
                mgpu_store_disconnect(self.st)
            self.st = NULL

    def put(self, data, name=None, device=None):
        """Creates an object of data's bytes (an mgpu Array, anything with
        the buffer protocol or NumPy can read) on device (default: the
        current device, or an Array's own), fills it, seals it, and returns
        its id. A taken name raises ExistsError."""
        cdef mgpu_store_object *o = NULL
        cdef const unsigned char[::1] view
        cdef mgpu_buffer *dst
        cdef int rc, dev
        cdef size_t n
        cdef uint64_t oid
        src = None
        if isinstance(data, Array):
            src = <Array>data
            dev = (<Array>data).device if device is None else _devno(device)
            n = (<Array>data).nbytes
        else:
            host = _np.ascontiguousarray(data if not isinstance(
                data, (bytes, bytearray, memoryview)) else
                _np.frombuffer(data, _np.uint8))
            view = host.reshape(-1).view(_np.uint8)
            n = host.nbytes
            dev = _devno(device)
        o = self._create(dev, n, name, "put")
        try:
            dst = mgpu_store_object_buffer(o)
            if dst == NULL:
                raise ERRORS[MGPU_ENODEV]("put: the new object has no buffer "
                                          "in this process", "")
            if src is not None:
                (<Array>src)._sync()
                with nogil:
                    rc = mgpu_memcpy(dst, 0, (<Array>src).buf, 0, n)
            else:
                with nogil:
                    rc = mgpu_memcpy_htod(dst, 0, &view[0], n)
            _check(rc)
            with nogil:
                rc = mgpu_store_seal(o)
            _check(rc)
            oid = mgpu_store_object_id(o)
        finally:
            # The daemon keeps a sealed object without holders (until it
            # is deleted or evicted); an unsealed one is aborted.
            with nogil:
                mgpu_store_release(o)
            mgpu_error_clear()
        return oid

    cdef mgpu_store_object *_create(self, int dev, size_t n, object name,
                                    str what) except NULL:
        """A new object of n bytes on dev, named name (None: unnamed)."""
        cdef mgpu_store *st = self._open()
        cdef mgpu_store_object *o = NULL
        cdef bytes nm = None if name is None else str(name).encode()
        cdef const char *cn = NULL if nm is None else <const char *>nm
        cdef int rc
        if n == 0:
            raise ValueError("%s: the store has no empty objects" % what)
        with nogil:
            rc = mgpu_store_create(st, dev, n, cn, &o)
        _check(rc)
        return o

    def create(self, shape, dtype="uint8", name=None, device=None):
        """A new object of shape and dtype on device (default: the current
        one), named name (a taken name raises ExistsError), as a writable
        StoreArray: fill it through its host mirror (``mirror()``) or
        ``copy_from``, then ``seal()`` it, which returns its id and makes it
        read-only and gettable by others. Dropped unsealed, it cannot be
        got, and goes when the connection closes."""
        cdef mgpu_store_object *o = NULL
        cdef int dev = _devno(device)
        cdef StoreArray a
        dt = _as_dtype(dtype)
        shp = _as_shape(shape)
        cdef size_t n = dt.itemsize
        for x in shp:
            n *= <size_t>x
        o = self._create(dev, n, name, "create")
        try:
            a = _store_array(self, o, dt, shp)
        except BaseException:
            mgpu_store_release(o)
            mgpu_error_clear()
            raise
        a.writable = True
        return a

    def get(self, key, dtype="uint8", shape=None):
        """The sealed object of id (int) or name (str) as a read-only
        StoreArray over the shared memory, viewed as dtype and shape
        (default: 1-D over all its bytes). ``np.asarray(a)`` and
        ``np.from_dlpack(a)`` see the same memory, read-only. Unknown or
        deleted: NotFoundError; not sealed yet: NotReadyError."""
        cdef mgpu_store *st = self._open()
        cdef mgpu_store_object *o = NULL
        _store_by_key(st, key, &o, NULL)
        try:
            return _store_array(self, o, dtype, shape)
        except BaseException:
            mgpu_store_release(o)
            mgpu_error_clear()
            raise

    def delete(self, key):
        """Deletes the object of id or name: it can no longer be got, and
        its memory goes when the last holder lets go. Returns True when
        holders kept it alive (deferred)."""
        cdef mgpu_store *st = self._open()
        cdef int deferred = 0
        _store_by_key(st, key, NULL, &deferred)
        return bool(deferred)

    def list(self):
        """Every object as a dict: id, name (None when unnamed), device_uuid,
        bytes, sealed, deleted, refs."""
        cdef mgpu_store *st = self._open()
        cdef mgpu_store_entry *e = NULL
        cdef size_t n = 0, i
        cdef int rc
        with nogil:
            rc = mgpu_store_list(st, &e, &n)
        _check(rc)
        out = []
        try:
            for i in range(n):
                name = e[i].name.decode("utf-8", "replace")
                out.append({"id": e[i].id, "name": name or None,
                            "device_uuid": e[i].device_uuid.decode(),
                            "bytes": e[i].bytes, "sealed": bool(e[i].sealed),
                            "deleted": bool(e[i].deleted), "refs": e[i].refs})
        finally:
            mgpu_store_list_free(e)
        return out

    def stats(self):
        """The daemon's figures: clients, objects, refs, evictions, and per
        device uuid, backend, capacity, in_use, held, objects."""
        cdef mgpu_store *st = self._open()
        cdef mgpu_store_stats *s = <mgpu_store_stats *>calloc(1, sizeof(mgpu_store_stats))
        cdef mgpu_store_device_stats *d
        cdef int rc, i
        if s == NULL:
            raise MemoryError()
        try:
            s.size = sizeof(mgpu_store_stats)
            with nogil:
                rc = mgpu_store_stats_get(st, s)
            _check(rc)
            devs = []
            for i in range(s.ndevices):
                d = &s.devices[i]
                devs.append({"uuid": d.uuid.decode(),
                             "backend": "cuda" if d.backend_kind == MGPU_BACKEND_CUDA else "host",
                             "capacity": d.capacity, "in_use": d.in_use,
                             "held": d.held, "objects": d.objects})
            return {"clients": s.clients, "objects": s.objects, "refs": s.refs,
                    "evictions": s.evictions, "devices": devs}
        finally:
            free(s)


cdef class StoreArray:
    """A store object got through ``Store.get``: read-only memory shared with
    the daemon and every process that got it, used in place through
    ``__dlpack__`` (read-only flag set), ``__array_interface__`` (read-only,
    host devices) or ``__cuda_array_interface__`` (CUDA devices). The object
    stays held while this array or any export of it is alive."""
    cdef mgpu_store_object *obj
    cdef Store store
    cdef void *ptr
    cdef readonly uint64_t id
    cdef readonly int device
    cdef readonly tuple shape
    cdef readonly object dtype
    cdef int dl_type, dl_id
    cdef readonly bint writable  # made by Store.create, not sealed yet
    cdef object mirror_ref       # weak reference to its open StoreMirror
    cdef object __weakref__

    def __init__(self):
        raise TypeError("use Store.get or Store.create")

    cdef mgpu_store_object *_obj(self) except NULL:
        if self.obj == NULL:
            raise ValueError("the store array was released")
        return self.obj

    def seal(self):
        """Seals an object made by Store.create: read-only from then on
        (here too) and gettable by others. Returns its id. Refused while its
        host mirror is open (its copy would not be written back)."""
        cdef mgpu_store_object *o = self._obj()
        cdef int rc
        if not self.writable:
            raise ValueError("the store object %d is sealed already" % self.id)
        m = self.mirror_ref() if self.mirror_ref is not None else None
        if m is not None and (<StoreMirror>m).open:
            raise ValueError("seal: end the host mirror of object %d first"
                             % self.id)
        with nogil:
            rc = mgpu_store_seal(o)
        _check(rc)
        self.writable = False
        return self.id

    def copy_from(self, data):
        """Writes data (anything NumPy reads, as many bytes as the object
        view) into an object made by Store.create and not sealed yet."""
        cdef mgpu_store_object *o = self._obj()
        cdef const unsigned char[::1] view
        cdef size_t n
        cdef int rc
        if not self.writable:
            raise ERRORS[MGPU_EREADONLY]("MGPU_EREADONLY: store object %d is "
                                         "sealed" % self.id, "")
        host = _np.ascontiguousarray(data, dtype=self.dtype)
        if host.nbytes != self.nbytes:
            raise ValueError("copy_from: %d bytes into %d" % (host.nbytes,
                                                               self.nbytes))
        view = host.reshape(-1).view(_np.uint8)
        n = host.nbytes
        with nogil:
            rc = mgpu_memcpy_htod(mgpu_store_object_buffer(o), 0, &view[0], n)
        _check(rc)
        return self

    def mirror(self, fill=True):
        """A host copy of the object (``mgpu_store_mirror_begin``): pinned
        memory for an object in device memory, filled from it when fill is
        true. Writable while the object is (made by Store.create, not
        sealed), then ``end()`` (or the end of a ``with`` block) writes it
        back; read-only for an object got. One mirror per object at a time
        (AlreadyInitializedError)."""
        cdef mgpu_store_object *o = self._obj()
        cdef void *host = NULL
        cdef int rc, f = 1 if fill else 0
        with nogil:
            rc = mgpu_store_mirror_begin(o, f, &host)
        _check(rc)
        cdef StoreMirror m = StoreMirror.__new__(StoreMirror)
        m.arr = self
        m.host = host
        m.open = True
        m.writable = self.writable
        import weakref
        self.mirror_ref = weakref.ref(m)
        return m

    @property
    def ptr(self):
        return <uintptr_t>self.ptr

    @property
    def nbytes(self):
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n

    def __repr__(self):
        return "<mgpu.StoreArray id=%d shape=%s dtype=%s device=%d>" % (
            self.id, self.shape, self.dtype, self.device)

    def __dlpack_device__(self):
        return (self.dl_type, self.dl_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """A read-only DLPack capsule over the object (no copy). A consumer
        asking for a copy or another device gets BufferError."""
        cdef DLManagedTensorVersioned *t = NULL
        cdef _store_export *e
        cdef int64_t shape[64]
        cdef int nd = len(self.shape), i
        if copy is True:
            raise BufferError("a store array exports only in place (copy=True)")
        if dl_device is not None and tuple(dl_device) != (self.dl_type, self.dl_id):
            raise BufferError("the store array lives on DLPack device %s" %
                              ((self.dl_type, self.dl_id),))
        if self.obj == NULL:
            raise ValueError("the store array was released")
        for i in range(nd):
            shape[i] = self.shape[i]
        _check(mgpu_buffer_dlpack(mgpu_store_object_buffer(self.obj), 0,
                                  _dl_dtype(self.dtype), nd, shape, NULL, &t))
        e = <_store_export *>calloc(1, sizeof(_store_export))
        if e == NULL:
            t.deleter(t)
            raise MemoryError()
        e.outer = t[0]
        e.outer.manager_ctx = <void *>e
        e.outer.deleter = _store_export_deleter
        e.outer.flags |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
        e.inner = t
        e.owner = <PyObject *>self
        Py_INCREF(self)
        return _dl_capsule(&e.outer, max_version is not None and
                           int(max_version[0]) >= 1)

    @property
    def __array_interface__(self):
        """NumPy's array interface, read-only, for host memory."""
        if self.dl_type != 1:
            raise AttributeError("__array_interface__: the object is in "
                                 "device memory (use __cuda_array_interface__)")
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (<uintptr_t>self.ptr, True), "strides": None,
                "version": 3}

    @property
    def __cuda_array_interface__(self):
        """The CUDA array interface (version 3), read-only, CUDA memory."""
        if self.dl_type == 1:
            raise AttributeError("__cuda_array_interface__: the object is in "
                                 "host memory (use __array_interface__)")
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (<uintptr_t>self.ptr, True), "strides": None,
                "version": 3, "stream": None}

    def numpy(self):
        """A read-only NumPy view (host memory) or copy (device memory)."""
        cdef uintptr_t dst
        cdef size_t n = self.nbytes
        cdef int rc
        if self.dl_type == 1:
            return _np.asarray(self)
        out = _np.empty(self.shape, self.dtype)
        dst = out.__array_interface__["data"][0]
        with nogil:
            rc = mgpu_memcpy_dtoh(<void *>dst, mgpu_store_object_buffer(self.obj), 0, n)
        _check(rc)
        return out

    def __dealloc__(self):
        cdef mgpu_store_object *o = self.obj
        self.obj = NULL
        if o != NULL:
            with nogil:
                mgpu_store_release(o)
            mgpu_error_clear()
        if self.store is not None:
            self.store.live -= 1
            self.store._maybe_disconnect()


cdef class StoreMirror:
    """A host copy of a store object (``StoreArray.mirror``).

    Read and write it as a NumPy array: ``m[...]`` reads a copy and
    assigns in place; ``m.numpy()`` or ``np.asarray(m)`` is a view of the
    copy, which keeps the mirror open while it lives. ``end()`` (or the end
    of a ``with`` block) writes the copy back when the object is writable
    and frees it; it raises BufferError while views made by ``numpy()`` are
    alive (as ``memoryview.release`` does). A mirror never ended ends when
    it and its views are gone.
    """
    cdef StoreArray arr
    cdef void *host
    cdef readonly bint open
    cdef readonly bint writable
    cdef object view_ref   # weak reference to the _MirrorMemory of its views
    cdef object __weakref__

    def __init__(self):
        raise TypeError("use StoreArray.mirror")

    @property
    def shape(self):
        return self.arr.shape

    @property
    def dtype(self):
        return self.arr.dtype

    def numpy(self):
        """A NumPy view of the host copy (read-only unless the object is
        writable); the mirror stays open while it lives."""
        if not self.open:
            raise ValueError("the host mirror was ended")
        mem = self.view_ref() if self.view_ref is not None else None
        if mem is None:
            mem = _MirrorMemory.__new__(_MirrorMemory)
            (<_MirrorMemory>mem).m = self
            import weakref
            self.view_ref = weakref.ref(mem)
        return _np.asarray(mem)

    def __array__(self, dtype=None, copy=None):
        if copy:
            out = self.numpy().copy()
        else:
            out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key):
        return self.numpy()[key].copy()

    def __setitem__(self, key, value):
        if not self.writable:
            raise ERRORS[MGPU_EREADONLY](
                "MGPU_EREADONLY: the store object %d is sealed: its host "
                "mirror is read-only" % self.arr.id, "")
        self.numpy()[key] = value

    def end(self):
        """Writes the host copy back (writable objects) and frees it.
        Idempotent."""
        if not self.open:
            return
        if self.view_ref is not None and self.view_ref() is not None:
            raise BufferError("the host mirror of store object %d still has "
                              "NumPy views: delete them first" % self.arr.id)
        self._end()

    cdef _end(self):
        cdef int rc = 0
        cdef mgpu_store_object *o = self.arr.obj
        self.open = False
        if o != NULL:
            with nogil:
                rc = mgpu_store_mirror_end(o)
        _check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()

    def __repr__(self):
        return "<mgpu.StoreMirror of object %d%s>" % (
            self.arr.id, "" if self.open else " (ended)")

    def __dealloc__(self):
        if (self.open and self.arr is not None and self.arr.obj != NULL and
                mgpu_is_initialized()):
            self.open = False
            with nogil:
                mgpu_store_mirror_end(self.arr.obj)
            mgpu_error_clear()


cdef class _MirrorMemory:
    """What NumPy views of a StoreMirror hold: keeps the mirror open."""
    cdef StoreMirror m
    cdef object __weakref__

    @property
    def __array_interface__(self):
        return {"shape": self.m.arr.shape, "typestr": self.m.arr.dtype.str,
                "data": (<uintptr_t>self.m.host, not self.m.writable),
                "strides": None, "version": 3}


cdef StoreArray _store_array(Store store, mgpu_store_object *o, dtype, shape):
    cdef StoreArray a
    cdef DLDevice where
    cdef size_t size = mgpu_store_object_size(o)
    cdef mgpu_buffer *b = mgpu_store_object_buffer(o)
    dt = _as_dtype(dtype)
    if shape is None:
        if size % dt.itemsize:
            raise ValueError("get: %d bytes are not a whole number of %s" %
                             (size, dt))
        shp = (size // dt.itemsize,)
    else:
        shp = _as_shape(shape)
        n = dt.itemsize
        for s in shp:
            n *= s
        if n > size:
            raise ValueError("get: shape %s of %s needs %d bytes, the object "
                             "has %d" % (shp, dt, n, size))
    if b == NULL:
        raise ERRORS[MGPU_ENODEV]("the store object has no device in this "
                                  "process (mgpu not initialized, or no "
                                  "device of its UUID open)", "")
    _check(mgpu_buffer_dldevice(b, &where))
    a = StoreArray.__new__(StoreArray)
    a.obj = o
    a.store = store
    store.live += 1
    a.ptr = mgpu_store_object_ptr(o)
    a.id = mgpu_store_object_id(o)
    a.device = mgpu_store_object_device(o)
    a.shape = shp
    a.dtype = dt
    a.dl_type = where.device_type
    a.dl_id = where.device_id
    return a


# ---------------------------------------------------------------------------
# What this build has: the MPI module's bindings (_mpi.pxi) where the build
# found MPI, else _MPI_MISSING saying why not (python/CMakeLists.txt).

include "_features.pxi"
