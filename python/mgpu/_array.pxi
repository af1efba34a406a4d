# ---------------------------------------------------------------------------
# DLPack data types

_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_MGPU_DTYPES = {"float32": MGPU_FLOAT32, "float64": MGPU_FLOAT64,
                "int32": MGPU_INT32, "int64": MGPU_INT64,
                "float16": MGPU_FLOAT16, "bfloat16": MGPU_BFLOAT16}
_TAKES = ("bool, int8 to int64, uint8 to uint64, float16, bfloat16, "
          "float32, float64, complex64, complex128")

# bfloat16: NumPy has no such type. With ml_dtypes installed it is
# ml_dtypes.bfloat16; without, a uint16 dtype marked in its metadata, so
# that NumPy sees the raw bits (uint16) and mgpu still knows the type. NumPy
# ignores metadata when comparing dtypes: compare with _same_dtype.
try:
    import ml_dtypes as _ml_dtypes
    _BF16 = _np.dtype(_ml_dtypes.bfloat16)
except (ImportError, AttributeError):  # absent (or blocked: None)
    _BF16 = _np.dtype(_np.uint16, metadata={"mgpu_dtype": "bfloat16"})

# The largest element count and byte count of an array: NumPy's (the
# largest Py_ssize_t), which also keeps every count within size_t and
# DLPack's int64 extents.
_MAX_BYTES = (1 << 63) - 1


def _is_bf16(dt):
    return dt.name == "bfloat16" or (
        dt.metadata is not None and dt.metadata.get("mgpu_dtype") == "bfloat16")


def _dtype_name(dt):
    """dt's name as the package spells it ("bfloat16" for both kinds)."""
    return "bfloat16" if _is_bf16(dt) else dt.name


def _typestr(dt):
    """dt in the array interfaces: bfloat16 as its raw bits ("<u2"), which
    is all that a type string can say of it."""
    return "<u2" if _is_bf16(dt) else dt.str


def _as_values(host, dt):
    """host (a NumPy array) converted to dt, refusing values that cannot be
    bfloat16 without ml_dtypes (the array then holds raw uint16 bits)."""
    if (_is_bf16(dt) and dt.name != "bfloat16" and not _is_bf16(host.dtype)
            and host.dtype.kind not in "biu"):
        raise TypeError("%s values into bfloat16 need ml_dtypes (pip install "
                        "ml_dtypes); without it bfloat16 arrays take raw "
                        "uint16 bits only" % host.dtype)
    return _np.asarray(host, dtype=dt, order="C")


def _same_dtype(a, b):
    return a == b and _is_bf16(a) == _is_bf16(b)


def _as_dtype(dtype):
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _BF16
    try:
        dt = _np.dtype(dtype)
    except TypeError as e:
        raise TypeError("not a data type: %r" % (dtype,)) from e
    if _is_bf16(dt):
        return _BF16
    # long double is not an IEEE type DLPack could name (NumPy refuses it).
    if (dt.kind not in _DL_CODES or dt.byteorder == ">" or dt.fields is not None
            or (dt.kind == "f" and dt.itemsize > 8) or dt.itemsize > 16):
        raise TypeError("data type %s has no DLPack equivalent: mgpu takes %s"
                        % (dt, _TAKES))
    return dt


cdef DLDataType _dl_dtype(object dt):
    cdef DLDataType t
    t.code = 4 if _is_bf16(dt) else _DL_CODES[dt.kind]
    t.bits = dt.itemsize * 8
    t.lanes = 1
    return t


def _np_dtype_of(int code, int bits, int lanes):
    kinds = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
    if code == 4 and bits == 16 and lanes == 1:  # kDLBfloat
        return _BF16
    if lanes != 1 or code not in kinds or bits % 8 != 0:
        raise TypeError("DLPack data type (code %d, %d bits, %d lanes) is "
                        "not supported: mgpu takes %s"
                        % (code, bits, lanes, _TAKES))
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


