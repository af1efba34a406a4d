# Open MPI's MPI_Allreduce, the peer of `mgpu bench allreduce`
# (bench/peers/mpi_allreduce.c), a Jacobi solver on MPI ranks, the peer
# of `mgpu bench jacobi` (bench/peers/mpi_jacobi.c), and MPI_Barrier, the
# peer of `mgpu bench barrier` (bench/peers/mpi_barrier.c). Built only when an MPI
# C library is found; run them with
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_allreduce --json
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_jacobi
#   mpirun --allow-run-as-root --oversubscribe -np N build/libexec/mgpu/mpi_barrier
find_package(MPI QUIET COMPONENTS C)
if(MPI_C_FOUND)
  add_executable(mpi_allreduce ${CMAKE_SOURCE_DIR}/bench/peers/mpi_allreduce.c)
  target_link_libraries(mpi_allreduce PRIVATE MPI::MPI_C)
  add_executable(mpi_jacobi ${CMAKE_SOURCE_DIR}/bench/peers/mpi_jacobi.c)
  target_link_libraries(mpi_jacobi PRIVATE MPI::MPI_C)
  add_executable(mpi_barrier ${CMAKE_SOURCE_DIR}/bench/peers/mpi_barrier.c)
  target_link_libraries(mpi_barrier PRIVATE MPI::MPI_C)
endif()
