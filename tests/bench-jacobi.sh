#!/usr/bin/env bash
# mgpu bench jacobi --quick --json: the graph and op-by-op rows of the
# Jacobi step on 2 and 4 devices for each size, every figure positive, next
# to the MPI peer's figure when the peer was built and mpirun is present
# (the command has checked that the MPI grid and mgpu's agree after 20
# iterations, else it fails); without them, a baseline that says why.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
sanitized=$(grep -E '^MGPU_SANITIZE:STRING=.+' "$build/CMakeCache.txt" || true)
have_mpi=0
if [ -z "$sanitized" ] && [ -x "$build/libexec/mgpu/mpi_jacobi" ] &&
   command -v mpirun >/dev/null; then
  have_mpi=1
fi
out=$(MGPU_DEVICES=host:4 timeout 600 "$mgpu" bench jacobi --quick --json) ||
  fail "bench jacobi --quick --json exited non-zero"
echo "$out" | python3 -c '
import json, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "jacobi", doc
rows = {r["case"]: r for r in doc["results"]}
for ndev in (2, 4):
    for n in (64, 256):
        for how in ("graph", "op by op"):
            r = rows["jacobi %dx%d, %d devices, %s" % (n, n, ndev, how)]
            assert r["metric"] == "per_iter" and r["unit"] == "us", r
            assert r["value"] > 0, r
            if sys.argv[1] == "1":
                assert r["baseline"]["name"].startswith("MPI ranks"), r
                assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
            else:
                assert r["baseline"]["name"], r
assert len(rows) == 8, sorted(rows)
' "$have_mpi" || { echo "$out"; fail "bench jacobi --quick --json"; }
echo "ok bench jacobi (MPI peer: $have_mpi)"
