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


cdef extern from *:
    """
    #include <dlfcn.h>
    #include <stddef.h>
    /* Stream order between mgpu and a consumer's CUDA stream, through the
     * CUDA driver the CUDA plugin loaded (never loaded from here: without
     * it there is no CUDA memory to order). Its handles are opaque
     * pointers, so this compiles without the toolkit. Called with the GIL
     * held, which guards the one-time lookup. */
    static struct {
      int tried;
      void *lib;
      int (*stream_get_ctx)(void *stream, void **ctx);
      int (*ctx_push)(void *ctx);
      int (*ctx_pop)(void **ctx);
      int (*event_create)(void **ev, unsigned flags);
      int (*event_record)(void *ev, void *stream);
      int (*stream_wait_event)(void *stream, void *ev, unsigned flags);
      int (*event_destroy)(void *ev);
    } mgpu_py_cu;
    static int mgpu_py_cu_loaded(void) {
      if (!mgpu_py_cu.tried) {
        mgpu_py_cu.tried = 1;
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h != NULL) {
    #define MGPU_PY_CU(field, name) \\
          *(void **)&mgpu_py_cu.field = dlsym(h, name); \\
          if (mgpu_py_cu.field == NULL) return 0;
          MGPU_PY_CU(stream_get_ctx, "cuStreamGetCtx")
          MGPU_PY_CU(ctx_push, "cuCtxPushCurrent_v2")
          MGPU_PY_CU(ctx_pop, "cuCtxPopCurrent_v2")
          MGPU_PY_CU(event_create, "cuEventCreate")
          MGPU_PY_CU(event_record, "cuEventRecord")
          MGPU_PY_CU(stream_wait_event, "cuStreamWaitEvent")
          MGPU_PY_CU(event_destroy, "cuEventDestroy_v2")
    #undef MGPU_PY_CU
          mgpu_py_cu.lib = h;
        }
      }
      return mgpu_py_cu.lib != NULL;
    }
    /* Work queued on consumer from now on waits for the work queued on
     * producer so far (both cudaStream_t / CUstream; consumer may be
     * CU_STREAM_LEGACY (1) or CU_STREAM_PER_THREAD (2)), without blocking
     * the host: an event recorded on producer, in producer's context, and
     * waited on by consumer. 0, -1 without a CUDA driver, or the driver's
     * error. */
    static int mgpu_py_cuda_order(void *producer, void *consumer) {
      if (!mgpu_py_cu_loaded()) return -1;
      void *ctx = NULL, *ev = NULL, *prev = NULL;
      int rc = mgpu_py_cu.stream_get_ctx(producer, &ctx);
      if (rc != 0) return rc;
      rc = mgpu_py_cu.ctx_push(ctx);
      if (rc != 0) return rc;
      rc = mgpu_py_cu.event_create(&ev, 2 /* CU_EVENT_DISABLE_TIMING */);
      if (rc == 0) rc = mgpu_py_cu.event_record(ev, producer);
      if (rc == 0) rc = mgpu_py_cu.stream_wait_event(consumer, ev, 0);
      /* The wait holds on to the recorded work; the event may go. */
      if (ev != NULL) mgpu_py_cu.event_destroy(ev);
      mgpu_py_cu.ctx_pop(&prev);
      return rc;
    }
    """
    int mgpu_py_cuda_order(void *producer, void *consumer)


def _cuda_order(uintptr_t producer, uintptr_t consumer):
    """mgpu_py_cuda_order(producer, consumer): 0, -1 without a CUDA driver
    loaded, or the driver's error (for the tests)."""
    return mgpu_py_cuda_order(<void *>producer, <void *>consumer)


# ---------------------------------------------------------------------------
# One file per area, compiled as one module (Cython's include is textual:
# the order below is the order the names are defined in).

include "_errors.pxi"
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
# What this build has: the MPI module's bindings (_mpi.pxi) where the build
# found MPI, else _MPI_MISSING saying why not (python/CMakeLists.txt).

include "_features.pxi"
