#!/usr/bin/env bash
# The layer check (tools/check-layers.py): it passes on the tree as it is,
# and on a copy of src/ it fails, naming the file, for a deliberately wrong
# include of each kind: a layer below (core including copy), sideways (chan
# including coll), and a folder that has no layer. Then the symbol check:
# it passes on the build, and on a copy of the build's objects it fails,
# naming the object and the symbol, for a planted call of each kind: an
# upward call through a local prototype, an `extern`, a public header, a
# sideways call, a plugin calling into the library, the MPI module calling
# an internal function, and a tool calling CUDA.
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

build=$3
command -v readelf >/dev/null || { echo "readelf not found: symbol check skipped"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "no C compiler: symbol check skipped"; exit 77; }
python3 "$check" --build "$build" || fail "the build itself breaks the layer order"

# A copy of the build's objects (hard links where the file system allows),
# with one planted object at a time.
objs=$tmp/build
fresh_objs() {
  rm -rf "$objs"
  (cd "$build" && find . -name '*.o' -print) | while read -r o; do
    mkdir -p "$objs/$(dirname "$o")"
    ln "$build/$o" "$objs/$o" 2>/dev/null || cp "$build/$o" "$objs/$o"
  done
}
# plant DIR NAME SOURCE: compiles SOURCE as DIR/NAME.c.o of the copy.
plant() {
  mkdir -p "$objs/$1"
  printf '%s\n' "$3" >"$tmp/$2.c"
  "$cc" -c -I"$src/include" -I"$src/src" -o "$objs/$1/$2.c.o" "$tmp/$2.c" ||
    fail "cannot compile the planted $2.c"
}
expect_sym() {
  local obj=$1 sym=$2 why=$3
  python3 "$check" --build "$objs" >"$tmp/out" 2>&1
  local rc=$?
  grep -v "^check-layers: every include" "$tmp/out"
  [ $rc -eq 1 ] || fail "symbol check passed (rc $rc) with $obj referencing $sym"
  grep -q "^$obj: references $sym, .*$why" "$tmp/out" ||
    fail "output does not name $obj, $sym and '$why'"
}

fresh_objs
python3 "$check" --build "$objs" >/dev/null || fail "the copy of the build fails before any change"

lib=CMakeFiles/mgpu_objects.dir/src
plant $lib/util plant 'int mgpu_init(const void *c); int f(void) { return mgpu_init(0); }'
expect_sym $lib/util/plant.c.o mgpu_init "a layer below util"

fresh_objs
plant $lib/core plant 'extern int mgpu_memcpy(); int f(void) { return mgpu_memcpy(); }'
expect_sym $lib/core/plant.c.o mgpu_memcpy "a layer below core"

fresh_objs
plant $lib/obs plant '#include "mgpu/core.h"
int f(void) { return mgpu_init(NULL); }'
expect_sym $lib/obs/plant.c.o mgpu_init "a layer below obs"

fresh_objs
plant $lib/chan plant 'int mgpu_allreduce(); int f(void) { return mgpu_allreduce(); }'
expect_sym $lib/chan/plant.c.o mgpu_allreduce "sideways"

fresh_objs
plant src/backend/cuda/CMakeFiles/mgpu_cuda.dir plant 'int mgpu_init(const void *c); int f(void) { return mgpu_init(0); }'
expect_sym src/backend/cuda/CMakeFiles/mgpu_cuda.dir/plant.c.o mgpu_init "a plugin links nothing"

fresh_objs
plant src/mpi/CMakeFiles/mgpu_mpi.dir plant 'void mgpu__error(int c, const char *f, ...); void f(void) { mgpu__error(0, ""); }'
expect_sym src/mpi/CMakeFiles/mgpu_mpi.dir/plant.c.o mgpu__error "not a public call"

fresh_objs
plant CMakeFiles/mgpu_tool.dir/tools plant 'int cudaMalloc(void **p, unsigned long n); int f(void) { void *p; return cudaMalloc(&p, 1); }'
expect_sym CMakeFiles/mgpu_tool.dir/tools/plant.c.o cudaMalloc "only the cuda plugin"

# mgpu._core, which `import mgpu` loads, calls no MPI (only mgpu._mpi does).
fresh_objs
plant python/CMakeFiles/mgpu_python.dir plant 'int MPI_Initialized(int *flag); int f(void) { int y; return MPI_Initialized(&y); }'
expect_sym python/CMakeFiles/mgpu_python.dir/plant.c.o MPI_Initialized "only the MPI module"

echo "check-layers: every wrong reference was refused"
