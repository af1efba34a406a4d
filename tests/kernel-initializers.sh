#!/usr/bin/env bash
# mgpu_kernel in the examples and the docs is filled with designated
# initializers: code copied from them builds clean with -Wextra however the
# struct grows (it grew opencl_src, and three positional values then draw
# -Wmissing-field-initializers). Every `mgpu_kernel NAME = {` of examples/,
# docs/ and README.md must start with a `.field =`; and the documented form,
# with one variant only, compiles against include/ with -Wall -Wextra -Werror.
# Usage: kernel-initializers.sh MGPU_BINARY SOURCE_DIR BUILD_DIR
set -u
src=$2
build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Each initializer with the text after its brace, joined over line breaks.
bad=$(cd "$src" && grep -rn -A1 --include='*.c' --include='*.h' \
        --include='*.md' -E 'mgpu_kernel [A-Za-z_0-9]+ *= *\{' \
        examples docs README.md |
      awk '/mgpu_kernel [A-Za-z_0-9]+ *= *\{/ { line = $0; rest = $0;
             sub(/.*= *\{ */, "", rest);
             if (rest == "") { getline nxt; sub(/^[^-]*-[0-9]+-[ \t]*/, "", nxt); rest = nxt }
             if (rest !~ /^\./) print line }')
[ -z "$bad" ] || fail "positional mgpu_kernel initializers:
$bad"

cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "no C compiler: skipped"; exit 77; }
cat > "$tmp/k.c" <<'C'
#include <mgpu.h>
static void k_host(const mgpu_kernel_ctx *ctx, const void *args) {
  (void)ctx;
  (void)args;
}
const mgpu_kernel k = {.name = "k", .host_fn = k_host};
int main(void) { return k.cuda_fn == NULL && k.opencl_src == NULL ? 0 : 1; }
C
"$cc" -std=c11 -Wall -Wextra -Werror -I"$src/include" -I"$build/include" \
  -o "$tmp/k" "$tmp/k.c" || fail "the documented initializer does not build clean"
"$tmp/k" || fail "fields left out are not NULL"
echo "ok"
