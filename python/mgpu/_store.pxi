# ---------------------------------------------------------------------------
# The store (include/mgpu/store.h): objects shared between processes through
# a daemon, got back as read-only arrays over the shared memory.

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


# A store device's backend by its kind (the daemon's stats).
_BACKEND_NAMES = {MGPU_BACKEND_HOST: "host", MGPU_BACKEND_CUDA: "cuda",
                  MGPU_BACKEND_OPENCL: "opencl"}


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
        cdef size_t n = _shape_bytes(shp, dt)[1]
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
        """Every object as a dict: id, name (None when unnamed), device (the
        device's UUID), bytes, sealed, deleted, refs: the keys of
        ``mgpu store ls --json``."""
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
                            "device": e[i].device_uuid.decode(),
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
                             "backend": _BACKEND_NAMES.get(d.backend_kind, "host"),
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
        """Writes data (anything NumPy reads, of the object view's shape,
        values converting under NumPy's "same_kind" rule) into an object
        made by Store.create and not sealed yet."""
        cdef mgpu_store_object *o = self._obj()
        cdef const unsigned char[::1] view
        cdef size_t n
        cdef int rc
        if not self.writable:
            raise _fail(MGPU_EREADONLY, "store object %d is sealed" % self.id)
        host = _host_data("copy_from", data, self.dtype, self.shape)
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
        """A DLPack capsule over the object (array API standard, as
        Array.__dlpack__): in place and flagged read-only for a consumer
        that reads DLPack 1.x (``max_version >= (1, 0)``); a copy for one
        that cannot see the flag, or that asks for a copy or another device
        (BufferError where ``copy=False``)."""
        self._obj()
        return _dlpack_export(self, stream, max_version, dl_device, copy)

    def _export_copy(self, bint to_host):
        """A writable mgpu Array with the object's contents, on its device
        (in host memory of it: to_host)."""
        cdef Array out
        cdef size_t n = self.nbytes
        cdef int rc
        out = _new_array(self.shape, self.dtype, self.device,
                         "pinned" if to_host else "device")
        if n:
            with nogil:
                rc = mgpu_memcpy(out.buf, 0, mgpu_store_object_buffer(self.obj),
                                 0, n)
            _check(rc)
        return out

    def _in_place(self, stream, bint versioned, bint copied):
        """The capsule over the object itself, read-only (also before the
        seal: a consumer's view outlives it): the object stays held while
        the capsule or its tensor lives."""
        return _export(mgpu_store_object_buffer(self._obj()), self.dtype,
                       self.shape, True, copied, self, versioned)

    @property
    def __array_interface__(self):
        """NumPy's array interface, read-only, for host memory."""
        if self.dl_type != 1:
            raise AttributeError("__array_interface__: the object is in "
                                 "device memory (use __cuda_array_interface__)")
        return {"shape": self.shape, "typestr": _typestr(self.dtype),
                "data": (<uintptr_t>self.ptr, True), "strides": None,
                "version": 3}

    @property
    def __cuda_array_interface__(self):
        """The CUDA array interface (version 3), read-only, CUDA memory."""
        if self.dl_type == 1:
            raise AttributeError("__cuda_array_interface__: the object is in "
                                 "host memory (use __array_interface__)")
        return {"shape": self.shape, "typestr": _typestr(self.dtype),
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
            raise _fail(MGPU_EREADONLY, "the store object %d is sealed: its "
                        "host mirror is read-only" % self.arr.id)
        host = _np.asarray(value)
        if not _np.can_cast(host.dtype, self.arr.dtype, "same_kind"):
            raise TypeError("mirror: values of %s do not convert to the "
                            "object's %s (same_kind casting)" %
                            (host.dtype, _dtype_name(self.arr.dtype)))
        self.numpy()[key] = host

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
        return {"shape": self.m.arr.shape, "typestr": _typestr(self.m.arr.dtype),
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


