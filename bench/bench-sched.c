/* mgpu bench sched: what the task pool costs and how well it balances.
 *
 * 1. Overhead: N empty tasks submitted from one thread, then wait_all; the
 *    figure is wall time / N (ns per task, submit to completion), for 1, 2
 *    and 4 devices and each policy. Baselines, measured in the same run:
 *    a plain thread pool of as many threads (one queue under a mutex,
 *    workers sleeping on a condition variable: what a user would otherwise
 *    write, bench/sched_work.h), and StarPU's eager scheduler with as many
 *    CPU workers, run beside this command (bench/peers/starpu_sched --raw,
 *    under a timeout) when it was built.
 * 2. Balance: 2,000 tasks whose lengths are log-uniform between 1 us and
 *    1 ms (fixed seed, so heavily skewed: most are short, a few dominate).
 *    A task stands for device work: it sleeps its length, so four devices
 *    really run in parallel even on a two-core machine. The figure is the
 *    makespan next to the ideal one, max(sum of measured lengths / devices,
 *    longest task); ratio = makespan / ideal, 1.0 is perfect.
 * bench/peers/starpu_sched.c measures StarPU on the same two cases. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>

#include "bench.h"
#include "cmd.h"
#include "sched_work.h"

static int skew_body(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  skew_run_one(arg);
  return 0;
}

/* ---- the pool ---- */

static const char *policy_name[] = {"static", "dynamic", "ws"};

static int empty_task(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  (void)arg;
  return 0;
}

static mgpu_pool *make_pool(mgpu_sched_policy policy, int ndev) {
  mgpu_pool_opts o = MGPU_POOL_OPTS_INITIALIZER;
  o.policy = policy;
  o.ndevices = ndev;
  mgpu_pool *p = NULL;
  int rc = mgpu_pool_create(&p, &o);
  if (rc != 0) {
    fprintf(stderr, "mgpu bench sched: pool of %d devices: %s: %s\n", ndev,
            mgpu_strerror(rc), mgpu_error_detail());
    return NULL;
  }
  return p;
}

static double overhead_ns(mgpu_pool *p, size_t n) {
  double t0 = bench_now();
  for (size_t i = 0; i < n; i++)
    if (mgpu_pool_submit_fn(p, empty_task, NULL, NULL) != 0) return -1;
  if (mgpu_pool_wait_all(p) != 0) return -1;
  return (bench_now() - t0) * 1e9 / (double)n;
}

/* Returns the makespan in ms and writes the ideal one. */
static double skew_run(mgpu_pool *p, skew_task *t, int n, int ndev,
                       double *ideal_ms) {
  skew_lengths(t, n);
  double t0 = bench_now();
  for (int i = 0; i < n; i++)
    if (mgpu_pool_submit_fn(p, skew_body, &t[i], NULL) != 0) return -1;
  if (mgpu_pool_wait_all(p) != 0) return -1;
  double makespan = (bench_now() - t0) * 1e3;
  *ideal_ms = skew_ideal_ms(t, n, ndev);
  return makespan;
}

/* StarPU eager's empty-task ns for 1, 2 and 4 workers (index 0, 1, 2; 0
 * where it did not run), from the peer program beside this one. */
static void starpu_eager(int quick, int reps, double out[3]) {
  out[0] = out[1] = out[2] = 0;
  char peer[PATH_MAX];
  if (!mgpu_cmd_helper_path("starpu_sched", peer, sizeof peer)) {
    if (mgpu_cmd_helper_built("starpu_sched"))
      fprintf(stderr, "mgpu bench sched: no StarPU baseline: %s is missing "
              "(it is built and installed with this command)\n", peer);
    else
      fprintf(stderr, "mgpu bench sched: no StarPU baseline: starpu_sched "
              "was not built (pkg-config found no starpu-1.3 when mgpu was "
              "configured)\n");
    return;
  }
  char cmd[PATH_MAX + 128];
  snprintf(cmd, sizeof cmd, "timeout %d '%s' --raw --reps %d%s", quick ? 60 : 300,
           peer, reps, quick ? " --quick" : "");
  FILE *f = popen(cmd, "r");
  if (f == NULL) return;
  int w;
  double ns;
  while (fscanf(f, "%d %lf", &w, &ns) == 2)
    if (w == 1 || w == 2 || w == 4) out[w == 4 ? 2 : w - 1] = ns;
  if (pclose(f) != 0)
    fprintf(stderr, "mgpu bench sched: the StarPU peer failed\n");
}

