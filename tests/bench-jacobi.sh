#!/usr/bin/env bash
# mgpu bench jacobi --quick --json: the graph and op-by-op rows of the
# Jacobi step on 2 and 4 devices for each size, every figure positive, next
# to the MPI peer's figure when the peer was built and mpirun is present,
# and to MPICH's build of it when that was made and mpiexec.mpich is
# present, on no more ranks than CPUs (a row each; the command has checked
# that each MPI grid and mgpu's agree after 20 iterations, else it fails);
# without any, a baseline that says why; no figure from a peer that failed
# after printing its figures.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
. "$2/tests/mpi-peers.bash"
mpi_peers mpi_jacobi
out=$(MGPU_DEVICES=host:4 timeout 600 "$mgpu" bench jacobi --quick --json) ||
  fail "bench jacobi --quick --json exited non-zero"
echo "$out" | python3 -c '
import json, os, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "jacobi", doc
rows = {}
for r in doc["results"]:
    rows.setdefault(r["case"], []).append(r)
for ndev in (2, 4):
    want = set()
    if sys.argv[1] == "1":
        want.add("Open MPI ranks, MPI_Sendrecv halos")
    # MPICH is not run on more ranks than CPUs (its ranks poll).
    if sys.argv[2] == "1" and ndev <= len(os.sched_getaffinity(0)):
        want.add("MPICH ranks, MPI_Sendrecv halos")
    for n in (64, 256):
        for how in ("graph", "op by op"):
            mine = rows["jacobi %dx%d, %d devices, %s" % (n, n, ndev, how)]
            for r in mine:
                assert r["metric"] == "per_iter" and r["unit"] == "us", r
                assert r["value"] > 0, r
                assert r["baseline"]["name"], r
                if want:
                    assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
            names = {r["baseline"]["name"] for r in mine}
            assert want <= names, (want - names, mine)
assert len(rows) == 8, sorted(rows)
' "$have_mpi" "$have_mpich" || { echo "$out"; fail "bench jacobi --quick --json"; }
# Sides given: only those grids; a side out of range is refused.
out=$(MGPU_DEVICES=host:2 timeout 300 "$mgpu" bench jacobi --quick --json \
      --reps 1 48) || fail "bench jacobi --quick 48 exited non-zero"
echo "$out" | python3 -c '
import json, sys
cases = {r["case"] for r in json.load(sys.stdin)["results"]}
assert cases == {"jacobi 48x48, 2 devices, graph",
                 "jacobi 48x48, 2 devices, op by op"}, cases
' || { echo "$out"; fail "bench jacobi 48 ran other sizes"; }
for bad in 5 20000 12x 1,2; do
  rc=0
  err=$("$mgpu" bench jacobi "$bad" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] && [[ "$err" == *"not '$bad'"* ]] ||
    fail "bench jacobi $bad: status $rc, '$err'"
done
rc=0
"$mgpu" bench jacobi 64 128 256 512 >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "bench jacobi with four sizes: status $rc"
# A peer that says it is ready and then fails (it never opens its FIFO, so
# no batch is run) gives no baseline.
if [ "$have_mpi" = 1 ]; then
  failing_peer mpi_jacobi 'ready 0\n1e-06\n1e-06' \
    "no Open MPI baseline on 2 ranks: its launcher exited with status" \
    bench jacobi --quick --reps 1
  python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
assert rows and not [r for r in rows if r["baseline"]["value"]], rows
' "$stand_in/out" || fail "a failing peer still gave a baseline"
fi
echo "ok bench jacobi (Open MPI peer: $have_mpi, MPICH peer: $have_mpich)"
