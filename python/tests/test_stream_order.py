"""The stream order of CUDA exports (Array.__dlpack__(stream=...)) goes
through the library (mgpu_stream_order_native, which the CUDA plugin
implements; its C test is interop.order_native_stream): the extension never
loads or looks up the CUDA driver itself, so only the plugin depends on
CUDA."""
import numpy as np

import mgpu
import mgpu._core


def test_extension_does_not_reach_for_the_driver():
    with open(mgpu._core.__file__, "rb") as f:
        image = f.read()
    for name in (b"libcuda.so", b"cuStreamWaitEvent", b"cuEventRecord",
                 b"cuCtxPushCurrent"):
        assert name not in image, name


def test_host_exports_wait_on_the_host(mg):
    # Host memory has no consumer stream: the export waits for the work
    # queued on the array (a copy on a stream of its own) before it goes.
    src = mgpu.full(1 << 16, 4, "int32", device=0)
    dst = mgpu.zeros(1 << 16, "int32", device=1)
    s = mgpu.Stream(1)
    dst.copy_from(src, stream=s)
    x = np.from_dlpack(dst)
    assert int(x.sum()) == 4 << 16
    s.close()
