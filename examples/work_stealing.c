/* Work stealing over every device.
 *
 * One task on device 0 sums a vector of 2^20 integers by splitting itself:
 * a task over more than 4096 elements submits its two halves, which land on
 * the deque of the device that split them; a leaf sums its slice and then
 * stands for device work of 20 us to 2 ms (lengths vary from leaf to leaf).
 * All 511 tasks start on device 0, and the other devices get work only by
 * stealing it. The total is checked against the closed form; prints
 * per-device tasks run, tasks stolen and busy time, and the imbalance.
 *
 * Build: cc work_stealing.c $(pkg-config --cflags --libs mgpu) */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <mgpu.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N (1 << 20)

typedef struct job {
  mgpu_pool *pool;
  const int64_t *data;
  _Atomic int64_t total;
} job;

typedef struct slice {
  job *job;
  size_t begin, end;
  long work_us; /* how long the "device" is busy with this slice */
} slice;

static int sum_slice(int dev, mgpu_stream *stream, void *arg);

/* Slices longer than 4096 elements split in two tasks, queued on the
 * device that splits them: that device's deque grows, and the others
 * steal from it. */
static int submit_slice(job *j, size_t begin, size_t end, long work_us) {
  slice *s = malloc(sizeof *s);
  if (s == NULL) return MGPU_ENOMEM;
  *s = (slice){j, begin, end, work_us};
  return mgpu_pool_submit_fn(j->pool, sum_slice, s, NULL);
}

static int sum_slice(int dev, mgpu_stream *stream, void *arg) {
  (void)dev;
  (void)stream;
  slice *s = arg;
  job *j = s->job;
  int rc = 0;
  if (s->end - s->begin > 4096) {
    size_t mid = s->begin + (s->end - s->begin) / 2;
    rc = submit_slice(j, s->begin, mid, s->work_us);
    if (rc == 0) rc = submit_slice(j, mid, s->end, s->work_us * 3 % 2000 + 20);
  } else {
    int64_t sum = 0;
    for (size_t i = s->begin; i < s->end; i++) sum += j->data[i];
    atomic_fetch_add(&j->total, sum);
    /* Stand-in for device work of this length. */
    struct timespec ts = {0, s->work_us * 1000};
    nanosleep(&ts, NULL);
  }
  free(s);
  return rc;
}

int main(void) {
  int rc = mgpu_init(NULL);
  if (rc != 0) {
    fprintf(stderr, "mgpu_init: %s: %s\n", mgpu_strerror(rc),
            mgpu_error_detail());
    return 1;
  }
  int ndev = mgpu_device_count();
  int64_t *data = malloc(N * sizeof *data);
  for (size_t i = 0; i < N; i++) data[i] = (int64_t)i;

  mgpu_pool_opts opts = MGPU_POOL_OPTS_INITIALIZER;
  opts.policy = MGPU_SCHED_WS;
  mgpu_pool *pool;
  if ((rc = mgpu_pool_create(&pool, &opts)) != 0) {
    fprintf(stderr, "mgpu_pool_create: %s\n", mgpu_error_detail());
    return 1;
  }
  job j = {pool, data, 0};
  slice *root = malloc(sizeof *root);
  *root = (slice){&j, 0, N, 137};
  /* The root task prefers device 0: every split starts there. */
  mgpu_task_desc d = MGPU_TASK_DESC_INITIALIZER;
  d.fn = sum_slice;
  d.arg = root;
  d.device = 0;
  rc = mgpu_pool_submit(pool, &d, NULL);
  if (rc == 0) rc = mgpu_pool_wait_all(pool);
  if (rc != 0) {
    fprintf(stderr, "tasks failed: %s: %s\n", mgpu_strerror(rc),
            mgpu_error_detail());
    return 1;
  }

  mgpu_pool_stats st = {.size = sizeof st};
  mgpu_pool_stats_get(pool, &st);
  uint64_t run = 0, stolen = 0;
  printf("device  tasks run  stolen  busy ms\n");
  for (int i = 0; i < st.ndevices; i++) {
    printf("%6d  %9llu  %6llu  %7.2f\n", st.dev[i].device,
           (unsigned long long)st.dev[i].tasks_run,
           (unsigned long long)st.dev[i].tasks_stolen,
           (double)st.dev[i].busy_ns * 1e-6);
    run += st.dev[i].tasks_run;
    stolen += st.dev[i].tasks_stolen;
  }
  printf("load imbalance (max busy / mean busy - 1): %.3f\n",
         st.load_imbalance);
  mgpu_pool_destroy(pool);

  int64_t want = (int64_t)N * (N - 1) / 2;
  int ok = atomic_load(&j.total) == want && run == 2 * (N / 4096) - 1 &&
           (ndev == 1 || stolen > 0);
  printf("%s: sum %lld (expected %lld), %llu tasks, %llu stolen\n",
         ok ? "ok" : "WRONG", (long long)atomic_load(&j.total),
         (long long)want, (unsigned long long)run,
         (unsigned long long)stolen);
  free(data);
  mgpu_shutdown();
  return ok ? 0 : 1;
}
