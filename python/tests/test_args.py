"""Arguments checked against each other: dtypes, counts, shapes, writability
and sizes, before any byte moves. Nothing is reinterpreted."""
import gc

import numpy as np
import pytest

import mgpu
from conftest import LegacyConsumerView, run_python


def _values(arrays):
    return [a.numpy().tolist() for a in arrays]


def _refused(exc, words, fn, *args, **kw):
    """fn(*args) raises exc whose message names every one of words."""
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_allreduce_refuses_other_counts_and_dtypes(mg):
    four = [mgpu.full(4, 1, "float32", device=0),
            mgpu.full(5, 2, "float32", device=1)]
    _refused(ValueError, ["arrays[1]", "(5,)", "(4,)"], mgpu.allreduce, four)
    assert _values(four) == [[1.0] * 4, [2.0] * 5]
    mixed = [mgpu.full(4, 1, "float32", device=0),
             mgpu.full(4, 2, "float64", device=1)]
    _refused(TypeError, ["arrays[1]", "float64", "float32"], mgpu.allreduce,
             mixed)
    assert _values(mixed) == [[1.0] * 4, [2.0] * 4]
    # Same count, other shape.
    square = [mgpu.full((2, 2), 1, "float32", device=0),
              mgpu.full(4, 2, "float32", device=1)]
    _refused(ValueError, ["arrays[1]", "(2, 2)"], mgpu.allreduce, square)


def test_allreduce_out_must_match(mg):
    send = [mgpu.full(4, 1.5, "float32", device=d) for d in (0, 1)]
    out = [mgpu.full(4, 7, "int32", device=d) for d in (0, 1)]
    _refused(TypeError, ["out[0]", "int32", "float32"], mgpu.allreduce, send,
             out=out)
    assert _values(out) == [[7] * 4, [7] * 4]
    short = [mgpu.full(4, 7, "float32", device=0),
             mgpu.full(3, 7, "float32", device=1)]
    _refused(ValueError, ["out[1]", "(3,)"], mgpu.allreduce, send, out=short)
    assert _values(short) == [[7.0] * 4, [7.0] * 3]
    comm = mgpu.Comm([0, 1])
    _refused(TypeError, ["out[0]"], comm.allreduce, send, out)
    comm.close()


def test_broadcast_refuses_other_dtypes(mg):
    arrays = [mgpu.full(3, 2.5, "float64", device=0),
              mgpu.full(3, 9, "int64", device=1)]
    _refused(TypeError, ["arrays[1]", "int64", "float64"], mgpu.broadcast,
             arrays, root=0)
    assert _values(arrays) == [[2.5] * 3, [9] * 3]
    longer = [mgpu.full(3, 2.5, "float64", device=0),
              mgpu.full(4, 9, "float64", device=1)]
    _refused(ValueError, ["arrays[1]"], mgpu.broadcast, longer)
    assert _values(longer) == [[2.5] * 3, [9.0] * 4]


def test_allgather_and_reduce_scatter_sizes(mg):
    comm = mgpu.Comm([0, 1])
    send = [mgpu.full(2, d + 1, "float32", device=d) for d in (0, 1)]
    small = [mgpu.full(3, 0, "float32", device=d) for d in (0, 1)]
    _refused(ValueError, ["out[0]", "3 elements", "4"], comm.allgather, send,
             small)
    wrong = [mgpu.full(4, 0, "int32", device=d) for d in (0, 1)]
    _refused(TypeError, ["out[0]", "int32"], comm.allgather, send, wrong)
    assert _values(small) == [[0.0] * 3] * 2
    assert _values(wrong) == [[0] * 4] * 2
    big = [mgpu.full(4, d + 1, "float32", device=d) for d in (0, 1)]
    out = [mgpu.full(3, 0, "float32", device=d) for d in (0, 1)]
    _refused(ValueError, ["arrays[0]", "4 elements"], comm.reduce_scatter,
             big, out)
    good = [mgpu.zeros(2, "float32", device=d) for d in (0, 1)]
    comm.reduce_scatter(big, good)
    assert _values(good) == [[3.0, 3.0], [3.0, 3.0]]
    comm.close()


