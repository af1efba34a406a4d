"""Devices, streams and events, copies, collectives, channels, the task
pool, distributions and metrics, and threads releasing the GIL."""
import threading
import time

import numpy as np
import pytest

import mgpu
from conftest import mem_in_use


def test_version_from_the_library():
    assert mgpu.__version__ == mgpu.version()
    assert mgpu.version().count(".") == 2


def test_devices_and_properties(mg):
    devs = mgpu.devices()
    assert [d.index for d in devs] == [0, 1, 2, 3]
    p = devs[2].properties()
    assert p["backend"] == "host" and p["name"] == "host device 2"
    assert p["total_mem"] > 0 and p["split_count"] == 1
    assert mgpu.device_count() == 4


def test_current_device_context(mg):
    assert mgpu.get_device() == 0
    with mgpu.Device(2):
        assert mgpu.get_device() == 2
        assert mgpu.empty(4).device == 2
        with mgpu.Device(3):
            assert mgpu.zeros(1).device == 3
        assert mgpu.get_device() == 2
    assert mgpu.get_device() == 0


def test_run_on_device(mg):
    seen = mgpu.run_on_device(3, lambda x: (mgpu.get_device(),
                                            threading.get_ident(), x), 5)
    assert seen[0] == 3 and seen[2] == 5
    assert seen[1] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        mgpu.run_on_device(1, lambda: 1 / 0)


def test_copies_peer_and_staged(mg):
    src = mgpu.asarray(np.arange(1 << 18, dtype=np.float32), device=0)
    assert mgpu.copy_path(0, 1) in ("direct", "peer", "direct peer")  \
        or mgpu.copy_path(0, 1)
    direct = src.copy_to(1)
    mgpu.peer_disable(0, 2)
    staged = src.copy_to(2)
    m = mgpu.metrics()["devices"]
    assert m[0]["copies_peer_staged"] + m[2]["copies_peer_staged"] >= 1
    for a in (direct, staged):
        assert np.array_equal(a.numpy(), np.arange(1 << 18, dtype=np.float32))
    with mgpu.Stream(0) as s:
        out = src.copy_to(3, stream=s)
        s.synchronize()
    assert np.array_equal(out.numpy(), src.numpy())


def test_streams_events_and_callbacks(mg):
    s = mgpu.Stream(1)
    hits = []
    s.add_callback(hits.append, 1)
    e = s.record()
    e.synchronize()
    s.synchronize()
    assert hits == [1] and s.query() and e.query()
    e2 = mgpu.Event(1).record(s)
    e2.synchronize()
    assert e.elapsed_ms(e2) >= 0
    s2 = mgpu.Stream(1)
    s2.wait(e2)
    s2.synchronize()
    s.close()
    s.close()


def test_waiting_thread_releases_the_gil(mg):
    # The stream's callback blocks until the main thread, running Python,
    # lets it go: the synchronizing thread must not hold the GIL meanwhile.
    s = mgpu.Stream(0)
    release = threading.Event()
    entered = threading.Event()

    def block():
        entered.set()
        release.wait(30)

    s.add_callback(block)
    done = []
    t = threading.Thread(target=lambda: (s.synchronize(), done.append(1)))
    t.start()
    assert entered.wait(30)
    count = sum(range(10000))  # Python runs while t waits
    assert count and not done
    release.set()
    t.join(30)
    assert done == [1]


