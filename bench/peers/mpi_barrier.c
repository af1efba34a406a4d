/* MPI_Barrier (Open MPI's, or MPICH's in its _mpich build), the peer of
 * `mgpu bench barrier`: the time per
 * barrier across the ranks of one machine, printed as one line, or with
 * --raw as "ranks seconds" (what `mgpu bench barrier` reads when it runs
 * this program beside itself).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_barrier
 *
 * Each repetition times a batch of back-to-back barriers (--iters, 20000
 * by default) on every rank; a repetition's time is the slowest rank's, the
 * figure the median over --reps repetitions (7 by default) after a
 * warm-up, as in mgpu's benchmark. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "median.h"

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int raw = 0, reps = 7, iters = 20000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
      iters = atoi(argv[++i]);
  }
  if (reps < 1) reps = 1;
  if (iters < 1) iters = 1;
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int rep = -1; rep < reps; rep++) { /* -1: warm-up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) MPI_Barrier(MPI_COMM_WORLD);
    double mine = (MPI_Wtime() - t0) / iters, slowest;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rep >= 0) t[rep] = slowest;
  }
  if (rank == 0) {
    double med = peer_median(t, reps);
    if (raw)
      printf("%d %.9g\n", n, med);
    else
      printf("MPI_Barrier, %d ranks: %.4g us\n", n, med * 1e6);
  }
  free(t);
  MPI_Finalize();
  return 0;
}
