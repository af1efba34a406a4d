#!/usr/bin/env bash
# mgpu bench sched --quick --json prints both cases for every policy: the
# empty-task overhead for each device count up to 4 the machine has, with
# its plain thread-pool baseline (and StarPU eager's when its peer was
# built), and the skewed makespan with its ideal. A command whose helpers
# are not beside it says that the peer is missing, not that it was not
# built.
set -euo pipefail
mgpu=$1
build=$3
out=$("$mgpu" bench sched --quick --json)
echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["bench"] == "sched", r
n = min(r["devices"], 4)
counts = [c for c in (1, 2, 4) if c <= n]
cases = {}
for x in r["results"]:
    cases.setdefault(x["case"], []).append(x)
for pol in ("static", "dynamic", "ws"):
    for c in counts:
        rows = cases["empty task, %d dev, %s" % (c, pol)]
        names = [x["baseline"]["name"] for x in rows]
        assert names[0] == "plain thread pool", rows
        assert set(names) <= {"plain thread pool", "StarPU eager"}, rows
        for x in rows:
            assert x["unit"] == "ns/task" and x["value"] > 0, x
            assert x["baseline"]["value"] > 0, x
    x = cases["skewed 2000 tasks, %d dev, %s" % (r["devices"], pol)][0]
    assert x["unit"] == "ms" and x["value"] > 0 and x["baseline"]["value"] > 0, x
    assert x["ratio"] >= 0.9, x   # no schedule beats the ideal
' || { echo "FAIL: bench sched --quick --json"; echo "$out"; exit 1; }
if [ -x "$build/libexec/mgpu/starpu_sched" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/bin"
  cp "$mgpu" "$tmp/bin/mgpu"
  MGPU_DEVICES=host:1 "$tmp/bin/mgpu" bench sched --quick --reps 1 >/dev/null 2>"$tmp/err" ||
    { echo "FAIL: bench sched away from its helpers"; cat "$tmp/err"; exit 1; }
  grep -q "starpu_sched is missing" "$tmp/err" && ! grep -q "not built" "$tmp/err" ||
    { echo "FAIL: away from its helpers, the reason given: $(cat "$tmp/err")"; exit 1; }
fi
echo "ok bench sched"
