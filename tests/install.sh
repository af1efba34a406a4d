#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds a small program
# against the installed copy both ways: pkg-config and CMake's
# find_package(mgpu) with its imported target. Both programs must run.
set -euo pipefail
src=$2
build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -n1)
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
  # A static link of libmgpu.a with what `pkg-config --static` lists (hwloc
  # among it when the build uses hwloc).
  cc -std=c11 -o "$tmp/app-static" "$tmp/app.c" \
    $(pkg-config --cflags --static --libs mgpu | sed 's/-lmgpu\b/-l:libmgpu.a/')
  if ldd "$tmp/app-static" | grep -q libmgpu; then
    echo "install: the static program loads libmgpu.so" >&2
    exit 1
  fi
  MGPU_DEVICES=host:2 "$tmp/app-static" | grep -q "2 devices"
  echo "install: pkg-config ok (shared, rpath, static)"
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
# The installed command starts with no LD_LIBRARY_PATH (its rpath is
# $ORIGIN/../lib) and uses the library installed beside it.
(unset LD_LIBRARY_PATH; MGPU_DEVICES=host:2 "$tmp/prefix/bin/mgpu" devices >/dev/null)
ldd "$tmp/prefix/bin/mgpu" | grep libmgpu | grep -q "$tmp/prefix"
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