def _shape_bytes(tuple shape, dt):
    """The element count and byte count of an array of shape and dt, in
    Python integers (which do not wrap). ValueError past _MAX_BYTES, as
    NumPy says it: no allocation or later size_t product can overflow."""
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dt.itemsize
    if nbytes > _MAX_BYTES:
        raise ValueError("array is too big: shape %s of %s is %d elements, "
                         "%d bytes, more than the largest possible (2^63 - 1 "
                         "bytes)" % (shape, _dtype_name(dt), count, nbytes))
    return count, nbytes


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
    # Its attributes are declared in _core.pxd (shared with mgpu._mpi).

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

    @property
    def writable(self):
        """False for an array over read-only memory it was imported from:
        mgpu never writes it, and its views and exports are read-only."""
        return not self.readonly

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return "<mgpu.Array shape=%s dtype=%s device=%d kind=%s>" % (
            self.shape, _dtype_name(self.dtype), self.device, self.kind)

    # -- views: parts of the same buffer
    def __getitem__(self, key):
        """A view of the part basic indexing selects (ints, slices, ...,
        None), when that part is one contiguous piece of the buffer:
        ``a[i:j]``, ``a[k]``, ``a[2, 1:3]`` of a 2-d array. ValueError
        for a part that is not (``a[::2]``, ``a[:, 1]``), IndexError for an
        index out of range. See reshape for what a view is."""
        first, shape = _basic_index(self.shape, key)
        return _view(self, first, shape)

    def reshape(self, *shape):
        """A view of the array with another shape of as many elements
        (one extent may be -1: inferred). A view is an mgpu.Array over the
        same memory (its ptr is inside this one's): NumPy, the collectives,
        copies, channels and mgpu.mpi take it like any array, and writes
        through either are seen by both. It keeps this array's memory
        alive."""
        if len(shape) == 1 and not hasattr(shape[0], "__index__"):
            shape = shape[0]
        return _view(self, 0, _reshaped(self.count, shape))

    # -- the exchange protocols
    def __dlpack_device__(self):
        """``(device_type, device_id)``: (1, 0) for host memory, (2, n) for
        device memory of CUDA GPU n, (13, n) for its unified memory."""
        return (self.dl_type, self.dl_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """A DLPack capsule over the array's memory (array API standard).

        ``max_version >= (1, 0)`` gets a versioned tensor
        (``dltensor_versioned``, flagged read-only for read-only memory),
        otherwise a legacy one (``dltensor``), which cannot say read-only:
        read-only memory then goes as a copy (BufferError with
        ``copy=False``). ``stream``: on host memory only None; on CUDA
        memory -1 skips synchronization, anything else waits for the
        device's work first. ``dl_device`` other than the array's own, or
        ``copy=True``, makes a copy (flagged IS_COPIED) when allowed;
        ``copy=False`` never copies.
        """
        return _dlpack_export(self, stream, max_version, dl_device, copy)

    def _export_copy(self, bint to_host):
        """A writable copy for an export: in host memory of the array's
        device (to_host), else of the array's own kind."""
        out = _new_array(self.shape, self.dtype, self.device,
                         "pinned" if to_host else self.kind)
        if self.nbytes:
            _copy_bytes(out, self, self.nbytes, None)
        return out

    def _in_place(self, stream, bint versioned, bint copied):
        """The capsule over the array itself, ordered after its work."""
        if self.dl_type == 1:
            self._sync("__dlpack__")
        elif stream != -1:
            # The consumer's stream (None: the legacy default one) waits for
            # the array's queued work on the device, not the host.
            self._order_after(1 if stream is None else stream)
        return _export(self.buf, self.dtype, self.shape, self.readonly, copied,
                       None, versioned)

    cdef _order_after(self, uintptr_t consumer):
        """Makes CUDA stream consumer wait for the work queued on the
        array's pending streams (mgpu_stream_order_native: an event each,
        through the CUDA plugin); where that cannot be done (a handle the
        driver refuses), waits on the host instead."""
        cdef Stream st
        cdef int rc
        if not self.pending:
            return
        for x in self.pending:
            st = <Stream>x
            if not st.owned or not mgpu_is_initialized():
                continue  # destroyed: its work is done
            rc = mgpu_stream_order_native(st.s, <void *>consumer)
            if rc == MGPU_EFREED:
                mgpu_error_clear()  # a stream of a closed session: done
            elif rc != 0:
                mgpu_error_clear()
                self._sync()
                return

    cdef _touch(self, Stream st):
        if self.pending is None:
            self.pending = [st]
        elif not any(x is st for x in self.pending):
            self.pending.append(st)

    @property
    def __array_interface__(self):
        """NumPy's array interface (version 3), for host memory only."""
        if self.dl_type != 1:
            raise AttributeError("__array_interface__: the array is in device "
                                 "memory (use __cuda_array_interface__)")
        self._sync("__array_interface__")
        return {"shape": self.shape, "typestr": _typestr(self.dtype),
                "data": (<uintptr_t>self.ptr, self.readonly), "strides": None,
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
        return {"shape": self.shape, "typestr": _typestr(self.dtype),
                "data": (<uintptr_t>self.ptr, self.readonly), "strides": None,
                "version": 3, "stream": native if native > 2 else None}

    def _sync(self, str what="Array"):
        """Waits on the host for the work queued on the array's device.
        what names the caller's call in an error: a freed array (or one of
        an earlier session, after a new init) is FreedError; after
        mgpu.shutdown the memory stays where it is and nothing is waited
        for."""
        cdef int rc = 0, d = self.device
        if not mgpu_is_initialized():
            return
        if mgpu_buffer_device(self.buf) != d:
            # The accessor's own detail names the handle; the call and the
            # array's device go in front of it.
            raise _error(MGPU_EFREED, "%s: the array of device %d was freed "
                         "(Array.free, or a new mgpu.init since it was made)"
                         % (what, d))
        with nogil:
            rc = mgpu_device_synchronize(d)
        if rc < 0:
            raise _error(rc, what)
        self.pending = None

    # -- host views and copies
    def numpy(self, copy=False):
        """The array as a NumPy array: a view of host memory (no copy), or
        a copy for device memory (or when copy=True)."""
        if self.dl_type == 1 and not copy:
            self._sync("Array.numpy")
            out = _np.asarray(self)
            # A type string says only raw bits of bfloat16: the view gets
            # the array's own dtype (ml_dtypes.bfloat16 where installed).
            return out.view(self.dtype) if _is_bf16(self.dtype) else out
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
        """Copies src into this array: another mgpu Array of the same dtype
        and shape (any device), or anything NumPy can read (host data) of
        the same shape whose values convert under NumPy's "same_kind" rule.
        TypeError / ValueError naming both otherwise, before any byte moves;
        ReadOnlyError into read-only memory. With a stream the copy is
        queued on it (a stream of either device, for an Array); from host
        data the call then waits for it (the host data may go once it
        returns), except on a stream capturing a graph, where the copy is
        recorded and the graph keeps the host data (each launch copies it
        as it is then)."""
        cdef const unsigned char[::1] view
        cdef size_t n
        cdef int rc
        _writable("copy_from", "the array", self)
        if isinstance(src, Array):
            _same_shape("copy_from", "the array", self, "src", src)
            _disjoint("copy_from", "the array", self, "src", src)
            if self.nbytes:
                _copy_bytes(self, src, self.nbytes, stream)
            return self
        host = _host_data("copy_from", src, self.dtype, self.shape)
        n = host.nbytes
        if n and stream is not None:
            _htod_on(self, host, _on_stream("copy_from", self, stream))
        elif n:
            view = host.reshape(-1).view(_np.uint8)
            with nogil:
                rc = mgpu_memcpy_htod(self.buf, 0, &view[0], n)
            _check(rc)
        return self

    def fill(self, value):
        """Sets every element to value."""
        v = _as_values(_np.asarray(value), self.dtype)
        _writable("fill", "the array", self)
        if self.dl_type == 1:
            self._sync("Array.fill")
            self.numpy()[...] = v
        else:
            self.copy_from(_np.full(self.shape, v, self.dtype))
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


# -- export: the one __dlpack__ of Array and StoreArray

cdef extern from "Python.h":
    ctypedef int PyGILState_STATE
    PyGILState_STATE PyGILState_Ensure() noexcept nogil
    void PyGILState_Release(PyGILState_STATE) noexcept nogil
    int Py_IsInitialized() noexcept nogil
    void Py_DecRef(PyObject *) noexcept nogil


# An export that also holds a Python object (a StoreArray: its store object
# stays held, and mapped, while a consumer holds the tensor): the inner
# tensor is the library's export of the buffer.
ctypedef struct _owned_export:
    DLManagedTensorVersioned outer
    DLManagedTensorVersioned *inner
    PyObject *owner


cdef void _owned_export_deleter(DLManagedTensorVersioned *t) noexcept nogil:
    cdef _owned_export *e = <_owned_export *>t.manager_ctx
    cdef PyGILState_STATE g
    e.inner.deleter(e.inner)
    if Py_IsInitialized():
        g = PyGILState_Ensure()
        Py_DecRef(e.owner)
        PyGILState_Release(g)
    free(e)


cdef object _export(mgpu_buffer *buf, object dt, tuple shape, bint readonly,
                    bint copied, object owner, bint versioned):
    """A capsule over buf viewed as shape and dt, flagged read-only and
    copied as said, holding owner (None: nothing but the buffer)."""
    cdef DLManagedTensorVersioned *t = NULL
    cdef _owned_export *e
    cdef int64_t dims[64]
    cdef int nd = len(shape), i
    for i in range(nd):
        dims[i] = shape[i]
    _check(mgpu_buffer_dlpack(buf, 0, _dl_dtype(dt), nd, dims, NULL, &t))
    if readonly:
        t.flags |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    if copied:
        t.flags |= 2  # DLPACK_FLAG_BITMASK_IS_COPIED
    if owner is None:
        return _dl_capsule(t, versioned)
    e = <_owned_export *>calloc(1, sizeof(_owned_export))
    if e == NULL:
        t.deleter(t)
        raise MemoryError()
    e.outer = t[0]
    e.outer.manager_ctx = <void *>e
    e.outer.deleter = _owned_export_deleter
    e.inner = t
    e.owner = <PyObject *>owner
    Py_INCREF(owner)
    return _dl_capsule(&e.outer, versioned)


_DL_TYPE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost",
                  4: "kDLOpenCL", 13: "kDLCUDAManaged"}


def _dl_where(where):
    """DLPack device where as the message names it: "(4, 0) (kDLOpenCL)"."""
    return "%s (%s)" % (where, _DL_TYPE_NAMES.get(where[0], "unknown type"))


cdef tuple _dlpack_args(tuple where, int device, stream, max_version,
                        dl_device, copy):
    """Checks __dlpack__'s arguments (array API standard) for memory of
    mgpu device device on DLPack device where; returns (versioned, to_host):
    whether the consumer reads DLPack 1.x tensors, and whether it asked for
    host memory instead (a copy)."""
    cdef bint versioned = False, to_host = False
    if max_version is not None:
        try:
            versioned = int(max_version[0]) >= 1
        except (TypeError, IndexError, ValueError):
            raise TypeError("max_version must be a (major, minor) tuple, not %r"
                            % (max_version,)) from None
    if copy is not None and not isinstance(copy, bool):
        raise TypeError("copy must be True, False or None, not %r" % (copy,))
    if dl_device is not None:
        try:
            want = (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, IndexError, ValueError):
            raise TypeError("dl_device must be a (device_type, id) tuple, not "
                            "%r" % (dl_device,)) from None
        if want != where:
            if copy is False:
                raise BufferError(
                    "the array of mgpu device %d lives on DLPack device %s, "
                    "not %s, and copy=False forbids a copy"
                    % (device, _dl_where(where), _dl_where(want)))
            if want[0] != 1:
                raise BufferError(
                    "the array of mgpu device %d lives on DLPack device %s; "
                    "a copy to DLPack device %s is not supported (only to "
                    "host memory, dl_device=(1, 0))"
                    % (device, _dl_where(where), _dl_where(want)))
            to_host = True
    if where[0] == 1:
        if stream is not None:
            raise ValueError("stream must be None for host memory, got %r"
                             % (stream,))
    elif stream is not None and (isinstance(stream, bool) or
                                 not isinstance(stream, int)):
        raise TypeError("stream must be an int or None")
    elif stream is not None and stream < -1:
        raise ValueError("stream %d is not a CUDA stream" % stream)
    elif stream == 0:
        raise ValueError("stream 0 is ambiguous (array API standard): "
                         "pass 1 for the legacy default stream, 2 for "
                         "the per-thread one, or a cudaStream_t")
    return versioned, to_host


def _dlpack_export(src, stream, max_version, dl_device, copy):
    """__dlpack__ of src (an Array or a StoreArray): in place where the
    consumer may have it, else a copy where copy allows one. Read-only
    memory goes in place only to a consumer that reads DLPack 1.x's
    read-only flag (max_version >= (1, 0)): a legacy capsule cannot carry
    the flag, and a consumer that writes through it would write (or fault
    on) memory that is not its to write."""
    versioned, to_host = _dlpack_args(src.__dlpack_device__(), src.device,
                                      stream, max_version, dl_device, copy)
    # A store object's exports are read-only even before it is sealed: a
    # consumer's view outlives the seal.
    readonly = isinstance(src, StoreArray) or not src.writable
    if readonly and not versioned and copy is False:
        raise BufferError(
            "%r is read-only and the consumer cannot see DLPack's read-only "
            "flag (max_version %r, not >= (1, 0)); copy=False forbids a copy"
            % (src, max_version))
    if to_host or copy is True or (readonly and not versioned):
        out = src._export_copy(to_host)
        return (<Array>out)._in_place(None if to_host else stream, versioned,
                                      True)
    return src._in_place(stream, versioned, False)


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
    a.mdt = _MGPU_DTYPES.get(_dtype_name(dt), -1)
    a.count = _shape_bytes(shape, dt)[0]
    a.readonly = _check(mgpu_buffer_is_readonly(b)) == 1
    _check(mgpu_buffer_dlpack(b, 0, u8, 1, &n, NULL, &a.pin))
    _check(mgpu_buffer_dldevice(b, &where))
    a.dl_type = where.device_type
    a.dl_id = where.device_id
    return a


def _reshaped(count, shape):
    """shape (an int or a tuple, one extent may be -1) for count elements."""
    shape = list(shape) if isinstance(shape, (tuple, list)) else [shape]
    for i, s in enumerate(shape):
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError("shape entries must be ints, not %s" %
                            type(s).__name__)
        shape[i] = s.__index__()
    if shape.count(-1) > 1:
        raise ValueError("reshape: only one extent may be -1")
    if -1 in shape:
        rest = 1
        for s in shape:
            rest *= s if s != -1 else 1
        if rest == 0 or count % rest:
            raise ValueError("cannot reshape %d elements into shape %s" %
                             (count, tuple(shape)))
        shape[shape.index(-1)] = count // rest
    out = _as_shape(tuple(shape))
    n = 1
    for s in out:
        n *= s
    if n != count:
        raise ValueError("cannot reshape %d elements into shape %s" %
                         (count, out))
    return out


def _key_items(int ndim, key):
    """key as a tuple of ints, slices and None with one int or slice per
    dimension (... expanded)."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    nreal = sum(1 for k in key if k is not None and k is not Ellipsis)
    if nreal > ndim:
        raise IndexError("too many indices: %d for %d dimensions" %
                         (nreal, ndim))
    if Ellipsis not in key:
        key = key + (Ellipsis,)
    i = key.index(Ellipsis)
    return key[:i] + (slice(None),) * (ndim - nreal) + key[i + 1:]


def _basic_index(tuple shape, key):
    """(first element, shape) of the part of a C-order array of shape that
    the basic index key selects; ValueError unless that part is one
    contiguous run of elements."""
    cstride = [1] * len(shape)
    for ax in range(len(shape) - 2, -1, -1):
        cstride[ax] = cstride[ax + 1] * shape[ax + 1]
    first, out, steps, ax = 0, [], [], 0
    for k in _key_items(len(shape), key):
        if k is None:
            out.append(1)
            steps.append(0)
            continue
        n, st = shape[ax], cstride[ax]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            out.append(len(range(start, stop, step)))
            steps.append(step * st)
            first += start * st
        elif isinstance(k, bool) or not hasattr(k, "__index__"):
            raise IndexError("an mgpu.Array takes basic indices only (ints, "
                             "slices, ..., None), not %s" % type(k).__name__)
        else:
            j = k.__index__()
            if not -n <= j < n:
                raise IndexError("index %d is out of bounds for axis %d with "
                                 "size %d" % (j, ax, n))
            first += (j % n) * st
        ax += 1
    count = 1
    for s in out:
        count *= s
    want = 1
    for i in range(len(out) - 1, -1, -1):
        if count > 1 and out[i] != 1 and steps[i] != want:
            raise ValueError(
                "%r selects elements that are not one contiguous piece "
                "(dimension %d of the result steps %d elements, %d wanted): "
                "an mgpu.Array view is a part of its buffer in C order; "
                "copy the part through NumPy instead" % (key, i, steps[i], want))
        want *= out[i]
    return (first if count else 0), tuple(out)


cdef Array _view(Array base, size_t first, tuple shape):
    """An Array over elements [first, first + its size) of base's buffer,
    of shape: an export of that range (mgpu_buffer_dlpack), taken back as a
    buffer of its own (mgpu_buffer_from_dlpack), so that every call takes
    it as any buffer while the export keeps base's memory alive. Read-only
    memory stays read-only. An empty view has no bytes to share: it is a
    new empty array."""
    cdef DLManagedTensorVersioned *t = NULL
    cdef mgpu_buffer *b = NULL
    cdef DLDataType u8
    cdef int64_t n
    cdef int rc, ro
    cdef Array a
    dt = base.dtype
    n = _shape_bytes(shape, dt)[1]
    if n == 0:
        return _new_array(shape, dt, base.device, base.kind)
    u8.code = 1
    u8.bits = 8
    u8.lanes = 1
    ro = base.readonly
    _check(mgpu_buffer_dlpack(base.buf, first * dt.itemsize, u8, 1, &n, NULL, &t))
    if ro:
        t.flags |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    if base.kind == "pinned" and Device(base.device).backend != "host":
        t.dl_tensor.device.device_type = kDLCUDAHost  # pinned, of its GPU
    rc = mgpu_buffer_from_dlpack(&b, base.device, t)
    if rc < 0:
        err = _error(rc)
        t.deleter(t)
        raise err
    try:
        a = _wrap_buffer(b, shape, dt, base.kind)
    except BaseException:
        mgpu_free(b)
        raise
    a.owner = base
    if base.pending:
        a.pending = list(base.pending)
    return a


cdef Array _new_array(tuple shape, object dt, int dev, str kind):
    cdef mgpu_buffer *b = NULL
    cdef size_t n = _shape_bytes(shape, dt)[1]
    cdef int rc
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


# -- arrays given together: every call that takes several arrays checks
# them against each other before a byte moves; nothing is reinterpreted.

def _fail(int code, str msg):
    """The mgpu.Error subclass of code with msg (a check of the package's
    own, before any call into the library)."""
    return ERRORS[code]("%s: %s" % (mgpu_err_name(code).decode(), msg), msg)


cdef str _arg(object name):
    """An argument's name: a str, or (name, index) for "name[index]" (made
    only when a check fails, so the checks cost no formatting)."""
    return name if isinstance(name, str) else "%s[%d]" % name


cdef _same_type(str what, object an, Array a, object bn, Array b):
    """TypeError naming both arrays unless a and b hold the same dtype."""
    if a.dtype is b.dtype:
        return
    if a.mdt != b.mdt or not _same_dtype(a.dtype, b.dtype):
        raise TypeError("%s: %s is %s but %s is %s (nothing is converted)" %
                        (what, _arg(bn), _dtype_name(b.dtype), _arg(an),
                         _dtype_name(a.dtype)))


cdef _same_shape(str what, object an, Array a, object bn, Array b):
    """_same_type, and ValueError unless their shapes are equal."""
    _same_type(what, an, a, bn, b)
    if a.shape != b.shape:
        raise ValueError("%s: %s has shape %s (%d elements) but %s has %s "
                         "(%d elements)" % (what, _arg(bn), b.shape, b.count,
                                            _arg(an), a.shape, a.count))


cdef _times(str what, object an, Array a, object bn, Array b, size_t n):
    """_same_type, and ValueError unless b has n times a's elements."""
    _same_type(what, an, a, bn, b)
    if b.count != a.count * n:
        raise ValueError("%s: %s has %d elements, %d (%d ranks x %d of %s) "
                         "wanted" % (what, _arg(bn), b.count, a.count * n, n,
                                     a.count, _arg(an)))


