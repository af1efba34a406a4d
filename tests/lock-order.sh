#!/usr/bin/env bash
# The library's one lock order is written twice on purpose: as the ranks of
# MGPU__LOCK_RANKS in src/util/thread.h, which lock-checking builds enforce,
# and as the table of docs/ARCHITECTURE.md ("Lock order"), which says what
# each lock guards. This fails when the two lists differ (a rank missing,
# added or moved), when a rank is given to no mutex, and when a mutex of
# libmgpu escapes the ranks (a raw pthread_mutex_t outside util/thread.[ch]
# and the plugins, or a static mgpu__mutex without its rank). The import
# map's header defaults to a plain mutex for the CUDA plugin; libmgpu's
# includer (backend/host/ipc.c) makes it a ranked one.
# Usage: lock-order.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
src=$2
fail() { echo "FAIL: $*"; exit 1; }

code=$(sed -n 's/^ *X(MGPU__LOCK_\([A-Z_]*\),.*/\1/p' "$src/src/util/thread.h")
doc=$(awk '/^## Lock order$/ {on = 1; next} /^## / {on = 0}
           on && /^\| `[A-Z_]*` \|/ {print}' "$src/docs/ARCHITECTURE.md" |
      sed 's/^| `\([A-Z_]*\)`.*/\1/')
[ -n "$code" ] || fail "no ranks found in src/util/thread.h"
[ -n "$doc" ] || fail "no lock table found in docs/ARCHITECTURE.md"
if [ "$code" != "$doc" ]; then
  diff <(echo "$code") <(echo "$doc")
  fail "src/util/thread.h (<) and docs/ARCHITECTURE.md (>) list the ranks differently"
fi
echo "$(echo "$code" | wc -l) ranks, the same in code and doc"

for rank in $code; do
  grep -rqE "MGPU__LOCK_$rank\b" --include='*.c' "$src/src" ||
    fail "rank $rank is given to no mutex in src/"
done

raw=$(grep -rn 'pthread_mutex_t\|pthread_mutex_init' --include='*.[ch]' "$src/src" |
      grep -v "^$src/src/util/thread\.[ch]:" |
      grep -v "^$src/src/backend/cuda/" | grep -v "^$src/src/backend/opencl/" |
      grep -v "^$src/src/backend/import-map\.h:")
[ -z "$raw" ] || { echo "$raw"; fail "a mutex of libmgpu without a rank"; }
unranked=$(grep -rn 'mgpu__mutex [a-z_]* *= *PTHREAD_MUTEX_INITIALIZER' \
             --include='*.[ch]' "$src/src")
[ -z "$unranked" ] || { echo "$unranked"; fail "a static mutex without a rank"; }
echo "every mutex of libmgpu has its rank"
