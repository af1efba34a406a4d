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
        cdef Stream s = _default_stream(a.device)
        self._move(a, n, s, True)

    def recv(self, Array a not None):
        """Receives the next message into the array; returns its size in
        bytes."""
        a._check_writable("recv")
        return self._move(a, 0, _default_stream(a.device), False)

    cdef size_t _move(self, Array a, size_t n, Stream s, bint send) except? 0:
        """One send (n bytes) or receive (returns its size) on stream s, and
        the wait for it. On the main thread the wait for room or a message
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