def test_collective_into_read_only_memory(mg):
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    ro = mgpu.from_dlpack(frozen, device=1)
    send = [mgpu.full(4, 1, "float32", device=0), ro]
    _refused(mgpu.ReadOnlyError, ["arrays[1]"], mgpu.allreduce, send)
    assert send[0].numpy().tolist() == [1.0] * 4
    assert frozen.tolist() == [0.0] * 4
    # A broadcast is in place on every rank, the root's too.
    dst = mgpu.full(4, 5, "float32", device=0)
    _refused(mgpu.ReadOnlyError, ["arrays[1]"], mgpu.broadcast, [dst, ro],
             root=1)
    assert dst.numpy().tolist() == [5.0] * 4


def test_copies_check_dtype_and_shape(mg):
    a = mgpu.full(4, 1, "float32", device=0)
    b = mgpu.full(2, 2, "float64", device=1)   # as many bytes
    _refused(TypeError, ["src", "float64", "float32"], a.copy_from, b)
    _refused(ValueError, ["src", "(2, 2)", "(4,)"], a.copy_from,
             mgpu.zeros((2, 2), "float32", device=1))
    _refused(TypeError, ["float64", "int32"], mgpu.zeros(2, "int32").copy_from,
             np.array([1.5, 2.5]))
    _refused(ValueError, ["(5,)", "(4,)"], a.copy_from, np.arange(5.0))
    assert a.numpy().tolist() == [1.0] * 4
    a.copy_from(np.arange(4))            # int64 values into float32: kept
    assert a.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_copy_from_reads_a_dlpack_only_host_tensor(mg):
    # What asarray reads, copy_from reads: a host tensor with only
    # __dlpack__ (no buffer or array interface) goes through DLPack, its
    # values checked like any host data's.
    src = LegacyConsumerView(np.arange(4, dtype=np.float64))
    a = mgpu.zeros(4, "float32", device=0)
    a.copy_from(src)
    assert a.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    _refused(TypeError, ["float64", "int32"],
             mgpu.zeros(4, "int32").copy_from, src)
    _refused(ValueError, ["(4,)", "(5,)"], mgpu.zeros(5).copy_from, src)


def test_dist_gather_checks_parts(mg):
    d = mgpu.dist.Dist(8, "block")
    parts = d.scatter(np.arange(8.0))
    other = list(parts)
    other[1] = mgpu.zeros(parts[1].size, "int64", device=parts[1].device)
    _refused(TypeError, ["arrays[1]", "int64"], d.gather, other)
    _refused(TypeError, ["out"], d.gather, parts, out=np.zeros(8, np.int32))
    assert d.gather(parts).tolist() == list(np.arange(8.0))


def test_shapes_do_not_wrap(mg):
    _refused(ValueError, ["too big"], mgpu.zeros, 1 << 62, "float64")   # 2^65 B
    _refused(ValueError, ["too big"], mgpu.zeros, (1 << 62, 1 << 62))   # 2^124
    _refused(ValueError, ["too big"], mgpu.empty, (1 << 40, 1 << 40, 2), "u1")
    with pytest.raises(MemoryError):
        mgpu.zeros(1 << 62, "int8")    # 2^62 bytes: fits a size, not a device
    _refused(ValueError, ["too big"], mgpu.zeros, 1 << 64)  # not a size_t


def test_zero_dimensional(mg):
    z = mgpu.zeros(())
    assert z.shape == () and z.size == 1 and z.ndim == 0
    assert z.numpy().shape == ()
    assert mgpu.asarray(3.0).shape == ()
    assert mgpu.asarray(np.float32(3)).numpy().shape == ()
    f = mgpu.full((), 2, "int64")
    f.copy_from(np.int64(5))
    assert f.numpy().tolist() == 5


def test_channel_checks_its_arrays(mg):
    ch = mgpu.Channel(0, 1, 16, dtype="float32")
    assert ch.dtype == np.float32
    _refused(TypeError, ["float64", "float32"], ch.send,
             mgpu.zeros(2, "float64", device=0))
    _refused(ValueError, ["whole elements"], ch.send,
             mgpu.zeros(4, "float32", device=0), 6)
    ch.send(mgpu.full(4, 3, "float32", device=0))
    _refused(TypeError, ["int32", "float32"], ch.recv,
             mgpu.zeros(4, "int32", device=1))
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    _refused(mgpu.ReadOnlyError, ["recv", "read-only"], ch.recv,
             mgpu.from_dlpack(frozen, device=1))
    got = mgpu.zeros(4, "float32", device=1)
    assert ch.recv(got) == 16           # the message waited for a good array
    assert got.numpy().tolist() == [3.0] * 4
    with pytest.raises(ValueError):
        mgpu.Channel(0, 1, 6, dtype="float32")
    ch.close()


