/* Stress: many user threads driving many devices through many streams at
 * once, with cross-device event waits and run_on_device calls mixed in.
 * Every result is checked; under TSan this is the race detector's workload. */
#include <pthread.h>
#include <stdatomic.h>

#include "task.h"

#define THREADS 8
#define ROUNDS 40
#define ELEMS 4096

typedef struct worker {
  int id, ndev, failures;
} worker;

static int bump(int dev, void *arg) {
  _Atomic int *count = arg;
  atomic_fetch_add(count, 1);
  return dev;
}

static _Atomic int run_count;

static void *stress_thread(void *arg) {
  worker *w = arg;
  uint64_t seed = 1000 + (uint64_t)w->id;
  int d0 = w->id % w->ndev, d1 = (w->id + 1) % w->ndev;
  mgpu_stream *s0[2], *s1;
  mgpu_event *done;
  mgpu_buffer *a, *b, *c, *staging;
  ASSERT_OK(mgpu_stream_create(&s0[0], d0));
  ASSERT_OK(mgpu_stream_create(&s0[1], d0));
  ASSERT_OK(mgpu_stream_create(&s1, d1));
  ASSERT_OK(mgpu_event_create(&done, d0));
  ASSERT_OK(mgpu_malloc(&a, d0, ELEMS * 4));
  ASSERT_OK(mgpu_malloc(&b, d0, ELEMS * 4));
  ASSERT_OK(mgpu_malloc(&c, d1, ELEMS * 4));
  ASSERT_OK(mgpu_malloc_host(&staging, d0, ELEMS * 4));
  int32_t *va = malloc(ELEMS * 4), *vb = malloc(ELEMS * 4), *out = malloc(ELEMS * 4);
  for (int r = 0; r < ROUNDS; r++) {
    mgpu_stream *s = s0[r & 1];
    for (int i = 0; i < ELEMS; i++) {
      va[i] = (int32_t)(test_rand(&seed) % 1000);
      vb[i] = (int32_t)(test_rand(&seed) % 1000);
    }
    ASSERT_OK(mgpu_memcpy_htod_async(a, 0, va, ELEMS * 4, s));
    ASSERT_OK(mgpu_memcpy_htod_async(b, 0, vb, ELEMS * 4, s));
    ASSERT_OK(mgpu_elementwise(s, a, 0, a, 0, b, 0, ELEMS, MGPU_INT32, MGPU_SUM));
    ASSERT_OK(mgpu_memcpy_async(staging, 0, a, 0, ELEMS * 4, s));
    ASSERT_OK(mgpu_event_record(done, s));
    ASSERT_OK(mgpu_stream_wait_event(s1, done));
    ASSERT_OK(mgpu_memcpy_async(c, 0, staging, 0, ELEMS * 4, s1));
    ASSERT_OK(mgpu_memcpy_dtoh_async(out, c, 0, ELEMS * 4, s1));
    if (r % 8 == 0) ASSERT_EQ(mgpu_run_on_device(d1, bump, &run_count), d1);
    ASSERT_OK(mgpu_stream_synchronize(s1));
    for (int i = 0; i < ELEMS; i++)
      if (out[i] != va[i] + vb[i]) w->failures++;
  }
  free(va);
  free(vb);
  free(out);
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_free(c));
  ASSERT_OK(mgpu_free(staging));
  ASSERT_OK(mgpu_event_destroy(done));
  ASSERT_OK(mgpu_stream_destroy(s0[0]));
  ASSERT_OK(mgpu_stream_destroy(s0[1]));
  ASSERT_OK(mgpu_stream_destroy(s1));
  return NULL;
}

TEST_IMPL(threads_devices_streams) {
  int n = test_init();
  pthread_t t[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){i, n, 0};
    ASSERT_EQ(pthread_create(&t[i], NULL, stress_thread, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < THREADS; i++) ASSERT_EQ(w[i].failures, 0);
  ASSERT_EQ(run_count, THREADS * ((ROUNDS + 7) / 8));
  return 0;
}

static void *alloc_thread(void *arg) {
  worker *w = arg;
  uint64_t seed = 77 + (uint64_t)w->id;
  mgpu_buffer *held[16] = {0};
  for (int i = 0; i < 400; i++) {
    int k = (int)(test_rand(&seed) % 16);
    if (held[k] != NULL) {
      if (mgpu_free(held[k]) != 0) w->failures++;
      if (mgpu_free(held[k]) != MGPU_EFREED) w->failures++;
      held[k] = NULL;
    } else {
      int dev = (int)(test_rand(&seed) % (uint64_t)w->ndev);
      int rc = mgpu_malloc(&held[k], dev, 1 + test_rand(&seed) % 65536);
      if (rc != 0 && rc != MGPU_ENOMEM) w->failures++;
      if (rc != 0) held[k] = NULL;
    }
  }
  for (int k = 0; k < 16; k++)
    if (held[k] != NULL && mgpu_free(held[k]) != 0) w->failures++;
  return NULL;
}

TEST_IMPL(concurrent_alloc_free) {
  int n = test_init();
  pthread_t t[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){i, n, 0};
    ASSERT_EQ(pthread_create(&t[i], NULL, alloc_thread, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < THREADS; i++) ASSERT_EQ(w[i].failures, 0);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  for (int d = 0; d < n; d++) ASSERT_EQ(m.dev[d].mem_in_use, 0);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(threads_devices_streams)
TEST_ENTRY(concurrent_alloc_free)
TEST_LIST_END
