/* A 2-D Jacobi solver over several devices, the pattern of NVIDIA's
 * multi-GPU programming models: the grid is cut into slabs of rows, one per
 * device, each with a halo row above and below; an iteration launches one
 * kernel per device, pushes each slab's edge rows into its neighbours'
 * halos with mgpu_memcpy_async on its own stream, and joins the streams
 * with a stream barrier. The same step is issued op by op (jacobi_run) or
 * captured once into a graph of two iterations (jacobi_capture) and
 * replayed. Used by examples/jacobi.c, `mgpu bench graph` and `mgpu bench
 * jacobi`; the host kernel sweeps with jacobi-sweep.h, as the MPI peer does.
 *
 * The grid has nx columns and ny rows; its first row is held at 1, the
 * other edges at 0. Functions return 0 or an MGPU_E... code. */
#ifndef MGPU_EXAMPLES_JACOBI_H
#define MGPU_EXAMPLES_JACOBI_H

#include <mgpu.h>
#include <stdlib.h>
#include <string.h>

#include "demo_cuda.h"
#include "jacobi-sweep.h"

typedef struct jacobi {
  int ndev, nx, ny;
  int rows[MGPU_MAX_DEVICES];  /* interior rows of each slab */
  int first[MGPU_MAX_DEVICES]; /* grid row of each slab's first one */
  mgpu_buffer *a[MGPU_MAX_DEVICES], *b[MGPU_MAX_DEVICES];
  mgpu_stream *s[MGPU_MAX_DEVICES];
  mgpu_event *start, *done[MGPU_MAX_DEVICES];
  mgpu_stream_barrier *barrier;
  int gpu[MGPU_MAX_DEVICES]; /* a CUDA device: many threads per launch */
} jacobi;

typedef struct jacobi_args {
  const float *in;
  float *out;
  int nx, rows;
} jacobi_args;

/* Rows 1..rows of out from in (columns 1..nx-2); block b of the grid takes
 * its share of the rows. */
static void jacobi_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  const jacobi_args *a = argp;
  int per = (a->rows + (int)ctx->grid_dim.x - 1) / (int)ctx->grid_dim.x;
  int lo = 1 + (int)ctx->block_idx.x * per, hi = lo + per;
  if (hi > a->rows + 1) hi = a->rows + 1;
  jacobi_sweep(a->in, a->out, a->nx, lo, hi);
}

/* The same kernel in OpenCL C, for OpenCL devices (pointers as ulong). */
static const char jacobi_src[] =
    "typedef struct { ulong in, out; int nx, rows; } jacobi_args;\n"
    "__kernel void jacobi(jacobi_args a) {\n"
    "  __global const float *in = (__global const float *)a.in;\n"
    "  __global float *out = (__global float *)a.out;\n"
    "  int g = (int)get_global_size(0);\n"
    "  int per = (a.rows + g - 1) / g, lo = 1 + (int)get_global_id(0) * per;\n"
    "  int hi = lo + per > a.rows + 1 ? a.rows + 1 : lo + per;\n"
    "  for (int r = lo; r < hi; r++)\n"
    "    for (int c = 1; c < a.nx - 1; c++) {\n"
    "      __global const float *p = in + (size_t)r * a.nx + c;\n"
    "      out[(size_t)r * a.nx + c] =\n"
    "          0.25f * (p[-a.nx] + p[a.nx] + p[-1] + p[1]);\n"
    "    }\n"
    "}\n";

/* The CUDA variant is compiled by nvcc into libmgpu-demo-cuda.so
 * (tools/cuda/jacobi.cu) and found at run time (demo_cuda.h), so that this
 * file stays plain C: jacobi_init fills cuda_fn where the library is there
 * (a build with CUDA). */
static mgpu_kernel jacobi_kernel = {
    .name = "jacobi", .host_fn = jacobi_host, .opencl_src = jacobi_src};


