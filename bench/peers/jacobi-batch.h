/* Iterations per timed batch of the Jacobi step, for `mgpu bench jacobi`
 * and its MPI peer alike (bench/peers/mpi_jacobi.c): about 2^26 cell
 * updates of an n x n grid, 10 to 1000 iterations (a tenth with quick, at
 * least 2), an even number (a captured graph holds two iterations). */
#ifndef MGPU_BENCH_JACOBI_BATCH_H
#define MGPU_BENCH_JACOBI_BATCH_H

static inline int jacobi_batch(int n, int quick) {
  long long it = (1LL << 26) / ((long long)n * n);
  if (it < 10) it = 10;
  if (it > 1000) it = 1000;
  if (quick) it = it / 10 > 2 ? it / 10 : 2;
  return (int)(it + (it & 1));
}

#endif /* MGPU_BENCH_JACOBI_BATCH_H */
