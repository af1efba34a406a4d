/* MPI's ping-pong (Open MPI's, or MPICH's in its _mpich build), the MPI
 * peer of the channel rows of `mgpu bench launch`: rank 0 sends a message with MPI_Send, rank 1
 * receives it with MPI_Recv and sends it back; the figure is the round
 * trip, printed as one line per size, or with --raw as "bytes seconds"
 * (what `mgpu bench launch` reads when it runs this program beside
 * itself).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_pingpong
 *
 * Sizes are 8 B and 4 KiB (the channel rows'), or those given with
 * --bytes N (repeatable). Each repetition times a batch of back-to-back
 * round trips (--iters, 2000 by default) on rank 0; the figure is the
 * median over --reps repetitions (7 by default) after a warm-up, as in
 * mgpu's benchmark. Ranks beyond the first two only take part in the
 * barriers.
 *
 * With --gate DIR (bench/peers/gate.h), the ranks run one batch of each
 * size at a time when told, so that `mgpu bench launch` can time its own
 * round trips and these in turn: rank 0 prints "ready" once both ranks
 * have their FIFOs open, then for each batch one line of seconds per
 * round trip, a figure per size in the order given. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gate.h"
#include "median.h"

#define MAXSIZES 8

/* Seconds per round trip of `bytes` between ranks 0 and 1, one batch. */
static double batch(int rank, char *buf, int bytes, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int it = 0; it < iters; it++) {
    if (rank == 0) {
      MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - t0) / iters;
}

/* --gate: a batch of each size at a time, as DIR/go.<rank> says. */
static void serve(const char *dir, int rank, char *buf, const int *sizes,
                  int nsizes, int iters) {
  int fd = peer_gate_open("mpi_pingpong", dir, rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    printf("ready\n");
    fflush(stdout);
  }
  while (peer_gate_next(fd)) {
    for (int k = 0; k < nsizes; k++) {
      double s = batch(rank, buf, sizes[k] > 0 ? sizes[k] : 1, iters);
      if (rank == 0) printf("%s%.9g", k ? " " : "", s);
    }
    if (rank == 0) {
      printf("\n");
      fflush(stdout);
    }
  }
  close(fd);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int raw = 0, reps = 7, iters = 2000, nsizes = 0, sizes[MAXSIZES];
  const char *gate = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--gate") == 0 && i + 1 < argc)
      gate = argv[++i];
    else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc &&
             nsizes < MAXSIZES)
      sizes[nsizes++] = atoi(argv[++i]);
  }
  if (nsizes == 0) {
    sizes[0] = 8;
    sizes[1] = 4096;
    nsizes = 2;
  }
  if (reps < 1) reps = 1;
  if (iters < 1) iters = 1;
  if (n < 2) {
    fprintf(stderr, "mpi_pingpong: needs 2 ranks, has %d\n", n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int most = 1;
  for (int k = 0; k < nsizes; k++)
    if (sizes[k] > most) most = sizes[k];
  double *t = malloc((size_t)reps * sizeof *t);
  char *buf = calloc(1, (size_t)most);
  if (t == NULL || buf == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  if (gate != NULL) {
    serve(gate, rank, buf, sizes, nsizes, iters);
    nsizes = 0;
  }
  for (int k = 0; k < nsizes; k++) {
    int bytes = sizes[k] > 0 ? sizes[k] : 1;
    for (int rep = -1; rep < reps; rep++) { /* -1: warm-up */
      double s = batch(rank, buf, bytes, iters);
      if (rep >= 0) t[rep] = s;
    }
    if (rank != 0) continue;
    double med = peer_median(t, reps);
    if (raw)
      printf("%d %.9g\n", bytes, med);
    else
      printf("MPI ping-pong, %d B: %.4g us a round trip\n", bytes, med * 1e6);
    fflush(stdout);
  }
  free(buf);
  free(t);
  MPI_Finalize();
  return 0;
}
