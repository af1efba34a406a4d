"""What the extensions link: no CUDA runtime, no CUDA driver, no NCCL (the
CUDA plugin beside them opens them), so that `import mgpu` works without them
and a library imported after mgpu loads its own NCCL (PyTorch ships one); no
MPI but in mgpu._mpi, so that `import mgpu` works without MPI and only
`import mgpu.mpi` loads it; the shared libmgpu (one copy of the library's
state for both extensions), found beside them through an $ORIGIN RUNPATH."""
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import mgpu


def dynamic(path, tag):
    """The values of one tag (NEEDED, RUNPATH, ...) of path's dynamic
    section."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines()
            if "(%s)" % tag in line]


def needed(path):
    return dynamic(path, "NEEDED")


# MPI's own libraries: Open MPI's (libmpi, libopen-pal, libopen-rte) and
# MPICH's.
MPI_LIB = re.compile(r"^lib(mpi|mpich|open-pal|open-rte)([._]|$)")
built_with_mpi = getattr(mgpu._core, "_MPI_MISSING", None) is None
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None,
                                   reason="no readelf")
needs_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                                reason="no /proc/self/maps")


def extensions():
    """The files of the package's extensions: _core, and _mpi where built."""
    mods = ["mgpu._core"] + (["mgpu._mpi"] if built_with_mpi else [])
    return [importlib.import_module(m).__file__ for m in mods]


def mapped(code):
    """The file names mapped into a fresh interpreter after it ran code."""
    out = subprocess.run(
        [sys.executable, "-c", code + "\nprint(open('/proc/self/maps').read())"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {line.split()[-1] for line in out.stdout.splitlines()
            if len(line.split()) >= 6 and line.split()[-1].startswith("/")}


def mpi_of(paths):
    return sorted(p for p in paths if MPI_LIB.match(os.path.basename(p)))


@needs_readelf
def test_core_links_no_mpi():
    libs = needed(mgpu._core.__file__)
    assert libs, "readelf listed no NEEDED entry at all"
    assert [lib for lib in libs if MPI_LIB.match(lib)] == [], \
        "mgpu._core links %s" % libs


def assert_runpath(ext):
    """ext's RUNPATH is $ORIGIN; _mpi's may also name the folders of MPI's
    own libraries, which the build reports (the linker adds them where MPI
    lives outside the system's folders, as a prefix of its own)."""
    runpath = dynamic(ext, "RUNPATH")
    assert len(runpath) == 1, (ext, runpath)
    entries = runpath[0].split(":")
    assert "$ORIGIN" in entries, (ext, runpath)
    allowed = {"$ORIGIN"}
    if os.path.basename(ext).startswith("_mpi."):
        allowed.update(mgpu._core._MPI_LIBDIRS)
    assert set(entries) <= allowed, \
        "%s has RUNPATH %s: only $ORIGIN (and, for _mpi, MPI's folders %s)" \
        % (ext, runpath[0], sorted(allowed - {"$ORIGIN"}))


@needs_readelf
def test_extensions_find_libmgpu_beside_them():
    # Each extension links the shared libmgpu (libmgpu_mpi for _mpi), found
    # through a RUNPATH relative to the extension: a copy of the package
    # works wherever it is put, and both extensions load the same file.
    exts = extensions()
    for ext in exts:
        here = os.path.dirname(ext)
        libs = needed(ext)
        mine = [lib for lib in libs if lib.startswith("libmgpu")]
        assert "libmgpu.so.0" in mine or "libmgpu_mpi.so.0" in mine, libs
        assert_runpath(ext)
        for lib in mine:
            assert os.path.isfile(os.path.join(here, lib)), \
                "%s is not beside %s" % (lib, ext)


@needs_maps
def test_import_mgpu_loads_no_mpi():
    paths = mapped("import mgpu; mgpu.init(devices='host:2'); mgpu.shutdown()")
    assert mpi_of(paths) == [], "import mgpu loaded %s" % mpi_of(paths)
    assert [p for p in paths if "libmgpu.so" in p], "libmgpu is not mapped"


@needs_maps
@pytest.mark.skipif(not built_with_mpi, reason="built without MPI")
def test_import_mgpu_mpi_loads_mpi_and_one_libmgpu():
    paths = mapped("import mgpu.mpi")
    assert mpi_of(paths), "import mgpu.mpi loaded no MPI library"
    # _core and _mpi share one library: one libmgpu file, the one beside
    # the extensions.
    ours = sorted(p for p in paths
                  if re.match(r"^libmgpu\.so", os.path.basename(p)))
    assert ours == [os.path.join(os.path.dirname(
        os.path.realpath(mgpu._core.__file__)), "libmgpu.so.0")], ours


@needs_readelf
def test_extension_links_no_cuda_and_no_nccl():
    exts = extensions()
    for ext in exts:
        libs = needed(ext)
        assert libs, "readelf listed no NEEDED entry at all"
        bad = [lib for lib in libs
               if lib.startswith(("libcudart.so", "libcuda.so", "libnccl.so"))]
        assert bad == [], "%s links %s" % (ext, bad)


@pytest.mark.parametrize("other", ["torch", "cupy"])
def test_import_after_mgpu(other):
    if importlib.util.find_spec(other) is None:
        pytest.skip("%s is not installed" % other)
    out = subprocess.run([sys.executable, "-c",
                          "import mgpu, %s; print('ok')" % other],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
