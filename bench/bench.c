/* The report printer, timers and the memcpy baseline shared by every
 * benchmark. */
#include "bench.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_row {
  char case_name[96];
  char metric[32];
  char unit[16];
  char baseline_name[96];
  double value, baseline;
  int has_baseline;
  double noise; /* > 0: the figure is this noisy (bench_report_noise) */
} bench_row;

struct bench_report {
  char name[32];
  bench_row *rows;
  int nrows, cap;
};

int bench_parse(int argc, char **argv, const char *usage, bench_opts *opts,
                char **rest, int maxrest, int *nrest) {
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
    } else if (*nrest < maxrest) {
      rest[(*nrest)++] = argv[i];
    } else {
      fprintf(stderr, "unexpected argument %s\nusage: %s\n", argv[i], usage);
      return 2;
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

void bench_report_noise(bench_report *r, double noise) {
  if (r != NULL && r->nrows > 0) r->rows[r->nrows - 1].noise = noise;
}

/* The figure is within its noise of 0: no measurement. */
static int below_noise(const bench_row *row) {
  return row->noise > 0 && row->value <= row->noise;
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
      if (below_noise(row))
        printf(", \"value\": null, \"below_noise\": true");
      else
        printf(", \"value\": %.6g", row->value);
      if (row->noise > 0) printf(", \"noise\": %.6g", row->noise);
      printf(", \"unit\": ");
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
      if (below_noise(row)) {
        char what[64];
        snprintf(what, sizeof what, "below noise (± %.3g %s)", row->noise,
                 row->unit);
        printf("%-40s %-10s %s", row->case_name, row->metric, what);
      } else {
        printf("%-40s %-10s %12.4g %-7s", row->case_name, row->metric,
               row->value, row->unit);
      }
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

double bench_thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

/* ---- memcpy with n threads ---- */

typedef struct copy_team {
  pthread_barrier_t go, done;
  char *a, *b;
  size_t size;
  int nthreads, iters, reps;
  double *t; /* per repetition: first start to last end, per copy */
  double *start, *end; /* per thread, this repetition */
} copy_team;

typedef struct copy_member {
  copy_team *team;
  int idx;
} copy_member;

static void *copy_thread(void *p) {
  copy_member *m = p;
  copy_team *t = m->team;
  size_t lo = t->size * (size_t)m->idx / (size_t)t->nthreads;
  size_t hi = t->size * (size_t)(m->idx + 1) / (size_t)t->nthreads;
  for (int r = -1; r < t->reps; r++) { /* -1: warm-up */
    pthread_barrier_wait(&t->go);
    t->start[m->idx] = bench_now();
    for (int i = 0; i < t->iters; i++) memcpy(t->b + lo, t->a + lo, hi - lo);
    t->end[m->idx] = bench_now();
    pthread_barrier_wait(&t->done);
    if (m->idx == 0 && r >= 0) {
      /* Wall time: threads that share a core take turns, and that counts. */
      double first = t->start[0], last = t->end[0];
      for (int k = 1; k < t->nthreads; k++) {
        if (t->start[k] < first) first = t->start[k];
        if (t->end[k] > last) last = t->end[k];
      }
      t->t[r] = (last - first) / t->iters;
    }
  }
  return NULL;
}

double bench_memcpy_gbps(size_t size, int nthreads, int iters, int reps) {
  if (nthreads < 1) nthreads = 1;
  if (iters < 1) iters = 1;
  copy_team t = {.size = size, .nthreads = nthreads, .iters = iters,
                 .reps = reps};
  t.a = malloc(size);
  t.b = malloc(size);
  t.t = malloc((size_t)reps * sizeof *t.t);
  t.start = calloc((size_t)nthreads, sizeof *t.start);
  t.end = calloc((size_t)nthreads, sizeof *t.end);
  pthread_t *th = calloc((size_t)nthreads, sizeof *th);
  copy_member *m = calloc((size_t)nthreads, sizeof *m);
  double gbps = 0;
  if (!t.a || !t.b || !t.t || !t.start || !t.end || !th || !m) goto out;
  memset(t.a, 1, size); /* pre-touched */
  memset(t.b, 2, size);
  pthread_barrier_init(&t.go, NULL, (unsigned)nthreads);
  pthread_barrier_init(&t.done, NULL, (unsigned)nthreads);
  int started = 0;
  for (int i = 1; i < nthreads; i++) {
    m[i] = (copy_member){&t, i};
    if (pthread_create(&th[i], NULL, copy_thread, &m[i]) != 0) break;
    started++;
  }
  if (started == nthreads - 1) {
    m[0] = (copy_member){&t, 0};
    copy_thread(&m[0]);
    gbps = (double)size / bench_median(t.t, reps) / 1e9;
  } else {
    fprintf(stderr, "bench: cannot start %d copy threads\n", nthreads);
    exit(1); /* the started ones wait at a barrier for ever */
  }
  for (int i = 1; i < nthreads; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&t.go);
  pthread_barrier_destroy(&t.done);
out:
  free(t.a);
  free(t.b);
  free(t.t);
  free(t.start);
  free(t.end);
  free(th);
  free(m);
  return gbps;
}

/* ---- the two-thread ping-pong ---- */

typedef struct pingpong {
  _Alignas(64) _Atomic long ping; /* written by the caller */
  _Alignas(64) _Atomic long pong; /* written by the partner */
  _Alignas(64) pthread_mutex_t lock;
  pthread_cond_t cond;
  long turn_ping, turn_pong; /* lock */
  int spin;
  /* Bytes each side moves per turn: the caller copies its message into
   * ab before its ping, the partner copies ab out into its own buffer and
   * that into ba before its pong, the caller copies ba out. NULL: none. */
  size_t bytes;
  unsigned char *ab, *ba, *mine, *theirs, *back;
} pingpong;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

#define PP_STOP (-1L)

static void *pingpong_partner(void *p) {
  pingpong *pp = p;
  if (pp->spin) {
    for (long seen = 0;;) {
      long v;
      while ((v = atomic_load_explicit(&pp->ping, memory_order_acquire)) == seen)
        relax();
      if (v == PP_STOP) break;
      seen = v;
      if (pp->bytes) {
        memcpy(pp->theirs, pp->ab, pp->bytes);
        memcpy(pp->ba, pp->theirs, pp->bytes);
      }
      atomic_store_explicit(&pp->pong, v, memory_order_release);
    }
    return NULL;
  }
  pthread_mutex_lock(&pp->lock);
  for (long seen = 0;;) {
    while (pp->turn_ping == seen) pthread_cond_wait(&pp->cond, &pp->lock);
    if (pp->turn_ping == PP_STOP) break;
    seen = pp->turn_ping;
    if (pp->bytes) {
      memcpy(pp->theirs, pp->ab, pp->bytes);
      memcpy(pp->ba, pp->theirs, pp->bytes);
    }
    pp->turn_pong = seen;
    pthread_cond_broadcast(&pp->cond);
  }
  pthread_mutex_unlock(&pp->lock);
  return NULL;
}

static void pingpong_once(pingpong *pp, long i) {
  if (pp->bytes) memcpy(pp->ab, pp->mine, pp->bytes);
  if (pp->spin) {
    atomic_store_explicit(&pp->ping, i, memory_order_release);
    while (atomic_load_explicit(&pp->pong, memory_order_acquire) != i) relax();
  } else {
    pthread_mutex_lock(&pp->lock);
    pp->turn_ping = i;
    pthread_cond_broadcast(&pp->cond);
    while (pp->turn_pong != i) pthread_cond_wait(&pp->cond, &pp->lock);
    pthread_mutex_unlock(&pp->lock);
  }
  if (pp->bytes) memcpy(pp->back, pp->ba, pp->bytes);
}

double bench_pingpong_us(int spin, int iters, int reps) {
  return bench_pingpong_bytes_us(spin, 0, iters, reps);
}

double bench_pingpong_bytes_us(int spin, size_t bytes, int iters, int reps) {
  pingpong *pp = aligned_alloc(64, sizeof *pp);
  double *v = malloc((size_t)reps * sizeof *v);
  unsigned char *mem = bytes ? malloc(5 * bytes) : NULL;
  if (pp == NULL || v == NULL || (bytes && mem == NULL)) {
    free(pp);
    free(v);
    free(mem);
    return 0;
  }
  memset(pp, 0, sizeof *pp);
  pp->spin = spin;
  if (bytes) {
    memset(mem, 1, 5 * bytes); /* pre-touched */
    pp->bytes = bytes;
    pp->mine = mem;
    pp->ab = mem + bytes;
    pp->theirs = mem + 2 * bytes;
    pp->ba = mem + 3 * bytes;
    pp->back = mem + 4 * bytes;
  }
  pthread_mutex_init(&pp->lock, NULL);
  pthread_cond_init(&pp->cond, NULL);
  pthread_t t;
  double m = 0;
  if (pthread_create(&t, NULL, pingpong_partner, pp) == 0) {
    long k = 0;
    for (int i = 0; i < iters; i++) pingpong_once(pp, ++k); /* warm-up */
    for (int r = 0; r < reps; r++) {
      double t0 = bench_now();
      for (int i = 0; i < iters; i++) pingpong_once(pp, ++k);
      v[r] = (bench_now() - t0) / iters * 1e6;
    }
    if (spin) {
      atomic_store_explicit(&pp->ping, PP_STOP, memory_order_release);
    } else {
      pthread_mutex_lock(&pp->lock);
      pp->turn_ping = PP_STOP;
      pthread_cond_broadcast(&pp->cond);
      pthread_mutex_unlock(&pp->lock);
    }
    pthread_join(t, NULL);
    m = bench_median(v, reps);
  }
  pthread_mutex_destroy(&pp->lock);
  pthread_cond_destroy(&pp->cond);
  free(pp);
  free(v);
  free(mem);
  return m;
}

/* ---- load ---- */

static struct {
  _Atomic int stop;
  int n;
  pthread_t th[64];
} load;

static void *load_thread(void *p) {
  (void)p;
  volatile unsigned long x = 0;
  while (!atomic_load_explicit(&load.stop, memory_order_relaxed)) x++;
  return NULL;
}

void bench_load_start(int n) {
  if (n > 64) n = 64;
  atomic_store(&load.stop, 0);
  load.n = 0;
  for (int i = 0; i < n; i++)
    if (pthread_create(&load.th[load.n], NULL, load_thread, NULL) == 0)
      load.n++;
}

void bench_load_stop(void) {
  atomic_store(&load.stop, 1);
  for (int i = 0; i < load.n; i++) pthread_join(load.th[i], NULL);
  load.n = 0;
}

int bench_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
