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
