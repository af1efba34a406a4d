"""What the extension links: no CUDA runtime, no CUDA driver, no NCCL (the
CUDA plugin beside it opens them), so that `import mgpu` works without them
and a library imported after mgpu loads its own NCCL (PyTorch ships one)."""
import importlib.util
import shutil
import subprocess
import sys

import pytest

import mgpu


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines()
            if "(NEEDED)" in line]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")
def test_extension_links_no_cuda_and_no_nccl():
    libs = needed(mgpu._core.__file__)
    assert libs, "readelf listed no NEEDED entry at all"
    bad = [lib for lib in libs
           if lib.startswith(("libcudart.so", "libcuda.so", "libnccl.so"))]
    assert bad == [], "mgpu._core links %s" % bad


@pytest.mark.parametrize("other", ["torch", "cupy"])
def test_import_after_mgpu(other):
    if importlib.util.find_spec(other) is None:
        pytest.skip("%s is not installed" % other)
    out = subprocess.run([sys.executable, "-c",
                          "import mgpu, %s; print('ok')" % other],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
