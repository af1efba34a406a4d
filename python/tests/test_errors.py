"""Errors: one exception class per MGPU_E code, wrong types are TypeError,
use before init and after shutdown raise, nothing crashes."""
import numpy as np
import pytest

import mgpu


def test_every_code_has_its_class():
    codes = sorted(mgpu.ERRORS)
    assert codes == list(range(-len(codes), 0))  # -N .. -1, no gap
    classes = set()
    for code, cls in mgpu.ERRORS.items():
        assert issubclass(cls, mgpu.Error) and cls is not mgpu.Error
        assert cls.code == code and cls.name.startswith("MGPU_E")
        assert getattr(mgpu, cls.__name__) is cls
        # every code has a chosen name, not the made-up "EFooError"
        made_up = "E" + cls.name[len("MGPU_E"):].capitalize() + "Error"
        assert cls.__name__ != made_up, cls.__name__
        classes.add(cls)
    assert len(classes) == len(codes)
    assert issubclass(mgpu.InvalidArgumentError, ValueError)
    assert issubclass(mgpu.OutOfMemoryError, MemoryError)
    assert mgpu.DeviceLostError.name == "MGPU_EDEVLOST"
    assert mgpu.DeadlockError.name == "MGPU_EDEADLK"


def test_detail_names_what_was_wrong(mg):
    with pytest.raises(mgpu.NoDeviceError) as e:
        mgpu.empty(4, device=9)
    assert e.value.code == -3 and "9" in e.value.detail
    with pytest.raises(mgpu.OutOfMemoryError) as e:
        mgpu.empty(1 << 40, "uint8", device=1)
    assert "device 1" in e.value.detail


def test_wrong_types_are_type_errors(mg):
    bad = [
        lambda: mgpu.empty("four"),
        lambda: mgpu.empty((2, 2.5)),
        lambda: mgpu.empty(3, dtype=object),
        lambda: mgpu.empty(3, dtype="U4"),
        lambda: mgpu.empty(3, device="gpu"),
        lambda: mgpu.empty(3, device=1.0),
        lambda: mgpu.run_on_device(0, 5),
        lambda: mgpu.Stream(device=[0]),
        lambda: mgpu.Channel(0, 1, "big"),
        lambda: mgpu.zeros(2, device=0).copy_to(None),
        lambda: mgpu.zeros(2, device=0).copy_to(1, stream=3),
        lambda: mgpu.Event(0).record(None),
        lambda: mgpu.Pool().submit(None),
        lambda: mgpu.init(devices=4),
    ]
    for f in bad:
        with pytest.raises(TypeError):
            f()
    with pytest.raises(TypeError):
        mgpu.Array()
    with pytest.raises(ValueError):
        mgpu.empty(-1)
    with pytest.raises(ValueError):
        mgpu.empty(3, kind="shared")


def test_init_twice_and_bad_spec(mg):
    with pytest.raises(mgpu.AlreadyInitializedError):
        mgpu.init(devices="host:1")
    mgpu.shutdown()
    with pytest.raises(mgpu.InvalidArgumentError) as e:
        mgpu.init(devices="quantum:3")
    assert "quantum" in e.value.detail
    mgpu.init(devices="host:4")


def test_calls_before_init_and_after_shutdown():
    mgpu.shutdown()
    mgpu.shutdown()  # twice is fine
    assert not mgpu.is_initialized()
    for f in (lambda: mgpu.empty(3), mgpu.devices, mgpu.metrics,
              lambda: mgpu.Stream(0), lambda: mgpu.run_on_device(0, print)):
        with pytest.raises(mgpu.NotInitializedError):
            f()
    mgpu.init(devices="host:2")
    s = mgpu.Stream(1)
    e = mgpu.Event(1)
    comm = mgpu.Comm([0, 1])
    pool = mgpu.Pool()
    ch = mgpu.Channel(0, 1, 8)
    a = mgpu.full(3, 1.5, device=1)
    mgpu.shutdown()
    with pytest.raises(mgpu.NotInitializedError):
        s.synchronize()
    with pytest.raises(mgpu.Error):
        comm.allreduce([a, a])
    with pytest.raises(mgpu.Error):
        ch.send(a)
    assert a.numpy().tolist() == [1.5] * 3
    del s, e, comm, pool, ch, a
