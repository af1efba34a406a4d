/* The report printer, timers and the memcpy baseline shared by every
 * benchmark. */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_row {
  char case_name[96];
  char metric[32];
  char unit[16];
  char baseline_name[48];
  double value, baseline;
  int has_baseline;
} bench_row;

struct bench_report {
  char name[32];
  bench_row *rows;
  int nrows, cap;
};

int bench_parse(int argc, char **argv, const char *usage, bench_opts *opts,
                char **rest, int *nrest) {
  memset(opts, 0, sizeof *opts);
  *nrest = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      opts->json = 1;
    } else if (strcmp(argv[i], "--quick") == 0) {
      opts->quick = 1;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      opts->reps = atoi(argv[++i]);
      if (opts->reps < 1) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
      }
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "unknown option %s\nusage: %s\n", argv[i], usage);
      return 2;
    } else {
      rest[(*nrest)++] = argv[i];
    }
  }
  if (opts->reps == 0) opts->reps = opts->quick ? 3 : 7;
  return 0;
}

size_t bench_parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  else if (*end == 'G' || *end == 'g') v <<= 30, end++;
  return end != s && *end == '\0' ? (size_t)v : 0;
}

bench_report *bench_report_new(const char *name) {
  bench_report *r = calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  snprintf(r->name, sizeof r->name, "%s", name);
  return r;
}

void bench_report_add(bench_report *r, const char *case_name,
                      const char *metric, double value, const char *unit,
                      const char *baseline_name, double baseline_value) {
  if (r->nrows == r->cap) {
    int cap = r->cap ? r->cap * 2 : 32;
    bench_row *rows = realloc(r->rows, (size_t)cap * sizeof *rows);
    if (rows == NULL) return;
    r->rows = rows;
    r->cap = cap;
  }
  bench_row *row = &r->rows[r->nrows++];
  memset(row, 0, sizeof *row);
  /* Progress on a terminal only: the figure just measured, overwritten by
   * the next, erased before the report. */
  if (isatty(STDERR_FILENO))
    fprintf(stderr, "\r\033[K[bench %s] %d measured, last: %.60s", r->name,
            r->nrows, case_name);
  snprintf(row->case_name, sizeof row->case_name, "%s", case_name);
  snprintf(row->metric, sizeof row->metric, "%s", metric);
  snprintf(row->unit, sizeof row->unit, "%s", unit);
  row->value = value;
  if (baseline_name != NULL) {
    row->has_baseline = 1;
    snprintf(row->baseline_name, sizeof row->baseline_name, "%s",
             baseline_name);
    row->baseline = baseline_value;
  }
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    putchar(*s);
  }
  putchar('"');
}

void bench_report_finish(bench_report *r, int json) {
  if (isatty(STDERR_FILENO) && r->nrows > 0) fprintf(stderr, "\r\033[K");
  int ndev = mgpu_device_count();
  const char *backend = "none";
  mgpu_device_props p = {.size = sizeof p};
  if (ndev > 0 && mgpu_device_get_props(0, &p) == 0) backend = p.backend;
  if (json) {
    printf("{\"bench\": ");
    json_string(r->name);
    printf(", \"backend\": ");
    json_string(backend);
    printf(", \"devices\": %d,\n \"results\": [", ndev < 0 ? 0 : ndev);
    for (int i = 0; i < r->nrows; i++) {
      bench_row *row = &r->rows[i];
      printf("%s\n   {\"case\": ", i ? "," : "");
      json_string(row->case_name);
      printf(", \"metric\": ");
      json_string(row->metric);
      printf(", \"value\": %.6g, \"unit\": ", row->value);
      json_string(row->unit);
      if (row->has_baseline) {
        printf(", \"baseline\": {\"name\": ");
        json_string(row->baseline_name);
        printf(", \"value\": %.6g}", row->baseline);
        if (row->baseline != 0)
          printf(", \"ratio\": %.4g", row->value / row->baseline);
      }
      printf("}");
    }
    printf("]}\n");
  } else {
    printf("bench %s: backend %s, %d devices\n", r->name, backend, ndev);
    printf("%-40s %-10s %12s %-7s %-22s %12s %7s\n", "case", "metric", "value",
           "unit", "baseline", "value", "ratio");
    for (int i = 0; i < r->nrows; i++) {
      bench_row *row = &r->rows[i];
      printf("%-40s %-10s %12.4g %-7s", row->case_name, row->metric,
             row->value, row->unit);
      if (row->has_baseline && row->baseline != 0)
        printf(" %-22s %12.4g %7.3f", row->baseline_name, row->baseline,
               row->value / row->baseline);
      printf("\n");
    }
  }
  free(r->rows);
  free(r);
}

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_memcpy_gbps(size_t size, int reps) {
  char *a = malloc(size), *b = malloc(size);
  double *t = malloc((size_t)reps * sizeof *t);
  double gbps = 0;
  if (a == NULL || b == NULL || t == NULL) goto out;
  memset(a, 1, size);
  memset(b, 2, size);
  memcpy(b, a, size); /* warm-up */
  for (int i = 0; i < reps; i++) {
    double t0 = bench_now();
    memcpy(b, a, size);
    t[i] = bench_now() - t0;
  }
  gbps = (double)size / bench_median(t, reps) / 1e9;
out:
  free(a);
  free(b);
  free(t);
  return gbps;
}
