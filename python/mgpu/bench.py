"""python -m mgpu.bench: what the Python layer costs over the C library.

Each case prints the Python figure next to a baseline measured in the same
run (the same library calls looped in C, or the small export for the large
one), as a ratio, in the JSON shape of ``mgpu bench --json``:

- an 8-byte all-reduce over two host devices (``mgpu.allreduce``);
- a ``run_on_device`` round trip (a Python no-op against a C no-op);
- exporting a 1 GiB array to NumPy (``np.from_dlpack``) against a 1 KiB one:
  no copy, so the same time.

Figures are medians of repeated rounds after a warm-up. ``--json`` prints
the one JSON object only; ``--rounds`` and ``--iters`` trade time for
steadiness.
"""
import argparse
import json
import statistics
import time

import numpy as np

import mgpu
from mgpu import _core


def _paired(fn, base, rounds):
    """Medians of fn and base, measured in alternating rounds after a
    warm-up, so that both see the same machine load."""
    fn()
    base()
    a, b = [], []
    for _ in range(rounds):
        a.append(fn())
        b.append(base())
    return statistics.median(a), statistics.median(b)


def _loop(fn, iters):
    def run():
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters
    return run


def _result(case, metric, value, unit, base_name, base, **extra):
    r = {"case": case, "metric": metric, "value": value, "unit": unit,
         "baseline": {"name": base_name, "value": base},
         "ratio": value / base if base else None}
    r.update(extra)
    return r


def run(rounds=7, iters=2000):
    """Runs every case; returns the JSON object."""
    mgpu.init(devices="host:2", host_mem=3 << 30)
    try:
        results = []
        arrays = [mgpu.zeros(2, "float32", device=d) for d in (0, 1)]
        py, c = _paired(_loop(lambda: mgpu.allreduce(arrays), iters),
                        lambda: _core._c_allreduce(arrays, iters), rounds)
        results.append(_result("allreduce 8 B, 2 host devices", "latency",
                               py * 1e6, "us", "C loop", c * 1e6,
                               overhead_us=(py - c) * 1e6))

        def noop():
            return None
        py, c = _paired(_loop(lambda: mgpu.run_on_device(1, noop), iters),
                        lambda: _core._c_run_on_device(1, iters), rounds)
        results.append(_result("run_on_device round trip", "latency",
                               py * 1e6, "us", "C loop", c * 1e6,
                               overhead_us=(py - c) * 1e6))

        small = mgpu.empty(1 << 10, "uint8", device=0)
        big = mgpu.empty(1 << 30, "uint8", device=1)
        n = max(iters // 4, 10)
        t_big, t_small = _paired(_loop(lambda: np.from_dlpack(big), n),
                                 _loop(lambda: np.from_dlpack(small), n),
                                 rounds)
        results.append(_result("np.from_dlpack 1 GiB", "latency",
                               t_big * 1e6, "us", "np.from_dlpack 1 KiB",
                               t_small * 1e6))
        del small, big
        return {"bench": "python", "backend": "host", "devices": 2,
                "results": results}
    finally:
        mgpu.shutdown()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mgpu.bench",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args(argv)
    out = run(args.rounds, args.iters)
    if args.json:
        print(json.dumps(out))
        return 0
    print("%-34s %12s %12s %8s %14s" % ("case", "python", "baseline",
                                         "ratio", "over C"))
    for r in out["results"]:
        over = ("%.2f us" % r["overhead_us"]) if "overhead_us" in r else ""
        print("%-34s %9.2f %s %9.2f %s %8.2f %14s" % (
            r["case"], r["value"], r["unit"], r["baseline"]["value"],
            r["unit"], r["ratio"], over))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
