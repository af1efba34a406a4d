"""Arrays exchanged with NumPy through DLPack and the array interface: the
same memory on both sides, every dtype, shapes and strides."""
import ctypes

import numpy as np
import pytest

import mgpu

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "float16", "float32", "float64", "complex64",
          "complex128"]

_name = ctypes.pythonapi.PyCapsule_GetName
_name.restype = ctypes.c_char_p
_name.argtypes = [ctypes.py_object]


def test_from_dlpack_writes_seen_both_ways(mg):
    b = mgpu.zeros(4, "float32", device=1)
    x = np.from_dlpack(b)
    assert x.flags.writeable
    x[:] = 7
    assert b.copy_to(0).numpy().tolist() == [7.0] * 4
    b.copy_from(np.arange(4, dtype=np.float32))
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(mg, dtype):
    a = mgpu.zeros((3, 5), dtype, device=2)
    x = np.from_dlpack(a)
    assert x.dtype == np.dtype(dtype)
    assert x.shape == (3, 5)
    assert not x.any()
    ref = (np.arange(15).reshape(3, 5) % 2).astype(dtype)
    x[...] = ref
    assert np.array_equal(a.copy_to(3).numpy(), ref)
    y = np.asarray(a)  # __array_interface__
    assert np.shares_memory(x, y)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 4), (2, 3, 4),
                                   (2, 1, 3, 1, 2), (0, 5)])
def test_shapes(mg, shape):
    a = mgpu.empty(shape, "int64", device=0)
    x = np.from_dlpack(a)
    assert x.shape == shape
    assert x.strides == a.strides
    x[...] = np.arange(x.size).reshape(shape)
    assert np.array_equal(a.numpy(copy=True), np.arange(x.size).reshape(shape))


def test_strided_views_see_the_buffer(mg):
    a = mgpu.zeros((4, 6), "float64", device=1)
    x = np.from_dlpack(a)
    x[::2, 1::3] = 5
    x.T[0] = 1
    got = a.numpy(copy=True)
    ref = np.zeros((4, 6))
    ref[::2, 1::3] = 5
    ref[:, 0] = 1
    assert np.array_equal(got, ref)
    # A strided view exchanged again (NumPy exports its strides).
    v = x[1::2, ::2]
    assert np.array_equal(np.from_dlpack(v), ref[1::2, ::2])


def test_capsules_versioned_and_legacy(mg):
    a = mgpu.zeros(3, "int32", device=0)
    assert _name(a.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert _name(a.__dlpack__(max_version=(1, 1))) == b"dltensor_versioned"
    assert _name(a.__dlpack__()) == b"dltensor"
    assert _name(a.__dlpack__(max_version=(0, 8))) == b"dltensor"

    class Legacy:
        def __dlpack__(self, **kw):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    legacy = np.from_dlpack(Legacy())
    assert not legacy.flags.writeable  # NumPy's rule for legacy capsules
    assert np.from_dlpack(a).flags.writeable


def test_dlpack_device_and_interfaces(mg):
    a = mgpu.zeros(3, device=3)
    assert a.__dlpack_device__() == (1, 0)
    assert not hasattr(a, "__cuda_array_interface__")
    ai = a.__array_interface__
    assert ai["version"] == 3 and ai["data"][0] == a.ptr
    for kind in ("pinned", "unified"):
        assert mgpu.zeros(2, device=0, kind=kind).__dlpack_device__() == (1, 0)


def test_dlpack_arguments(mg):
    a = mgpu.full(4, 2.0, "float32", device=0)
    with pytest.raises(ValueError):
        a.__dlpack__(stream=1)  # host memory takes no stream
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(2, 0), copy=False)
    same = np.from_dlpack(a, device="cpu")
    assert np.shares_memory(same, np.asarray(a))
    c = np.from_dlpack(a, copy=True)
    c[:] = 9
    assert a.numpy().tolist() == [2.0] * 4
    with pytest.raises(TypeError):
        a.__dlpack__(max_version=3)


def test_numpy_view_and_copy(mg):
    a = mgpu.full((2, 2), 1, "int16", device=2)
    v = a.numpy()
    v[0, 0] = 4
    assert a.numpy(copy=True)[0, 0] == 4
    c = a.numpy(copy=True)
    c[1, 1] = 8
    assert a.numpy()[1, 1] == 1


def test_asarray_of_host_data(mg):
    src = np.arange(12, dtype=np.float64).reshape(3, 4)
    a = mgpu.asarray(src, device=3)
    assert a.device == 3 and a.shape == (3, 4) and a.dtype == np.float64
    assert np.array_equal(a.numpy(), src)
    assert mgpu.asarray(a) is a
    b = mgpu.asarray(a, device=1)
    assert b.device == 1 and np.array_equal(b.numpy(), src)
    c = mgpu.asarray([[1, 2], [3, 4]], dtype="int32", device=0)
    assert c.numpy().tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError):
        mgpu.asarray(a, device=2, copy=False)
