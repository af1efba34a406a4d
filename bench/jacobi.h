/* The Jacobi step that `mgpu bench jacobi` and its MPI peer
 * (bench/peers/mpi_jacobi.c) both run, so that both do the same arithmetic:
 * NVIDIA's multi-GPU Jacobi pattern on an n x n grid of floats, split into
 * bands of rows, each band stored with one halo row above and one below.
 * The left and right columns are fixed at sin(2 pi y / (n - 1)); top and
 * bottom are periodic (the halo rows come from the neighbouring bands). */
#ifndef MGPU_BENCH_JACOBI_H
#define MGPU_BENCH_JACOBI_H

#include <math.h>
#include <stddef.h>

/* One sweep of rows [y0, y1) of a band (row 0 its halo above): anew gets
 * the mean of each cell's four neighbours in a; the fixed columns are left
 * as they are. */
static inline void jacobi_rows(float *restrict anew, const float *restrict a,
                               int n, int y0, int y1) {
  for (int y = y0; y < y1; y++) {
    const float *up = a + (size_t)(y - 1) * n, *row = a + (size_t)y * n,
                *down = a + (size_t)(y + 1) * n;
    float *out = anew + (size_t)y * n;
    for (int x = 1; x < n - 1; x++)
      out[x] = 0.25f * (row[x + 1] + row[x - 1] + down[x] + up[x]);
  }
}

/* Sets the fixed columns of a band of `rows` rows (plus its halos) whose
 * first row is global row y0 of an n x n grid. */
static inline void jacobi_boundary(float *a, int n, int rows, int y0) {
  const double pi = 3.14159265358979323846;
  for (int y = 0; y < rows + 2; y++) {
    int gy = ((y0 + y - 1) % n + n) % n;
    float v = (float)sin(2.0 * pi * gy / (n - 1));
    a[(size_t)y * n] = v;
    a[(size_t)y * n + n - 1] = v;
  }
}

/* Sweeps per timed batch for an n x n grid: about 2^26 cells updated, at
 * least 10 and at most 1000 sweeps (a tenth of that with quick). */
static inline int jacobi_iters(int n, int quick) {
  long long cells = (long long)n * n, it = (1LL << 26) / cells;
  if (it < 10) it = 10;
  if (it > 1000) it = 1000;
  return quick ? (int)(it / 10 > 2 ? it / 10 : 2) : (int)it;
}

#endif /* MGPU_BENCH_JACOBI_H */
