"""Memory other libraries own, taken in place (mgpu.from_dlpack,
mgpu.asarray): writes seen on both sides, lifetimes, what cannot be taken."""
import gc

import numpy as np
import pytest

import mgpu
from conftest import mem_in_use


def test_numpy_array_taken_in_place(mg):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = mgpu.asarray(x, device=2)
    assert a.device == 2 and a.shape == (3, 4) and a.dtype == np.float32
    assert a.ptr == x.ctypes.data
    assert mem_in_use(2) >= 0
    x[0, 0] = 99  # NumPy writes, mgpu copies see it
    assert a.copy_to(0).numpy()[0, 0] == 99
    a.copy_from(np.full((3, 4), 5, np.float32))  # mgpu writes, NumPy sees it
    assert (x == 5).all()
    src = mgpu.full((3, 4), 8, "float32", device=1)
    a.copy_from(src)
    assert (x == 8).all()


def test_round_trip_both_directions(mg):
    b = mgpu.full(6, 3, "int64", device=1)
    x = np.from_dlpack(b)
    back = mgpu.from_dlpack(x)
    assert back.ptr == b.ptr
    back.copy_from(np.arange(6))
    assert b.numpy().tolist() == list(range(6)) == x.tolist()


def test_imported_memory_lives_until_the_last_holder(mg):
    x = np.ones(1000, dtype=np.int32)
    base = x.ctypes.data
    a = mgpu.from_dlpack(x, device=0)
    del x
    gc.collect()
    assert a.numpy().sum() == 1000 and a.ptr == base
    y = np.from_dlpack(a)  # exported again
    del a
    gc.collect()
    assert y.sum() == 1000
    del y
    gc.collect()


def test_shutdown_with_imported_arrays():
    mgpu.init(devices="host:2")
    x = np.full(100, 2.5)
    a = mgpu.from_dlpack(x)
    mgpu.shutdown()
    assert a.numpy().sum() == 250.0
    del a
    gc.collect()
    assert x.sum() == 250.0


def test_what_cannot_be_taken_in_place(mg):
    x = np.arange(20, dtype=np.float64)
    with pytest.raises(BufferError, match="not contiguous"):
        mgpu.from_dlpack(x[::2])
    a = mgpu.asarray(x[::2], device=1)  # copied instead
    assert a.numpy().tolist() == list(range(0, 20, 2))
    assert a.ptr != x.ctypes.data
    with pytest.raises(BufferError):
        mgpu.asarray(x[::2], copy=False)
    with pytest.raises(BufferError, match="device 9|9"):
        mgpu.from_dlpack(x, device=9)
    with pytest.raises(TypeError):
        mgpu.from_dlpack([1, 2, 3])
    e = mgpu.asarray(np.zeros(0), device=0)  # empty: copied
    assert e.shape == (0,)


def test_read_only_memory_stays_read_only(mg):
    x = np.arange(4.0)
    x.flags.writeable = False
    a = mgpu.from_dlpack(x)
    with pytest.raises(mgpu.ReadOnlyError):
        a.copy_from(np.zeros(4))
    assert a.copy_to(1).numpy().tolist() == [0, 1, 2, 3]


def test_legacy_producer(mg):
    x = np.arange(5, dtype=np.int16)

    class Legacy:
        def __dlpack__(self, stream=None):  # no max_version: pre-1.0
            return x.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    a = mgpu.from_dlpack(Legacy())
    assert a.ptr == x.ctypes.data
    assert a.numpy().tolist() == [0, 1, 2, 3, 4]
    del a
    gc.collect()
