import gc

import pytest

import mgpu


@pytest.fixture
def mg():
    """mgpu open on four host devices for one test, closed after."""
    yield from opened("host:4")


def opened(devices):
    """Opens mgpu on devices for one test (a fixture's body), closes it
    after."""
    if mgpu.is_initialized():
        mgpu.shutdown()
    mgpu.init(devices=devices)
    yield mgpu
    gc.collect()
    mgpu.shutdown()


def mem_in_use(dev):
    return mgpu.metrics()["devices"][dev]["mem_in_use"]