def test_python_threads_share_devices(mg):
    results = []

    def work(dev):
        a = mgpu.full(1000, dev, "int64", device=dev)
        b = a.copy_to((dev + 1) % 4)
        results.append((dev, int(b.numpy().sum()),
                        mgpu.run_on_device(dev, mgpu.get_device)))

    threads = [threading.Thread(target=work, args=(d,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [(d, 1000 * d, d) for d in range(4)]


def test_allreduce_broadcast_and_comm(mg):
    arrays = [mgpu.full(16, d + 1, "float32", device=d) for d in range(4)]
    mgpu.allreduce(arrays)
    for a in arrays:
        assert a.numpy().tolist() == [10.0] * 16
    outs = [mgpu.empty(16, "float32", device=d) for d in range(4)]
    mgpu.allreduce(arrays, out=outs, op="max")
    assert all(o.numpy()[0] == 10 for o in outs)
    src = [mgpu.full(4, d, "int64", device=d) for d in range(4)]
    mgpu.broadcast(src, root=2)
    assert all(a.numpy().tolist() == [2] * 4 for a in src)
    comm = mgpu.Comm([0, 1])
    send = [mgpu.full(2, d + 1, "float64", device=d) for d in (0, 1)]
    recv = [mgpu.empty(4, "float64", device=d) for d in (0, 1)]
    comm.allgather(send, recv)
    assert recv[1].numpy().tolist() == [1, 1, 2, 2]
    with pytest.raises(mgpu.WrongDeviceError):
        comm.allreduce([mgpu.zeros(2, device=0), mgpu.zeros(2, device=1)],
                       out=[mgpu.zeros(2, device=1), mgpu.zeros(2, device=0)])
    with pytest.raises(TypeError):
        comm.allreduce([1, 2])
    with pytest.raises(TypeError):
        mgpu.allreduce([mgpu.zeros(2, "int8", device=0),
                        mgpu.zeros(2, "int8", device=1)])


def test_comm_abort(mg):
    # The wrapper: abort ends the object and leaves the devices usable.
    # What the abort does to calls blocked in the communicator (they end
    # with MGPU_ECANCELED) is tested in C, tests/test-abort.c: a Comm's
    # collectives issue every rank from one thread, so none can block here.
    comm = mgpu.Comm([0, 1, 2])
    send = [mgpu.full(8, d + 1, "float32", device=d) for d in range(3)]
    comm.allreduce(send)
    comm.abort()
    with pytest.raises(ValueError):
        comm.allreduce(send)
    with pytest.raises(ValueError):
        comm.abort()
    comm.close()  # closing an aborted communicator does nothing
    again = mgpu.Comm([0, 1, 2])  # the devices go on
    again.allreduce(send)
    assert send[2].numpy().tolist() == [18.0] * 8
    again.close()


def test_channel(mg):
    ch = mgpu.Channel(0, 3, 64, capacity=2)
    got = []

    def receiver():
        dst = mgpu.zeros(16, "float32", device=3)
        while True:
            try:
                n = ch.recv(dst)
            except mgpu.ClosedError:
                return
            got.append((n, dst.numpy()[:n // 4].tolist()))

    t = threading.Thread(target=receiver)
    t.start()
    for i in range(5):
        ch.send(mgpu.full(16, i, "float32", device=0), nbytes=8)
    ch.close()
    t.join(30)
    assert got == [(8, [float(i)] * 2) for i in range(5)]


def test_pool(mg):
    with mgpu.Pool() as pool:
        tasks = [pool.submit(lambda dev, x: (dev, x * x), i) for i in range(20)]
        res = [t.wait() for t in tasks]
    assert [r[1] for r in res] == [i * i for i in range(20)]
    assert all(0 <= r[0] < 4 for r in res)
    with mgpu.Pool(devices=[1]) as pool:
        t = pool.submit(lambda dev: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            t.wait()
        assert pool.map(lambda dev, x: dev, [0, 1]) == [1, 1]


def test_dist(mg):
    d = mgpu.dist.Dist(10, "block_cyclic", block=2, devices=[0, 1])
    assert [p[0] for p in d.parts] == [0, 1]
    assert d.parts[0][2] == [(0, 2), (4, 6), (8, 10)]
    parts = d.scatter(np.arange(10, dtype=np.int32))
    assert parts[1].numpy().tolist() == [2, 3, 6, 7]
    assert d.gather(parts).tolist() == list(range(10))
    with pytest.raises(ValueError):
        mgpu.dist.Dist(10, "diagonal")


def test_metrics(mg):
    mgpu.reset_metrics()
    before = mem_in_use(1)
    a = mgpu.zeros(1024, "float64", device=1)
    m = mgpu.metrics()
    assert m["ndevices"] == 4
    assert m["devices"][1]["mem_in_use"] == before + 8192
    assert "chan_msgs_sent" in m["devices"][0]
    del a


def test_trace(mg, tmp_path):
    import json
    path = tmp_path / "run.json"
    mgpu.trace.start(str(path))
    assert mgpu.trace.active()
    with mgpu.trace.span("python phase"):
        mgpu.full(1000, 1.0, device=1).copy_to(2)
    mgpu.trace.stop()
    assert not mgpu.trace.active()
    assert mgpu.trace.stats()["events"] > 0
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert any(e.get("name") == "python phase" for e in events)
    with pytest.raises(mgpu.InvalidArgumentError):
        mgpu.trace.stop()


def test_task_waited_after_its_pool_closed(mg):
    pool = mgpu.Pool()
    t = pool.submit(lambda dev: "ran")
    bad = pool.submit(lambda dev: {}["missing"])
    pool.close()
    assert t.wait() == "ran"
    with pytest.raises(KeyError):
        bad.wait()
    with pytest.raises(ValueError):
        t.wait()
    with pytest.raises(ValueError):
        mgpu.Task.__new__(mgpu.Task).wait()
