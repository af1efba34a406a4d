"""The body of test_mpi.py: run by every rank under mpirun.

    mpirun -np N python3 mpi_ranks.py

Each case checks every value it gets; a failing rank prints its traceback
and aborts the job (MPI_Abort), so that no other rank waits in a
collective. At the end each rank prints "rank R of N: K cases ok".
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

import mgpu
import mgpu.mpi

world = MPI.COMM_WORLD
rank, size = world.rank, world.size
cases = []


def case(fn):
    cases.append(fn)
    return fn


def several():
    """True when every rank has more than one device (a refusal on one
    rank is seen by all of them)."""
    return world.allreduce(mgpu.device_count(), op=MPI.MIN) > 1


def on_host(a):
    """True when a's memory is host memory, which NumPy reads and writes in
    place (np.from_dlpack); on CUDA devices it takes copies instead."""
    return mgpu.devices()[a.device].properties()["backend"] == "host"


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError("%s did not raise %s" % (fn.__name__, exc.__name__))


@case
def info():
    i = mgpu.mpi.info()
    assert (i["rank"], i["nranks"]) == (rank, size), i
    assert i["ndevices"] == mgpu.device_count() >= 1, i
    counts = world.allgather(i["ndevices"])
    assert i["first_device"] == sum(counts[:rank]), (i, counts)
    assert i["total_devices"] == sum(counts), (i, counts)
    assert not i["cuda_aware"]  # host devices
    assert repr(mgpu.mpi.comm(world)) == "<mgpu.mpi comm rank %d of %d>" % (rank, size)


waited = []  # requests waited on and kept alive until finalize


@case
def send_recv_ring():
    # Each rank sends to the next and receives from the one before, both
    # posted before either is waited on.
    for dt in ("float64", "int32", "complex128", "int16", "float16"):
        out = mgpu.full(7, rank * 10 + 1, dt, device=0)
        got = mgpu.zeros(7, dt, device=mgpu.device_count() - 1)
        rq = mgpu.mpi.irecv(got, (rank - 1) % size, tag=5)
        sq = mgpu.mpi.isend(out, (rank + 1) % size, tag=5)
        assert not rq.done
        sq.wait()
        rq.wait()
        assert rq.done and sq.done
        raises(ValueError, rq.wait)
        waited.extend((rq, sq))  # alive at finalize, which skips them
        want = ((rank - 1) % size) * 10 + 1
        assert (got.numpy() == np.full(7, want, dt)).all(), (dt, got.numpy())
    # Blocking forms, in an order that cannot deadlock.
    a = mgpu.zeros(3, "float32", device=0)
    if rank == 0:
        if size > 1:
            mgpu.mpi.send(mgpu.full(3, 2.5, "float32", device=0), 1, tag=9)
            assert mgpu.mpi.recv(a, size - 1, tag=9) is a
            assert (a.numpy() == 2.5).all()
    else:
        mgpu.mpi.recv(a, rank - 1, tag=9)
        mgpu.mpi.send(a, (rank + 1) % size, tag=9)


@case
def dropped_request():
    # A request that goes without wait() is waited on when it goes.
    if size < 2:
        return
    if rank == 0:
        mgpu.mpi.isend(mgpu.full(5, 3.0, "float64", device=0), 1)
    elif rank == 1:
        a = mgpu.zeros(5, "float64", device=0)
        mgpu.mpi.irecv(a, 0)
        assert (a.numpy() == 3.0).all()
    world.Barrier()


@case
def bcast():
    root = size - 1
    for dt in ("float32", "int64", "complex64"):
        a = mgpu.full(9, 42 if rank == root else -1, dt, device=0)
        assert mgpu.mpi.bcast(a, root=root) is a
        assert (a.numpy() == 42).all(), (dt, a.numpy())


@case
def reduce():
    a = mgpu.full(6, rank + 1, "float64", device=0)
    out = mgpu.zeros(6, "float64", device=0)
    got = mgpu.mpi.reduce(a, out, op="sum", root=0)
    if rank == 0:
        assert got is out
        assert (out.numpy() == size * (size + 1) / 2).all(), out.numpy()
    else:
        assert got is None and (out.numpy() == 0).all()
    b = mgpu.full(6, rank + 1, "int32", device=0)
    got = mgpu.mpi.reduce(b, op="max", root=size - 1)  # in place on root
    if rank == size - 1:
        assert got is b and (b.numpy() == size).all(), b.numpy()
    else:
        assert got is None


@case
def allreduce():
    ops = {"sum": sum, "prod": np.prod, "min": min, "max": max}
    for dt in ("float32", "float64", "int32", "int64"):
        for op, f in ops.items():
            vals = [r + 2 for r in range(size)]
            a = mgpu.full(33, vals[rank], dt, device=0)
            want = f(vals)
            assert mgpu.mpi.allreduce(a, op=op) is a       # in place
            assert (a.numpy() == want).all(), (dt, op, a.numpy(), want)
            a = mgpu.full(33, vals[rank], dt, device=0)
            if several():
                # send and recv of one rank must be on one device: refused
                # on every rank
                out = mgpu.zeros(33, dt, device=1)
                raises(mgpu.WrongDeviceError, mgpu.mpi.allreduce, a, out, op=op)
            out = mgpu.zeros(33, dt, device=0)
            assert mgpu.mpi.allreduce(a, out, op=op) is out
            assert (out.numpy() == want).all() and (a.numpy() == vals[rank]).all()


@case
def every_dtype():
    # Every dtype an mgpu.Array holds moves, 1-byte ones and odd counts of
    # them included; integers reduce by every op, bool by min and max.
    for dt in ("bool", "int8", "uint8", "int16", "uint16", "uint32",
               "uint64", "complex64", "float16"):
        want = (np.arange(13) % 2 if dt == "bool" else np.arange(13) + 3).astype(dt)
        a = mgpu.asarray(want if rank == 0 else np.zeros(13, dt), device=0)
        assert mgpu.mpi.bcast(a, root=0) is a
        assert (a.numpy() == want).all(), (dt, a.numpy())
        out = mgpu.asarray(np.full(7, rank + 1).astype(dt), device=0)
        got = mgpu.zeros(7, dt, device=0)
        rq = mgpu.mpi.irecv(got, (rank - 1) % size, tag=6)
        mgpu.mpi.send(out, (rank + 1) % size, tag=6)
        rq.wait()
        assert (got.numpy() == np.full(7, (rank - 1) % size + 1).astype(dt)).all(), dt
        mine = mgpu.asarray(np.full(5, rank % 2 if dt == "bool" else rank).astype(dt), device=0)
        every = mgpu.zeros(5 * size, dt, device=0)
        assert mgpu.mpi.allgather(mine, every) is every
        ranks = np.arange(size) % 2 if dt == "bool" else np.arange(size)
        assert (every.numpy() == np.repeat(ranks, 5).astype(dt)).all(), dt
    ops = {"sum": sum, "prod": np.prod, "min": min, "max": max}
    for dt in ("int8", "uint8", "int16", "uint16", "uint32", "uint64"):
        for op, f in ops.items():
            vals = [r + 1 for r in range(size)]
            a = mgpu.asarray(np.full(9, vals[rank]).astype(dt), device=0)
            assert mgpu.mpi.allreduce(a, op=op) is a
            assert (a.numpy() == np.array(f(vals)).astype(dt)).all(), (dt, op, a.numpy())
    b = mgpu.asarray(np.array([rank == 0, True, False, rank == size - 1]), device=0)
    c = mgpu.zeros(4, "bool", device=0)
    mgpu.mpi.allreduce(b, c, op="min")
    assert list(c.numpy()) == [size == 1, True, False, size == 1], c.numpy()
    mgpu.mpi.allreduce(b, c, op="max")
    assert list(c.numpy()) == [True, True, False, True], c.numpy()
    raises(TypeError, mgpu.mpi.allreduce, b, c, op="sum")
    raises(TypeError, mgpu.mpi.allreduce, mgpu.zeros(4, "complex64", device=0))


@case
def reduce_scatter_allgather():
    k = 5
    send = mgpu.asarray(np.arange(size * k, dtype="float64") + rank, device=0)
    out = mgpu.zeros(k, "float64", device=0)
    mgpu.mpi.reduce_scatter(send, out)
    want = sum(np.arange(size * k, dtype="float64") + r for r in range(size))
    assert (out.numpy() == want[rank * k:(rank + 1) * k]).all(), out.numpy()
    mine = mgpu.full(k, rank, "int64", device=0)
    every = mgpu.zeros(size * k, "int64", device=0)
    assert mgpu.mpi.allgather(mine, every) is every
    assert (every.numpy() == np.repeat(np.arange(size), k)).all(), every.numpy()
    # Views: a part of a buffer moves in place, the rest stays.
    whole = mgpu.full((3, k), -1, "float64", device=0)
    part = whole[1]
    mgpu.mpi.allreduce(mgpu.full(k, rank + 1, "float64", device=0), part)
    got = whole.numpy()
    assert (got[1] == size * (size + 1) / 2).all() and (got[[0, 2]] == -1).all(), got


@case
def scatter_gather():
    k = 11
    for dt in ("float64", "complex128", "int16"):
        src = None
        if rank == 0:
            src = mgpu.asarray(np.arange(size * k).astype(dt), device=0)
        part = mgpu.zeros(k, dt, device=0)
        assert mgpu.mpi.scatter(src, part, root=0) is part
        assert (part.numpy() == np.arange(rank * k, (rank + 1) * k).astype(dt)).all()
        # On a host device the part is an array NumPy writes in place
        # (DLPack, no copy); elsewhere it is written through a copy.
        if on_host(part):
            x = np.from_dlpack(part)
            x *= 2
        else:
            part = mgpu.asarray(part.numpy() * 2, device=0)
        back = mgpu.zeros(size * k, dt, device=0) if rank == 0 else None
        got = mgpu.mpi.gather(part, back, root=0)
        if rank == 0:
            assert got is back
            assert (back.numpy() == 2 * np.arange(size * k).astype(dt)).all()
        else:
            assert got is None


@case
def sub_communicator():
    # Calls over a communicator of mpi4py other than the one given to init.
    half = world.Split(rank % 2, rank)
    a = mgpu.full(4, rank, "float64", device=0)
    mgpu.mpi.allreduce(a, comm=half)
    assert (a.numpy() == sum(range(rank % 2, size, 2))).all(), a.numpy()
    c = mgpu.mpi.comm(half)
    assert (c.rank, c.size) == (half.rank, half.size)
    mgpu.mpi.bcast(a, root=0, comm=c)
    half.Free()


@case
def streams():
    s = mgpu.Stream(0)
    a = mgpu.full(8, rank + 1, "float32", device=0)
    mgpu.mpi.allreduce(a, stream=s)
    assert (a.numpy() == size * (size + 1) / 2).all()
    if several():
        other = mgpu.Stream(1)
        e = raises(mgpu.WrongDeviceError, mgpu.mpi.bcast, a, stream=other)
        assert e.code == mgpu.WrongDeviceError.code and e.detail
    raises(TypeError, mgpu.mpi.bcast, a, stream=3)


@case
def errors():
    a = mgpu.zeros(4, "float32", device=0)
    raises(TypeError, mgpu.mpi.allreduce, np.zeros(4))
    raises(TypeError, mgpu.mpi.bcast, a, root="0")
    raises(TypeError, mgpu.mpi.allreduce, a, comm=object())
    raises(TypeError, mgpu.mpi.allreduce, mgpu.zeros(4, "complex64", device=0))
    # bool reduces by min (and) and max (or) only
    raises(TypeError, mgpu.mpi.allreduce, mgpu.zeros(4, "bool", device=0))
    raises(ValueError, mgpu.mpi.allreduce, a, op="avg")
    raises(TypeError, mgpu.mpi.allreduce, a, mgpu.zeros(4, "float64", device=0))
    raises(TypeError, mgpu.mpi.gather, a, None, root=rank)  # root needs out
    # The arrays of one call agree on each rank before anything moves.
    e = raises(ValueError, mgpu.mpi.allreduce, a, mgpu.zeros(5, "float32", device=0))
    assert "out" in str(e) and "(5,)" in str(e), e
    raises(TypeError, mgpu.mpi.allgather, mgpu.zeros(4, "complex64", device=0),
           mgpu.zeros(4 * size, "int64", device=0))  # the same 8-byte units
    e = raises(ValueError, mgpu.mpi.allgather, a,
               mgpu.zeros(4 * size + 1, "float32", device=0))
    assert "%d ranks x 4" % size in str(e), e
    w = mgpu.zeros(8, "float32", device=0)
    raises(mgpu.OverlapError, mgpu.mpi.allreduce, w[0:4], w[2:6])
    # Counts that differ between ranks fail the call on every rank before
    # any data moves, naming the rank.
    if size > 1:
        b = mgpu.zeros(4 + (rank == 1), "float32", device=0)
        e = raises(mgpu.Error, mgpu.mpi.allreduce, b)
        assert isinstance(e, (mgpu.MismatchError, mgpu.RangeError)), e
        assert "rank" in e.detail, e.detail
        # A receive too small for the send fails both sides.
        if rank < 2:
            n = 8 if rank == 0 else 4
            x = mgpu.zeros(n, "float64", device=0)
            if rank == 0:
                e = raises(mgpu.Error, mgpu.mpi.send, x, 1)
            else:
                e = raises(mgpu.Error, mgpu.mpi.recv, x, 0)
            assert isinstance(e, (mgpu.MismatchError, mgpu.RangeError)), e
    world.Barrier()


@case
def device_comm():
    # One mgpu communicator over every device of every rank: this rank's
    # devices are global ranks first .. first + n - 1.
    c = mgpu.mpi.comm_create()
    n, first = mgpu.device_count(), mgpu.mpi.info()["first_device"]
    total = mgpu.mpi.info()["total_devices"]
    assert (c.first_rank, c.nranks, c.devices) == (first, total, tuple(range(n)))
    mine = [mgpu.full(6, first + i + 1, "float64", device=i) for i in range(n)]
    c.allreduce(mine)
    for a in mine:
        assert (a.numpy() == total * (total + 1) / 2).all(), a.numpy()
    b = [mgpu.full(3, first + i, "int32", device=i) for i in range(n)]
    c.broadcast(b, root=total - 1)
    for a in b:
        assert (a.numpy() == total - 1).all(), a.numpy()
    send = [mgpu.full(2, first + i, "float32", device=i) for i in range(n)]
    out = [mgpu.zeros(2 * total, "float32", device=i) for i in range(n)]
    c.allgather(send, out)
    for a in out:
        assert (a.numpy() == np.repeat(np.arange(total), 2)).all(), a.numpy()
    c.close()
    # Another one left open is closed by finalize.
    mgpu.mpi.comm_create(devices=[0])


@case
def distribution():
    # A distribution over every device of every rank, scattered from a
    # device array of rank 0 and gathered back.
    n = 1001
    info = mgpu.mpi.info()
    for kind, kw in (("block", {}), ("cyclic", {}),
                     ("block_cyclic", {"block": 7}),
                     ("weighted", {"weights": [1 + p % 3 for p in range(info["total_devices"])]})):
        d = mgpu.mpi.dist(n, kind, **kw)
        assert isinstance(d, mgpu.dist.Dist)
        assert (d.first_part, d.nlocal) == (info["first_device"], info["ndevices"])
        assert d.nparts == info["total_devices"]
        whole = np.arange(n, dtype=np.float64) * 3
        src = mgpu.asarray(whole, device=0) if rank == 0 else None
        parts = list(mgpu.mpi.dist_scatter(d, src, root=0))
        assert len(parts) == d.nlocal
        every = d.parts
        for i, a in enumerate(parts):
            assert a.device == i
            dev, count, ranges = every[d.first_part + i]
            want = np.concatenate([whole[b:e] for b, e in ranges]) if ranges else whole[:0]
            assert (a.numpy() == want).all(), (kind, i)
            if on_host(a):
                np.from_dlpack(a)[:] += 1
            else:
                parts[i] = mgpu.asarray(a.numpy() + 1, device=a.device)
        back = mgpu.mpi.dist_gather(d, parts, root=0)
        if rank == 0:
            assert (back.numpy() == whole + 1).all(), kind
        else:
            assert back is None
    raises(TypeError, mgpu.mpi.dist_scatter, d, "not an array" if rank == 0 else None)
    raises(TypeError, d.scatter, np.arange(n))
    raises(TypeError, mgpu.mpi.dist_scatter, d,
           mgpu.zeros(n, "uint8", device=0) if rank == 0 else None)
    if several():   # parts of two dtypes, refused on every rank
        bad = list(parts)
        bad[1] = mgpu.zeros(bad[1].size, "int64", device=1)
        e = raises(TypeError, mgpu.mpi.dist_gather, d, bad, root=0)
        assert "parts[1] is int64" in str(e), e


@case
def stats():
    s = mgpu.mpi.stats(reset=True)
    assert s["calls_host"] + s["calls_staged"] > 0, s
    assert s["calls_direct"] == 0
    a = mgpu.full(1000, 1.0, "float64", device=0)
    mgpu.mpi.allreduce(a)
    s = mgpu.mpi.stats()
    staged = s["calls_staged"] > 0
    assert s["calls_host" if not staged else "calls_staged"] == 1, s
    assert s["bytes_host"] + s["bytes_staged"] >= 8000, s


def main():
    mgpu.mpi.init(world)
    raises(mgpu.AlreadyInitializedError, mgpu.mpi.init, world)
    for fn in cases:
        try:
            fn()
        except BaseException:
            sys.stdout.flush()
            print("rank %d: case %s failed" % (rank, fn.__name__), file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            world.Abort(1)
        world.Barrier()
    kept = mgpu.zeros(4, device=0)
    kept_on_host = on_host(kept)
    mgpu.mpi.finalize()
    mgpu.mpi.finalize()  # safe twice
    assert not mgpu.is_initialized()
    raises(mgpu.NotInitializedError, mgpu.mpi.info)
    raises(mgpu.NotInitializedError, mgpu.mpi.allreduce, kept)
    if kept_on_host:  # host memory outlives the library; a GPU's does not
        assert (kept.numpy() == 0).all()
    else:
        raises(mgpu.NotInitializedError, kept.numpy)
    print("rank %d of %d: %d cases ok" % (rank, size, len(cases)))


if __name__ == "__main__":
    main()
