"""Ctrl-C during blocking calls: KeyboardInterrupt arrives while the call
still waits (not when it ends), and mgpu works after. Each case runs in a
child that blocks, gets SIGINT, and reports; the bound is generous (the
wait goes in slices of 50-100 ms)."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

CHILD = textwrap.dedent("""
    import sys, threading, time
    import mgpu
    mgpu.init(devices="host:4")
    kind = sys.argv[1]
    go = threading.Event()  # what the blocked work waits for

    def block():
        if kind == "run_on_device":
            mgpu.run_on_device(1, go.wait, 60)
        elif kind == "channel_recv":
            ch = mgpu.Channel(0, 1, 64)
            block.ch = ch
            ch.recv(mgpu.zeros(16, device=1))
        elif kind == "task_wait":
            block.pool = mgpu.Pool()
            block.task = block.pool.submit(lambda d: go.wait(60))
            block.task.wait()
        elif kind == "stream_synchronize":
            block.s = mgpu.Stream(2)
            block.s.add_callback(go.wait, 60)
            block.s.synchronize()

    def after():
        go.set()
        if kind == "channel_recv":
            block.ch.send(mgpu.full(16, 3, device=0))
            out = mgpu.zeros(16, device=1)
            assert block.ch.recv(out) == 64 and out.numpy()[0] == 3
        elif kind == "task_wait":
            assert block.task.wait() is True
            block.pool.close()
        elif kind == "stream_synchronize":
            block.s.synchronize()
        assert mgpu.run_on_device(3, lambda: 7) == 7
        a = mgpu.full(4, 2, device=0)
        assert a.copy_to(1).numpy().tolist() == [2] * 4

    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        block()
    except KeyboardInterrupt:
        print("interrupted %.3f" % (time.monotonic() - t0), flush=True)
    else:
        print("not interrupted %.3f" % (time.monotonic() - t0), flush=True)
    after()
    mgpu.shutdown()
    print("usable after", flush=True)
""")


@pytest.mark.parametrize("kind", ["run_on_device", "channel_recv",
                                  "task_wait", "stream_synchronize"])
def test_ctrl_c_ends_a_blocking_call(tmp_path, kind):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(script), kind],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # into the wait (earlier is fine too)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    lines = out.split("\n")
    assert lines[0].startswith("interrupted "), out
    assert float(lines[0].split()[1]) < 3.0, out
    assert "usable after" in lines, out
