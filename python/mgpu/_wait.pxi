# ---------------------------------------------------------------------------
# Waits that Ctrl-C ends
#
# A blocking call made on the main thread (the one Python runs signal
# handlers on) waits in slices of _SLICE_MS with the GIL released, and runs
# the handlers between slices (PyErr_CheckSignals), as NumPy and CuPy do: a
# SIGINT raises KeyboardInterrupt within a slice, whatever the wait. The
# work waited for goes on to its end, holding what it needs; mgpu stays
# usable. Other threads wait in one piece: signals are not theirs to handle.
#
# The end of the work is told by a waiter: a semaphore with two owners, the
# caller and the party that posts it (a stream callback, a device's thread,
# a pool task), the last of which to let go frees it, so a caller that
# stopped waiting leaves nothing behind.

from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident

cdef extern from *:
    """
    #include <errno.h>
    #include <sched.h>
    #include <semaphore.h>
    #include <stdatomic.h>
    #include <time.h>
    #define MGPU_PY_LOOK_NS 20000L
    typedef struct mgpu_py_waiter {
      sem_t sem;
      atomic_int refs; /* the caller's and the poster's */
    } mgpu_py_waiter;
    static mgpu_py_waiter *mgpu_py_waiter_new(void) {
      mgpu_py_waiter *w = (mgpu_py_waiter *)calloc(1, sizeof *w);
      if (w == NULL) return NULL;
      if (sem_init(&w->sem, 0, 0) != 0) { free(w); return NULL; }
      atomic_init(&w->refs, 2);
      return w;
    }
    static void mgpu_py_waiter_unref(mgpu_py_waiter *w) {
      if (atomic_fetch_sub(&w->refs, 1) == 1) {
        sem_destroy(&w->sem);
        free(w);
      }
    }
    /* The poster's end (a stream callback as it is): posts, lets go. */
    static void mgpu_py_waiter_post(void *arg) {
      mgpu_py_waiter *w = (mgpu_py_waiter *)arg;
      sem_post(&w->sem);
      mgpu_py_waiter_unref(w);
    }
    /* Waits at most ms for the post: 1 posted, 0 not (yet), also when a
     * signal interrupted the wait, so that its handler runs at once. Looks
     * for a few microseconds first, yielding the core, before it sleeps:
     * short calls (a run_on_device of a small function) end there, without
     * the cost of a sleep and a wake-up. */
    static int mgpu_py_waiter_wait(mgpu_py_waiter *w, int ms) {
      struct timespec ts, now;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      for (;;) {
        if (sem_trywait(&w->sem) == 0) return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - ts.tv_sec) * 1000000000L + (now.tv_nsec - ts.tv_nsec)
            > MGPU_PY_LOOK_NS) break;
        sched_yield();
      }
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += (long)ms * 1000000L;
      ts.tv_sec += ts.tv_nsec / 1000000000L;
      ts.tv_nsec %= 1000000000L;
      return sem_timedwait(&w->sem, &ts) == 0;
    }
    """
    ctypedef struct mgpu_py_waiter:
        pass
    mgpu_py_waiter *mgpu_py_waiter_new() nogil
    void mgpu_py_waiter_unref(mgpu_py_waiter *w) nogil
    void mgpu_py_waiter_post(void *arg) noexcept nogil
    int mgpu_py_waiter_wait(mgpu_py_waiter *w, int ms) nogil

# Long enough to cost nothing, short enough for Ctrl-C to feel immediate.
cdef enum:
    _SLICE_MS = 50

cdef unsigned long _main_ident = _threading.main_thread().ident
# The handles of run_on_device calls whose caller stopped waiting (Ctrl-C):
# each is waited once, before the library shuts down.
_abandoned = []


cdef inline bint _on_main():
    return PyThread_get_thread_ident() == _main_ident


cdef mgpu_py_waiter *_waiter() except NULL:
    cdef mgpu_py_waiter *w = mgpu_py_waiter_new()
    if w == NULL:
        raise MemoryError()
    return w


cdef int _slice(mgpu_py_waiter *w) except -1:
    """One slice of a wait: 1 once w was posted, else 0 after running the
    signal handlers (whose exception, KeyboardInterrupt, ends the wait)."""
    cdef int got
    with nogil:
        got = mgpu_py_waiter_wait(w, _SLICE_MS)
    if got:
        return 1
    PyErr_CheckSignals()
    return 0


cdef int _stream_wait(mgpu_stream *s) except -1:
    """mgpu_stream_synchronize; on the main thread in slices, a callback
    on the stream telling its end (polled too, in case a backend skips
    callbacks after a fault)."""
    cdef mgpu_py_waiter *w
    cdef int rc
    if _on_main() and mgpu_stream_query(s) == MGPU_EAGAIN:
        w = _waiter()
        if mgpu_stream_add_callback(s, mgpu_py_waiter_post, w) < 0:
            mgpu_error_clear()  # the synchronize below says why
            mgpu_py_waiter_unref(w)
            mgpu_py_waiter_unref(w)
        else:
            try:
                while not _slice(w):
                    if mgpu_stream_query(s) != MGPU_EAGAIN:
                        break
            finally:
                mgpu_py_waiter_unref(w)
    with nogil:
        rc = mgpu_stream_synchronize(s)
    return _check(rc)


def _reap_abandoned():
    """Waits for the run_on_device calls left by a Ctrl-C (each handle is
    waited once; the calls free their own state)."""
    cdef uintptr_t w
    while _abandoned:
        w = _abandoned.pop()
        with nogil:
            mgpu_work_wait(<mgpu_work *>w)
        mgpu_error_clear()
