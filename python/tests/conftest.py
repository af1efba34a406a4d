import gc
import os
import subprocess
import sys

import pytest

import mgpu


@pytest.fixture
def mg():
    """mgpu open on four host devices for one test, closed after
    (MGPU_TEST_DEVICES names others: the OpenCL pass of .ci/run)."""
    yield from opened(os.environ.get("MGPU_TEST_DEVICES") or "host:4")


def opened(devices):
    """Opens mgpu on devices for one test (a fixture's body), closes it
    after."""
    if mgpu.is_initialized():
        mgpu.shutdown()
    mgpu.init(devices=devices)
    yield mgpu
    gc.collect()
    mgpu.shutdown()


def run_child(tmp_path, code, timeout=120):
    """Runs code in a fresh interpreter (a crash there fails a test, not the
    suite); returns its stdout, stripped, after checking it exited 0."""
    script = tmp_path / "child.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class LegacyConsumerView:
    """What a consumer from before DLPack 1.0 sees of x: __dlpack__ called
    without max_version (a legacy capsule)."""

    def __init__(self, x):
        self.x = x

    def __dlpack__(self, **kw):
        return self.x.__dlpack__()

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def host_device(k):
    """Device k of the open ones (wrapped: k % the count) when it is a host
    device, whose memory NumPy reads in place; skips the test elsewhere
    (np.from_dlpack refuses CUDA memory)."""
    d = k % mgpu.device_count()
    backend = mgpu.devices()[d].properties()["backend"]
    if backend != "host":
        pytest.skip("device %d is a %s device: NumPy cannot read its memory "
                    "in place" % (d, backend))
    return d


def mem_in_use(dev):
    return mgpu.metrics()["devices"][dev]["mem_in_use"]


def run_python(code, timeout=60):
    """Runs code in a new interpreter that imports this same mgpu, under a
    timeout; returns its output (stdout and stderr), failing on a non-zero
    exit."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(mgpu.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          check=True).stdout.decode()
