#!/usr/bin/env bash
# mgpu bench allreduce --quick: the one JSON shape, every figure positive,
# the traffic rows next to their memcpy baseline; and the Open MPI peer's
# output in the same shape when it was built and mpirun is present.
set -euo pipefail
mgpu=$1
build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

check='
import json, sys
doc = json.load(sys.stdin)
assert doc["bench"] == "allreduce", doc
assert doc["devices"] >= 1, doc
rows = doc["results"]
cases = {r["case"] for r in rows}
for size in ("4KiB", "64KiB", "1MiB"):
    assert "allreduce " + size in cases, (size, cases)
for r in rows:
    for k in ("case", "metric", "value", "unit"):
        assert k in r, (k, r)
    assert r["value"] > 0, r
    if r["case"].endswith("traffic") and sys.argv[1] == "mgpu":
        assert r["baseline"]["name"].startswith("memcpy"), r
        assert r["baseline"]["value"] > 0 and r["ratio"] > 0, r
'
MGPU_DEVICES=host:2 "$mgpu" bench allreduce --quick --json |
  python3 -c "$check" mgpu || fail "mgpu bench allreduce --quick --json"
MGPU_DEVICES=host:3 "$mgpu" bench allreduce --quick >/dev/null ||
  fail "mgpu bench allreduce --quick (table)"

# Open MPI itself is not sanitizer-clean (it leaks at finalize): the peer is
# checked in plain builds only.
sanitized=$(grep -E '^MGPU_SANITIZE:STRING=.+' "$build/CMakeCache.txt" || true)
if [ -z "$sanitized" ] && [ -x "$build/bench/mpi_allreduce" ] &&
   command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np 2 \
      "$build/bench/mpi_allreduce" --quick --json |
    python3 -c "$check" mpi || fail "mpi_allreduce --quick --json"
fi
echo "bench-allreduce: ok"
