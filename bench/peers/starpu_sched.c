/* StarPU on the two cases of mgpu bench sched, for comparison.
 *
 *   starpu_sched [--json] [--quick] [--reps N] [--raw]
 *
 * Runs StarPU's eager (one shared queue) and ws (work stealing) schedulers
 * with 1, 2 and 4 CPU workers standing for devices: the overhead of an
 * empty task (N submitted, then starpu_task_wait_for_all; ns per task) next
 * to the same plain thread-pool baseline, and 2,000 skewed tasks (the same
 * lengths and body as mgpu's, bench/sched_work.h) next to the ideal
 * makespan. Prints the JSON shape of every mgpu benchmark, with "bench":
 * "sched-starpu". --raw: only eager's empty-task overhead, one line
 * "workers ns" per worker count (what `mgpu bench sched` reads when it runs
 * this program beside itself). Built by bench/peers/starpu.cmake when pkg-config finds
 * StarPU. */
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_work.h"

static void empty_cpu(void *buffers[], void *arg) {
  (void)buffers;
  (void)arg;
}

static void skew_cpu(void *buffers[], void *arg) {
  (void)buffers;
  skew_task *t;
  starpu_codelet_unpack_args(arg, &t);
  skew_run_one(t);
}

static struct starpu_codelet empty_cl = {
    .cpu_funcs = {empty_cpu}, .nbuffers = 0, .name = "empty"};
static struct starpu_codelet skew_cl = {
    .cpu_funcs = {skew_cpu}, .nbuffers = 0, .name = "skew"};

static int start(const char *sched, int ncpus) {
  struct starpu_conf conf;
  starpu_conf_init(&conf);
  conf.sched_policy_name = sched;
  conf.ncpus = ncpus;
  conf.ncuda = 0;
  conf.nopencl = 0;
  int rc = starpu_init(&conf);
  if (rc != 0) {
    fprintf(stderr, "starpu_sched: starpu_init(%s, %d cpus) failed: %d\n",
            sched, ncpus, rc);
    return rc;
  }
  if ((int)starpu_cpu_worker_get_count() != ncpus) {
    fprintf(stderr, "starpu_sched: asked for %d CPU workers, got %u\n", ncpus,
            starpu_cpu_worker_get_count());
    starpu_shutdown();
    return -1;
  }
  return 0;
}

static double overhead_ns(size_t n) {
  double t0 = sched_work_now();
  for (size_t i = 0; i < n; i++) {
    struct starpu_task *t = starpu_task_create();
    t->cl = &empty_cl;
    if (starpu_task_submit(t) != 0) return -1;
  }
  starpu_task_wait_for_all();
  return (sched_work_now() - t0) * 1e9 / (double)n;
}

