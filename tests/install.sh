#!/usr/bin/env bash
# Installs the build into a temporary prefix, then:
# - reads the NEEDED entries of every installed ELF file and of the Python
#   package's files: only the CUDA side links CUDA or NCCL, only the MPI side
#   MPI (mgpu._mpi, never mgpu._core);
# - runs the installed Python package: `import mgpu` maps no MPI, and
#   mgpu.mpi runs under mpirun;
# - runs every installed program without LD_LIBRARY_PATH (their RUNPATH is
#   $ORIGIN-relative), and the command and `import mgpu` (with the README's
#   Python block) under a loader that cannot find CUDA's libraries;
# - builds a small program against the installed copy both ways, pkg-config
#   and CMake's find_package(mgpu) with its imported target, and runs it.
set -euo pipefail
src=$2
build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install: FAIL: $*" >&2; exit 1; }
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -n1)
libdir=${libdir%/}
# The wheel's files (the extensions, the shared libraries they link and the
# CUDA plugin beside them), as scikit-build-core installs them, where the
# build has the extension; with the package's Python files, the installed
# package in $tmp/pkg. A plain install leaves them out.
[ ! -e "$tmp/prefix/mgpu" ] || fail "make install put the Python package's files at the prefix's root"
ext=""
if ls "$build"/python/mgpu/_core*.so >/dev/null 2>&1; then
  cmake --install "$build" --component python --prefix "$tmp/wheel" >/dev/null
  ext=$(ls "$tmp"/wheel/mgpu/*.so*)
  mkdir -p "$tmp/pkg/mgpu"
  cp "$src"/python/mgpu/*.py "$tmp"/wheel/mgpu/* "$tmp/pkg/mgpu/"
fi
built_with=$(env -u LD_LIBRARY_PATH "$tmp/prefix/bin/mgpu" version --json) ||
  fail "the installed mgpu version --json did not run"
has() {
  echo "$built_with" | python3 -c "import json, sys; sys.exit(0 if json.load(sys.stdin)['built_with']['$1'] else 1)"
}

# NEEDED entries. The CUDA plugin and the demo's CUDA kernels (both opened
# with dlopen, only on CUDA devices) may link CUDA's runtime; nothing links
# libcuda or libnccl (the plugin opens NCCL with dlopen). MPI only for the
# MPI module, the helpers that are MPI programs and the Python package's
# mgpu._mpi (mgpu.mpi): `import mgpu` loads no MPI.
elves=$(find "$tmp/prefix" -type f | while read -r f; do
  if [ "$(head -c4 "$f" | tail -c3)" = "ELF" ]; then echo "$f"; fi; done)
[ -n "$elves" ] || fail "no ELF file installed"
checked=0
for f in $elves $ext; do
  name=$(basename "$f")
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  for lib in $needed; do
    case "$lib" in
      libcudart.so*)
        case "$name" in libmgpu-cuda.so|libmgpu-demo-cuda.so) ;;
          *) fail "$f carries NEEDED $lib: only the CUDA plugin may link CUDA" ;; esac ;;
      libcuda.so*|libnccl.so*)
        fail "$f carries NEEDED $lib: CUDA's driver and NCCL are opened with dlopen" ;;
      libmpi.so*|libmpich.so*)
        case "$name" in libmgpu_mpi.so*|mgpu-bench-mpi|mpi_allreduce|mpi_barrier|mpi_jacobi|mpi_pingpong|mpi_*_mpich|_mpi.*.so) ;;
          *) fail "$f carries NEEDED $lib: only the MPI module may link MPI" ;; esac ;;
    esac
  done
  checked=$((checked + 1))
done
echo "install: NEEDED entries of $checked files ok"

# Open MPI is not sanitizer-clean (it leaks at finalize): MPI programs run in
# plain builds only.
sanitized=$(grep -E '^MGPU_SANITIZE:STRING=.+' "$build/CMakeCache.txt" || true)
# A build against MPICH runs its peers as MPICH's, under their plain names:
# the MPI rows are asserted in builds against Open MPI.
mpich_main=$(grep -E '^MGPU_MPI_H_IS_MPICH:INTERNAL=1' "$build/CMakeCache.txt" || true)

# The Python package: each extension finds the libmgpu libraries it links
# beside it through an $ORIGIN RUNPATH, one file each (a wheel holds no
# links); `import mgpu` maps no MPI library, and mgpu.mpi runs under mpirun
# (where it was built, with mpi4py and outside sanitizer builds).
# _mpi's RUNPATH may also name the folders of MPI's own libraries, as the
# build found them (the linker adds them where MPI lives outside the
# system's folders); nothing else may be there.
mpi_dirs=$(sed -n 's/^MPI_[A-Za-z0-9_]*_LIBRARY:FILEPATH=\(.*\)\/[^/]*$/\1/p' \
  "$build/CMakeCache.txt" | sort -u)
if [ -n "$ext" ]; then
  for f in "$tmp"/pkg/mgpu/_*.so; do
    runpath=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
    case ":$runpath:" in
      *':$ORIGIN:'*) ;;
      *) fail "$f has RUNPATH '$runpath', not \$ORIGIN" ;;
    esac
    for entry in $(echo "$runpath" | tr ':' ' '); do
      [ "$entry" = '$ORIGIN' ] && continue
      case "$(basename "$f")" in
        _mpi.*) grep -qxF -- "$entry" <<<"$mpi_dirs" && continue ;;
      esac
      fail "$f has RUNPATH '$runpath': only \$ORIGIN (and MPI's folders for _mpi)"
    done
    for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(libmgpu.*\)\]/\1/p'); do
      [ -f "$tmp/pkg/mgpu/$lib" ] && [ ! -L "$tmp/wheel/mgpu/$lib" ] ||
        fail "$lib, linked by $(basename "$f"), is not a file beside it"
    done
  done
  ! ls "$tmp"/wheel/mgpu/libmgpu*.so.*.* >/dev/null 2>&1 || fail "the package holds a library twice: $(ls "$tmp"/wheel/mgpu)"
  if python3 -c "import numpy" 2>/dev/null && [ -r /proc/self/maps ]; then
    maps=$(cd "$tmp" && unset LD_LIBRARY_PATH && PYTHONPATH="$tmp/pkg" python3 -c '
import mgpu
mgpu.init(devices="host:2"); mgpu.shutdown()
print(open("/proc/self/maps").read())') || fail "the installed package: import mgpu"
    # A here-string, not a pipe: grep -q leaves at the first match, and
    # echo, writing the rest of a map over 64 KiB, died of SIGPIPE, which
    # pipefail took for a failure (a flaky FAIL under load).
    grep -q "$tmp/pkg/mgpu/libmgpu.so.0" <<<"$maps" || fail "import mgpu did not load the libmgpu beside it"
    ! grep -Eq '/lib(mpi|mpich|open-pal|open-rte)[._]' <<<"$maps" || fail "import mgpu loaded MPI"
    echo "install: the installed package finds libmgpu beside it; import mgpu loads no MPI"
  fi
  if [ -e "$tmp"/pkg/mgpu/_mpi.*.so ] && [ -z "$sanitized" ] &&
     command -v mpirun >/dev/null && python3 -c "import numpy, mpi4py" 2>/dev/null; then
    cat > "$tmp/ranks.py" <<'PY'
from mpi4py import MPI
import mgpu, mgpu.mpi
mgpu.mpi.init(MPI.COMM_WORLD, devices="host:2")
a = mgpu.full(4, MPI.COMM_WORLD.rank + 1.0, "float64", device=0)
mgpu.mpi.allreduce(a)
assert (a.numpy() == 3.0).all(), a.numpy()
mgpu.mpi.finalize()
print("rank %d ok" % MPI.COMM_WORLD.rank)
PY
    out=$(cd "$tmp" && unset LD_LIBRARY_PATH && PYTHONPATH="$tmp/pkg" OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=yes \
      OMPI_MCA_btl_vader_single_copy_mechanism=none \
      timeout 120 mpirun -np 2 python3 "$tmp/ranks.py" 2>&1) || fail "mgpu.mpi of the installed package under mpirun: $out"
    # The two ranks' lines reach mpirun's output in any order, and may share
    # a line: each rank's report is counted wherever it stands.
    [ "$(echo "$out" | grep -o 'rank [01] ok' | sort -u | wc -l)" = 2 ] || fail "mgpu.mpi of the installed package under mpirun printed: $out"
    echo "install: mgpu.mpi of the installed package runs under mpirun"
  fi
fi

# Every installed program starts with no LD_LIBRARY_PATH, from wherever the
# prefix is. The helpers are started with a bad option: each says its usage
# (exit 2) once it has loaded; a loader failure is exit 127.
(
  unset LD_LIBRARY_PATH
  MGPU_DEVICES=host:2 "$tmp/prefix/bin/mgpu" devices | grep -q "host device 1" ||
    fail "the installed mgpu devices"
  for f in $(find "$tmp/prefix/bin" "$tmp/prefix/libexec" -type f 2>/dev/null); do
    set +e
    out=$(timeout 60 "$f" --no-such-option 2>&1 </dev/null)
    rc=$?
    set -e
    case "$out" in *"error while loading shared libraries"*) fail "$f does not start: $out" ;; esac
    [ $rc -ne 127 ] && [ $rc -ne 126 ] || fail "$f does not start (exit $rc): $out"
  done
)
echo "install: every installed program starts without LD_LIBRARY_PATH"

# The helpers are where the command looks for them: `mgpu bench mpi` runs
# mgpu-bench-mpi as one rank (in plain builds: Open MPI is not
# sanitizer-clean, it leaks at finalize).
if has mpi && [ -z "$sanitized" ]; then
  [ -x "$tmp/prefix/libexec/mgpu/mgpu-bench-mpi" ] || fail "mgpu-bench-mpi not installed"
  [ -x "$tmp/prefix/libexec/mgpu/mpi_allreduce" ] || fail "mpi_allreduce not installed"
  for peer in mpi_allreduce mpi_barrier mpi_jacobi mpi_pingpong; do
    if [ -x "$build/libexec/mgpu/${peer}_mpich" ]; then
      [ -x "$tmp/prefix/libexec/mgpu/${peer}_mpich" ] || fail "${peer}_mpich not installed"
    fi
  done
  (unset LD_LIBRARY_PATH; MGPU_DEVICES=host:2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
     timeout 240 "$tmp/prefix/bin/mgpu" bench mpi --quick --reps 1 --json) |
    python3 -c 'import json, sys; r = json.load(sys.stdin); assert r["bench"] == "mpi" and r["results"], r' ||
    fail "the installed mgpu bench mpi"
  echo "install: mgpu bench mpi runs its installed helper"
fi
# The installed command finds its installed baselines: Open MPI's next to
# `bench allreduce` (where mpirun is there), StarPU's next to `bench sched`.
if [ -z "$sanitized$mpich_main" ] && [ -x "$tmp/prefix/libexec/mgpu/mpi_allreduce" ] &&
   command -v mpirun >/dev/null; then
  (unset LD_LIBRARY_PATH; MGPU_DEVICES=host:2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
     "$tmp/prefix/bin/mgpu" bench allreduce --quick --reps 1 --devices 2 --sizes 8 --json) |
    python3 -c '
import json, sys
rows = [r for r in json.load(sys.stdin)["results"] if r["metric"] == "busbw"]
names = {r["baseline"]["name"] for r in rows}
assert "Open MPI busbw" in names and names <= {"Open MPI busbw", "MPICH busbw"}, rows' ||
    fail "the installed mgpu bench allreduce has no Open MPI baseline"
  echo "install: bench allreduce finds its installed Open MPI baseline"
fi
if [ -z "$sanitized" ] && [ -x "$tmp/prefix/libexec/mgpu/starpu_sched" ]; then
  (unset LD_LIBRARY_PATH; MGPU_DEVICES=host:1 "$tmp/prefix/bin/mgpu" bench sched --quick --reps 1 --json) |
    python3 -c '
import json, sys
names = {r.get("baseline", {}).get("name") for r in json.load(sys.stdin)["results"]}
assert "StarPU eager" in names, names' ||
    fail "the installed mgpu bench sched has no StarPU baseline"
  echo "install: bench sched finds its installed StarPU baseline"
fi

# A loader that cannot find CUDA's libraries: ld.so without its cache
# searches only the system's own folders (CUDA lives in /usr/local). That
# CUDA's runtime and NCCL are hidden so is checked first (a dlopen of each
# fails there); the command and `import mgpu` with the README's Python block
# must run all the same.
ldso=$(readelf -l "$tmp/prefix/bin/mgpu" | sed -n 's/.*interpreter: \(.*\)\]/\1/p')
py=$(python3 -c "import sys; print(sys.executable)")
hidden=$(cd "$tmp" && unset LD_LIBRARY_PATH && "$ldso" --inhibit-cache "$py" -c '
import ctypes
found = []
for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "libnccl.so.2", "libcuda.so.1"):
    try:
        ctypes.CDLL(name)
        found.append(name)
    except OSError:
        pass
print(" ".join(found) if found else "hidden")')
if [ "$hidden" != "hidden" ]; then
  echo "install: $hidden found in a system folder here: the run without CUDA is skipped" >&2
else
  (unset LD_LIBRARY_PATH; "$ldso" --inhibit-cache "$tmp/prefix/bin/mgpu" version) |
    grep -Eq '^mgpu [0-9]' || fail "mgpu version where CUDA cannot be found"
  (unset LD_LIBRARY_PATH; MGPU_DEVICES=host:2 "$ldso" --inhibit-cache "$tmp/prefix/bin/mgpu" devices) |
    grep -q "host device 1" || fail "mgpu devices where CUDA cannot be found"
  if [ -n "$ext" ] && python3 -c "import numpy" 2>/dev/null; then
    awk '/^```python$/ {on=1; next} /^```$/ && on {exit} on {print}' "$src/README.md" > "$tmp/readme.py"
    out=$(cd "$tmp" && unset LD_LIBRARY_PATH && PYTHONPATH="$tmp/pkg" "$ldso" --inhibit-cache "$py" readme.py 2>&1) ||
      fail "import mgpu and README's Python block where CUDA cannot be found: $out"
    grep -q "\[7\. 7\. 7\. 7\.\]" <<<"$out" || fail "README's Python block printed: $out"
    echo "install: import mgpu and README's Python block run where CUDA cannot be found"
  fi
  echo "install: mgpu runs where CUDA cannot be found"
fi

cat > "$tmp/app.c" <<'C'
#include <mgpu.h>
#include <stdio.h>
int main(void) {
  if (mgpu_init(NULL) != 0) return 1;
  int n = mgpu_device_count();
  printf("mgpu %s: %d devices\n", mgpu_version_string(), n);
  mgpu_shutdown();
  return n > 0 ? 0 : 1;
}
C
# pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
if command -v pkg-config >/dev/null; then
  cc -std=c11 -o "$tmp/app-pc" "$tmp/app.c" $(pkg-config --cflags --libs mgpu)
  LD_LIBRARY_PATH="$libdir" MGPU_DEVICES=host:2 "$tmp/app-pc" | grep -q "2 devices"
  # What the README tells a user of a prefix outside the loader's path: an
  # rpath to pkg-config's libdir, so the program runs without LD_LIBRARY_PATH.
  cc -std=c11 -o "$tmp/app-rpath" "$tmp/app.c" $(pkg-config --cflags --libs mgpu) \
    -Wl,-rpath,"$(pkg-config --variable=libdir mgpu)"
  MGPU_DEVICES=host:2 "$tmp/app-rpath" | grep -q "2 devices"
  # hwloc is a pkg-config module of its own (Requires.private), so that
  # --static brings hwloc's own libraries, not a hard-coded -lhwloc.
  if has hwloc; then
    pkg-config --print-requires-private mgpu | grep -qx hwloc ||
      fail "mgpu.pc: hwloc is not in Requires.private"
  fi
  ! grep -q -- "-lhwloc" "$libdir/pkgconfig/mgpu.pc" || fail "mgpu.pc hard-codes -lhwloc"
  # A static link of libmgpu.a with what `pkg-config --static` lists. Each
  # library it names must be there to link (Debian: hwloc's libudev needs
  # libudev-dev); where one is not, that part says so and is skipped.
  static_libs=$(pkg-config --static --libs mgpu | sed 's/-lmgpu\b/-l:libmgpu.a/')
  missing=""
  for l in $static_libs; do
    case "$l" in -l:*|-lmgpu) ;; -l*)
      echo 'int main(void){return 0;}' | cc -x c - -o "$tmp/probe" $(pkg-config --libs-only-L mgpu) "$l" 2>/dev/null ||
        missing="$missing $l" ;;
    esac
  done
  kinds="shared, rpath, static"
  if [ -n "$missing" ]; then
    echo "install: static link skipped: cannot link$missing (Debian: apt-get install libudev-dev)" >&2
    kinds="shared, rpath"
  else
    cc -std=c11 -o "$tmp/app-static" "$tmp/app.c" $(pkg-config --cflags mgpu) $static_libs
    if ldd "$tmp/app-static" | grep -q libmgpu; then
      fail "the static program loads libmgpu.so"
    fi
    MGPU_DEVICES=host:2 "$tmp/app-static" | grep -q "2 devices"
  fi
  echo "install: pkg-config ok ($kinds)"
else
  echo "install: pkg-config not installed, skipping that half" >&2
fi
# CMake package
mkdir -p "$tmp/cm"
cat > "$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(mgpu REQUIRED)
add_executable(app ../app.c)
target_link_libraries(app PRIVATE mgpu::mgpu)
CM
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm/build" >/dev/null
LD_LIBRARY_PATH="$libdir" MGPU_DEVICES=host:3 "$tmp/cm/build/app" | grep -q "3 devices"
test -x "$tmp/prefix/bin/mgpu"
# The installed programs use the library installed beside them.
for f in "$tmp/prefix/bin/mgpu" "$tmp/prefix/bin/mgpud"; do
  (unset LD_LIBRARY_PATH; ldd "$f") | grep libmgpu | grep -q "$tmp/prefix" ||
    fail "$f does not load the libmgpu installed beside it"
done
echo "install: find_package ok"

# The MPI module, where it was built: mgpu-mpi.pc and the mgpu::mpi target,
# a program that runs as one rank without mpirun.
if [ -f "$libdir/pkgconfig/mgpu-mpi.pc" ]; then
  test -f "$tmp/prefix/include/mgpu/mpi.h"
  cat > "$tmp/app-mpi.c" <<'C'
#include <mgpu.h>
#include <mgpu/mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (mgpu_mpi_init(MPI_COMM_WORLD, NULL) != 0) return 1;
  mgpu_mpi_info info = {.size = sizeof info};
  if (mgpu_mpi_get_info(&info) != 0) return 1;
  printf("rank %d of %d: %d devices\n", info.rank, info.nranks, info.ndevices);
  mgpu_mpi_finalize();
  MPI_Finalize();
  return 0;
}
C
  if command -v pkg-config >/dev/null && command -v mpicc >/dev/null; then
    mpicc -std=c11 -o "$tmp/app-mpi-pc" "$tmp/app-mpi.c" $(pkg-config --cflags --libs mgpu-mpi)
    LD_LIBRARY_PATH="$libdir" MGPU_DEVICES=host:2 OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$tmp/app-mpi-pc" | grep -q "rank 0 of 1: 2 devices"
    echo "install: mgpu-mpi.pc ok"
  fi
  mkdir -p "$tmp/cm-mpi"
  cat > "$tmp/cm-mpi/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(app_mpi C)
find_package(mgpu REQUIRED)
add_executable(app_mpi ../app-mpi.c)
target_link_libraries(app_mpi PRIVATE mgpu::mpi)
CM
  cmake -S "$tmp/cm-mpi" -B "$tmp/cm-mpi/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
  cmake --build "$tmp/cm-mpi/build" >/dev/null
  LD_LIBRARY_PATH="$libdir" MGPU_DEVICES=host:3 OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$tmp/cm-mpi/build/app_mpi" | grep -q "rank 0 of 1: 3 devices"
  echo "install: mgpu::mpi ok"
fi
