#!/usr/bin/env bash
# The layer check (tools/check-layers.py): it passes on the tree as it is,
# and on a copy of src/ it fails, naming the file, for a deliberately wrong
# include of each kind: a layer below (core including copy), sideways (chan
# including coll), and a folder that has no layer.
# Usage: check-layers.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
src=$2
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check=$src/tools/check-layers.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$check" || fail "the tree itself breaks the layer order"

# Expects the check on the copy to fail, naming file and what.
expect_fail() {
  local file=$1 what=$2
  python3 "$check" --root "$tmp" >"$tmp/out" 2>&1
  local rc=$?
  cat "$tmp/out"
  [ $rc -eq 1 ] || fail "check passed (rc $rc) with $file including $what"
  grep -q "^$file:[0-9]*: includes \"$what\"" "$tmp/out" ||
    grep -q "^$file: folder" "$tmp/out" || fail "output does not name $file"
}

fresh() { rm -rf "$tmp/src"; cp -r "$src/src" "$tmp/src"; }

fresh
python3 "$check" --root "$tmp" >/dev/null || fail "the copy fails before any change"

echo '#include "copy/copy-internal.h"' >>"$tmp/src/core/init.c"
expect_fail src/core/init.c copy/copy-internal.h

fresh
echo '#include "coll/coll_internal.h"' >>"$tmp/src/chan/channel.c"
expect_fail src/chan/channel.c coll/coll_internal.h

fresh
echo '#include "mgpu/sched.h"' >>"$tmp/src/obs/metrics.c"
expect_fail src/obs/metrics.c mgpu/sched.h

fresh
mkdir -p "$tmp/src/nowhere"
echo '#include "util/log.h"' >"$tmp/src/nowhere/x.c"
expect_fail src/nowhere/x.c util/log.h

echo "check-layers: every wrong include was refused"
