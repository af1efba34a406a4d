#!/usr/bin/env bash
# The internal-name check (tools/check-names.py): on the build, every global
# mgpu__ symbol defined by an object of src/ (libmgpu, the CUDA and OpenCL
# plugins, the MPI module) is referenced by another object; on a copy of the
# build's objects with a planted object defining an mgpu__ function no one
# calls, in libmgpu's objects or in a plugin's or module's, the check of all
# of src/ fails naming object and symbol.
# Usage: internal-names.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
src=$2 build=$3
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
command -v nm >/dev/null || { echo "nm not found: skipped"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "no C compiler: skipped"; exit 77; }
check=$src/tools/check-names.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$check" --build "$build" ||
  fail "an mgpu__ function is used only in its own file: make it static"

# A copy of the build's objects (hard links where the file system allows)
# with one planted object of src/core.
objs=$tmp/build
(cd "$build" && find . -name '*.o' -print) | while read -r o; do
  mkdir -p "$objs/$(dirname "$o")"
  ln "$build/$o" "$objs/$o" 2>/dev/null || cp "$build/$o" "$objs/$o"
done
lib=CMakeFiles/mgpu_objects.dir/src
printf 'int mgpu__lonely(void);\nint mgpu__lonely(void) { return 1; }\n' \
  >"$tmp/lonely.c"
"$cc" -c -o "$objs/$lib/core/lonely.c.o" "$tmp/lonely.c" ||
  fail "cannot compile the planted object"
python3 "$check" --build "$objs" core >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ $rc -eq 1 ] || fail "check passed (rc $rc) with mgpu__lonely used nowhere"
grep -q "^$lib/core/lonely.c.o: defines mgpu__lonely, used by no other object$" \
  "$tmp/out" || fail "output does not name the object and mgpu__lonely"

# The same in the objects of targets outside libmgpu (CMake keeps them
# under the target's own folder): found with no folder named.
for dir in src/mpi/CMakeFiles/mgpu_mpi.dir src/backend/opencl/CMakeFiles/mgpu_opencl.dir \
  src/backend/cuda/CMakeFiles/mgpu_cuda.dir; do
  rm -f "$objs/$lib/core/lonely.c.o"
  mkdir -p "$objs/$dir"
  "$cc" -c -o "$objs/$dir/lonely.c.o" "$tmp/lonely.c" ||
    fail "cannot compile the planted object"
  python3 "$check" --build "$objs" >"$tmp/out" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "check of src/ passed (rc $rc) with $dir/lonely.c.o"
  grep -q "^$dir/lonely.c.o: defines mgpu__lonely, used by no other object$" \
    "$tmp/out" || fail "output does not name $dir/lonely.c.o: $(cat "$tmp/out")"
  rm -f "$objs/$dir/lonely.c.o"
done

python3 "$check" --build "$objs" nowhere >/dev/null 2>&1
[ $? -eq 2 ] || fail "a folder without objects was not a usage error"

echo "internal-names: every mgpu__ symbol is shared, and a lonely one is refused"
