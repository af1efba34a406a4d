# Sourced by the bench-*.sh tests (not a test itself). Which MPI peers of
# the mgpu command a test may expect rows of. `mpi_peers NAME` sets
#  - have_mpi: 1 when Open MPI's peer NAME was built and mpirun is there;
#  - have_mpich: 1 when MPICH's build of it (NAME_mpich) was made and
#    mpiexec.mpich is there;
# both 0 in sanitized builds (Open MPI leaks at finalize: the command still
# runs the peers there, but their rows are not asserted) and in builds
# against MPICH (whose peers run as MPICH's under their plain names).
# Reads $build, the build folder.
mpi_peers() {
  have_mpi=0
  have_mpich=0
  if grep -qE '^MGPU_SANITIZE:STRING=.+' "$build/CMakeCache.txt" ||
     grep -qE '^MGPU_MPI_H_IS_MPICH:INTERNAL=1' "$build/CMakeCache.txt"; then
    return 0
  fi
  if [ -x "$build/libexec/mgpu/$1" ] && command -v mpirun >/dev/null; then
    have_mpi=1
  fi
  if [ -x "$build/libexec/mgpu/$1_mpich" ] &&
     command -v mpiexec.mpich >/dev/null; then
    have_mpich=1
  fi
  return 0
}

# `failing_peer NAME LINES MESSAGE ARG...`: runs `mgpu ARG... --json` on
# host:2 from a copy of the command ($mgpu) in a folder of its own (its
# RUNPATH still finds libmgpu, at $stand_in/bin/mgpu), beside a stand-in
# helper NAME that prints LINES and exits 3: a peer that fails after
# printing its figures. The command must succeed and say MESSAGE on
# stderr; its JSON is left in $stand_in/out for the caller's checks. The
# folder goes at the script's exit.
failing_peer() {
  stand_in=$(mktemp -d)
  trap 'rm -rf "$stand_in"' EXIT
  mkdir -p "$stand_in/bin" "$stand_in/libexec/mgpu"
  cp "$mgpu" "$stand_in/bin/mgpu"
  local peer="$stand_in/libexec/mgpu/$1" message=$3
  printf '#!/bin/sh\nprintf "%s\\n"\nexit 3\n' "$2" >"$peer"
  chmod +x "$peer"
  shift 3
  MGPU_DEVICES=host:2 timeout 300 "$stand_in/bin/mgpu" "$@" --json \
    >"$stand_in/out" 2>"$stand_in/err" || fail "mgpu $* with a failing peer"
  grep -q "$message" "$stand_in/err" ||
    fail "mgpu $* with a failing peer, the reason given: $(cat "$stand_in/err")"
}
