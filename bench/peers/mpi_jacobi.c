/* A Jacobi solver on MPI ranks, the peer of `mgpu bench jacobi`: NVIDIA's
 * multi-GPU Jacobi pattern (a 5-point sweep of an n x n grid split into
 * bands of rows, one band per rank, the halo rows exchanged with the
 * neighbouring ranks after every sweep, top and bottom periodic, the left
 * and right columns fixed at sin(2 pi y / (n - 1))) written as an MPI
 * program would write it: MPI_Sendrecv of the halo rows between sweeps.
 *
 *   mpirun --oversubscribe -np 2 ./mpi_jacobi [--quick] [--reps N]
 *          [--sizes 256,1024,4096] [--raw]
 *
 * Each repetition times a batch of sweeps between two barriers; a
 * repetition's time is the slowest rank's, the figure the median over
 * repetitions after a warm-up, per sweep. With --raw, one line per size:
 * "n seconds-per-sweep checksum", the checksum the sum of the squares of
 * the grid's cells after the warm-up and the timed sweeps (what `mgpu bench
 * jacobi` compares with its own grid, so that both did the same work). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../jacobi.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct band {
  int n, rows, y0; /* grid size, rows of this rank, first global row */
  int up, down;    /* neighbouring ranks (periodic) */
  float *a, *anew; /* (rows + 2) x n: a halo row above and below */
} band;

static void band_init(band *b, int n, int rank, int size) {
  b->n = n;
  b->rows = n / size + (rank < n % size);
  b->y0 = rank * (n / size) + (rank < n % size ? rank : n % size);
  b->up = (rank + size - 1) % size;
  b->down = (rank + 1) % size;
  size_t cells = (size_t)(b->rows + 2) * (size_t)n;
  b->a = calloc(cells, sizeof(float));
  b->anew = calloc(cells, sizeof(float));
  if (b->a == NULL || b->anew == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  jacobi_boundary(b->a, n, b->rows, b->y0);
  jacobi_boundary(b->anew, n, b->rows, b->y0);
}

/* One sweep, then the halo exchange, then the swap. */
static void sweep(band *b) {
  int n = b->n;
  jacobi_rows(b->anew, b->a, n, 1, b->rows + 1);
  MPI_Sendrecv(b->anew + (size_t)n, n, MPI_FLOAT, b->up, 0,
               b->anew + (size_t)(b->rows + 1) * n, n, MPI_FLOAT, b->down, 0,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Sendrecv(b->anew + (size_t)b->rows * n, n, MPI_FLOAT, b->down, 1,
               b->anew, n, MPI_FLOAT, b->up, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  float *t = b->a;
  b->a = b->anew;
  b->anew = t;
}

/* The sum of the squares of the grid's cells (rank 0 gets it). */
static double checksum(const band *b) {
  double mine = 0, all = 0;
  for (int y = 1; y <= b->rows; y++)
    for (int x = 0; x < b->n; x++) {
      double v = b->a[(size_t)y * b->n + x];
      mine += v * v;
    }
  MPI_Reduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  return all;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int quick = 0, reps = 0, raw = 0, sizes[8] = {256, 1024, 4096}, nsizes = 3;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      nsizes = 0;
      for (char *p = argv[++i]; *p != '\0' && nsizes < 8;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 8 || v > 65536) break;
        sizes[nsizes++] = (int)v;
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  if (reps < 1) reps = quick ? 3 : 7;
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  if (rank == 0 && !raw)
    printf("bench jacobi: MPI, %d ranks (median per sweep)\n", size);
  for (int s = 0; s < nsizes; s++) {
    band b;
    band_init(&b, sizes[s], rank, size);
    int iters = jacobi_iters(sizes[s], quick);
    for (int rep = -1; rep < reps; rep++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int it = 0; it < iters; it++) sweep(&b);
      double mine = (MPI_Wtime() - t0) / iters, slowest;
      MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rep >= 0) t[rep] = slowest;
    }
    double sum = checksum(&b);
    free(b.a);
    free(b.anew);
    if (rank != 0) continue;
    qsort(t, (size_t)reps, sizeof *t, cmp);
    double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    if (raw)
      printf("%d %.9g %.9g\n", sizes[s], med, sum);
    else
      printf("jacobi %dx%d  %10.3f us per sweep  (checksum %.6g)\n", sizes[s],
             sizes[s], med * 1e6, sum);
    fflush(stdout);
  }
  free(t);
  MPI_Finalize();
  return 0;
}
