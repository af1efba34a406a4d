/* mgpu bench mpi: all-reduce of device buffers across MPI ranks. The
 * program mgpu-bench-mpi, installed among the command's helpers
 * (libexec/mgpu), which `mgpu bench mpi` runs in its place:
 *
 *   mpirun -np N mgpu bench mpi --json      (alone: one rank)
 *
 * Per size, 8 B to 256 MiB (--quick: 8 B, 4 KiB, 1 MiB), float sums of a
 * buffer on each rank's device 0 with mgpu_mpi_allreduce, in nccl-tests'
 * units: algbw = size / time, busbw = algbw * 2 (n - 1) / n. Next to it, in
 * the same run and with the same timing:
 *   (a) MPI_Allreduce on plain host buffers of the same size (malloc'd and
 *       touched once), what the program would do with no devices at all;
 *   (b) the way without the module: mgpu_memcpy_dtoh to a host buffer,
 *       MPI_Allreduce, mgpu_memcpy_htod back (host buffers allocated and
 *       touched once, so (b) is not slowed by page faults).
 * Each repetition runs a batch of calls between barriers; a repetition's
 * time is the slowest rank's; figures are medians after a warm-up. Only
 * rank 0 prints. */
#ifdef MGPU_HAVE_MPI
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "mgpu/mpi.h"

typedef struct bench_mpi {
  size_t bytes;
  mgpu_buffer *send, *recv;
  float *host_send, *host_recv; /* (a) and (b) */
} bench_mpi;

enum { CASE_MGPU, CASE_HOST_MPI, CASE_COPY_MPI };

