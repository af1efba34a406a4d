"""mgpu: a multi-GPU runtime, from Python.

Devices (host worker threads or CUDA GPUs, whole or split), arrays in their
memory that NumPy, CuPy and PyTorch use in place (DLPack), streams, events,
copies between devices, collectives, channels, a task pool and metrics.

    import mgpu, numpy as np
    mgpu.init(devices="host:2")
    b = mgpu.zeros(4, "float32", device=1)
    np.from_dlpack(b)[:] = 7          # writes the buffer itself
    print(b.copy_to(0).numpy())       # [7. 7. 7. 7.]

Every failure of the library raises a subclass of ``mgpu.Error`` carrying
``.code`` (the negative ``MGPU_E...`` value) and ``.detail``.
"""
from mgpu._core import ERRORS, Error  # noqa: F401
# One class per MGPU_E code of the library (InvalidArgumentError,
# OutOfMemoryError, NoDeviceError, ...), made from its own list of codes.
globals().update({cls.__name__: cls for cls in ERRORS.values()})
from mgpu._core import (  # noqa: F401,E402
    version, init, shutdown, is_initialized, device_count, devices, Device,
    get_device, set_device, run_on_device, synchronize,
    Stream, Event, Graph, capture,
    Array, empty, zeros, full, asarray, from_dlpack,
    peer_can_access, peer_enable, peer_disable, copy_path,
    metrics, reset_metrics,
    Comm, allreduce, broadcast, Channel, Pool, Task,
)
from mgpu import dist, store, trace  # noqa: F401
from mgpu._core import __version__  # noqa: F401
