# ---------------------------------------------------------------------------
# Streams and events

cdef class Stream:
    """An in-order queue of work on one device (``mgpu_stream``).

    Work on one stream runs in order; several streams of a device run
    concurrently. ``synchronize()`` waits with the GIL released, in slices
    that let Ctrl-C through.
    """
    # Its attributes are declared in _core.pxd (shared with mgpu._mpi).

    def __init__(self, device=None):
        self.device = _devno(device)
        _check(mgpu_stream_create(&self.s, self.device))
        self.owned = True

    def synchronize(self):
        """Waits until the work queued so far is done; raises its error.
        On the main thread Ctrl-C ends the wait (the work goes on)."""
        _stream_wait(self.s)

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
        if mgpu_stream_is_capturing(self.s) == 1:
            # Recorded into a graph: runs at every launch (_graph.pxi).
            _check(mgpu_stream_add_callback(self.s, _stream_callback_kept,
                                            <void *>call))
            _captured_calls.append(call)
            return
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


cdef void _stream_callback_kept(void *arg) noexcept nogil:
    """A callback of a graph: the graph keeps the tuple alive."""
    with gil:
        mgpu_py_keep_thread_state()
        call = <tuple>arg
        try:
            call[0](*call[1])
        except BaseException:
            import traceback
            traceback.print_exc()


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