cdef _writable(str what, object name, Array a):
    """ReadOnlyError unless a's buffer takes writes."""
    if a.readonly:
        raise _fail(MGPU_EREADONLY, "%s: %s is read-only memory (%s on "
                    "device %d)" % (what, _arg(name), a.shape, a.device))


cdef _disjoint(str what, object an, Array a, object bn, Array b):
    """OverlapError when a and b are two arrays over overlapping memory
    (views of one buffer): the library sees two buffers and would read
    what it has already written. The same array twice is in place."""
    cdef uintptr_t pa = <uintptr_t>a.ptr, pb = <uintptr_t>b.ptr
    cdef size_t na = a.count * a.dtype.itemsize, nb = b.count * b.dtype.itemsize
    if a is b or na == 0 or nb == 0 or pa >= pb + nb or pb >= pa + na:
        return
    raise _fail(MGPU_EOVERLAP, "%s: %s and %s overlap ([%#x, %#x) and [%#x, "
                "%#x)): views of one buffer; the same array twice is in "
                "place" % (what, _arg(an), _arg(bn), pa, pa + na, pb, pb + nb))


cdef Stream _on_stream(str what, Array a, object stream):
    """The stream a transfer of a goes on: the package's stream of a's
    device, or stream (an mgpu.Stream)."""
    if stream is None:
        return _default_stream(a.device)
    if not isinstance(stream, Stream):
        raise TypeError("%s: stream is %s, not mgpu.Stream" %
                        (what, type(stream).__name__))
    return <Stream>stream


