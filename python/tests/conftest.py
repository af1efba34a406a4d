import gc
import os
import subprocess
import sys

import pytest

import mgpu


@pytest.fixture
def mg():
    """mgpu open on four host devices for one test, closed after."""
    yield from opened("host:4")


def opened(devices):
    """Opens mgpu on devices for one test (a fixture's body), closes it
    after."""
    if mgpu.is_initialized():
        mgpu.shutdown()
    mgpu.init(devices=devices)
    yield mgpu
    gc.collect()
    mgpu.shutdown()


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