static double skew_run(skew_task *tasks, int n, int ndev, double *ideal_ms) {
  skew_lengths(tasks, n);
  double t0 = sched_work_now();
  for (int i = 0; i < n; i++) {
    skew_task *p = &tasks[i];
    if (starpu_insert_task(&skew_cl, STARPU_VALUE, &p, sizeof p, 0) != 0)
      return -1;
  }
  starpu_task_wait_for_all();
  double makespan = (sched_work_now() - t0) * 1e3;
  *ideal_ms = skew_ideal_ms(tasks, n, ndev);
  return makespan;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct row {
  char name[96], metric[16], unit[16], base[32];
  double value, baseline;
} row;

int main(int argc, char **argv) {
  int json = 0, quick = 0, reps = 0, raw = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--raw") == 0) raw = 1;
    else if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: starpu_sched [--json] [--quick] [--reps N] "
              "[--raw]\n");
      return 2;
    }
  }
  if (reps < 1) reps = quick ? 3 : 7;
  setenv("STARPU_SILENT", "1", 0);
  /* More workers than cores, as mgpu runs four devices on two: StarPU
   * would otherwise refuse to bind them. */
  setenv("STARPU_WORKERS_NOBIND", "1", 0);
  size_t n = quick ? 2000 : 20000;
  const char *scheds[] = {"eager", "ws"};
  const int counts[] = {1, 2, 4};
  row rows[16];
  int nrows = 0;
  double v[64], b[64];
  if (reps > 64) reps = 64;

  for (int c = 0; c < 3; c++)
    for (int s = 0; s < (raw ? 1 : 2); s++) {
      /* The baseline first: StarPU's idle workers spin, and would slow a
       * pool measured while they are up. */
      if (!raw) {
        plain_pool_ns(n / 4, counts[c]);
        for (int i = 0; i < reps; i++) b[i] = plain_pool_ns(n, counts[c]);
      }
      if (start(scheds[s], counts[c]) != 0) return 1;
      overhead_ns(n / 4);
      for (int i = 0; i < reps; i++) v[i] = overhead_ns(n);
      starpu_shutdown();
      if (raw) {
        printf("%d %.6g\n", counts[c], median(v, reps));
        fflush(stdout);
        continue;
      }
      row *r = &rows[nrows++];
      snprintf(r->name, sizeof r->name, "empty task, %d dev, starpu %s",
               counts[c], scheds[s]);
      snprintf(r->metric, sizeof r->metric, "overhead");
      snprintf(r->unit, sizeof r->unit, "ns/task");
      snprintf(r->base, sizeof r->base, "plain thread pool");
      r->value = median(v, reps);
      r->baseline = median(b, reps);
    }
  if (raw) return 0;

  enum { NSKEW = 2000 };
  skew_task *tasks = calloc(NSKEW, sizeof *tasks);
  int sreps = quick ? 2 : 5;
  if (sreps > reps) sreps = reps;
  for (int s = 0; s < 2; s++) {
    if (start(scheds[s], 4) != 0) return 1;
    double span[16], ideal[16], ratio[16];
    for (int i = 0; i < sreps; i++) {
      span[i] = skew_run(tasks, NSKEW, 4, &ideal[i]);
      ratio[i] = span[i] / ideal[i];
      v[i] = ratio[i];
    }
    starpu_shutdown();
    double mr = median(v, sreps);
    int med = 0;
    for (int i = 0; i < sreps; i++)
      if (ratio[i] == mr) med = i;
    row *r = &rows[nrows++];
    snprintf(r->name, sizeof r->name, "skewed %d tasks, 4 dev, starpu %s",
             NSKEW, scheds[s]);
    snprintf(r->metric, sizeof r->metric, "makespan");
    snprintf(r->unit, sizeof r->unit, "ms");
    snprintf(r->base, sizeof r->base, "ideal");
    r->value = span[med];
    r->baseline = ideal[med];
  }
  free(tasks);

  if (json) {
    printf("{\"bench\": \"sched-starpu\", \"backend\": \"host\", "
           "\"devices\": 4,\n \"results\": [");
    for (int i = 0; i < nrows; i++)
      printf("%s\n   {\"case\": \"%s\", \"metric\": \"%s\", \"value\": %.6g, "
             "\"unit\": \"%s\", \"baseline\": {\"name\": \"%s\", \"value\": "
             "%.6g}, \"ratio\": %.4g}",
             i ? "," : "", rows[i].name, rows[i].metric, rows[i].value,
             rows[i].unit, rows[i].base, rows[i].baseline,
             rows[i].value / rows[i].baseline);
    printf("]}\n");
  } else {
    printf("bench sched-starpu: StarPU %d.%d, CPU workers as devices\n",
           STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION);
    printf("%-40s %-10s %12s %-7s %-22s %12s %7s\n", "case", "metric",
           "value", "unit", "baseline", "value", "ratio");
    for (int i = 0; i < nrows; i++)
      printf("%-40s %-10s %12.4g %-7s %-22s %12.4g %7.3f\n", rows[i].name,
             rows[i].metric, rows[i].value, rows[i].unit, rows[i].base,
             rows[i].baseline, rows[i].value / rows[i].baseline);
  }
  return 0;
}
