#!/usr/bin/env bash
# mgpu topo --json and mgpu bench p2p --json --quick, with host devices
# allowed to copy directly and with MGPU_HOST_PEER=none: each must print one
# valid JSON object whose facts agree with the setting.
# Usage: topo-json.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
mgpu=$1
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Bad arguments print usage and exit 2.
"$mgpu" topo --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "mgpu topo --bogus did not exit 2"
"$mgpu" topo --measure 12Q >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad --measure size did not exit 2"

for peer in "" none; do
  echo "== MGPU_HOST_PEER=${peer:-unset}"
  MGPU_HOST_PEER=$peer "$mgpu" topo --json >"$tmp/topo.json" || fail "mgpu topo --json failed"
  python3 -m json.tool "$tmp/topo.json" >/dev/null || fail "topo JSON does not parse"
  MGPU_HOST_PEER=$peer "$mgpu" topo --json --measure 1M >"$tmp/topo-m.json" || fail "mgpu topo --measure failed"
  python3 -m json.tool "$tmp/topo-m.json" >/dev/null || fail "measured topo JSON does not parse"
  MGPU_HOST_PEER=$peer "$mgpu" bench p2p --json --quick >"$tmp/p2p.json" || fail "mgpu bench p2p failed"
  python3 -m json.tool "$tmp/p2p.json" >/dev/null || fail "p2p JSON does not parse"
  PEER=$peer python3 - "$tmp/topo.json" "$tmp/topo-m.json" "$tmp/p2p.json" <<'PY' || fail "JSON content"
import json, os, sys
topo, measured, p2p = (json.load(open(f)) for f in sys.argv[1:4])
none = os.environ["PEER"] == "none"
n = topo["devices"]
assert n >= 1 and len(topo["device"]) == n and len(topo["links"]) == n * n
assert topo["measured"] is False and measured["measured"] is True
host = topo["device"][0]["backend"] == "host"
for l in topo["links"]:
    assert l["bandwidth_gbps"] is None
    if l["src"] == l["dst"]:
        assert l["kind"] == "same-device" and l["path"] == "device", l
    elif host:
        want = ("staged", "staged") if none else ("host-memory", "direct")
        assert (l["kind"], l["path"]) == want, l
for l in measured["links"]:
    assert l["bandwidth_gbps"] > 0 and l["latency_us"] > 0, l
assert p2p["bench"] == "p2p" and p2p["devices"] == n
res = p2p["results"]
if n >= 2:
    assert res, "no results"
    cases = [r["case"] for r in res]
    for r in res:
        assert r["value"] > 0 and "baseline" in r and r["ratio"] > 0, r
    if host:
        assert any(c.startswith("staged 0->1 ") for c in cases), cases
        assert any(c.startswith("direct") for c in cases) != none, cases
print("ok: %d devices, %d p2p figures" % (n, len(res)))
PY
done
echo "PASS"
