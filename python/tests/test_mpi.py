"""mgpu.mpi under mpirun: each test starts `mpirun -np N` itself, under a
timeout, running mpi_ranks.py (every call, checked on every rank) or the
example examples/python/shift_mpi.py. Skipped where mpirun or mpi4py is
missing, or the package was built without MPI."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mgpu
from conftest import run_python

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "shift_mpi.py")


def _mpirun():
    # MGPU_TEST_MPIEXEC names another launcher (CI: MPICH's mpiexec.mpich).
    found = (os.environ.get("MGPU_TEST_MPIEXEC") or shutil.which("mpirun")
             or shutil.which("mpiexec"))
    # Open MPI takes its prefix from the launcher's folder: the real one,
    # not /bin where /bin links to /usr/bin.
    return os.path.realpath(found) if found else None


def _skip_reason():
    if getattr(mgpu._core, "_MPI_MISSING", None) is not None:
        return mgpu._core._MPI_MISSING
    if _mpirun() is None:
        return "no mpirun"
    try:
        import mpi4py  # noqa: F401  (MPI itself starts only in the ranks)
    except ImportError:
        return "no mpi4py (pip install mpi4py)"
    return None


needs_mpi = pytest.mark.skipif(_skip_reason() is not None,
                               reason=str(_skip_reason()))


def mpirun(np_, *args, env=None, timeout=120):
    """Runs `mpirun -np np_ python args...` under a timeout; returns its
    output (stdout and stderr together), failing the test on a non-zero
    exit."""
    e = dict(os.environ)
    e.update({
        # as root (CI), in containers, more ranks than cores
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_rmaps_base_oversubscribe": "yes",
        "MGPU_DEVICES": e.get("MGPU_DEVICES") or "host:4",
    })
    e.update(env or {})
    # The ranks import the same mgpu as this process.
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(mgpu.__file__)))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, e.get("PYTHONPATH")) if p)
    launcher = _mpirun()
    # Open MPI refuses more ranks than cores without --oversubscribe;
    # MPICH's Hydra has no such flag and needs none.
    version = subprocess.run([launcher, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=60).stdout
    over = [] if b"HYDRA" in version else ["--oversubscribe"]
    cmd = ["timeout", str(timeout), launcher] + over + ["-np", str(np_),
                                                        sys.executable] + list(args)
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=timeout + 30)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0, "mpirun exited %d:\n%s" % (p.returncode, out)
    return out


@needs_mpi
@pytest.mark.parametrize("np_,env", [
    (1, {}),
    (2, {}),
    (3, {}),   # host:4 over 3 ranks: 1, 1 and 2 devices
    (2, {"MGPU_MPI_STAGE": "1", "MGPU_MPI_CHUNK": "4K"}),  # bounce buffers
], ids=["np1", "np2", "np3", "np2-staged"])
def test_every_call(np_, env):
    out = mpirun(np_, os.path.join(HERE, "mpi_ranks.py"), env=env)
    for r in range(np_):
        assert "rank %d of %d: 15 cases ok" % (r, np_) in out, out


@needs_mpi
def test_shift_example(tmp_path):
    # The lesson: scatter, shift by -0.5 on each rank's device, gather.
    out_file = tmp_path / "back.npy"
    out = mpirun(2, EXAMPLE, str(out_file))
    n = 100003
    assert "2 ranks x %d numbers: mean after the shift" % n in out, out
    mean = float(out.split("mean after the shift")[1].split()[0])
    assert abs(mean) < 0.01, out
    back = np.load(out_file)
    # Every number made it there and back, shifted exactly.
    want = np.random.default_rng(42).random(2 * n) - 0.5
    assert back.shape == want.shape
    assert (back == want).all()
    assert abs(back.mean() - mean) < 1e-5


def test_import_without_mpi():
    # A package built without MPI: `import mgpu.mpi` says why, clearly.
    code = ("import mgpu._core as c; c._MPI_MISSING = 'mgpu was built "
            "without MPI (not found)'\n"
            "try:\n import mgpu.mpi\nexcept ImportError as e:\n print('IE', e)\n")
    out = run_python(code)
    assert out.startswith("IE mgpu.mpi is not available: mgpu was built "
                          "without MPI (not found)"), out
    assert "libopenmpi-dev" in out


@pytest.mark.skipif(getattr(mgpu._core, "_MPI_MISSING", None) is not None,
                    reason="built without MPI")
def test_errors_are_the_package_classes():
    # mgpu.mpi is an extension of its own (mgpu._mpi) that raises through
    # mgpu._core's error mapping: the very classes of mgpu, both for a code
    # of the C library and for a check made in Python. Before mgpu.mpi.init,
    # so no MPI is started.
    code = ("import mgpu, mgpu.mpi\n"
            "for f in (mgpu.mpi.info, lambda: mgpu.mpi.allreduce(None)):\n"
            "    try:\n"
            "        f()\n"
            "    except mgpu.Error as e:\n"
            "        print(type(e) is mgpu.NotInitializedError, e)\n")
    out = run_python(code).splitlines()
    assert out == ["True MGPU_ENOINIT: mgpu_mpi_get_info: mgpu_mpi_init has not run",
                   "True MGPU_ENOINIT: mgpu.mpi.init() was not called"], out
