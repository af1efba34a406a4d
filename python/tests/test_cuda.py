"""CuPy and PyTorch exchange with CUDA buffers, whole GPUs and a logical
device of a split GPU. Skipped without a GPU or without those libraries."""
import numpy as np
import pytest

import mgpu


def _cuda(spec):
    if mgpu.is_initialized():
        mgpu.shutdown()
    try:
        mgpu.init(devices=spec)
    except mgpu.Error as e:
        pytest.skip("no CUDA device: %s" % e.detail)


@pytest.fixture(params=["cuda:0", "cuda:0/2"])
def gpu(request):
    _cuda(request.param)
    yield request.param
    mgpu.shutdown()


def test_export_device_is_the_real_ordinal(gpu):
    last = mgpu.device_count() - 1  # a logical device of GPU 0 when split
    a = mgpu.zeros(8, "float32", device=last)
    assert a.__dlpack_device__() == (2, mgpu.Device(last).ordinal)
    assert a.__cuda_array_interface__["version"] == 3
    assert not hasattr(a, "__array_interface__")
    u = mgpu.zeros(8, "float32", device=last, kind="unified")
    assert u.__dlpack_device__()[0] == 13
    assert mgpu.zeros(8, device=last, kind="pinned").__dlpack_device__() == (1, 0)


def test_cupy_round_trip(gpu):
    cp = pytest.importorskip("cupy")
    last = mgpu.device_count() - 1
    a = mgpu.zeros(16, "float32", device=last)
    x = cp.from_dlpack(a)
    x[:] = 3
    cp.cuda.Stream.null.synchronize()
    assert a.numpy().tolist() == [3.0] * 16
    y = cp.arange(10, dtype=cp.float64)
    cp.cuda.Stream.null.synchronize()
    b = mgpu.from_dlpack(y)
    assert b.ptr == y.data.ptr
    assert np.array_equal(b.numpy(), np.arange(10.0))
    c = cp.asarray(a)  # __cuda_array_interface__
    assert c.data.ptr == a.ptr


def test_torch_round_trip(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    last = mgpu.device_count() - 1
    a = mgpu.zeros((2, 3), "float32", device=last)
    t = torch.from_dlpack(a)
    assert t.is_cuda and t.shape == (2, 3)
    t += 2
    torch.cuda.synchronize()
    assert (a.numpy() == 2).all()
    src = torch.arange(6, dtype=torch.int64, device="cuda:%d" % mgpu.Device(last).ordinal)
    torch.cuda.synchronize()
    b = mgpu.from_dlpack(src)
    assert b.numpy().tolist() == list(range(6))
