"""Who keeps the memory alive: exports outlive the array object, del in any
order, gc, shutdown with live arrays and exports, interpreter exit."""
import gc
import itertools
import weakref

import numpy as np
import pytest

import mgpu
from conftest import host_device, mem_in_use, run_child

N = 1 << 16


def test_consumer_outlives_the_array(mg):
    dev = host_device(1)
    base = mem_in_use(dev)
    a = mgpu.full(N, 3, "int32", device=dev)
    x = np.from_dlpack(a)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None
    assert mem_in_use(dev) >= base + 4 * N  # still held by x
    x[:] = 5
    assert x.sum() == 5 * N
    del x
    gc.collect()
    assert mem_in_use(dev) == base


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_del_in_every_order(mg, order):
    dev = host_device(2)
    base = mem_in_use(dev)
    a = mgpu.full(N, 1, "float32", device=dev)
    objs = [a, np.from_dlpack(a), a.__dlpack__(max_version=(1, 0)),
            a.numpy()]
    del a
    for i in order:
        objs[i] = None
        gc.collect()
    assert mem_in_use(dev) == base


def test_unconsumed_capsules_release(mg):
    base = mem_in_use(0)
    a = mgpu.zeros(N, device=0)
    caps = [a.__dlpack__(), a.__dlpack__(max_version=(1, 0))]
    a.free()
    del a  # the capsules alone hold the memory now
    gc.collect()
    assert mem_in_use(0) >= base + 4 * N
    del caps
    gc.collect()
    assert mem_in_use(0) == base


def test_free_while_exported(mg):
    a = mgpu.full(8, 6, "int64", device=host_device(3))
    x = np.from_dlpack(a)
    a.free()
    x += 1
    assert x.tolist() == [7] * 8
    with pytest.raises(mgpu.FreedError):
        a.copy_to(0)
    # Host views and exports made after the free are refused too (they
    # read and wrote the memory as if the array were live), naming the
    # call; the export made before stays valid.
    for name, call in [("Array.fill", lambda: a.fill(1)),
                       ("Array.numpy", lambda: a.numpy()),
                       ("__array_interface__", lambda: np.asarray(a)),
                       ("__dlpack__", lambda: np.from_dlpack(a))]:
        with pytest.raises(mgpu.FreedError, match=name):
            call()
    assert x.tolist() == [7] * 8


def test_host_wait_inside_capture_names_the_call(mg):
    dev = host_device(0)
    a = mgpu.zeros(8, "float32", device=dev)
    s = mgpu.Stream(dev)
    with pytest.raises(mgpu.NotSupportedError, match="Array.fill: .*capturing"):
        with mgpu.capture(s):
            a.fill(1)
    a.fill(2)  # the capture is over
    assert a.numpy().tolist() == [2] * 8


def test_shutdown_with_live_arrays_and_exports():
    mgpu.init(devices="host:2")
    a = mgpu.full(N, 2, "float64", device=1)
    x = np.from_dlpack(a)
    y = a.numpy()
    cap = a.__dlpack__(max_version=(1, 0))
    mgpu.shutdown()
    assert x.sum() == 2 * N and y[0] == 2
    x[0] = 9
    assert a.numpy()[0] == 9
    with pytest.raises(mgpu.NotInitializedError):
        a.copy_to(0)
    with pytest.raises(mgpu.NotInitializedError):
        a.__dlpack__()
    mgpu.init(devices="host:2")
    with pytest.raises(mgpu.FreedError) as e:
        a.copy_to(0)
    assert e.value.code == mgpu.FreedError.code
    del a, x, y, cap
    gc.collect()
    mgpu.shutdown()


def test_interpreter_exit_with_exports_alive(tmp_path):
    assert run_child(tmp_path,
        "import mgpu, numpy as np\n"
        "mgpu.init(devices='host:2')\n"
        "a = mgpu.full(1000, 4, 'int32', device=1)\n"
        "x = np.from_dlpack(a)\n"
        "cap = a.__dlpack__(max_version=(1, 0))\n"
        "s = mgpu.Stream(0)\n"
        "keep = [a, x, cap, s, mgpu.zeros(3, device=0)]\n"
        "print(int(x.sum()))\n") == "4000"


def test_pool_tasks_dropped_unwaited(tmp_path):
    # A child: the failure this guards against kills the interpreter.
    assert run_child(tmp_path,
        "import gc, mgpu\n"
        "mgpu.init(devices='host:4')\n"
        "out = []\n"
        "with mgpu.Pool() as p:\n"
        "    [p.submit(lambda d, x: out.append(x), i) for i in range(2000)]\n"
        "    gc.collect()\n"
        "print(sorted(out) == list(range(2000)))\n") == "True"


def test_pool_call_released_once_run(mg):
    class Arg:
        pass

    with mgpu.Pool() as p:
        arg = Arg()
        ref = weakref.ref(arg)
        t = p.submit(lambda d, x: 5, arg)
        del arg
        assert t.wait() == 5
        del t
        gc.collect()
        assert ref() is None  # nothing kept once the task ran and was waited
        dropped = Arg()
        ref = weakref.ref(dropped)
        p.submit(lambda d, x: None, dropped)
        del dropped
    gc.collect()
    assert ref() is None  # the pool let go of a dropped task's call
