#!/usr/bin/env bash
# mgpu bench launch --quick: the one JSON shape; the channel rows for 8 B
# and 4 KiB next to the spinning and the mutex+cond ping-pongs of the same
# bytes, and next to each MPI's ping-pong whose peer was built and whose
# launcher is present (Open MPI under mpirun, MPICH under mpiexec.mpich on
# at least 2 CPUs);
# every figure positive; the peers' own raw lines; no row from a peer that
# failed after printing figures. One device: the channel rows are between
# device 0 and itself.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

check='
import json, os, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "launch", doc
rows = doc["results"]
peer = int(sys.argv[1])
want = {"spinning ping-pong, same bytes", "mutex+cond ping-pong, same bytes"}
if sys.argv[2] == "1":
    want.add("Open MPI ping-pong, same bytes, 2 ranks")
# MPICH is not run on more ranks than CPUs (its ranks poll).
if sys.argv[3] == "1" and len(os.sched_getaffinity(0)) >= 2:
    want.add("MPICH ping-pong, same bytes, 2 ranks")
for size in (8, 4096):
    case = "channel round trip %d B, devices 0 and %d" % (size, peer)
    names = {r["baseline"]["name"] for r in rows if r["case"] == case}
    assert want <= names, (case, want - names, rows)
assert any(r["case"] == "run_on_device round trip" for r in rows), rows
for r in rows:
    assert r["value"] > 0 and r["unit"] == "us", r
    assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
'
. "$2/tests/mpi-peers.bash"
mpi_peers mpi_pingpong
if [ "$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')" -lt 2 ]; then
  have_mpich=0 # not run on more ranks than CPUs
fi
MGPU_DEVICES=host:2 timeout 300 "$mgpu" bench launch --quick --reps 3 --json |
  python3 -c "$check" 1 "$have_mpi" "$have_mpich" || fail "bench launch on 2 devices"
MGPU_DEVICES=host:1 timeout 300 "$mgpu" bench launch --quick --reps 3 --json |
  python3 -c "$check" 0 0 0 || fail "bench launch on 1 device"

raw_ok() { # the peer's --raw lines: "8 seconds" then "4096 seconds"
  [[ "$1" =~ ^8\ [0-9.e+-]+$'\n'4096\ [0-9.e+-]+$ ]]
}
if [ "$have_mpi" = 1 ]; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
    mpirun --oversubscribe -np 2 "$build/libexec/mgpu/mpi_pingpong" --raw \
    --reps 3 --iters 200)
  raw_ok "$out" || fail "mpi_pingpong --raw: '$out'"
fi
if [ "$have_mpich" = 1 ]; then
  out=$(timeout 120 mpiexec.mpich -n 2 "$build/libexec/mgpu/mpi_pingpong_mpich" \
    --raw --reps 3 --iters 200)
  raw_ok "$out" || fail "mpi_pingpong_mpich --raw: '$out'"
fi
# A peer that says it is ready and then fails (it never opens its FIFO,
# so no batch is run) gives no baseline.
if [ "$have_mpi" = 1 ]; then
  failing_peer mpi_pingpong 'ready\n1e-06 2e-06' \
    "no Open MPI ping-pong baseline: its launcher exited with status" \
    bench launch --quick --reps 1
  python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
assert not [r for r in rows if r["baseline"]["name"].startswith("Open MPI")], rows
' "$stand_in/out" || fail "a failing peer still gave a baseline"
fi
echo "bench-launch: ok"
