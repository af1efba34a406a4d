/* The 5-point Jacobi sweep on the host, in one function that every host
 * program of the Jacobi comparison runs: the host kernel of
 * examples/jacobi.h (on each of its blocks), its single-threaded
 * reference, and the MPI peer of `mgpu bench jacobi`
 * (bench/peers/mpi_jacobi.c).
 *
 * Why one function, with its start and its loops aligned to 64 bytes: the
 * same loop, compiled alike, ran at 35 or at 53 us per half of a 256^2
 * grid with two threads busy on the 2-vCPU build machine, depending only
 * on whether its inner loop's 44 bytes crossed a 64-byte line of code. The
 * MPI peers and the mgpu command each landed on one side or the other of
 * that line, so a comparison of the runtimes measured where the linker
 * put a loop. Aligned, every binary runs the same machine code the same
 * way (GCC; Clang aligns the function only). */
#ifndef MGPU_EXAMPLES_JACOBI_SWEEP_H
#define MGPU_EXAMPLES_JACOBI_SWEEP_H

#include <stddef.h>

#if defined(__GNUC__) && !defined(__clang__)
#define JACOBI_SWEEP_ATTR \
  __attribute__((noipa, aligned(64), optimize("align-loops=64")))
#elif defined(__GNUC__)
#define JACOBI_SWEEP_ATTR __attribute__((noinline, aligned(64)))
#else
#define JACOBI_SWEEP_ATTR
#endif

/* Rows lo..hi-1 of out (columns 1..nx-2) from in, both nx floats a row:
 * each cell a quarter of the sum of its four neighbours, added in the
 * order up, down, left, right, so that every caller computes the same
 * floats. */
static JACOBI_SWEEP_ATTR void jacobi_sweep(const float *in, float *out,
                                           int nx, int lo, int hi) {
  for (int r = lo; r < hi; r++)
    for (int c = 1; c < nx - 1; c++) {
      const float *p = in + (size_t)r * nx + c;
      out[(size_t)r * nx + c] = 0.25f * (p[-nx] + p[nx] + p[-1] + p[1]);
    }
}

#endif /* MGPU_EXAMPLES_JACOBI_SWEEP_H */
