# Open MPI's MPI_Allreduce, the peer of `mgpu bench allreduce`
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

# The ping-pong once more against MPICH where its compiler wrapper is
# installed beside the MPI found above (Debian's mpicc.mpich), so that the
# channel rows of `mgpu bench launch` stand next to the faster of the two
# MPIs: it runs this one with mpiexec.mpich. Built with the wrapper itself
# (CMake finds one MPI per build); not where the MPI found is MPICH.
find_program(MGPU_MPICC_MPICH mpicc.mpich)
mark_as_advanced(MGPU_MPICC_MPICH)
if(MGPU_MPICC_MPICH AND NOT MPI_C_COMPILER MATCHES "mpich" AND
   NOT MPI_C_LIBRARIES MATCHES "mpich")
  set(_mgpu_pp_mpich ${MGPU_HELPER_OUTPUT_DIRECTORY}/mpi_pingpong_mpich)
  add_custom_command(OUTPUT ${_mgpu_pp_mpich}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${MGPU_HELPER_OUTPUT_DIRECTORY}
    COMMAND ${MGPU_MPICC_MPICH} -O2 -o ${_mgpu_pp_mpich}
            ${CMAKE_SOURCE_DIR}/bench/peers/mpi_pingpong.c
    DEPENDS ${CMAKE_SOURCE_DIR}/bench/peers/mpi_pingpong.c
            ${CMAKE_SOURCE_DIR}/bench/peers/median.h
    VERBATIM)
  add_custom_target(mpi_pingpong_mpich ALL DEPENDS ${_mgpu_pp_mpich})
  install(PROGRAMS ${_mgpu_pp_mpich} DESTINATION ${MGPU_INSTALL_HELPERDIR})
  target_compile_definitions(mgpu_tool PRIVATE MGPU_PEER_MPI_PINGPONG_MPICH=1)
endif()
