"""mgpu.store against the build's own daemon on a private socket."""
import gc
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import mgpu
import mgpu.store
from conftest import LegacyConsumerView, opened

HERE = pathlib.Path(__file__).resolve().parent


def _daemon():
    """The daemon's command line: $MGPU_STORE_DAEMON, mgpud or `mgpu store
    serve` on PATH, else the repository's build folder."""
    exe = os.environ.get("MGPU_STORE_DAEMON")
    if exe and os.path.exists(exe):
        return [exe]
    if shutil.which("mgpud"):
        return [shutil.which("mgpud")]
    if shutil.which("mgpu"):
        return [shutil.which("mgpu"), "store", "serve"]
    for b in sorted((HERE.parent.parent).glob("build*/bin/mgpud")):
        return [str(b)]
    return None


@pytest.fixture
def daemon(tmp_path):
    yield from _daemon_on(tmp_path, "host:2")


def _daemon_on(tmp_path, devices):
    """A daemon on devices for one test (a fixture's body): its socket."""
    cmd = _daemon()
    if cmd is None:
        pytest.skip("no store daemon (mgpud) found")
    sock = str(tmp_path / "store.sock")
    env = dict(os.environ, MGPU_DEVICES=devices)
    p = subprocess.Popen(cmd + ["--socket", sock], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        if p.poll() is not None:
            pytest.fail("daemon exited: %s" % p.stdout.read().decode())
        if os.path.exists(sock):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(sock)
                break
            except OSError:
                pass
        if time.monotonic() > deadline:
            p.kill()
            pytest.fail("daemon did not answer in 30 s")
        time.sleep(0.05)
    yield sock
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail("daemon did not stop on SIGTERM")
    assert rc == 0, p.stdout.read().decode()


@pytest.fixture
def mg2():
    yield from opened("host:2")


OPENCL_DEVICES = "opencl:0,host:1"


@pytest.fixture
def mg_opencl():
    """mgpu open on an OpenCL device and a host device; skips where the
    OpenCL plugin or a device is missing."""
    os.environ.setdefault("POCL_DEVICES", "pthread")
    if mgpu.is_initialized():
        mgpu.shutdown()
    try:
        mgpu.init(devices=OPENCL_DEVICES)
    except mgpu.Error as e:
        pytest.skip("no OpenCL device: %s" % e)
    yield mgpu
    gc.collect()
    mgpu.shutdown()


@pytest.fixture
def daemon_opencl(tmp_path):
    yield from _daemon_on(tmp_path, OPENCL_DEVICES)


def _tool():
    """The mgpu command beside the daemon, or on PATH."""
    cmd = _daemon()
    if cmd is not None:
        beside = pathlib.Path(cmd[0]).with_name("mgpu")
        if beside.exists():
            return str(beside)
    return shutil.which("mgpu")


def test_list_keys_match_cli(daemon, mg2):
    tool = _tool()
    if tool is None:
        pytest.skip("no mgpu command found")
    with mgpu.store.connect(daemon) as st:
        st.put(np.arange(10, dtype="float32"), name="k", device=1)
        ours = st.list()
        out = subprocess.run([tool, "store", "--socket", daemon, "ls",
                              "--json"], capture_output=True, timeout=60,
                             check=True)
        import json
        theirs = json.loads(out.stdout)
        assert len(ours) == len(theirs) == 1
        assert set(ours[0]) == set(theirs[0])
        for key in ("id", "device", "bytes", "sealed", "deleted", "refs"):
            assert ours[0][key] == theirs[0][key], key
        assert ours[0]["name"] == theirs[0]["name"] == "k"
        st.delete("k")


def test_put_get_same_process(daemon, mg2):
    data = np.arange(1000, dtype=np.float32)
    with mgpu.store.connect(daemon) as st:
        oid = st.put(data, name="x", device=1)
        assert isinstance(oid, int)
        a = st.get("x", dtype="float32")
        assert a.id == oid and a.shape == (1000,) and a.device == 1
        v = np.asarray(a)
        assert not v.flags.writeable
        assert v.__array_interface__["data"][0] == a.ptr  # no copy
        np.testing.assert_array_equal(v, data)
        with pytest.raises(ValueError):
            v[0] = 1
        d = np.from_dlpack(a)
        assert not d.flags.writeable
        assert d.__array_interface__["data"][0] == a.ptr
        np.testing.assert_array_equal(d, data)
        b = st.get(oid, dtype="float32", shape=(10, 100))
        np.testing.assert_array_equal(np.asarray(b), data.reshape(10, 100))
        ents = {e["id"]: e for e in st.list()}
        assert ents[oid]["name"] == "x" and ents[oid]["bytes"] == 4000
        assert ents[oid]["sealed"] and ents[oid]["refs"] >= 2
        s = st.stats()
        assert s["objects"] >= 1 and s["clients"] >= 1
        assert sum(x["in_use"] for x in s["devices"]) >= 4000
        # Deleted while held: deferred, no longer gettable, views still read.
        assert st.delete("x") is True
        with pytest.raises(mgpu.NotFoundError):
            st.get("x")
        del a, b
        gc.collect()
        np.testing.assert_array_equal(v, data)  # v and d hold the object
        del v, d
        gc.collect()


def test_put_array_and_bytes(daemon, mg2):
    src = mgpu.full(16, 3, "int32", device=0)
    with mgpu.store.connect(daemon) as st:
        i1 = st.put(src)
        i2 = st.put(b"hello store")
        assert bytes(np.asarray(st.get(i2))) == b"hello store"
        np.testing.assert_array_equal(np.asarray(st.get(i1, "int32")),
                                      np.full(16, 3, np.int32))
        assert st.delete(i1) is False  # nobody holds it now
        gc.collect()


def test_errors(daemon, mg2):
    with mgpu.store.connect(daemon) as st:
        st.put(b"a", name="dup")
        with pytest.raises(mgpu.ExistsError) as e:
            st.put(b"b", name="dup")
        assert e.value.code < 0
        with pytest.raises(mgpu.NotFoundError):
            st.get(123456789)
        with pytest.raises(mgpu.NotFoundError):
            st.delete("nobody")
        with pytest.raises(TypeError):
            st.get(1.5)
        with pytest.raises(ValueError):
            st.get("dup", dtype="int32")  # 1 byte is not an int32
        with pytest.raises(ValueError):
            st.put(b"")
    with pytest.raises(ValueError):
        st.get("dup")  # closed
    with pytest.raises(mgpu.StoreError):
        mgpu.store.connect(daemon + ".none")


def test_close_waits_for_arrays(daemon, mg2):
    st = mgpu.store.connect(daemon)
    oid = st.put(np.ones(8, np.float64))
    v = np.asarray(st.get(oid, "float64"))
    st.close()  # the view keeps the connection and the object
    np.testing.assert_array_equal(v, np.ones(8))
    del v
    gc.collect()


def test_other_process(daemon, mg2):
    """Put in a child process, get here; then get here what this one put in
    another child, which checks the bytes."""
    data = np.random.default_rng(1).random(4096)
    child = textwrap.dedent("""
        import sys, numpy as np, mgpu, mgpu.store
        mgpu.init(devices="host:2")
        st = mgpu.store.connect(sys.argv[1])
        if sys.argv[2] == "put":
            st.put(np.random.default_rng(1).random(4096), name="from-child")
        else:
            a = np.asarray(st.get("from-parent", dtype="float64"))
            assert not a.flags.writeable
            assert (a == np.random.default_rng(1).random(4096) * 2).all()
            print("ok")
        st.close()
        mgpu.shutdown()
    """)
    env = dict(os.environ, MGPU_DEVICES="host:2")
    r = subprocess.run([sys.executable, "-c", child, daemon, "put"], env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    with mgpu.store.connect(daemon) as st:
        a = st.get("from-child", dtype="float64")
        np.testing.assert_array_equal(np.asarray(a), data)
        st.put(data * 2, name="from-parent")
        r = subprocess.run([sys.executable, "-c", child, daemon, "get"],
                           env=env, capture_output=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == b"ok", r.stderr.decode()
        del a
        gc.collect()


def test_create_mirror_seal(daemon, mg2):
    """The vineyard pattern: create, fill through the host mirror, seal;
    another process gets what was written."""
    data = np.arange(3000, dtype=np.float64) * 0.5
    with mgpu.store.connect(daemon) as st:
        obj = st.create((3, 1000), "float64", name="mirrored", device=1)
        assert obj.writable and obj.shape == (3, 1000) and obj.device == 1
        with obj.mirror(fill=False) as m:
            assert m.writable and m.open and m.shape == (3, 1000)
            m[:] = data.reshape(3, 1000)        # the host copy, in place
            m[2, :10] = -1
            assert m[2, 5] == -1 and m[0, 7] == 3.5
            # Another mirror of the same object while this one is open
            with pytest.raises(mgpu.AlreadyInitializedError):
                obj.mirror()
            with pytest.raises(ValueError):
                obj.seal()   # the copy would not be written back
        assert not m.open
        m.end()              # idempotent
        want = data.reshape(3, 1000).copy()
        want[2, :10] = -1
        # Written back into the object at the end of the block.
        np.testing.assert_array_equal(np.asarray(obj), want)
        oid = obj.seal()
        assert oid == obj.id and not obj.writable
        with pytest.raises(ValueError):
            obj.seal()
        with pytest.raises(mgpu.ReadOnlyError) as info:
            obj.copy_from(want)
        assert "store object %d is sealed" % oid in info.value.detail

        # A got object's mirror: filled, read-only, never written back.
        got = st.get("mirrored", "float64", (3, 1000))
        with got.mirror() as m:
            assert not m.writable
            np.testing.assert_array_equal(m[:], want)
            v = m.numpy()
            assert not v.flags.writeable
            assert v.__array_interface__["data"][0] != got.ptr  # a copy
            with pytest.raises(mgpu.ReadOnlyError) as info:
                m[0, 0] = 5
            assert "object %d is sealed" % got.id in info.value.detail
            # end() with a view alive is refused, as memoryview.release is
            with pytest.raises(BufferError):
                m.end()
            del v
        assert not m.open

        # The other process reads what the mirror wrote.
        child = ("import sys, numpy as np, mgpu, mgpu.store\n"
                 "mgpu.init(devices='host:2')\n"
                 "st = mgpu.store.connect(sys.argv[1])\n"
                 "a = np.asarray(st.get('mirrored', 'float64'))\n"
                 "w = np.arange(3000) * 0.5; w[2000:2010] = -1\n"
                 "assert (a == w).all(); print('ok'); del a\n"
                 "st.close(); mgpu.shutdown()\n")
        r = subprocess.run([sys.executable, "-c", child, daemon],
                           env=dict(os.environ, MGPU_DEVICES="host:2"),
                           capture_output=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == b"ok", r.stderr.decode()
        del got, obj
        gc.collect()


def test_mirror_views_keep_it_open(daemon, mg2):
    with mgpu.store.connect(daemon) as st:
        obj = st.create(64, "int32", device=0)
        obj.copy_from(np.arange(64, dtype=np.int32))
        m = obj.mirror()                       # filled from the object
        v = np.asarray(m)
        assert v.flags.writeable
        np.testing.assert_array_equal(v, np.arange(64))
        v[:] = 9
        del m                                  # the view keeps it open
        gc.collect()
        assert (v == 9).all()
        del v                                  # ends it: written back
        gc.collect()
        np.testing.assert_array_equal(np.asarray(obj), np.full(64, 9))
        # A new mirror is possible now; dropped without a view, it ends.
        obj.mirror(fill=True)
        gc.collect()
        obj.seal()
        with pytest.raises(TypeError):
            mgpu.store.StoreMirror()
        # An object created and dropped unsealed cannot be got, and is
        # discarded when its connection closes.
        tmp = st.create(8, "uint8", name="dropped")
        del tmp
        gc.collect()
        with pytest.raises(mgpu.NotReadyError):
            st.get("dropped")
        del obj
        gc.collect()
    with mgpu.store.connect(daemon) as st:
        with pytest.raises(mgpu.NotFoundError):
            st.get("dropped")


def test_dlpack_export_follows_the_array_api_rules(daemon, mg2):
    # A got object is read-only: in place only to a consumer that reads
    # DLPack 1.x's read-only flag; a copy to any other, or where asked.
    data = np.arange(8, dtype=np.int32)
    with mgpu.store.connect(daemon) as st:
        st.put(data, name="ro", device=0)
        a = st.get("ro", dtype="int32")
        view = np.asarray(a)

        old = np.from_dlpack(LegacyConsumerView(a))
        assert not np.shares_memory(old, view)
        np.testing.assert_array_equal(old, data)
        with pytest.raises(BufferError, match="read-only"):
            a.__dlpack__(copy=False)
        mine = np.from_dlpack(a, copy=True)
        assert mine.flags.writeable and not np.shares_memory(mine, view)
        mine[:] = -1
        np.testing.assert_array_equal(view, data)
        same = np.from_dlpack(a)
        assert np.shares_memory(same, view) and not same.flags.writeable
        # The arguments are checked as Array.__dlpack__ checks them.
        with pytest.raises(ValueError, match="stream"):
            a.__dlpack__(stream=1)
        with pytest.raises(TypeError, match="max_version"):
            a.__dlpack__(max_version=3)
        del old, mine, same, view, a
        gc.collect()


def test_writes_check_dtype_and_shape(daemon, mg2):
    with mgpu.store.connect(daemon) as st:
        obj = st.create((2, 4), "int32", device=1)
        obj.copy_from(np.arange(8, dtype=np.int32).reshape(2, 4))
        with pytest.raises(TypeError, match="float64"):
            obj.copy_from(np.full((2, 4), 1.5))     # would truncate
        with pytest.raises(ValueError, match=r"\(8,\)"):
            obj.copy_from(np.arange(8, dtype=np.int32))
        with pytest.raises(ValueError, match=r"\(2, 2\)"):
            obj.copy_from(np.zeros((2, 2), np.int64))
        with obj.mirror() as m:
            with pytest.raises(TypeError, match="int32"):
                m[0] = np.full(4, 2.5)
            m[1] = np.arange(4, dtype=np.int16)      # widens: kept
        assert np.asarray(obj).tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
        obj.seal()


def test_not_found_text_is_not_quoted(daemon, mg2):
    with mgpu.store.connect(daemon) as st:
        with pytest.raises(mgpu.NotFoundError) as info:
            st.get("no-such-object")
        text = str(info.value)
        assert text.startswith("MGPU_ENOENT") and text == info.value.args[0]
        assert isinstance(info.value, KeyError)


def test_objects_on_an_opencl_device(mg_opencl, daemon_opencl):
    """An object on an OpenCL device is host memory there (pinned, kDLCPU):
    filled from an OpenCL array, read back through NumPy by another
    connection, and counted against the OpenCL device."""
    with mgpu.store.connect(daemon_opencl) as a, \
            mgpu.store.connect(daemon_opencl) as b:
        src = mgpu.full(1000, 3.0, "float32", device=0)
        oid = a.put(src, name="cl")
        got = b.get("cl", "float32")
        assert got.device == 0
        assert got.__dlpack_device__() == (1, 0)
        assert np.asarray(got).tolist() == [3.0] * 1000
        stats = a.stats()
        assert stats["devices"][0]["backend"] == "opencl"
        assert stats["devices"][0]["uuid"].startswith("opencl-")
        assert stats["devices"][0]["in_use"] == 4000
        del got
        a.delete(oid)