/* The single-threaded reference: iters iterations on the whole grid. */
static inline void jacobi_reference(float *grid, int nx, int ny, int iters) {
  float *next = malloc((size_t)nx * ny * sizeof *next);
  memcpy(next, grid, (size_t)nx * ny * sizeof *next);
  for (int it = 0; it < iters; it++) {
    jacobi_sweep(grid, next, nx, 1, ny - 1);
    memcpy(grid, next, (size_t)nx * ny * sizeof *next);
  }
  free(next);
}

/* The first row at 1, the other edges at 0, the inside at 0.5: started
 * from 0 inside, the heat's front would leave subnormal floats ahead of
 * it, whose arithmetic costs a CPU tens of times more, so that an
 * iteration's time would depend on how many ran before it. */
static inline void jacobi_initial(float *grid, int nx, int ny) {
  memset(grid, 0, (size_t)nx * ny * sizeof *grid);
  for (int c = 0; c < nx; c++) grid[c] = 1.0f;
  for (int r = 1; r < ny - 1; r++)
    for (int c = 1; c < nx - 1; c++) grid[(size_t)r * nx + c] = 0.5f;
}

static inline int jacobi_init(jacobi *j, int ndev, int nx, int ny) {
  memset(j, 0, sizeof *j);
  j->ndev = ndev;
  j->nx = nx;
  j->ny = ny;
  float *grid = malloc((size_t)nx * ny * sizeof *grid);
  if (grid == NULL) return MGPU_ENOMEM;
  jacobi_initial(grid, nx, ny);
  if (jacobi_kernel.cuda_fn == NULL)
    jacobi_kernel.cuda_fn = demo_cuda_fn("mgpu_demo_jacobi_cuda_fn");
  int rc = 0, row = 1;
  for (int d = 0; d < ndev && rc == 0; d++) {
    j->rows[d] = (ny - 2) / ndev + (d < (ny - 2) % ndev);
    j->first[d] = row;
    row += j->rows[d];
    size_t bytes = (size_t)(j->rows[d] + 2) * nx * sizeof(float);
    const float *slab = grid + (size_t)(j->first[d] - 1) * nx;
    rc = mgpu_malloc(&j->a[d], d, bytes);
    if (rc == 0) rc = mgpu_malloc(&j->b[d], d, bytes);
    if (rc == 0) rc = mgpu_memcpy_htod(j->a[d], 0, slab, bytes);
    if (rc == 0) rc = mgpu_memcpy_htod(j->b[d], 0, slab, bytes);
    if (rc == 0) rc = mgpu_stream_create(&j->s[d], d);
    if (rc == 0) rc = mgpu_event_create(&j->done[d], d);
    mgpu_device_props p = {.size = sizeof p};
    if (rc == 0) rc = mgpu_device_get_props(d, &p);
    j->gpu[d] = rc == 0 && p.backend_kind == MGPU_BACKEND_CUDA;
  }
  free(grid);
  if (rc == 0) rc = mgpu_event_create(&j->start, 0);
  if (rc == 0) rc = mgpu_stream_barrier_create(j->s, ndev, &j->barrier);
  return rc;
}

/* One iteration from in to out on every device. */
static inline int jacobi_step(jacobi *j, mgpu_buffer **in, mgpu_buffer **out) {
  int rc = 0;
  size_t row = (size_t)j->nx * sizeof(float);
  for (int d = 0; d < j->ndev && rc == 0; d++) {
    jacobi_args args = {mgpu_buffer_ptr(in[d]), mgpu_buffer_ptr(out[d]), j->nx,
                        j->rows[d]};
    /* Host and OpenCL: up to 4 blocks of rows; CUDA: a thread per cell. */
    unsigned blocks = j->rows[d] < 4 ? (unsigned)j->rows[d] : 4u, threads = 1;
    if (j->gpu[d]) {
      size_t cells = (size_t)j->rows[d] * (size_t)(j->nx - 2);
      threads = 256;
      blocks = (unsigned)((cells + threads - 1) / threads);
      if (blocks > 4096) blocks = 4096;
      if (blocks == 0) blocks = 1;
    }
    rc = mgpu_launch(j->s[d], &jacobi_kernel, MGPU_DIM3(blocks, 1, 1),
                     MGPU_DIM3(threads, 1, 1), &args, sizeof args);
  }
  for (int d = 0; d < j->ndev && rc == 0; d++) {
    if (d > 0) /* first row up into the halo below the slab above */
      rc = mgpu_memcpy_async(out[d - 1], (size_t)(j->rows[d - 1] + 1) * row,
                             out[d], row, row, j->s[d]);
    if (rc == 0 && d + 1 < j->ndev) /* last row down */
      rc = mgpu_memcpy_async(out[d + 1], 0, out[d], (size_t)j->rows[d] * row,
                             row, j->s[d]);
  }
  if (rc == 0) rc = mgpu_stream_barrier_wait(j->barrier);
  return rc;
}

