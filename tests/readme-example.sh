#!/usr/bin/env bash
# Compiles the first C block of README.md exactly as it stands, links it to
# the freshly built library and runs it on four host devices.
set -euo pipefail
src=$2
build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^```c$/ {on=1; next} /^```$/ && on {exit} on {print}' "$src/README.md" > "$tmp/first.c"
[ -s "$tmp/first.c" ] || { echo "no C block in README.md" >&2; exit 1; }
cc -std=c11 -Wall -Wextra -Werror -I"$src/include" -I"$build/include" \
  -o "$tmp/first" "$tmp/first.c" -L"$build/lib" -lmgpu -Wl,-rpath,"$build/lib"
MGPU_DEVICES=host:4 "$tmp/first" | grep -q "x\[12345\] = 24690, computed on 4 devices"
echo "readme example: ok"
