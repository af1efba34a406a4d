#!/usr/bin/env bash
# The mgpu command: devices (table and JSON), version, the vecadd demo, and
# the exit codes: 2 for a bad argument (with usage), 1 for a runtime failure
# (with the error and its detail).
set -euo pipefail
mgpu=$1
err=$(mktemp)
trap 'rm -f "$err"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(MGPU_DEVICES=host:4 "$mgpu" devices --json)
echo "$out" | python3 -c '
import json, sys
devs = json.load(sys.stdin)
assert len(devs) == 4, devs
for i, d in enumerate(devs):
    assert d["id"] == i and d["backend"] == "host", d
    for k in ("name", "total_mem", "free_mem"):
        assert k in d, (k, d)
' || fail "devices --json under host:4"

MGPU_DEVICES=host:3 "$mgpu" devices | grep -q "host device 2" || fail "devices table"
"$mgpu" version | grep -Eq '^mgpu [0-9]+\.[0-9]+\.[0-9]+$' || fail "version"
"$mgpu" version --json | python3 -c '
import json, sys
v = json.load(sys.stdin)
assert v["version"] == "%d.%d.%d" % (v["major"], v["minor"], v["patch"]), v
assert set(v["built_with"]) == {"cuda", "nccl", "mpi", "hwloc"}, v
' || fail "version --json"
MGPU_DEVICES=host:4 "$mgpu" demo vecadd 100003 | grep -q "all 100003 elements correct" || fail "demo vecadd"

set +e
# A measurement size whose bytes wrap (2^44+1 MiB) or are too large is
# refused, not taken for 1 MiB.
for size in 17592186044417M 2G 12Q; do
  MGPU_DEVICES=host:2 "$mgpu" topo --measure "$size" >/dev/null 2>"$err"; rc=$?
  [ $rc -eq 2 ] && grep -q "bad size" "$err" || fail "topo --measure $size should exit 2 (got $rc)"
done
"$mgpu" devices --bogus >/dev/null 2>"$err"; rc=$?
[ $rc -eq 2 ] && grep -q usage "$err" || fail "bad option should exit 2 with usage (got $rc)"
"$mgpu" frobnicate >/dev/null 2>"$err"; rc=$?
[ $rc -eq 2 ] || fail "unknown command should exit 2 (got $rc)"
"$mgpu" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no command should exit 2 (got $rc)"
"$mgpu" demo vecadd zero >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "bad demo size should exit 2 (got $rc)"
# 2^62 floats: the byte count wraps; it must be refused, not crash.
MGPU_DEVICES=host:2 "$mgpu" demo vecadd 4611686018427387904 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "a demo size whose bytes overflow should exit 2 (got $rc)"
MGPU_DEVICES=host:2,warp:9 "$mgpu" devices >/dev/null 2>"$err"; rc=$?
[ $rc -eq 1 ] && grep -q "MGPU_EINVAL" "$err" && grep -q "warp:9" "$err" ||
  fail "bad MGPU_DEVICES should exit 1 naming the token (got $rc: $(cat "$err"))"
# A benchmark refuses an argument it does not take (or one too many),
# naming it, before it runs anything.
for args in "sched extra" "trace extra" "launch extra" "barrier extra" \
            "store extra" "allreduce extra" "graph 2 3" "copy 1M 2M" \
            "p2p 1M 2M" "jacobi 64 128 256 512"; do
  set -- $args
  last=${*: -1}
  MGPU_DEVICES=host:2 timeout 60 "$mgpu" bench $args >/dev/null 2>"$err"; rc=$?
  [ $rc -eq 2 ] && grep -q "unexpected argument $last" "$err" ||
    fail "bench $args should exit 2 naming '$last' (got $rc: $(cat "$err"))"
done
echo "cli: ok"
