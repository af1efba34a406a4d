/* Shared pieces of the benchmarks (bench/bench-<name>.c).
 *
 * Every benchmark collects its figures in a bench_report and prints them
 * either as a table or, with --json, as the one JSON object DESIGN.md gives:
 *   {"bench": ..., "backend": ..., "devices": N, "results": [
 *     {"case": ..., "metric": ..., "value": ..., "unit": ...,
 *      "baseline": {"name": ..., "value": ...}, "ratio": ...}]}
 * Every figure is a median of repeated runs after a warm-up, and sits next
 * to a baseline measured in the same run wherever one fits. */
#ifndef MGPU_BENCH_H
#define MGPU_BENCH_H

#include <stddef.h>

#include "mgpu.h"

typedef struct bench_opts {
  int json;    /* --json */
  int quick;   /* --quick: fewer sizes and repetitions (used by tests) */
  int reps;    /* --reps N: timed repetitions, default 7 (3 with --quick) */
} bench_opts;

/* Parses --json, --quick and --reps N; other arguments are left for the
 * benchmark in rest[0..*nrest), which holds at most maxrest of them
 * (rest may be NULL with maxrest 0: a benchmark that takes none).
 * Returns 0 or 2 (bad argument or too many, usage printed). */
int bench_parse(int argc, char **argv, const char *usage, bench_opts *opts,
                char **rest, int maxrest, int *nrest);

/* The capacity of an array of arguments, for bench_parse. */
#define BENCH_CAP(a) ((int)(sizeof(a) / sizeof *(a)))

/* "64M", "4K", "1G", "4096" in bytes; 0 for anything else. */
size_t bench_parse_size(const char *s);

typedef struct bench_report bench_report;

/* Starts a report for benchmark name over the open devices. The caller owns
 * it until bench_report_finish. */
bench_report *bench_report_new(const char *name);

/* Adds one figure. baseline_name NULL: no baseline (ratio omitted). */
void bench_report_add(bench_report *r, const char *case_name,
                      const char *metric, double value, const char *unit,
                      const char *baseline_name, double baseline_value);

/* Gives the figure added last its noise, in its unit: a figure within
 * ± noise of 0 is not a measurement, and is printed as "below noise
 * (± noise unit)" in the table, and in JSON as "value": null with
 * "below_noise": true and "noise". */
void bench_report_noise(bench_report *r, double noise);

/* Prints the report (a table, or JSON with json != 0) and frees it. */
void bench_report_finish(bench_report *r, int json);

/* Monotonic time in seconds. */
double bench_now(void);

/* CPU time of the calling thread in seconds: steadier than bench_now
 * where other processes share the cores, since time the thread waits for
 * a core is not counted. */
double bench_thread_cpu(void);

/* Median of n values (reorders v). */
double bench_median(double *v, int n);

/* Baseline: memcpy of size bytes between two pre-touched host buffers by
 * nthreads threads at once (each copies its slice, started together by a
 * barrier; each timed repetition copies iters times, so that small sizes
 * are not only the barrier), median of reps runs, in GB/s of bytes copied
 * (one byte read and one written count as one byte moved, like cudaMemcpy
 * bandwidth). The time of a repetition is the slowest thread's. */
double bench_memcpy_gbps(size_t size, int nthreads, int iters, int reps);

/* Baseline: the round trip of a two-thread ping-pong, median microseconds
 * of reps runs of iters round trips. spin 0: the partner and the caller
 * sleep on a mutex and condition variable (what a plain worker thread
 * does); spin 1: both spin on flags in their own cache lines, pausing the
 * CPU (the least a hand-off between two running threads costs). */
double bench_pingpong_us(int spin, int iters, int reps);

/* The same ping-pong moving bytes each way as a pair of channels does (a
 * message copied into a shared buffer by one side and out of it by the
 * other, then back): the baseline of a channel round trip. */
double bench_pingpong_bytes_us(int spin, size_t bytes, int iters, int reps);

/* Occupies n CPUs with threads that compute and never block, so that no
 * core is free (bench launch's loaded case); stopped by bench_load_stop. */
void bench_load_start(int n);
void bench_load_stop(void);

/* CPUs this process may run on. */
int bench_cpus(void);

#endif /* MGPU_BENCH_H */
