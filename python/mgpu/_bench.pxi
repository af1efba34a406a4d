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


