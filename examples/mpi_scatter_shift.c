/* mpi_scatter_shift: one process per device under mpirun, the scatter /
 * shift / gather lesson of mpi4py + Numba in C.
 *
 *   mpirun -np 4 ./mpi_scatter_shift
 *
 * Rank 0 draws N x size numbers in [0, 1) and uploads them to its device;
 * mgpu_mpi_scatter hands every rank its N numbers in a buffer on its own
 * device (staged through pinned memory where MPI cannot read device
 * memory); each rank shifts them by -0.5 on its device with the built-in
 * axpy kernel; mgpu_mpi_gather brings them back to rank 0, which checks
 * that every element is exactly shifted and that the mean is near 0. A
 * failing rank aborts the job.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <mgpu.h>
#include <mgpu/mpi.h>

#include "mpi_check.h"

#define N ((size_t)100003) /* per rank, not a multiple of anything */

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  CHECK(mgpu_mpi_init(MPI_COMM_WORLD, NULL));
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t total = N * (size_t)size;

  double *host = NULL;
  mgpu_buffer *all = NULL; /* rank 0: every number, on its device 0 */
  if (rank == 0) {
    host = malloc(total * sizeof *host);
    if (host == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    srand(42);
    for (size_t i = 0; i < total; i++) host[i] = rand() / (RAND_MAX + 1.0);
    CHECK(mgpu_malloc(&all, 0, total * sizeof(double)));
    CHECK(mgpu_memcpy_htod(all, 0, host, total * sizeof(double)));
  }
  mgpu_buffer *part, *half;
  CHECK(mgpu_malloc(&part, 0, N * sizeof(double)));
  CHECK(mgpu_malloc(&half, 0, N * sizeof(double)));
  CHECK(mgpu_mpi_scatter(all, 0, part, 0, N, MGPU_FLOAT64, 0, MPI_COMM_WORLD,
                         NULL));

  /* part -= 0.5, on this rank's device */
  mgpu_stream *s;
  CHECK(mgpu_stream_create(&s, 0));
  double h = 0.5;
  CHECK(mgpu_fill(s, half, 0, N, MGPU_FLOAT64, &h));
  CHECK(mgpu_axpy(s, part, 0, half, 0, N, MGPU_FLOAT64, -1.0));

  CHECK(mgpu_mpi_gather(part, 0, all, 0, N, MGPU_FLOAT64, 0, MPI_COMM_WORLD,
                        s));
  int bad = 0;
  if (rank == 0) {
    double *back = malloc(total * sizeof *back), sum = 0;
    if (back == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK(mgpu_memcpy_dtoh(back, all, 0, total * sizeof(double)));
    for (size_t i = 0; i < total; i++) {
      if (back[i] != host[i] - 0.5) {
        if (bad++ < 5)
          fprintf(stderr, "element %zu: %.17g, expected %.17g\n", i, back[i],
                  host[i] - 0.5);
      }
      sum += back[i];
    }
    double mean = sum / (double)total;
    printf("%d ranks x %zu numbers: mean after the shift %.5f, %d wrong\n",
           size, N, mean, bad);
    if (fabs(mean) > 0.01) bad++;
    free(back);
    free(host);
    CHECK(mgpu_free(all));
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(mgpu_stream_destroy(s));
  CHECK(mgpu_free(half));
  CHECK(mgpu_free(part));
  CHECK(mgpu_mpi_finalize());
  MPI_Finalize();
  return bad ? 1 : 0;
}
