/* MPI_Allreduce (Open MPI's, or MPICH's in its _mpich build), the peer of
 * `mgpu bench allreduce`: float sums
 * across the ranks of one machine, 8 B to 256 MiB per rank in powers of 4
 * (--quick: a few sizes; --sizes B,B,...: those sizes in bytes), printed in
 * the JSON shape of mgpu's benchmarks, or with --raw as one line
 * "bytes seconds" per size (what `mgpu bench allreduce` reads when it runs
 * this program beside itself).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 ./mpi_allreduce --json
 *
 * Each repetition times a batch of back-to-back all-reduces between two
 * barriers; a repetition's time is the slowest rank's, the figure is the
 * median over repetitions after a warm-up. Buffers are allocated and touched
 * once, as in mgpu's benchmark. busbw = algbw * 2 (n - 1) / n, and the
 * unavoidable traffic is 2 n size bytes per all-reduce. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "median.h"

#if defined(OPEN_MPI)
#define PEER_MPI "openmpi", "Open MPI"
#elif defined(MPICH_VERSION)
#define PEER_MPI "mpich", "MPICH"
#else
#define PEER_MPI "mpi", "MPI"
#endif
static const char *const peer_mpi[2] = {PEER_MPI}; /* JSON, text */

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int json = 0, quick = 0, reps = 0, raw = 0;
  size_t given[32];
  int ngiven = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      for (char *p = argv[++i]; *p != '\0' && ngiven < 32;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v < sizeof(float)) break;
        given[ngiven++] = (size_t)v / sizeof(float) * sizeof(float);
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  if (reps < 1) reps = quick ? 3 : 7;
  /* 8 B to 128 MiB in powers of 4 (nccl-tests -b 8 -e 256M -f 4), then
   * 256 MiB itself. */
  size_t full[16];
  int nfull = 0;
  for (size_t b = 8; b <= (256u << 20); b *= 4) full[nfull++] = b;
  full[nfull++] = 256u << 20;
  static const size_t small[] = {8, 4u << 10, 64u << 10, 1u << 20};
  const size_t *sizes = ngiven ? given : quick ? small : full;
  int nsizes = ngiven ? ngiven : quick ? 4 : nfull;
  size_t max = 0;
  for (int s = 0; s < nsizes; s++)
    if (sizes[s] > max) max = sizes[s];
  float *send = malloc(max), *recv = malloc(max);
  double *t = malloc((size_t)reps * sizeof *t);
  if (send == NULL || recv == NULL || t == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(send, 0, max);
  memset(recv, 0, max);
  double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (rank == 0 && !raw) {
    if (json)
      printf("{\"bench\": \"allreduce\", \"backend\": \"%s\", "
             "\"devices\": %d,\n \"results\": [", peer_mpi[0], n);
    else
      printf("bench allreduce: %s MPI_Allreduce, %d ranks\n", peer_mpi[1], n);
  }
  int first = 1;
  for (int s = 0; s < nsizes; s++) {
    size_t bytes = sizes[s];
    int count = (int)(bytes / sizeof(float));
    int iters = (int)((size_t)(64u << 20) / bytes);
    if (iters < 1) iters = 1;
    if (iters > (quick ? 20 : 1000)) iters = quick ? 20 : 1000;
    for (int rep = -1; rep < reps; rep++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int it = 0; it < iters; it++)
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double mine = (MPI_Wtime() - t0) / iters, slowest;
      MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rep >= 0) t[rep] = slowest;
    }
    if (rank != 0) continue;
    double med = peer_median(t, reps);
    if (raw) {
      printf("%zu %.9g\n", bytes, med);
      fflush(stdout);
      continue;
    }
    double algbw = (double)bytes / med / 1e9;
    char sz[32];
    if (bytes >= (1u << 20)) snprintf(sz, sizeof sz, "%zuMiB", bytes >> 20);
    else if (bytes >= (1u << 10)) snprintf(sz, sizeof sz, "%zuKiB", bytes >> 10);
    else snprintf(sz, sizeof sz, "%zuB", bytes);
    struct { const char *suffix, *metric, *unit; double v; } rows[] = {
        {"", "busbw", "GB/s", algbw * factor},
        {"", "algbw", "GB/s", algbw},
        {"", "time", "us", med * 1e6},
        {" traffic", "bandwidth", "GB/s", 2.0 * n * (double)bytes / med / 1e9}};
    for (int i = 0; i < 4; i++) {
      if (json)
        printf("%s\n   {\"case\": \"allreduce %s%s\", \"metric\": \"%s\", "
               "\"value\": %.6g, \"unit\": \"%s\"}",
               first ? "" : ",", sz, rows[i].suffix, rows[i].metric,
               rows[i].v, rows[i].unit);
      else
        printf("allreduce %-8s%-9s %-10s %12.4g %s\n", sz, rows[i].suffix,
               rows[i].metric, rows[i].v, rows[i].unit);
      first = 0;
    }
  }
  if (rank == 0 && json && !raw) printf("]}\n");
  free(send);
  free(recv);
  free(t);
  MPI_Finalize();
  return 0;
}
