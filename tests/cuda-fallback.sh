#!/usr/bin/env bash
# The paths of a machine with no usable GPU (as CI is):
#  - MGPU_DEVICES=cuda fails cleanly (exit 1, no crash) with the CUDA error
#    named in the detail (cudaErrorNoDevice, cudaErrorInsufficientDriver ...),
#    and, where no driver is installed, saying that no GPU or driver was
#    found; where the plugin was not built, it says the plugin is missing;
#  - MGPU_DEVICES unset falls back to four host devices and says so under
#    MGPU_LOG=info.
# On a machine where a GPU is usable the first case cannot be shown: skip.
# Arguments: the mgpu binary, the source dir, the build dir.
set -u
mgpu=$1
build=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

fail() { echo "FAIL: $*"; for f in "$out"/*; do echo "--- $f"; cat "$f"; done; exit 1; }

# 1. MGPU_DEVICES=cuda
MGPU_DEVICES=cuda "$mgpu" devices >"$out/cuda.out" 2>"$out/cuda.err"
rc=$?
if [ $rc -eq 0 ]; then
  echo "a CUDA device is usable here: the no-GPU path cannot be tested"
  exit 77
fi
[ $rc -eq 1 ] || fail "MGPU_DEVICES=cuda: exit $rc, want 1 (a clean failure)"
if [ -e "$build/lib/libmgpu-cuda.so" ]; then
  grep -Eq 'cudaError[A-Za-z]+' "$out/cuda.err" ||
    fail "MGPU_DEVICES=cuda: the CUDA error is not named"
  grep -Eq 'MGPU_E(NODEV|BACKEND)' "$out/cuda.err" ||
    fail "MGPU_DEVICES=cuda: want MGPU_ENODEV or MGPU_EBACKEND"
  # Where no NVIDIA driver can be loaded at all, the message says that no
  # GPU or driver was found, not that the driver's version is insufficient.
  if ! python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
    grep -q 'MGPU_ENODEV' "$out/cuda.err" && grep -q 'no GPU or driver was found' "$out/cuda.err" ||
      fail "MGPU_DEVICES=cuda without a driver: want MGPU_ENODEV, 'no GPU or driver was found'"
    ! grep -q 'version is insufficient' "$out/cuda.err" ||
      fail "MGPU_DEVICES=cuda without a driver: the message speaks of an insufficient driver"
  fi
else
  grep -q 'MGPU_EPLUGIN' "$out/cuda.err" ||
    fail "MGPU_DEVICES=cuda without the plugin: want MGPU_EPLUGIN"
fi
echo "MGPU_DEVICES=cuda: $(cat "$out/cuda.err")"

# A plugin that is not there at all: MGPU_EPLUGIN, naming where it looked.
MGPU_DEVICES=cuda MGPU_PLUGIN_PATH=/nonexistent "$mgpu" devices >/dev/null 2>"$out/path.err"
[ $? -eq 1 ] || fail "MGPU_PLUGIN_PATH=/nonexistent: want exit 1"

# 2. MGPU_DEVICES unset: host:4, said under MGPU_LOG=info.
env -u MGPU_DEVICES MGPU_LOG=info "$mgpu" devices --json >"$out/unset.out" 2>"$out/unset.err" ||
  fail "MGPU_DEVICES unset: mgpu devices failed"
grep -q 'falling back to the host backend' "$out/unset.err" ||
  fail "MGPU_DEVICES unset: no info line about the fallback"
n=$(grep -o '"backend": *"host"' "$out/unset.out" | wc -l)
[ "$n" -eq 4 ] || fail "MGPU_DEVICES unset: $n host devices listed, want 4"
if [ -e "$build/lib/libmgpu-cuda.so" ]; then
  grep -Eq 'cudaError[A-Za-z]+' "$out/unset.err" ||
    fail "MGPU_DEVICES unset: the info line does not name the CUDA error"
fi
echo "MGPU_DEVICES unset: $(grep 'falling back' "$out/unset.err")"

# 3. Without MGPU_LOG nothing is printed.
env -u MGPU_DEVICES -u MGPU_LOG "$mgpu" devices >/dev/null 2>"$out/quiet.err" ||
  fail "MGPU_DEVICES unset, no MGPU_LOG: mgpu devices failed"
[ ! -s "$out/quiet.err" ] || fail "the library printed without MGPU_LOG"
echo ok