int mgpu_bench_sched(int argc, char **argv) {
  bench_opts opts;
  int nrest;
  if (bench_parse(argc, argv, "mgpu bench sched [--json] [--quick] [--reps N]",
                  &opts, NULL, 0, &nrest) != 0)
    return 2;
  int ndev = mgpu_device_count();
  if (ndev < 1) return 1;
  size_t n = opts.quick ? 2000 : 20000;
  int reps = opts.reps;
  bench_report *r = bench_report_new("sched");
  double *v = calloc((size_t)reps, sizeof *v);
  double *b = calloc((size_t)reps, sizeof *b);

  const int counts[] = {1, 2, 4};
  double starpu[3];
  starpu_eager(opts.quick, reps, starpu);
  for (int c = 0; c < 3; c++) {
    int nd = counts[c];
    if (nd > ndev) break;
    for (int pol = 0; pol < 3; pol++) {
      /* The baseline first, with no pool up, as the StarPU peer does. */
      plain_pool_ns(n / 4, nd);
      for (int i = 0; i < reps; i++) b[i] = plain_pool_ns(n, nd);
      mgpu_pool *p = make_pool((mgpu_sched_policy)pol, nd);
      if (p == NULL) return 1;
      overhead_ns(p, n / 4); /* warm-up: slots, deques, threads */
      for (int i = 0; i < reps; i++) {
        v[i] = overhead_ns(p, n);
        if (v[i] < 0) {
          fprintf(stderr, "mgpu bench sched: %s\n", mgpu_error_detail());
          return 1;
        }
      }
      mgpu_pool_destroy(p);
      char name[96];
      snprintf(name, sizeof name, "empty task, %d dev, %s", nd,
               policy_name[pol]);
      double mine = bench_median(v, reps);
      bench_report_add(r, name, "overhead", mine, "ns/task",
                       "plain thread pool", bench_median(b, reps));
      if (starpu[c] > 0)
        bench_report_add(r, name, "overhead", mine, "ns/task", "StarPU eager",
                         starpu[c]);
    }
  }

  enum { NSKEW = 2000 };
  skew_task *tasks = calloc(NSKEW, sizeof *tasks);
  int sreps = opts.quick ? 2 : 5;
  if (sreps > reps) sreps = reps;
  for (int pol = 0; pol < 3; pol++) {
    mgpu_pool *p = make_pool((mgpu_sched_policy)pol, ndev);
    if (p == NULL) return 1;
    double ideal[16], ratio[16], span[16];
    for (int i = 0; i < sreps; i++) {
      span[i] = skew_run(p, tasks, NSKEW, ndev, &ideal[i]);
      if (span[i] < 0) {
        fprintf(stderr, "mgpu bench sched: %s\n", mgpu_error_detail());
        return 1;
      }
      ratio[i] = span[i] / ideal[i];
    }
    mgpu_pool_destroy(p);
    /* The run with the median ratio, so value, baseline and ratio agree. */
    int med = 0;
    double mr = bench_median(memcpy(v, ratio, sizeof(double) * (size_t)sreps),
                             sreps);
    for (int i = 0; i < sreps; i++)
      if (ratio[i] == mr) med = i;
    char name[96];
    snprintf(name, sizeof name, "skewed %d tasks, %d dev, %s", NSKEW,
             ndev, policy_name[pol]);
    bench_report_add(r, name, "makespan", span[med], "ms", "ideal",
                     ideal[med]);
  }
  free(tasks);
  free(v);
  free(b);
  bench_report_finish(r, opts.json);
  return 0;
}
