#!/usr/bin/env bash
# mgpu demo mandelbrot on host:4, as `make run` runs it but smaller: it
# writes both pictures, its trace and the timeline; the trace is Chrome
# trace-event JSON with spans on every device, steal arrows paired by id and
# memory counters; the check against one device passes; no progress bar
# when stderr is not a terminal. Then `mgpu trace view` on the trace (PNG
# read back for its size, SVG), and its errors.
set -euo pipefail
mgpu=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

MGPU_DEVICES=host:4 "$mgpu" demo mandelbrot --size 512x384 --iters 400 \
  --tile 32 --out "$out" >"$out/stdout" 2>"$out/stderr" ||
  fail "demo failed: $(cat "$out/stderr")"
grep -q "check: every one of 196608 pixels equals the one-device run" "$out/stdout" ||
  fail "no pixel check in: $(cat "$out/stdout")"
grep -Eq "speedup on 4 devices: [0-9.]+x" "$out/stdout" || fail "no speedup"
for d in 0 1 2 3; do
  grep -Eq "^$d +host device $d +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+%" "$out/stdout" ||
    fail "no table row for device $d"
done
[ ! -s "$out/stderr" ] || fail "stderr is not a terminal, yet: $(cat "$out/stderr")"
if [ -f "$out/mandelbrot.png" ]; then ext=png; else ext=ppm; fi
for f in "mandelbrot.$ext" "mandelbrot-devices.$ext" mandelbrot-trace.json; do
  [ -s "$out/$f" ] || fail "$f missing"
done
ls "$out"/mandelbrot-timeline.* >/dev/null || fail "timeline missing"
[ ! -e "$out/mandelbrot-trace.json.tmp" ] || fail "temporary trace left behind"

python3 - "$out/mandelbrot-trace.json" <<'PY' || fail "trace content"
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
assert t["otherData"]["dropped_events"] == 0
names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
for d in range(4):
    assert f"device {d}: host device {d}" in names, names
    spans = [e for e in ev if e["ph"] == "X" and e["pid"] == d]
    assert any(e["name"] == "kernel mandel" for e in spans), d
    assert any(e["name"] == "task" for e in spans), d
    assert all(e["dur"] >= 0 for e in spans)
    assert any(e["ph"] == "C" and e["pid"] == d and e["name"] == "memory in use" for e in ev), d
starts = {e["id"]: e for e in ev if e["ph"] == "s" and e["name"] == "steal"}
ends = {e["id"]: e for e in ev if e["ph"] == "f" and e["name"] == "steal"}
assert starts and starts.keys() == ends.keys(), (len(starts), len(ends))
for i, s in starts.items():
    assert s["pid"] != ends[i]["pid"] and ends[i]["bp"] == "e"
tasks = [e for e in ev if e["ph"] == "X" and e["name"] == "task"]
assert len(tasks) == 16 * 12, len(tasks)
assert sum(1 for e in tasks if e["args"]["stolen_from"] >= 0) == len(starts)
PY

"$mgpu" trace view "$out/mandelbrot-trace.json" -o "$out/t.svg" --width 900 |
  grep -Eq "4 processes, 12 lanes" || fail "trace view svg"
head -c 4 "$out/t.svg" | grep -q "<svg" || fail "svg content"
set +e
"$mgpu" trace view "$out/missing.json" -o "$out/x.svg" 2>"$out/err"; rc=$?
[ $rc -eq 1 ] && grep -q "missing.json" "$out/err" || fail "missing trace should exit 1 (got $rc)"
"$mgpu" trace view "$out/mandelbrot-trace.json" -o "$out/x.jpg" 2>"$out/err"; rc=$?
[ $rc -eq 1 ] && grep -q ".svg" "$out/err" || fail "bad picture name should exit 1 (got $rc)"
"$mgpu" trace view >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no arguments should exit 2 (got $rc)"
MGPU_DEVICES=host:2 "$mgpu" demo mandelbrot --tile 7 >/dev/null 2>"$out/err"; rc=$?
[ $rc -eq 2 ] || fail "a bad tile size should exit 2 (got $rc)"
grep -q -- "--tile: from 16 to 1024" "$out/err" || fail "no reason for the bad tile: $(cat "$out/err")"
MGPU_DEVICES=host:2 "$mgpu" demo mandelbrot --size 1x1 >/dev/null 2>"$out/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--size: width and height from 16" "$out/err" ||
  fail "no reason for the bad size (rc $rc): $(cat "$out/err")"
echo ok
