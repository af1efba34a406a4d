# Sourced by the bench-*.sh tests (not a test itself): which MPI peers of
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