def test_views_share_the_buffer(mg):
    a = mgpu.asarray(np.arange(12.0).reshape(3, 4), device=1)
    row = a[1]
    assert row.shape == (4,) and row.ptr == a.ptr + 4 * 8
    assert np.asarray(row).tolist() == [4.0, 5.0, 6.0, 7.0]
    assert np.from_dlpack(row).__array_interface__["data"][0] == row.ptr
    np.asarray(row)[0] = 40                     # seen through the base
    assert a.numpy()[1, 0] == 40
    assert a[1:3].ptr == row.ptr and a[1:3].shape == (2, 4)
    assert a[-1, 1:3].numpy().tolist() == [9.0, 10.0]
    assert a[2, 3].shape == () and a[2, 3].numpy() == 11
    assert a[None, 0, ...].shape == (1, 4)
    flat = a.reshape(-1)
    assert flat.ptr == a.ptr and flat.shape == (12,)
    assert a.reshape(4, 3).numpy()[1].tolist() == [3.0, 40.0, 5.0]
    assert a.reshape((2, 6)).shape == (2, 6)
    assert a[1:1].size == 0
    _refused(ValueError, ["12 elements", "(5, 2)"], a.reshape, 5, 2)
    _refused(ValueError, ["contiguous"], a.__getitem__, (slice(None), 1))
    _refused(ValueError, ["contiguous"], a.__getitem__, slice(None, None, 2))
    _refused(IndexError, ["out of bounds"], a.__getitem__, 3)
    _refused(IndexError, ["basic"], a.__getitem__, [0, 1])


def test_views_keep_the_base_and_its_read_only_flag(mg):
    a = mgpu.full(6, 2, "int32", device=0)
    tail = a[3:]
    del a
    gc.collect()
    assert tail.numpy().tolist() == [2, 2, 2]
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    part = mgpu.from_dlpack(frozen, device=0)[2:]
    with pytest.raises(mgpu.ReadOnlyError):
        part.copy_from(np.zeros(2))
    assert frozen.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_views_in_collectives_copies_and_channels(mg):
    bufs = [mgpu.zeros(8, "float32", device=d) for d in (0, 1)]
    parts = [b[2:6] for b in bufs]
    parts[0].fill(1)
    parts[1].fill(2)
    mgpu.allreduce(parts)                       # only the middle moves
    for b in bufs:
        assert b.numpy().tolist() == [0, 0, 3, 3, 3, 3, 0, 0]
    bufs[1][6:].copy_from(bufs[0][2:4])
    assert bufs[1].numpy().tolist() == [0, 0, 3, 3, 3, 3, 3, 3]
    ch = mgpu.Channel(0, 1, 8, dtype="float32")
    src = mgpu.asarray(np.arange(4, dtype=np.float32), device=0)
    ch.send(src[1:3])
    ch.recv(bufs[1][0:2])
    assert bufs[1].numpy().tolist()[:3] == [1, 2, 3]
    ch.close()


def test_bfloat16_is_a_dtype(mg):
    a = mgpu.zeros((2, 3), "bfloat16", device=0)
    assert a.nbytes == 12 and "bfloat16" in repr(a)
    assert np.asarray(a).dtype == np.uint16        # the raw bits
    for other in ("uint16", "float16"):
        b = mgpu.zeros((2, 3), other, device=1)
        _refused(TypeError, ["arrays[1]", other, "bfloat16"], mgpu.allreduce,
                 [a, b])
        _refused(TypeError, ["src", other, "bfloat16"], a.copy_from, b)


def test_bfloat16_with_ml_dtypes(mg):
    ml = pytest.importorskip("ml_dtypes")
    a = mgpu.zeros(4, ml.bfloat16, device=0)
    assert a.dtype == np.dtype(ml.bfloat16)
    a.fill(1.5)
    assert a.numpy().dtype == np.dtype(ml.bfloat16)
    assert a.numpy().astype(np.float32).tolist() == [1.5] * 4
    assert np.asarray(a).tolist() == [0x3FC0] * 4   # bfloat16 1.5, raw
    x = np.arange(4, dtype=ml.bfloat16)
    b = mgpu.asarray(x, device=1)                   # NumPy cannot DLPack it
    assert b.dtype == np.dtype(ml.bfloat16)
    assert b.numpy().astype(np.float32).tolist() == [0, 1, 2, 3]
    c = mgpu.asarray(np.arange(4, dtype=np.float32), "bfloat16")
    assert c.numpy().astype(np.float32).tolist() == [0, 1, 2, 3]


