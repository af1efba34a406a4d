#!/usr/bin/env bash
# mgpu bench barrier --quick: the one JSON shape, a row for 2 parties (and
# 4 where four devices are open) next to pthread_barrier_wait, each figure
# positive, and next to Open MPI's MPI_Barrier when the peer was built and
# mpirun is present (and MPICH's when its build of the peer was made,
# mpiexec.mpich is present and there are as many CPUs as ranks); the peer's own raw line. One device: no row, a line
# that says why.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

check='
import json, os, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "barrier", doc
rows = doc["results"]
want = int(sys.argv[1])
have_mpi = sys.argv[2] == "1"
have_mpich = sys.argv[3] == "1"
for n in (2, 4)[:want]:
    case = "host barrier, %d parties" % n
    mine = [r for r in rows if r["case"] == case]
    names = {r["baseline"]["name"] for r in mine}
    assert "pthread_barrier_wait" in names, (case, rows)
    if have_mpi:
        assert "Open MPI MPI_Barrier" in names, (case, rows)
    # MPICH is not run on more ranks than CPUs (its ranks poll).
    if have_mpich and n <= len(os.sched_getaffinity(0)):
        assert "MPICH MPI_Barrier" in names, (case, rows)
for r in rows:
    assert r["value"] > 0 and r["unit"] == "us", r
    assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
'
. "$2/tests/mpi-peers.bash"
mpi_peers mpi_barrier
MGPU_DEVICES=host:2 timeout 300 "$mgpu" bench barrier --quick --json |
  python3 -c "$check" 1 "$have_mpi" "$have_mpich" || fail "bench barrier on 2 devices"
MGPU_DEVICES=host:4 timeout 300 "$mgpu" bench barrier --quick --json |
  python3 -c "$check" 2 "$have_mpi" "$have_mpich" || fail "bench barrier on 4 devices"
err=$(MGPU_DEVICES=host:1 timeout 60 "$mgpu" bench barrier --quick 2>&1 >/dev/null)
grep -q "one device open" <<<"$err" || fail "one device: $err"

# Open MPI itself is not sanitizer-clean (it leaks at finalize): the peer is
# checked in plain builds only.
if [ "$have_mpi" = 1 ]; then
  line=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
    mpirun --oversubscribe -np 2 "$build/libexec/mgpu/mpi_barrier" --raw \
    --reps 3 --iters 200)
  [[ "$line" =~ ^2\ [0-9.e+-]+$ ]] || fail "mpi_barrier --raw: '$line'"
fi
echo "bench-barrier: ok"
