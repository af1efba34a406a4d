# MPI_Allreduce, the peer of `mgpu bench allreduce`
# (bench/peers/mpi_allreduce.c), a Jacobi solver on MPI ranks, the peer
# of `mgpu bench jacobi` (bench/peers/mpi_jacobi.c), MPI_Barrier, the
# peer of `mgpu bench barrier` (bench/peers/mpi_barrier.c), and a ping-pong
# of MPI_Send and MPI_Recv, the peer of the channel rows of `mgpu bench
# launch` (bench/peers/mpi_pingpong.c). Built only when an MPI
# C library is found; run them with
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_allreduce --json
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_jacobi
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_barrier
#   mpirun --allow-run-as-root --oversubscribe -np 2 build/libexec/mgpu/mpi_pingpong
# and their MPICH builds (below) with
#   mpiexec.mpich -n N build/libexec/mgpu/mpi_barrier_mpich
find_package(MPI QUIET COMPONENTS C)
if(MPI_C_FOUND)
  add_executable(mpi_allreduce ${CMAKE_SOURCE_DIR}/bench/peers/mpi_allreduce.c)
  target_link_libraries(mpi_allreduce PRIVATE MPI::MPI_C)
  add_executable(mpi_jacobi ${CMAKE_SOURCE_DIR}/bench/peers/mpi_jacobi.c)
  target_link_libraries(mpi_jacobi PRIVATE MPI::MPI_C)
  add_executable(mpi_barrier ${CMAKE_SOURCE_DIR}/bench/peers/mpi_barrier.c)
  target_link_libraries(mpi_barrier PRIVATE MPI::MPI_C)
  add_executable(mpi_pingpong ${CMAKE_SOURCE_DIR}/bench/peers/mpi_pingpong.c)
  target_link_libraries(mpi_pingpong PRIVATE MPI::MPI_C)
endif()

# The same peers once more against MPICH where its compiler wrapper is
# installed beside an Open MPI found above (Debian's mpicc.mpich), as
# <name>_mpich, so that each figure compared with MPI stands next to both
# MPIs: the command runs these with mpiexec.mpich. Built with the wrapper
# itself (CMake finds one MPI per build).
# Which MPI that is (its mpi.h says): the command runs MPICH's peers with
# mpiexec.mpich and names their rows MPICH, Open MPI's with mpirun.
set(MGPU_MPI_IS_MPICH OFF)
if(MPI_C_FOUND)
  include(CheckSymbolExists)
  set(CMAKE_REQUIRED_INCLUDES ${MPI_C_INCLUDE_DIRS})
  set(CMAKE_REQUIRED_QUIET ON)
  check_symbol_exists(MPICH_VERSION "mpi.h" MGPU_MPI_H_IS_MPICH)
  unset(CMAKE_REQUIRED_INCLUDES)
  unset(CMAKE_REQUIRED_QUIET)
  set(MGPU_MPI_IS_MPICH ${MGPU_MPI_H_IS_MPICH})
endif()
if(MGPU_MPI_IS_MPICH)
  target_compile_definitions(mgpu_tool PRIVATE MGPU_MAIN_MPI_IS_MPICH=1)
endif()

find_program(MGPU_MPICC_MPICH mpicc.mpich)
mark_as_advanced(MGPU_MPICC_MPICH)
if(MGPU_MPI_IS_MPICH)
  set(MGPU_MPICH_NOTE "ON (the MPI found is MPICH: the peers above are MPICH's, and Open MPI has none)")
elseif(NOT MGPU_MPICC_MPICH)
  set(MGPU_MPICH_NOTE "OFF (no mpicc.mpich: the benchmarks compare with one MPI)")
else()
  set(MGPU_MPICH_NOTE "ON (${MGPU_MPICC_MPICH}: MPICH baselines of bench allreduce, barrier, jacobi and launch)")
  file(GLOB _deps ${CMAKE_SOURCE_DIR}/bench/peers/*.h)
  list(APPEND _deps ${CMAKE_SOURCE_DIR}/examples/jacobi-sweep.h)
  foreach(_peer mpi_allreduce mpi_barrier mpi_jacobi mpi_pingpong)
    set(_out ${MGPU_HELPER_OUTPUT_DIRECTORY}/${_peer}_mpich)
    add_custom_command(OUTPUT ${_out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${MGPU_HELPER_OUTPUT_DIRECTORY}
      COMMAND ${MGPU_MPICC_MPICH} -O2 -std=gnu11 -Wall -Wextra -o ${_out}
              ${CMAKE_SOURCE_DIR}/bench/peers/${_peer}.c -lm
      DEPENDS ${CMAKE_SOURCE_DIR}/bench/peers/${_peer}.c ${_deps}
      VERBATIM)
    add_custom_target(${_peer}_mpich ALL DEPENDS ${_out})
    install(PROGRAMS ${_out} DESTINATION ${MGPU_INSTALL_HELPERDIR})
    list(APPEND MGPU_BUILT_HELPERS ${_peer}_mpich)
  endforeach()
endif()
