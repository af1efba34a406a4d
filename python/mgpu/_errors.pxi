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

    def __str__(self):
        # The message as it is: KeyError's own __str__ (a base of
        # NotFoundError) would quote it as a repr.
        return BaseException.__str__(self)


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


cdef object _error(int rc, str what=None):
    """The exception for code rc, carrying the calling thread's detail;
    what (the Python call the user made) goes in front of it, the detail
    naming the C call that failed inside that one."""
    detail = mgpu_error_detail().decode("utf-8", "replace")
    if what is not None:
        detail = "%s: %s" % (what, detail)
    cls = ERRORS.get(rc, Error)
    name = mgpu_err_name(rc).decode()
    msg = "%s: %s" % (name, detail) if detail else "%s (%s)" % (
        name, mgpu_strerror(rc).decode())
    e = cls(msg, detail)
    if cls is Error:
        e.code = rc
        e.name = name
    return e


cdef int _check(int rc) except -1:
    if rc < 0:
        raise _error(rc)
    return rc


