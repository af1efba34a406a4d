#!/usr/bin/env bash
# mgpu bench allreduce --quick: the one JSON shape, every figure positive,
# every size on 2 devices, the traffic rows next to their memcpy baseline,
# the busbw rows next to Open MPI's when the peer was built and mpirun is
# present, and next to MPICH's when its build of the peer was made,
# mpiexec.mpich is present and the 2 ranks have as many CPUs (a row each); and the Open MPI peer's own output
# in the same shape. A command
# whose helpers are not beside it says that they are missing, not that MPI
# was not found.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

check='
import json, os, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "allreduce", doc
assert doc["devices"] >= 1, doc
rows = doc["results"]
cases = {r["case"] for r in rows}
suffix = ", 2 dev" if sys.argv[1] == "mgpu" else ""
for size in ("8B", "4KiB", "64KiB", "1MiB"):
    assert "allreduce " + size + suffix in cases, (size, cases)
for r in rows:
    for k in ("case", "metric", "value", "unit"):
        assert k in r, (k, r)
    assert r["value"] > 0, r
    if r["case"].endswith("traffic") and sys.argv[1] == "mgpu":
        assert r["baseline"]["name"].startswith("memcpy"), r
        assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
    if r["metric"] == "busbw" and sys.argv[1] == "mgpu" and sys.argv[2] == "1":
        assert r["baseline"]["name"] in ("Open MPI busbw", "MPICH busbw"), r
        assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
if sys.argv[1] == "mgpu":
    for size in ("8B", "4KiB", "64KiB", "1MiB"):
        names = {r["baseline"]["name"] for r in rows
                 if r["case"] == "allreduce " + size + suffix and
                 r["metric"] == "busbw" and "baseline" in r}
        want = {"Open MPI busbw"} if sys.argv[2] == "1" else set()
        if sys.argv[3] == "1" and 2 <= len(os.sched_getaffinity(0)):
            want.add("MPICH busbw")
        assert want <= names, (size, want - names)
'
. "$2/tests/mpi-peers.bash"
mpi_peers mpi_allreduce
MGPU_DEVICES=host:2 "$mgpu" bench allreduce --quick --json |
  python3 -c "$check" mgpu "$have_mpi" "$have_mpich" ||
  fail "mgpu bench allreduce --quick --json"
MGPU_DEVICES=host:3 "$mgpu" bench allreduce --quick >/dev/null ||
  fail "mgpu bench allreduce --quick (table)"

# Open MPI itself is not sanitizer-clean (it leaks at finalize): the peer is
# checked in plain builds only.
if [ "$have_mpi" = 1 ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
    mpirun --oversubscribe -np 2 "$build/libexec/mgpu/mpi_allreduce" --quick --json |
    python3 -c "$check" mpi 0 0 || fail "mpi_allreduce --quick --json"
fi

# The command copied away from its helpers (its RUNPATH still finds libmgpu).
if [ "$have_mpi" = 1 ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/bin"
  cp "$mgpu" "$tmp/bin/mgpu"
  MGPU_DEVICES=host:2 "$tmp/bin/mgpu" bench allreduce --quick --devices 2 --sizes 8 \
    >/dev/null 2>"$tmp/err" || fail "mgpu bench allreduce away from its helpers"
  grep -q "mpi_allreduce is missing" "$tmp/err" && ! grep -q "found no MPI" "$tmp/err" ||
    fail "away from its helpers, the reason given: $(cat "$tmp/err")"
fi
echo "bench-allreduce: ok"