def test_bfloat16_without_ml_dtypes():
    # Without ml_dtypes a bfloat16 array holds raw uint16 bits: values that
    # would need a conversion are refused, bits go in and out as they are.
    code = """if True:
        import sys
        sys.modules["ml_dtypes"] = None        # as if not installed
        import numpy as np, mgpu
        mgpu.init(devices="host:2")
        a = mgpu.zeros(3, "bfloat16")
        try:
            a.fill(1.5)
        except TypeError as e:
            print("refused:", e)
        a.copy_from(np.full(3, 0x3FC0, np.uint16))
        print(a.numpy().dtype, a.numpy().tolist(), repr(a))
        mgpu.shutdown()
    """
    out = run_python(code)
    assert "refused: float64 values into bfloat16 need ml_dtypes" in out, out
    assert "uint16 [16320, 16320, 16320] <mgpu.Array shape=(3,) dtype=bfloat16" in out, out


# Host devices reduce float16 and bfloat16 as CUDA devices and the MPI
# module do.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_collectives(mg, dtype):
    # Written and read through np.asarray: float16 values, or bfloat16's raw
    # bits (uint16, with or without ml_dtypes).
    def put(a, v):
        np.asarray(a)[:] = (np.float16(v) if dtype == "float16" else
                            np.float32(v).view(np.uint32) >> 16)

    def get(a):
        raw = np.asarray(a)
        return (raw.astype(np.float32) if dtype == "float16" else
                (raw.astype(np.uint32) << 16).view(np.float32)).tolist()
    vals = [0.5, 1.25, 2.0, 3.75]                    # exact in both types
    arrays = [mgpu.zeros(5, dtype, device=d) for d in range(4)]
    for a, v in zip(arrays, vals):
        put(a, v)
    mgpu.allreduce(arrays)
    for a in arrays:
        assert get(a) == [sum(vals)] * 5, (dtype, get(a))
    src = [mgpu.zeros(3, dtype, device=d) for d in range(2)]
    put(src[1], 2.0)
    mgpu.broadcast(src, root=1)
    assert get(src[0]) == [2.0] * 3
    gathered = [mgpu.zeros(6, dtype, device=d) for d in range(2)]
    mgpu.Comm([0, 1]).allgather(src, gathered)
    assert get(gathered[1]) == [2.0] * 6


def test_views_over_the_same_memory_are_not_in_place(mg):
    # The library sees two buffers: it would read what it already wrote.
    a = mgpu.asarray(np.arange(8.0), device=0)
    _refused(mgpu.OverlapError, ["src", "overlap"], a[0:4].copy_from, a[2:6])
    a[0:4].copy_from(a[4:8])                      # disjoint parts: fine
    assert a.numpy().tolist() == [4, 5, 6, 7, 4, 5, 6, 7]
    b = mgpu.asarray(np.arange(8.0), device=1)
    _refused(mgpu.OverlapError, ["arrays[0]", "out[0]"], mgpu.allreduce,
             [a[0:4], b[0:4]], out=[a[2:6], b[4:8]])
    assert a.numpy().tolist() == [4, 5, 6, 7, 4, 5, 6, 7]
    mgpu.allreduce([a[0:4], b[0:4]])              # one array each: in place
    assert a.numpy().tolist() == [4, 6, 8, 10, 4, 5, 6, 7]


def test_asarray_of_what_dlpack_cannot_carry(mg):
    # NumPy's own exporter refuses these with BufferError: mgpu says which
    # dtype and which it takes.
    for x in (np.array(["a"]), np.array([b"a"]), np.array([object()]),
              np.array(["2020-01-01"], "datetime64[D]"), np.zeros(2, "f4,i4"),
              np.zeros(2, np.longdouble)):
        _refused(TypeError, [str(x.dtype), "bfloat16"], mgpu.asarray, x)
    big = np.arange(4, dtype=">f4")                  # copied, native order
    a = mgpu.asarray(big, device=1)
    assert a.dtype == np.float32 and a.numpy().tolist() == [0, 1, 2, 3]
