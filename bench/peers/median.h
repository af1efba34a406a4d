/* The median of a peer's repetitions, as mgpu's benchmarks take it
 * (bench_median): sorts t[0..n) and returns the middle value, or the mean
 * of the two middle ones. */
#ifndef MGPU_BENCH_PEER_MEDIAN_H
#define MGPU_BENCH_PEER_MEDIAN_H

#include <stdlib.h>

static int peer_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double peer_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, peer_cmp);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#endif /* MGPU_BENCH_PEER_MEDIAN_H */
