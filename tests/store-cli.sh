#!/usr/bin/env bash
# mgpu store ... and mgpud from the command line: put a file, list it, get it
# back byte for byte, delete it, and read the daemon's counts as JSON.
# Usage: store-cli.sh MGPU_TOOL SOURCE_DIR BUILD_DIR
set -euo pipefail
mgpu=$1
build=$3
dir=$(mktemp -d /tmp/mgpu-store-cli-XXXXXX)
sock=$dir/store.sock
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
export MGPU_DEVICES=${MGPU_DEVICES:-host:4}

"$build/bin/mgpud" --socket "$sock" 2>"$dir/daemon.log" &
daemon=$!
for _ in $(seq 200); do
  timeout 10 "$mgpu" store --socket "$sock" stat >/dev/null 2>&1 && break
  sleep 0.05
done

# The object goes on device 2 of host:4, wrapped onto the devices open
# elsewhere (one CUDA device: device 0).
ndev=$(timeout 30 "$mgpu" store --socket "$sock" stat --json |
  python3 -c 'import json, sys; print(len(json.load(sys.stdin)["devices"]))')
[ "$MGPU_DEVICES" != host:4 ] || [ "$ndev" = 4 ]
dev=$((2 % ndev))

head -c 300000 /dev/urandom >"$dir/in.bin"
id=$(timeout 30 "$mgpu" store --socket "$sock" put "$dir/in.bin" --name data --device "$dev")
[ "$id" -ge 1 ]
timeout 30 "$mgpu" store --socket "$sock" put "$dir/in.bin" --name data 2>"$dir/err" && exit 1
grep -q MGPU_EEXIST "$dir/err"
# A capacity that is not a size is refused with a reason (a negative one
# wrapped to 16 EiB before).
rc=0
timeout 30 "$mgpu" store serve --socket "$dir/other.sock" --capacity -5 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--capacity -5: expected a size" "$dir/err"
# A name of digits only would read as an id in get and rm: refused.
rc=0
timeout 30 "$mgpu" store --socket "$sock" put "$dir/in.bin" --name 123 2>"$dir/err" || rc=$?
[ "$rc" = 2 ]
grep -q "digits only" "$dir/err"

timeout 30 "$mgpu" store --socket "$sock" ls --json >"$dir/ls.json"
python3 - "$dir/ls.json" "$id" <<'PY'
import json, sys
objs = json.load(open(sys.argv[1]))
assert len(objs) == 1, objs
o = objs[0]
assert o["id"] == int(sys.argv[2]) and o["name"] == "data", o
assert o["bytes"] == 300000 and o["sealed"] and o["refs"] == 0, o
PY

timeout 30 "$mgpu" store --socket "$sock" get data "$dir/out1.bin"
timeout 30 "$mgpu" store --socket "$sock" get "$id" "$dir/out2.bin"
cmp "$dir/in.bin" "$dir/out1.bin"
cmp "$dir/in.bin" "$dir/out2.bin"

timeout 30 "$mgpu" store --socket "$sock" stat --json >"$dir/stat.json"
python3 - "$dir/stat.json" "$ndev" "$dev" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ndev, dev = int(sys.argv[2]), int(sys.argv[3])
assert s["objects"] == 1 and s["refs"] == 0 and s["clients"] == 1, s
assert len(s["devices"]) == ndev, s
assert s["devices"][dev]["in_use"] == 300000, s
PY

timeout 30 "$mgpu" store --socket "$sock" rm data --json | grep -q '"deferred": false'
timeout 30 "$mgpu" store --socket "$sock" get data "$dir/out3.bin" 2>"$dir/err" && exit 1
grep -q MGPU_ENOENT "$dir/err"
timeout 30 "$mgpu" store --socket "$sock" stat --json | grep -q '"objects": 0'

# A second daemon on a live socket is refused; the first stops cleanly.
timeout 30 "$build/bin/mgpud" --socket "$sock" 2>"$dir/err2" && exit 1
grep -q "MGPU_EALREADY" "$dir/err2"
grep -q "a daemon is already serving $sock (pid $daemon)" "$dir/err2"
kill "$daemon"
status=0
wait "$daemon" || status=$?
daemon=""
[ "$status" = 0 ] || { cat "$dir/daemon.log"; exit 1; }
[ ! -e "$sock" ]
[ ! -e "$sock.lock" ]

# A device that is not a number is an error, not device 0.
timeout 30 "$mgpu" store --socket "$sock" put "$dir/in.bin" --device abc 2>"$dir/err" && exit 1
grep -q "not a device number" "$dir/err"

# A regular file where the socket should be is never removed.
echo "keep me" >"$dir/file"
timeout 30 "$build/bin/mgpud" --socket "$dir/file" 2>"$dir/err3" && exit 1
grep -q "MGPU_EEXIST" "$dir/err3"
grep -q "is not a socket" "$dir/err3"
[ "$(cat "$dir/file")" = "keep me" ]
echo "store-cli: ok"