cdef _htod_on(Array a, object host, Stream s):
    """Queues the copy of host (C-contiguous, a's dtype and size) into a on
    s, and waits for it; on a capturing stream records it instead, the
    graph keeping host (_graph.pxi), so that each launch reads it."""
    cdef const unsigned char[::1] view = host.reshape(-1).view(_np.uint8)
    cdef size_t n = host.nbytes
    cdef int rc
    cdef bint captured = mgpu_stream_is_capturing(s.s) == 1
    with nogil:
        rc = mgpu_memcpy_htod_async(a.buf, 0, &view[0], n, s.s)
    _check(rc)
    if captured:
        _captured_calls.append(host)
    else:
        _stream_wait(s.s)


def _host_data(str what, data, dt, tuple shape):
    """data (anything NumPy reads, or a host tensor that speaks DLPack, as
    asarray takes) as a C-contiguous NumPy array of dt and shape, to copy
    into an array of dt and shape. Values convert only as NumPy's
    "same_kind" rule allows (int into float, float64 into float32, not
    float into int): TypeError otherwise; ValueError for another shape."""
    host = _host_data_of(data)
    if not _np.can_cast(host.dtype, dt, "same_kind"):
        raise TypeError("%s: data of %s does not convert to %s (same_kind "
                        "casting): convert it first" %
                        (what, host.dtype, _dtype_name(dt)))
    if host.shape != shape:
        raise ValueError("%s: data has shape %s (%d elements), the array %s "
                         "(%d elements)" % (what, host.shape, host.size,
                                            shape, _shape_bytes(shape, dt)[0]))
    return _as_values(host, dt)


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
    a NumPy or CuPy array, a PyTorch tensor, a JAX array), without a copy.

    The memory goes on device (default: the device it lives on: the current
    host device for host memory, a device of the same GPU for CUDA memory)
    and stays the producer's: it is released through its DLPack deleter
    when the Array and its exports are gone. Read-only memory (a read-only
    NumPy array, a tensor flagged read-only) gives a read-only Array
    (``writable`` False). An empty tensor gives a new empty Array. Raises
    TypeError for a dtype DLPack cannot carry, BufferError for a tensor mgpu
    cannot take in place (not C-contiguous, big-endian, on a device mgpu did
    not open) with the library's detail."""
    cdef int dev = -1 if device is None else _devno(device)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError("from_dlpack: %s does not speak DLPack"
                        % type(obj).__name__)
    dt = getattr(obj, "dtype", None)
    if isinstance(dt, _np.dtype):
        # NumPy refuses these with a BufferError from its internals.
        _as_dtype(dt.newbyteorder("=") if dt.byteorder == ">" else dt)
    try:
        cap = obj.__dlpack__(max_version=(1, 1))
    except TypeError:
        cap = obj.__dlpack__()  # a producer from before DLPack 1.0
    return _import_capsule(cap, dev)