static int run_once(bench_mpi *b, int which) {
  size_t count = b->bytes / sizeof(float);
  switch (which) {
    case CASE_MGPU:
      return mgpu_mpi_allreduce(b->send, 0, b->recv, 0, count, MGPU_FLOAT32,
                                MGPU_SUM, MPI_COMM_WORLD, NULL);
    case CASE_HOST_MPI:
      return MPI_Allreduce(b->host_send, b->host_recv, (int)count, MPI_FLOAT,
                           MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS
                 ? 0 : MGPU_EIO;
    default: {
      int rc = mgpu_memcpy_dtoh(b->host_send, b->send, 0, b->bytes);
      if (rc == 0 && MPI_Allreduce(b->host_send, b->host_recv, (int)count,
                                   MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD) != MPI_SUCCESS)
        rc = MGPU_EIO;
      if (rc == 0) rc = mgpu_memcpy_htod(b->recv, 0, b->host_recv, b->bytes);
      return rc;
    }
  }
}

/* Seconds per call: median over reps of the slowest rank's batch. */
static int time_case(bench_mpi *b, int which, int reps, double *secs) {
  int iters = (int)(((size_t)64 << 20) / b->bytes);
  if (iters < 1) iters = 1;
  if (iters > 200) iters = 200;
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) return MGPU_ENOMEM;
  int rc = 0;
  for (int rep = -1; rep < reps && rc == 0; rep++) { /* -1: warm-up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = bench_now();
    for (int it = 0; it < iters && rc == 0; it++) rc = run_once(b, which);
    double dt = (bench_now() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rep >= 0) t[rep] = dt;
  }
  if (rc == 0) *secs = bench_median(t, reps);
  free(t);
  return rc;
}

static void size_name(size_t bytes, char *out, size_t cap) {
  if (bytes >= ((size_t)1 << 20)) snprintf(out, cap, "%zuMiB", bytes >> 20);
  else if (bytes >= 1024) snprintf(out, cap, "%zuKiB", bytes >> 10);
  else snprintf(out, cap, "%zuB", bytes);
}

int mgpu_bench_mpi(int argc, char **argv) {
  bench_opts o;
  int nrest = 0;
  int prc = bench_parse(argc, argv, "mgpu bench mpi [--json] [--quick] [--reps N]",
                        &o, NULL, 0, &nrest);
  if (prc != 0) return prc;
  /* The module opens this rank's share of the devices itself. */
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init(NULL, NULL);
  int rc = mgpu_mpi_init(MPI_COMM_WORLD, NULL);
  if (rc != 0) {
    fprintf(stderr, "bench mpi: mgpu_mpi_init: %s (%s)\n", mgpu_err_name(rc),
            mgpu_error_detail());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  static const size_t full[] = {8, 64, 512, 4u << 10, 32u << 10, 256u << 10,
                                1u << 20, 4u << 20, 16u << 20, 64u << 20,
                                256u << 20};
  static const size_t quick[] = {8, 4u << 10, 1u << 20};
  const size_t *sizes = o.quick ? quick : full;
  int nsizes = o.quick ? 3 : (int)(sizeof full / sizeof full[0]);
  size_t max = sizes[nsizes - 1];
  bench_mpi b;
  memset(&b, 0, sizeof b);
  b.host_send = malloc(max);
  b.host_recv = malloc(max);
  if (b.host_send == NULL || b.host_recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(b.host_send, 0, max);
  memset(b.host_recv, 0, max);
  if ((rc = mgpu_malloc(&b.send, 0, max)) != 0 ||
      (rc = mgpu_malloc(&b.recv, 0, max)) != 0 ||
      (rc = mgpu_memcpy_htod(b.send, 0, b.host_send, max)) != 0 ||
      (rc = mgpu_memcpy_htod(b.recv, 0, b.host_recv, max)) != 0) {
    fprintf(stderr, "bench mpi: buffers: %s (%s)\n", mgpu_err_name(rc),
            mgpu_error_detail());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  mgpu_mpi_info info = {.size = sizeof info};
  mgpu_mpi_get_info(&info);
  double factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  bench_report *r = rank == 0 ? bench_report_new("mpi") : NULL;
  for (int s = 0; s < nsizes; s++) {
    b.bytes = sizes[s];
    double t[3];
    for (int which = 0; which < 3; which++) {
      if ((rc = time_case(&b, which, o.reps, &t[which])) != 0) {
        fprintf(stderr, "bench mpi: rank %d: %s (%s)\n", rank,
                mgpu_err_name(rc), mgpu_error_detail());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    if (r == NULL) continue;
    char name[96], sz[32];
    size_name(b.bytes, sz, sizeof sz);
    double gb = (double)b.bytes / 1e9;
    snprintf(name, sizeof name, "allreduce %s %d ranks", sz, n);
    bench_report_add(r, name, "algbw", gb / t[0], "GB/s",
                     "MPI_Allreduce host buffers", gb / t[1]);
    if (n > 1)
      bench_report_add(r, name, "busbw", gb / t[0] * factor, "GB/s",
                       "MPI_Allreduce host buffers", gb / t[1] * factor);
    bench_report_add(r, name, "time", t[0] * 1e6, "us", NULL, 0);
    snprintf(name, sizeof name, "allreduce %s %d ranks vs copy", sz, n);
    bench_report_add(r, name, "algbw", gb / t[0], "GB/s",
                     "dtoh + MPI_Allreduce + htod", gb / t[2]);
  }
  mgpu_mpi_stats st = {.size = sizeof st};
  mgpu_mpi_get_stats(&st);
  if (r != NULL) {
    if (!o.json)
      printf("path of the mgpu calls: %llu host, %llu direct, %llu staged "
             "(%s)\n", (unsigned long long)st.calls_host,
             (unsigned long long)st.calls_direct,
             (unsigned long long)st.calls_staged,
             info.cuda_aware ? "MPI is CUDA-aware" : "MPI is not CUDA-aware");
    bench_report_finish(r, o.json);
  }
  mgpu_free(b.send);
  mgpu_free(b.recv);
  free(b.host_send);
  free(b.host_recv);
  mgpu_mpi_finalize();
  if (!inited) MPI_Finalize();
  return 0;
}

int main(int argc, char **argv) { return mgpu_bench_mpi(argc, argv); }
#endif /* MGPU_HAVE_MPI */
