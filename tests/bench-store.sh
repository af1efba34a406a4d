#!/usr/bin/env bash
# mgpu bench store --quick --json prints its three figures, each with the
# baseline measured in the same run (bare UNIX-socket round trips, memcpy).
set -euo pipefail
mgpu=$1
out=$(timeout 300 "$mgpu" bench store --quick --json)
echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["bench"] == "store", r
cases = {x["case"]: x for x in r["results"]}
assert len(cases) == 3, cases
for x in cases.values():
    assert x["value"] > 0 and x["baseline"]["value"] > 0 and x["ratio"] > 0, x
life = cases["create+seal+get+release+release+delete (6 requests)"]
assert life["unit"] == "us" and "round trips" in life["baseline"]["name"], life
big = cases["get+release of a sealed 32MiB object"]
assert big["unit"] == "GB/s" and big["baseline"]["name"] == "memcpy 1 thread", big
' || { echo "FAIL: bench store --quick --json"; echo "$out"; exit 1; }
echo "ok bench store"
