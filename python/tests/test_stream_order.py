"""The stream order of CUDA exports (Array.__dlpack__(stream=...)): an
event recorded on the mgpu stream, in its context, waited on by the
consumer's stream. No GPU here: a stand-in libcuda.so.1, preloaded, logs
the driver calls the extension makes."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import mgpu

STUB = textwrap.dedent(r"""
    #include <stdio.h>
    #define SAY(...) (printf(__VA_ARGS__), printf("\n"), fflush(stdout))
    int cuStreamGetCtx(void *s, void **c) { SAY("getctx %p", s); *c = (void *)0xc7; return s == (void *)0xdead ? 201 : 0; }
    int cuCtxPushCurrent_v2(void *c) { SAY("push %p", c); return 0; }
    int cuCtxPopCurrent_v2(void **c) { SAY("pop"); *c = (void *)0xc7; return 0; }
    int cuEventCreate(void **e, unsigned f) { SAY("create %u", f); *e = (void *)0xe1; return 0; }
    int cuEventRecord(void *e, void *s) { SAY("record %p %p", e, s); return 0; }
    int cuStreamWaitEvent(void *s, void *e, unsigned f) { SAY("wait %p %p %u", s, e, f); return s == (void *)0xbad ? 400 : 0; }
    int cuEventDestroy_v2(void *e) { SAY("destroy %p", e); return 0; }
""")

CALLS = ("import mgpu._core as c\n"
         "for p, q in ((0x5, 0x1), (0x5, 0xbad), (0xdead, 0x2)):\n"
         "    print('rc', c._cuda_order(p, q), flush=True)\n")


def _run(env):
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(mgpu.__file__)))
    env = dict(os.environ, **env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", CALLS], env=env, timeout=60,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert out.returncode == 0, out.stdout.decode()
    return out.stdout.decode().split("\n")[:-1]


def test_without_a_driver_it_says_so():
    # No CUDA driver loaded (none is ever loaded from here): -1, and the
    # export falls back to a host wait.
    assert _run({}) == ["rc -1"] * 3


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_event_recorded_and_waited(tmp_path):
    src = tmp_path / "cuda.c"
    src.write_text(STUB)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1",
                    "-o", str(lib), str(src)], check=True, timeout=60)
    got = _run({"LD_PRELOAD": str(lib)})
    assert got == [
        # the producer's context current while its event is made and recorded
        "getctx 0x5", "push 0xc7", "create 2", "record 0xe1 0x5",
        # the consumer (1: the legacy default stream) waits on the device
        "wait 0x1 0xe1 0", "destroy 0xe1", "pop", "rc 0",
        # a consumer handle the driver refuses: its error, nothing left over
        "getctx 0x5", "push 0xc7", "create 2", "record 0xe1 0x5",
        "wait 0xbad 0xe1 0", "destroy 0xe1", "pop", "rc 400",
        # a producer the driver does not know: nothing pushed
        "getctx 0xdead", "rc 201",
    ], got
