"""mgpu.dist: partitions of [0, n) over devices, and moving a host array to
and from per-device parts.

    d = mgpu.dist.Dist(1000, "block")        # every open device
    parts = d.scatter(np.arange(1000.0))     # one mgpu.Array per part
    back = d.gather(parts)                   # the host array again
"""
from mgpu._core import Dist  # noqa: F401

__all__ = ["Dist"]
