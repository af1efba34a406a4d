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


# ---------------------------------------------------------------------------
# One file per area, compiled as one module (Cython's include is textual:
# the order below is the order the names are defined in).

include "_errors.pxi"
include "_wait.pxi"
include "_runtime.pxi"
include "_stream.pxi"
include "_array.pxi"
include "_peer.pxi"
include "_coll.pxi"
include "_channel.pxi"
include "_pool.pxi"
include "_bench.pxi"
include "_store.pxi"
include "_graph.pxi"

# ---------------------------------------------------------------------------
# What this build has: _MPI_MISSING is None where the build found MPI and
# made the extension mgpu._mpi (_mpi.pyx, imported by mgpu.mpi), else why
# not (python/CMakeLists.txt); _MPI_LIBDIRS, the folders of MPI's own
# libraries (a RUNPATH entry of _mpi where MPI is outside the system's
# folders). _core itself links no MPI.

include "_features.pxi"
