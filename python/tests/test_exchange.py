"""Exchange at the edges: bfloat16 (ml_dtypes), empty arrays, dtypes that
DLPack cannot carry, big-endian data, and the libraries users have (JAX,
PyTorch, CuPy) where they are installed."""
import subprocess
import sys

import numpy as np
import pytest

import mgpu
from conftest import host_device


def test_empty_arrays_go_both_ways(mg):
    for shape in [(0,), (3, 0), (0, 2, 5)]:
        x = np.zeros(shape, np.float32)
        dev = host_device(1)
        a = mgpu.from_dlpack(x, device=dev)
        assert a.shape == shape and a.dtype == np.float32 and a.size == 0
        assert a.device == dev
        back = np.from_dlpack(a)
        assert back.shape == shape
        assert mgpu.asarray(x, device=2).shape == shape
    ro = np.zeros(0)
    ro.flags.writeable = False
    assert not mgpu.from_dlpack(ro).writable


def test_dlpack_refusals_name_the_device(mg):
    """A consumer that asks for a DLPack device the array is not on, and
    forbids the copy or names a device mgpu cannot copy to, gets a
    BufferError naming the mgpu device and both DLPack devices."""
    a = mgpu.full(4, 2.0, "float32", device=0)
    if a.__dlpack_device__()[0] == 2:
        pytest.skip("CUDA memory: kDLCUDA is its own device")
    with pytest.raises(BufferError, match=r"mgpu device 0 .*\(2, 0\) "
                       r"\(kDLCUDA\).*copy=False"):
        a.__dlpack__(dl_device=(2, 0), copy=False)


def test_opencl_memory_to_numpy_through_a_host_copy(mg):
    """NumPy maps only host memory: OpenCL device memory (kDLOpenCL) goes
    to it as a host copy when it asks for the CPU, and never in place."""
    a = mgpu.full(4, 2.0, "float32", device=0)
    if a.__dlpack_device__()[0] != 4:
        pytest.skip("needs an OpenCL device (MGPU_TEST_DEVICES=opencl)")
    assert np.from_dlpack(a, device="cpu").tolist() == [2.0] * 4
    with pytest.raises(BufferError, match=r"mgpu device 0 .*\(kDLOpenCL\), "
                       r"not \(1, 0\) \(kDLCPU\).*copy=False"):
        np.from_dlpack(a, device="cpu", copy=False)
    with pytest.raises(BufferError, match=r"mgpu device 0 .*\(kDLOpenCL\); "
                       r"a copy to DLPack device \(2, 0\) \(kDLCUDA\) is "
                       r"not supported"):
        a.__dlpack__(dl_device=(2, 0))


@pytest.mark.parametrize("dtype", ["object", "U3", "S2", "datetime64[s]",
                                   "timedelta64[ms]", [("a", "i4"), ("b", "f4")],
                                   "longdouble", "clongdouble"])
def test_dtypes_dlpack_cannot_carry(mg, dtype):
    x = np.zeros(3, dtype=dtype)
    name = str(np.dtype(dtype))
    for take in (mgpu.asarray, mgpu.from_dlpack):
        with pytest.raises(TypeError) as e:
            take(x)
        assert name in str(e.value), str(e.value)
        assert "float32" in str(e.value) and "bfloat16" in str(e.value)


def test_big_endian_is_copied(mg):
    x = np.arange(6, dtype=">i4").reshape(2, 3)
    a = mgpu.asarray(x, device=0)
    assert a.dtype == np.dtype("int32") and a.shape == (2, 3)
    assert a.numpy().tolist() == x.tolist()
    f = mgpu.asarray(np.array([1.5, -2.0], dtype=">f8"),
                     device=1 % mgpu.device_count())
    assert f.numpy().tolist() == [1.5, -2.0]
    with pytest.raises(BufferError):
        mgpu.from_dlpack(x)  # in place it cannot be


def test_bfloat16_both_ways(mg):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    src = np.array([1.0, -2.5, 3.25, 0.0], dtype=bf16)
    # NumPy's DLPack refuses it: copied
    a = mgpu.asarray(src, device=1 % mgpu.device_count())
    assert a.dtype == bf16 and a.nbytes == 8
    assert a.numpy().astype(np.float32).tolist() == [1.0, -2.5, 3.25, 0.0]
    z = mgpu.zeros(3, "bfloat16", device=2)
    assert z.dtype == bf16
    z.copy_from(np.array([0.5, 1.5, 2.5], dtype=bf16))
    # mgpu's own export says DLPack code 4, 16 bits, and comes back as is.
    back = mgpu.from_dlpack(z)
    assert back.ptr == z.ptr and back.dtype == bf16
    assert back.numpy().astype(np.float32).tolist() == [0.5, 1.5, 2.5]


def test_bfloat16_without_ml_dtypes_says_so(mg):
    try:
        import ml_dtypes  # noqa: F401
        pytest.skip("ml_dtypes is installed")
    except ImportError:
        pass
    # Without ml_dtypes a bfloat16 array holds raw bits: values that would
    # have to be converted are refused, naming what would convert them.
    z = mgpu.zeros(2, "bfloat16")
    assert repr(z).find("bfloat16") > 0
    with pytest.raises(TypeError, match="ml_dtypes"):
        z.fill(1.5)


def test_jax_zero_copy_both_ways(mg):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    # Host memory both ways: JAX's CPU device (where JAX has a GPU, its
    # arrays go there by default) and host devices of mgpu.
    d0, d1 = host_device(0), host_device(1)
    with jax.default_device(jax.devices("cpu")[0]):
        x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
        a = mgpu.from_dlpack(x, device=d0)
        assert a.shape == (3, 4) and a.dtype == np.float32
        assert a.ptr == x.unsafe_buffer_pointer()
        np.testing.assert_array_equal(a.numpy(), np.asarray(x))
        b = mgpu.full((2, 5), 3, "int32", device=d1)
        y = jax.dlpack.from_dlpack(b)
        assert y.unsafe_buffer_pointer() == b.ptr
        assert int(y.sum()) == 30
        h = (jnp.asarray(np.array([1, 2, 3], dtype=ml_bf16()))
             if ml_bf16() else None)
        if h is not None:
            m = mgpu.from_dlpack(h)
            assert m.dtype == ml_bf16()
            assert jax.dlpack.from_dlpack(m).dtype == jnp.bfloat16


def ml_bf16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_imports_after_mgpu(lib):
    # A child: the library is imported after mgpu, as users do, and must
    # load (mgpu must not have loaded a CUDA or NCCL of its own first).
    found = subprocess.run([sys.executable, "-c", "import %s" % lib],
                           capture_output=True, timeout=300)
    if found.returncode != 0:
        pytest.skip("%s is not installed" % lib)
    out = subprocess.run(
        [sys.executable, "-c", "import mgpu, %s\nmgpu.init(devices='host:2')\n"
         "print(mgpu.device_count())" % lib], capture_output=True, text=True,
        timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
