# ---------------------------------------------------------------------------
# Channels

cdef class Channel:
    """A bounded queue of messages from one device's memory to another's
    (``mgpu_channel``). send and recv block (GIL released) while the channel
    is full or empty; recv raises ClosedError once it is closed and
    drained.

    With ``dtype`` the messages are elements of that dtype: send and recv
    take arrays of it only (TypeError naming the array and both dtypes),
    and a message is whole elements. Without, they are bytes of any
    array."""
    cdef mgpu_channel *ch
    cdef readonly int src, dst
    cdef readonly size_t msg_size
    cdef readonly object dtype

    def __init__(self, src, dst, msg_size, capacity=4, *, dtype=None):
        self.src = _devno(src)
        self.dst = _devno(dst)
        self.msg_size = _index(msg_size, "msg_size")
        self.dtype = None if dtype is None else _as_dtype(dtype)
        if self.dtype is not None and self.msg_size % self.dtype.itemsize:
            raise ValueError("msg_size %d is not whole elements of %s" %
                             (self.msg_size, _dtype_name(self.dtype)))
        _check(mgpu_channel_create(self.src, self.dst, self.msg_size,
                                   _index(capacity, "capacity"), &self.ch))

    cdef _typed(self, str what, Array a):
        if self.dtype is not None and not _same_dtype(a.dtype, self.dtype):
            raise TypeError("%s: a is %s, the channel carries %s" %
                            (what, _dtype_name(a.dtype),
                             _dtype_name(self.dtype)))

    def send(self, Array a not None, nbytes=None):
        """Sends the array's first nbytes (default: all) bytes."""
        cdef size_t n = a.nbytes if nbytes is None else _index(nbytes, "nbytes")
        cdef mgpu_stream *s = _default_stream(a.device).s
        cdef int rc
        self._typed("send", a)
        if self.dtype is not None and n % a.dtype.itemsize:
            raise ValueError("send: %d bytes are not whole elements of %s" %
                             (n, _dtype_name(a.dtype)))
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
        self._typed("recv", a)
        _writable("recv", "a", a)
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


