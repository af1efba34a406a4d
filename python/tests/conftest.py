import gc

import pytest

import mgpu


@pytest.fixture
def mg():
    """mgpu open on four host devices for one test, closed after."""
    if mgpu.is_initialized():
        mgpu.shutdown()
    mgpu.init(devices="host:4")
    yield mgpu
    gc.collect()
    mgpu.shutdown()


def mem_in_use(dev):
    return mgpu.metrics()["devices"][dev]["mem_in_use"]
