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

    def send(self, Array a not None, nbytes=None, stream=None):
        """Sends the array's first nbytes (default: all) bytes. With stream
        (an mgpu.Stream of the source device) the copy is ordered on it and
        the call returns once the message is queued, or recorded when the
        stream captures a graph; without, on the package's stream, once it
        has moved."""
        cdef size_t n = a.nbytes if nbytes is None else _index(nbytes, "nbytes")
        self._typed("send", a)
        if self.dtype is not None and n % a.dtype.itemsize:
            raise ValueError("send: %d bytes are not whole elements of %s" %
                             (n, _dtype_name(a.dtype)))
        self._move(a, n, _on_stream("send", a, stream), True, stream is None)

    def recv(self, Array a not None, stream=None):
        """Receives the next message into the array; returns its size in
        bytes. With stream (an mgpu.Stream of the destination device), as
        send says; a receive recorded into a graph returns None (each
        launch receives a message of its own)."""
        self._typed("recv", a)
        _writable("recv", "a", a)
        cdef Stream s = _on_stream("recv", a, stream)
        n = self._move(a, 0, s, False, stream is None)
        if stream is not None and mgpu_stream_is_capturing(s.s) == 1:
            return None
        return n

    cdef size_t _move(self, Array a, size_t n, Stream s, bint send,
                      bint wait) except? 0:
        """One send (n bytes) or receive (returns its size) on stream s, and
        (wait) the wait for it. On the main thread the wait for room or a message
        goes in slices, with the signal handlers run between them (Ctrl-C
        ends it; a slice that times out has moved nothing), within the
        library's own limit (MGPU_TIMEOUT)."""
        cdef int rc, limit = mgpu_timeout_ms(), step = -1
        cdef int waited = 0
        if _on_main():
            step = _SLICE_MS * 2
        while True:
            if step > 0 and limit - waited < step:
                step = limit - waited
            with nogil:
                if send:
                    rc = mgpu_channel_send_timeout(self.ch, a.buf, 0, n, s.s, step if step > 0 else 0)
                else:
                    rc = mgpu_channel_recv_timeout(self.ch, a.buf, 0, &n, s.s, step if step > 0 else 0)
            if rc != MGPU_ETIMEDOUT or step <= 0 or waited + step >= limit:
                break
            waited += step
            mgpu_error_clear()
            PyErr_CheckSignals()
        if rc == MGPU_ETIMEDOUT and step > 0:
            # The last slice's detail gives its own length: say the whole.
            detail = mgpu_error_detail().decode("utf-8", "replace").replace(
                "for %d ms" % step, "for %d ms" % limit, 1)
            raise ERRORS[MGPU_ETIMEDOUT]("MGPU_ETIMEDOUT: " + detail, detail)
        _check(rc)
        if wait:
            _stream_wait(s.s)
        return n

    def close(self):
        """Ends the messages: blocked senders and receivers wake."""
        _check(mgpu_channel_close(self.ch))

    def __dealloc__(self):
        if self.ch != NULL and mgpu_is_initialized():
            mgpu_channel_close(self.ch)
            with nogil:
                mgpu_channel_destroy(self.ch)