/* iters iterations op by op (an even number leaves the result in a). */
static inline int jacobi_run(jacobi *j, int iters) {
  int rc = 0;
  for (int it = 0; it < iters && rc == 0; it++)
    rc = it % 2 == 0 ? jacobi_step(j, j->a, j->b) : jacobi_step(j, j->b, j->a);
  return rc;
}

/* Two iterations (a to b, b to a) captured from the first device's stream,
 * the others joined through an event and rejoined at the end. */
static inline int jacobi_capture(jacobi *j, mgpu_graph **graph) {
  int rc = mgpu_stream_begin_capture(j->s[0]);
  if (rc != 0) return rc;
  rc = mgpu_event_record(j->start, j->s[0]);
  for (int d = 1; d < j->ndev && rc == 0; d++)
    rc = mgpu_stream_wait_event(j->s[d], j->start);
  if (rc == 0) rc = jacobi_run(j, 2);
  for (int d = 1; d < j->ndev && rc == 0; d++) {
    rc = mgpu_event_record(j->done[d], j->s[d]);
    if (rc == 0) rc = mgpu_stream_wait_event(j->s[0], j->done[d]);
  }
  mgpu_graph *g = NULL;
  int end = mgpu_stream_end_capture(j->s[0], &g);
  if (rc == 0) rc = end;
  if (rc == 0) *graph = g;
  else if (g != NULL) mgpu_graph_destroy(g);
  return rc;
}

static inline int jacobi_sync(jacobi *j) {
  int rc = 0;
  for (int d = 0; d < j->ndev && rc == 0; d++)
    rc = mgpu_stream_synchronize(j->s[d]);
  return rc;
}

/* iters iterations (an even number) as launches of x, a graph of
 * jacobi_capture, or op by op where x is NULL; then waits for them. */
static inline int jacobi_iterate(jacobi *j, mgpu_graph_exec *x, int iters) {
  int rc = 0;
  if (x != NULL)
    for (int it = 0; it < iters && rc == 0; it += 2)
      rc = mgpu_graph_launch(x, j->s[0]);
  else
    rc = jacobi_run(j, iters);
  return rc == 0 ? jacobi_sync(j) : rc;
}

/* The grid (nx * ny floats) from the devices' a slabs. */
static inline int jacobi_gather(jacobi *j, float *grid) {
  int rc = 0;
  size_t row = (size_t)j->nx * sizeof(float);
  jacobi_initial(grid, j->nx, j->ny);
  for (int d = 0; d < j->ndev && rc == 0; d++)
    rc = mgpu_memcpy_dtoh(grid + (size_t)j->first[d] * j->nx, j->a[d], row,
                          (size_t)j->rows[d] * row);
  return rc;
}

static inline void jacobi_free(jacobi *j) {
  if (j->barrier != NULL) mgpu_stream_barrier_destroy(j->barrier);
  if (j->start != NULL) mgpu_event_destroy(j->start);
  for (int d = 0; d < j->ndev; d++) {
    if (j->done[d] != NULL) mgpu_event_destroy(j->done[d]);
    if (j->s[d] != NULL) mgpu_stream_destroy(j->s[d]);
    if (j->a[d] != NULL) mgpu_free(j->a[d]);
    if (j->b[d] != NULL) mgpu_free(j->b[d]);
  }
}

#endif /* MGPU_EXAMPLES_JACOBI_H */