cdef Array _import_capsule(object cap, int dev):
    """The Array over the tensor of a DLPack capsule (see from_dlpack)."""
    cdef DLManagedTensorVersioned *t = NULL
    cdef bint versioned = PyCapsule_IsValid(cap, b"dltensor_versioned")
    if versioned:
        t = <DLManagedTensorVersioned *>PyCapsule_GetPointer(cap, b"dltensor_versioned")
    elif PyCapsule_IsValid(cap, b"dltensor"):
        t = mgpu_py_legacy_wrap(<DLManagedTensor *>PyCapsule_GetPointer(cap, b"dltensor"))
        if t == NULL:
            raise MemoryError()
    else:
        raise TypeError("from_dlpack: __dlpack__ did not return a DLPack capsule")
    try:
        a, took = _import_tensor(t, dev)
    except BaseException:
        if not versioned:
            free(t.manager_ctx)  # the wrapper only; the capsule keeps the tensor
        raise
    if took:
        # The buffer owns the tensor now: the capsule must not delete it.
        PyCapsule_SetName(cap, b"used_dltensor_versioned" if versioned
                          else b"used_dltensor")
    elif not versioned:
        free(t.manager_ctx)
    return a


cdef tuple _import_tensor(DLManagedTensorVersioned *t, int dev):
    """(Array, whether it took t): an Array over t's memory, or a new empty
    Array for a tensor without elements (nothing to share)."""
    cdef mgpu_buffer *b = NULL
    cdef DLTensor *x = &t.dl_tensor
    cdef Array a
    cdef int rc
    dt = _np_dtype_of(x.dtype.code, x.dtype.bits, x.dtype.lanes)
    shape = tuple(x.shape[i] for i in range(x.ndim))
    if 0 in shape:
        a = _new_array(shape, dt, _devno(None) if dev < 0 else dev, "device")
        a.readonly = (t.flags & 1) != 0
        return a, False
    rc = mgpu_buffer_from_dlpack(&b, dev, t)
    if rc < 0:
        err = _error(rc)
        raise BufferError(str(err)) from err
    a = _wrap_buffer(b, shape, dt, "device")
    a.owner = None
    return a, True


cdef object _host_data_of(object obj):
    """obj's data as a NumPy array: through the buffer protocol or the array
    interface where obj has them (NumPy arrays of every dtype, big-endian
    and ml_dtypes' bfloat16 included, which NumPy's DLPack export refuses),
    else through DLPack (a tensor of another library)."""
    if (isinstance(obj, _np.ndarray) or not hasattr(obj, "__dlpack__") or
            hasattr(obj, "__array_interface__")):
        return _np.asarray(obj)
    return _np.from_dlpack(obj)


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
    host = _host_data_of(obj)
    if dtype is None and host.dtype.byteorder == ">":
        dtype = host.dtype.newbyteorder("=")   # copied in native order
    dt = _as_dtype(host.dtype if dtype is None else dtype)
    host = _as_values(host, dt)
    out = empty(host.shape, dt, device)
    return out.copy_from(host)


