#!/usr/bin/env bash
# mgpu bench trace --quick --json: the recorder's cost per span next to
# tracing off, the pool and the 64 MiB all-reduce with tracing on next to
# off; the pool's recording really kept events (one span per task at
# least). With MGPU_TRACE set it refuses (it records its own traces).
set -euo pipefail
mgpu=$1
out=$("$mgpu" bench trace --quick --json)
echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["bench"] == "trace", r
cases = {x["case"]: x for x in r["results"]}
span = cases["mgpu_trace_span, one thread"]
assert span["unit"] == "ns/op" and span["value"] > 0, span
assert span["baseline"]["name"] == "tracing off" and span["baseline"]["value"] > 0, span
sched = [x for c, x in cases.items() if c.startswith("sched:") and x["unit"] == "ns/task"]
assert len(sched) == 1 and sched[0]["baseline"]["name"] == "tracing off", sched
assert cases["sched: events per task"]["value"] >= 1, cases
# The cost per event is a figure or, within its noise, no figure: never a
# negative cost.
ev = cases["sched: cost per recorded event"]
assert ev["noise"] > 0, ev
if ev.get("below_noise"):
    assert ev["value"] is None, ev
else:
    assert ev["value"] > ev["noise"], ev
ar = [x for c, x in cases.items() if c.startswith("allreduce 64MiB")]
assert len(ar) == 1 and ar[0]["value"] > 0 and ar[0]["baseline"]["value"] > 0, ar
' || { echo "FAIL: bench trace --quick --json"; echo "$out"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
set +e
MGPU_TRACE="$dir/t.json" "$mgpu" bench trace --quick >/dev/null 2>"$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q "MGPU_TRACE" "$dir/err" ||
  { echo "FAIL: bench trace under MGPU_TRACE should exit 1 (got $rc)"; exit 1; }
echo "ok bench trace"
