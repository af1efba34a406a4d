#!/usr/bin/env bash
# The function-length check (tools/check-functions.py): every function of
# src/ (backends, plugins and modules included) fits in 60 lines, and on a
# copy of src/ the check fails, naming file, line and function, for a planted
# function of 61 lines, while one of 60 lines (with braces inside strings,
# characters and comments, and a struct and an initializer beside it)
# passes; with no folder named it looks at every folder of src/, the MPI
# module and the CUDA plugin's .cu files too.
# Usage: function-length.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
src=$2
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check=$src/tools/check-functions.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$check" || fail "a function of src/ is over 60 lines"

# plant NAME LINES [FILE]: a file (src/core/NAME.c unless FILE, a path under
# src/) whose function NAME spans LINES lines, brace line to brace line (its
# first line is line 3).
plant() {
  rm -rf "$tmp/src"
  local file=${3:-core/$1.c}
  mkdir -p "$tmp/src/core" "$(dirname "$tmp/src/$file")"
  {
    echo 'struct shape { int a; };'
    echo 'static const int table[] = {1, 2, 3};'
    echo "int $1(int x) {"
    echo '  const char *s = "{{{"; char c = '"'{'"'; /* { */'
    for ((i = 5; i <= $2; i++)); do echo "  x += $i; // }"; done
    echo '  return x + s[0] + c;'
    echo '}'
  } >"$tmp/src/$file"
}

plant fits 60
python3 "$check" --root "$tmp" core || fail "a function of 60 lines was refused"

plant too_long 61
python3 "$check" --root "$tmp" core >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ $rc -eq 1 ] || fail "check passed (rc $rc) with a function of 61 lines"
grep -q "^src/core/too_long.c:3: too_long is 61 lines (limit 60)$" "$tmp/out" ||
  fail "output does not name src/core/too_long.c:3 and too_long"

# The folders the check once left out: the MPI module, the CUDA plugin's
# kernels, the OpenCL plugin, the host backend; found with no folder named.
for file in mpi/long_mpi.c backend/cuda/long_cuda.cu backend/opencl/long_ocl.c \
  backend/host/long_host.c; do
  name=$(basename "${file%.*}")
  plant "$name" 61 "$file"
  python3 "$check" --root "$tmp" >"$tmp/out" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "check of all of src/ passed (rc $rc) with src/$file"
  grep -q "^src/$file:3: $name is 61 lines (limit 60)$" "$tmp/out" ||
    fail "output does not name src/$file:3 and $name: $(cat "$tmp/out")"
  plant "$name" 60 "$file"
  python3 "$check" --root "$tmp" >/dev/null ||
    fail "a function of 60 lines in src/$file was refused"
done

python3 "$check" --root "$tmp" nowhere >/dev/null 2>&1
[ $? -eq 2 ] || fail "a folder that does not exist was not a usage error"

echo "function-length: every function fits, and a long one is refused"
