"""Graphs from Python: capture a step from streams, launch it again and
again (mgpu.capture, mgpu.Graph)."""
import numpy as np
import pytest

import mgpu


def test_capture_across_devices_and_launch(mg):
    s0, s1 = mgpu.Stream(0), mgpu.Stream(1)
    a = mgpu.asarray(np.arange(16, dtype="float32"), device=0)
    b = mgpu.zeros(16, "float32", device=1)
    hits = []
    with mgpu.capture(s0) as g:
        s1.wait(s0.record())           # s1 joins the capture
        b.copy_from(a, stream=s1)
        s1.add_callback(hits.append, "ran")
        s0.wait(s1.record())           # and rejoins s0
    assert g.nodes == 2
    s0.synchronize()
    assert hits == []                  # capturing ran nothing
    assert b.numpy().sum() == 0
    for _ in range(3):
        g.launch()
    s0.synchronize()
    assert hits == ["ran"] * 3
    np.testing.assert_array_equal(b.numpy(), np.arange(16, dtype="float32"))
    a.copy_from(np.full(16, 5, "float32"))
    g.launch(s0)
    s0.synchronize()
    assert (b.numpy() == 5).all()
    g.close()
    with pytest.raises(mgpu.InvalidArgumentError):
        g.launch()
    assert "nodes" in repr(g)


def test_synchronize_inside_capture_raises_and_ends_it(mg):
    s = mgpu.Stream(0)
    with pytest.raises(mgpu.NotSupportedError, match="mgpu_stream_synchronize"):
        with mgpu.capture(s) as g:
            s.synchronize()
    s.synchronize()                     # the capture ended with the block
    with pytest.raises(mgpu.InvalidArgumentError):
        g.launch()


def test_unjoined_stream_fails_the_capture(mg):
    s0, s1 = mgpu.Stream(0), mgpu.Stream(1)
    a = mgpu.zeros(4, "float32", device=1)
    with pytest.raises(mgpu.InvalidArgumentError, match="device 1 joined"):
        with mgpu.capture(s0):
            s1.wait(s0.record())
            a.copy_from(mgpu.zeros(4, "float32", device=1), stream=s1)
    s0.synchronize()
    s1.synchronize()


def test_captured_callbacks_live_with_the_graph(mg):
    s = mgpu.Stream(0)
    seen = []
    with mgpu.capture(s) as g:
        s.add_callback(lambda: seen.append(1))   # no other reference to it
    import gc
    gc.collect()
    g.launch()
    g.launch()
    s.synchronize()
    assert seen == [1, 1]
    assert mgpu._core._captured_calls == []      # handed to the graph
    g.close()


def test_capture_collective_and_channel_on_streams(mg):
    """A data-parallel step captured from Python: each rank's array copied
    from its own host array (the graph keeps it and reads it at each
    launch), an all-reduce over the ranks' streams, and the sum sent from
    device 0 to device 1 through a channel; every launch runs it all
    again."""
    n = min(mgpu.device_count(), 4)
    if n < 2:
        pytest.skip("needs two devices")
    ss = [mgpu.Stream(d) for d in range(n)]
    xs = [mgpu.zeros(16, "float32", device=d) for d in range(n)]
    host = [np.full(16, d + 1, "float32") for d in range(n)]
    got = mgpu.zeros(16, "float32", device=1)
    comm = mgpu.Comm(range(n))
    ch = mgpu.Channel(0, 1, 64)
    with mgpu.capture(ss[0]) as g:
        start = ss[0].record()
        for s in ss[1:]:
            s.wait(start)                       # the ranks' streams join
        for d in range(n):
            xs[d].copy_from(host[d], stream=ss[d])
        comm.allreduce(xs, streams=ss)          # recorded, not run
        ch.send(xs[0], stream=ss[0])
        assert ch.recv(got, stream=ss[1]) is None
        for s in ss[1:]:
            ss[0].wait(s.record())              # and rejoin the origin
    ss[0].synchronize()
    assert (got.numpy() == 0).all()             # capturing ran nothing
    total = n * (n + 1) / 2
    zeros = np.zeros(16, "float32")
    for k in range(3):
        for d, x in enumerate(xs):              # each launch does it again
            x.copy_from(zeros, stream=ss[d])
        got.copy_from(zeros, stream=ss[1])
        for s in ss:
            s.synchronize()
        host[0][:] = 1 + k                      # read at each launch
        g.launch()
        ss[0].synchronize()
        for x in xs:
            np.testing.assert_array_equal(x.numpy(), np.full(16, total + k))
        np.testing.assert_array_equal(got.numpy(), np.full(16, total + k))
    g.close()
    # Outside a capture the streams order the collective; nothing waits
    # for it but copies from host data.
    comm.allreduce(xs, streams=ss)
    for s in ss:
        s.synchronize()
    assert xs[1].numpy()[0] == n * (total + 2)
    with pytest.raises(ValueError, match="1 streams for"):
        comm.allreduce(xs, streams=ss[:1])
    with pytest.raises(TypeError, match="not mgpu.Stream"):
        ch.send(xs[0], stream=0)
    comm.close()
    ch.close()
