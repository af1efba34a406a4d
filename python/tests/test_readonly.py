"""Read-only memory both ways: store objects and read-only imports never
reach a consumer that cannot see DLPack's read-only flag, and mgpu never
writes memory it was handed read-only."""
import ctypes
import subprocess
import sys

import numpy as np
import pytest

import mgpu
from conftest import LegacyConsumerView

_name = ctypes.pythonapi.PyCapsule_GetName
_name.restype = ctypes.c_char_p
_name.argtypes = [ctypes.py_object]


class _Versioned:
    """The read-only flag of a versioned capsule, read from the tensor."""

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2),
                    ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint8 * 4),
                    ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("byte_offset", ctypes.c_uint64)]

    @classmethod
    def flags(cls, cap):
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.py_object, ctypes.c_char_p]
        p = get(cap, b"dltensor_versioned")

        class Managed(ctypes.Structure):
            _fields_ = [("version", cls.Version), ("manager_ctx", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                        ("dl_tensor", cls.Tensor)]
        m = Managed.from_address(p)
        return m.flags, m.dl_tensor.data


def _read_only_source(n=4):
    x = np.arange(n, dtype=np.float64)
    x.flags.writeable = False
    return x


def test_read_only_import_refuses_every_write(mg):
    x = _read_only_source()
    a = mgpu.asarray(x, device=0)
    assert a.ptr == x.ctypes.data  # in place, not a copy
    assert not a.writable
    with pytest.raises(mgpu.ReadOnlyError, match="fill"):
        a.fill(7)
    with pytest.raises(mgpu.ReadOnlyError):
        a.copy_from(np.zeros(4))
    with pytest.raises(mgpu.ReadOnlyError):
        a.copy_from(mgpu.zeros(4, "float64", device=1))
    with pytest.raises(mgpu.ReadOnlyError):
        a.copy_from(a)
    v = a.numpy()
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 9
    assert not np.asarray(a).flags.writeable
    assert a.__array_interface__["data"][1] is True
    assert x.tolist() == [0, 1, 2, 3]


def test_read_only_import_as_collective_and_channel_output(mg):
    x = _read_only_source(8)
    ro = mgpu.from_dlpack(x, device=1)
    src = mgpu.full(8, 5, "float64", device=0)
    with pytest.raises(mgpu.ReadOnlyError):
        mgpu.broadcast([src, ro], root=0)
    ch = mgpu.Channel(0, 1, 64)
    ch.send(src)
    with pytest.raises(mgpu.ReadOnlyError):
        ch.recv(ro)
    assert x.tolist() == list(range(8))


def test_read_only_mmap_write_raises_not_segfaults(tmp_path):
    # In a child: a SIGSEGV there is a failed test, not a dead suite.
    path = tmp_path / "data.bin"
    path.write_bytes(np.arange(16, dtype=np.int32).tobytes())
    code = (
        "import mgpu, mmap, numpy as np\n"
        "mgpu.init(devices='host:2')\n"
        "f = open(%r, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "x = np.frombuffer(m, dtype=np.int32)\n"
        "a = mgpu.asarray(x, device=0)\n"
        "assert a.ptr == x.ctypes.data and not a.writable\n"
        "for write in (lambda: a.fill(1), lambda: a.copy_from(np.zeros(16)),\n"
        "              lambda: a.numpy().__setitem__(0, 1)):\n"
        "    try:\n"
        "        write()\n"
        "    except (mgpu.ReadOnlyError, ValueError):\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('a write went through')\n"
        "print(int(a.numpy().sum()))\n" % str(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sum(range(16)))


def test_read_only_export_only_to_consumers_that_see_the_flag(mg):
    a = mgpu.from_dlpack(_read_only_source(), device=2)
    cap = a.__dlpack__(max_version=(1, 0))
    flags, data = _Versioned.flags(cap)
    assert flags & 1 and data == a.ptr  # in place, flagged read-only
    # A legacy consumer gets a copy (copy=None allows one), flagged nowhere
    # but its memory is not the read-only memory.
    legacy = a.__dlpack__()
    assert _name(legacy) == b"dltensor"
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__(max_version=(0, 8), copy=False)
    flags, data = _Versioned.flags(a.__dlpack__(max_version=(1, 0), copy=True))
    assert flags & 2 and not flags & 1 and data != a.ptr

    y = np.from_dlpack(LegacyConsumerView(a))
    assert not np.shares_memory(y, np.asarray(a))
    assert y.tolist() == [0, 1, 2, 3]


def test_writable_array_legacy_export_stays_in_place(mg):
    a = mgpu.zeros(4, "int32", device=0)
    assert a.writable
    cap = a.__dlpack__()
    assert _name(cap) == b"dltensor"
    flags, data = _Versioned.flags(a.__dlpack__(max_version=(1, 1)))
    assert flags == 0 and data == a.ptr
    with pytest.raises(TypeError, match="copy"):
        a.__dlpack__(copy="yes")
    with pytest.raises(TypeError, match="dl_device"):
        a.__dlpack__(dl_device=3)
