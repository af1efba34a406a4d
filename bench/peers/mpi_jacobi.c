/* A Jacobi solver on MPI ranks, the peer of `mgpu bench jacobi`: the
 * problem of examples/jacobi.h (NVIDIA's multi-GPU Jacobi pattern: an n x n
 * grid, its first row held at 1 and the other edges at 0, the interior rows
 * cut into one slab per rank, each slab with a halo row above and below)
 * written as an MPI program would write it: a 5-point sweep of the slab,
 * then MPI_Sendrecv of the edge rows into the neighbours' halos. The sweep
 * is the example kernel's own function (examples/jacobi-sweep.h), so both
 * compute the same floats with the same machine code, aligned alike.
 *
 *   mpirun --oversubscribe -np 2 ./mpi_jacobi [--quick] [--reps N]
 *          [--sizes 256,1024,4096] [--check K] [--raw] [--gate DIR]
 *
 * Each repetition times a batch of sweeps between two barriers; a
 * repetition's time is the slowest rank's, the figure the median over
 * repetitions after a warm-up, per sweep. --check K first runs K sweeps
 * from the initial grid and prints the sum of the squares of the grid's
 * cells (what `mgpu bench jacobi` compares with its own grid after K
 * iterations, so that both are seen to do the same work). With --raw, one
 * line per size: "n seconds-per-sweep checksum".
 *
 * With --gate DIR (one size), the ranks run a batch at a time when told,
 * so that `mgpu bench jacobi` can time its own batches and the peers'
 * alternately, each side over the same seconds of a machine whose speed
 * drifts: rank r reads commands from the FIFO DIR/go.r (opened read-write,
 * so that it blocks in read() without polling until a command comes, and
 * never sees an end of file), 'r' running one batch and 'q' ending; rank 0
 * prints "ready checksum" once every rank has its FIFO open, then the
 * slowest rank's seconds per sweep of each batch, a line each. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/jacobi-sweep.h"
#include "gate.h"
#include "jacobi-batch.h"
#include "median.h"

typedef struct slab {
  int n, rows;     /* grid size, interior rows of this rank */
  int first;       /* the grid's row of this rank's first one */
  int up, down;    /* neighbouring ranks, MPI_PROC_NULL at the grid's edge */
  float *a, *anew; /* (rows + 2) x n: a halo row above and below */
} slab;

static void slab_init(slab *s, int n, int rank, int size) {
  s->n = n;
  s->rows = (n - 2) / size + (rank < (n - 2) % size);
  s->first = 1 + rank * ((n - 2) / size) +
             (rank < (n - 2) % size ? rank : (n - 2) % size);
  s->up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
  s->down = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
  size_t cells = (size_t)(s->rows + 2) * (size_t)n;
  s->a = calloc(cells, sizeof(float));
  s->anew = calloc(cells, sizeof(float));
  if (s->a == NULL || s->anew == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  if (rank == 0) /* the grid's first row, the first rank's halo above */
    for (int x = 0; x < n; x++) s->a[x] = s->anew[x] = 1.0f;
  /* The inside at 0.5, as examples/jacobi.h starts it (no subnormal
   * floats): the slab's rows and the halos that are inside cells. */
  for (int y = 0; y < s->rows + 2; y++) {
    int row = s->first + y - 1; /* the grid's row */
    if (row < 1 || row > n - 2) continue;
    for (int x = 1; x < n - 1; x++)
      s->a[(size_t)y * n + x] = s->anew[(size_t)y * n + x] = 0.5f;
  }
}

/* One sweep, then the halo exchange, then the swap. */
static void sweep(slab *s) {
  int n = s->n;
  jacobi_sweep(s->a, s->anew, n, 1, s->rows + 1);
  MPI_Sendrecv(s->anew + (size_t)n, n, MPI_FLOAT, s->up, 0,
               s->anew + (size_t)(s->rows + 1) * n, n, MPI_FLOAT, s->down, 0,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Sendrecv(s->anew + (size_t)s->rows * n, n, MPI_FLOAT, s->down, 1,
               s->anew, n, MPI_FLOAT, s->up, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  float *t = s->a;
  s->a = s->anew;
  s->anew = t;
}

/* The sum of the squares of the interior rows' cells (rank 0 gets it). */
static double checksum(const slab *s) {
  double mine = 0, all = 0;
  for (size_t i = (size_t)s->n; i < (size_t)(s->rows + 1) * s->n; i++)
    mine += (double)s->a[i] * s->a[i];
  MPI_Reduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  return all;
}

/* One timed batch of iters sweeps: the slowest rank's seconds per sweep
 * (rank 0 gets it). */
static double batch(slab *s, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int it = 0; it < iters; it++) sweep(s);
  double mine = (MPI_Wtime() - t0) / iters, slowest = 0;
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  return slowest;
}

/* --gate: batches of iters sweeps of s as DIR/go.<rank> says (see the
 * top of the file). */
static void serve(slab *s, int iters, const char *dir, int rank,
                  double sum) {
  int fd = peer_gate_open("mpi_jacobi", dir, rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    printf("ready %.17g\n", sum);
    fflush(stdout);
  }
  while (peer_gate_next(fd)) {
    double t = batch(s, iters);
    if (rank == 0) {
      printf("%.9g\n", t);
      fflush(stdout);
    }
  }
  close(fd);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int quick = 0, reps = 0, raw = 0, check = 0;
  const char *gate = NULL;
  int sizes[8] = {256, 1024, 4096}, nsizes = 3;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--check") == 0 && i + 1 < argc) check = atoi(argv[++i]);
    else if (strcmp(argv[i], "--gate") == 0 && i + 1 < argc) gate = argv[++i];
    else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      nsizes = 0;
      for (char *p = argv[++i]; *p != '\0' && nsizes < 8;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < size + 2 || v > 65536) break;
        sizes[nsizes++] = (int)v;
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  if (reps < 1) reps = quick ? 3 : 7;
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  if (gate != NULL) {
    slab s;
    slab_init(&s, sizes[0], rank, size);
    for (int it = 0; it < check; it++) sweep(&s);
    serve(&s, jacobi_batch(sizes[0], quick), gate, rank, checksum(&s));
    free(s.a);
    free(s.anew);
    free(t);
    MPI_Finalize();
    return 0;
  }
  if (rank == 0 && !raw)
    printf("bench jacobi: MPI, %d ranks (median per sweep)\n", size);
  for (int k = 0; k < nsizes; k++) {
    slab s;
    slab_init(&s, sizes[k], rank, size);
    for (int it = 0; it < check; it++) sweep(&s);
    double sum = checksum(&s);
    int iters = jacobi_batch(sizes[k], quick);
    for (int rep = -1; rep < reps; rep++) {
      double slowest = batch(&s, iters);
      if (rep >= 0) t[rep] = slowest;
    }
    free(s.a);
    free(s.anew);
    if (rank != 0) continue;
    double med = peer_median(t, reps);
    if (raw)
      printf("%d %.9g %.17g\n", sizes[k], med, sum);
    else
      printf("jacobi %dx%d  %10.3f us per sweep  (after %d sweeps: sum of "
             "squares %.10g)\n", sizes[k], sizes[k], med * 1e6, check, sum);
    fflush(stdout);
  }
  free(t);
  MPI_Finalize();
  return 0;
}
