/* mpi_mandelbrot: the rows of a Mandelbrot image over every device of every
 * rank, sent to rank 0 device to device, checked against one device.
 *
 *   mpirun -np 4 ./mpi_mandelbrot
 *
 * mgpu_mpi_init gives each rank its share of the node's devices; the image's
 * rows are cut into one block per device of every rank (global device g =
 * first_device + d). Each device computes its block with a kernel, then
 * every block travels to rank 0's result buffer with mgpu_mpi_isend /
 * mgpu_mpi_irecv (tag = the global device index). Rank 0 then computes the
 * whole image again on its device 0 alone and compares every pixel.
 *
 * The kernel's CUDA variant is compiled by nvcc into libmgpu-demo-cuda.so
 * (tools/cuda/mpi_mandel.cu) and found at run time (demo_cuda.h), so that
 * this file stays plain C; a program of your own would link its __global__
 * function and name it in mgpu_kernel.cuda_fn.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mgpu.h>
#include <mgpu/mpi.h>

#include "demo_cuda.h"
#include "mpi_check.h"

#define W 397
#define H 301
#define MAXITER 200

struct mandel_args {
  int32_t *pixels; /* rows [row0, row0 + gridDim.x) of the image */
  int row0, width, height, iters;
};

/* One block per row. */
static void mandel_host(const mgpu_kernel_ctx *ctx, const void *p) {
  const struct mandel_args *a = p;
  int row = a->row0 + (int)ctx->block_idx.x;
  double ci = -1.2 + 2.4 * row / (a->height - 1);
  for (int x = 0; x < a->width; x++) {
    double cr = -2.2 + 3.2 * x / (a->width - 1), zr = 0, zi = 0;
    int it = 0;
    while (it < a->iters && zr * zr + zi * zi <= 4.0) {
      double t = zr * zr - zi * zi + cr;
      zi = 2 * zr * zi + ci;
      zr = t;
      it++;
    }
    a->pixels[(size_t)ctx->block_idx.x * (size_t)a->width + (size_t)x] = it;
  }
}

static mgpu_kernel mandel = {.name = "mandelbrot", .host_fn = mandel_host};

/* Rows [first(g), first(g + 1)) belong to global device g of T. */
static int first_row(int g, int t) { return (int)((long)H * g / t); }

static void compute(mgpu_buffer *buf, int dev, int row0, int rows) {
  if (rows == 0) return;
  mgpu_stream *s;
  CHECK(mgpu_stream_create(&s, dev));
  struct mandel_args a = {mgpu_buffer_ptr(buf), row0, W, H, MAXITER};
  /* One block a row; a host device runs each block's row in one call. */
  CHECK(mgpu_launch(s, &mandel, MGPU_DIM3((unsigned)rows, 1, 1),
                    MGPU_DIM3(128, 1, 1), &a, sizeof a));
  CHECK(mgpu_stream_destroy(s)); /* waits for the kernel */
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  mandel.cuda_fn = demo_cuda_fn("mgpu_example_mpi_mandel_cuda_fn");
  CHECK(mgpu_mpi_init(MPI_COMM_WORLD, NULL));
  mgpu_mpi_info info;
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  CHECK(mgpu_mpi_get_info(&info));
  int t = info.total_devices, rank = info.rank;
  size_t row_bytes = W * sizeof(int32_t);

  /* Every device of this rank computes its block and sends it to rank 0. */
  mgpu_buffer *block[MGPU_MAX_DEVICES];
  mgpu_mpi_request *sent[MGPU_MAX_DEVICES];
  for (int d = 0; d < info.ndevices; d++) {
    int g = info.first_device + d;
    int row0 = first_row(g, t), rows = first_row(g + 1, t) - row0;
    CHECK(mgpu_malloc(&block[d], d, rows ? rows * row_bytes : row_bytes));
    compute(block[d], d, row0, rows);
    CHECK(mgpu_mpi_isend(block[d], 0, (size_t)rows * W, MGPU_INT32, 0, g,
                         MPI_COMM_WORLD, NULL, &sent[d]));
  }
  int bad = 0;
  if (rank == 0) {
    /* Rank 0 learns which rank owns each global device. */
    int *owner_first = malloc((size_t)info.nranks * sizeof *owner_first);
    if (owner_first == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Gather(&info.first_device, 1, MPI_INT, owner_first, 1, MPI_INT, 0,
               MPI_COMM_WORLD);
    mgpu_buffer *image;
    CHECK(mgpu_malloc(&image, 0, H * row_bytes));
    mgpu_mpi_request **got = malloc((size_t)t * sizeof *got);
    if (got == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int g = 0; g < t; g++) {
      int owner = 0;
      while (owner + 1 < info.nranks && owner_first[owner + 1] <= g) owner++;
      int row0 = first_row(g, t), rows = first_row(g + 1, t) - row0;
      CHECK(mgpu_mpi_irecv(image, (size_t)row0 * row_bytes, (size_t)rows * W,
                           MGPU_INT32, owner, g, MPI_COMM_WORLD, NULL,
                           &got[g]));
    }
    for (int g = 0; g < t; g++) CHECK(mgpu_mpi_wait(got[g]));
    for (int d = 0; d < info.ndevices; d++) CHECK(mgpu_mpi_wait(sent[d]));
    /* The same image on one device. */
    mgpu_buffer *ref;
    CHECK(mgpu_malloc(&ref, 0, H * row_bytes));
    compute(ref, 0, 0, H);
    int32_t *a = malloc(H * row_bytes), *b = malloc(H * row_bytes);
    if (a == NULL || b == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK(mgpu_memcpy_dtoh(a, image, 0, H * row_bytes));
    CHECK(mgpu_memcpy_dtoh(b, ref, 0, H * row_bytes));
    long inside = 0;
    for (size_t i = 0; i < (size_t)W * H; i++) {
      bad += a[i] != b[i];
      inside += a[i] == MAXITER;
    }
    printf("%dx%d image over %d devices of %d ranks: %ld pixels inside, %d "
           "differ from one device\n", W, H, t, info.nranks, inside, bad);
    if (inside == 0) bad++;
    free(a);
    free(b);
    free(got);
    free(owner_first);
    CHECK(mgpu_free(ref));
    CHECK(mgpu_free(image));
  } else {
    MPI_Gather(&info.first_device, 1, MPI_INT, NULL, 1, MPI_INT, 0,
               MPI_COMM_WORLD);
    for (int d = 0; d < info.ndevices; d++) CHECK(mgpu_mpi_wait(sent[d]));
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  for (int d = 0; d < info.ndevices; d++) CHECK(mgpu_free(block[d]));
  CHECK(mgpu_mpi_finalize());
  MPI_Finalize();
  return bad ? 1 : 0;
}
