/* The test harness: each tests/test-<area>.c defines tests with TEST_IMPL and
 * lists them between TEST_LIST_BEGIN and TEST_LIST_END; CMake registers each
 * entry as its own ctest test. runner.c runs each test in a child process
 * under a timeout, so a crash or a hang is reported with the test's name.
 *
 * An assertion failure prints the expression, the mgpu error and its detail,
 * and aborts. A test returns TEST_SKIP (77) when the machine cannot run it
 * (fewer devices than it needs, say). */
#ifndef MGPU_TEST_TASK_H
#define MGPU_TEST_TASK_H

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mgpu.h"

#define TEST_SKIP 77

#define TEST_IMPL(name) int test_##name(void)

typedef struct test_entry {
  const char *name;
  int (*fn)(void);
} test_entry;

#define TEST_LIST_BEGIN const test_entry mgpu_test_list[] = {
#define TEST_ENTRY(name) {#name, test_##name},
/* An entry the runner knows by name but ctest does not register: a helper
 * that a test runs in a process of its own (libuv's TEST_HELPER). */
#define TEST_HELPER(name) {#name, test_##name},
#define TEST_LIST_END {NULL, NULL}};

#define ASSERT(expr)                                                        \
  do {                                                                      \
    if (!(expr)) {                                                          \
      fprintf(stderr, "%s:%d: assertion failed: %s\n  last detail: %s\n",    \
              __FILE__, __LINE__, #expr, mgpu_error_detail());              \
      abort();                                                              \
    }                                                                       \
  } while (0)

/* The call must succeed. */
#define ASSERT_OK(expr)                                                     \
  do {                                                                      \
    int test_rc_ = (expr);                                                  \
    if (test_rc_ != 0) {                                                    \
      fprintf(stderr, "%s:%d: %s returned %s (%d): %s\n  detail: %s\n",     \
              __FILE__, __LINE__, #expr, mgpu_err_name(test_rc_), test_rc_, \
              mgpu_strerror(test_rc_), mgpu_error_detail());                \
      abort();                                                              \
    }                                                                       \
  } while (0)

/* The call must fail with exactly this code and leave a detail. */
#define ASSERT_ERR(code, expr)                                              \
  do {                                                                      \
    int test_rc_ = (expr);                                                  \
    if (test_rc_ != (code)) {                                               \
      fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s\n"           \
              "  detail: %s\n", __FILE__, __LINE__, #expr,                   \
              mgpu_err_name(test_rc_), test_rc_, mgpu_err_name(code),       \
              mgpu_error_detail());                                         \
      abort();                                                              \
    }                                                                       \
    if (mgpu_error_detail()[0] == '\0') {                                   \
      fprintf(stderr, "%s:%d: %s failed without a detail\n", __FILE__,      \
              __LINE__, #expr);                                             \
      abort();                                                              \
    }                                                                       \
  } while (0)

#define ASSERT_EQ(a, b)                                                     \
  do {                                                                      \
    long long test_a_ = (long long)(a), test_b_ = (long long)(b);           \
    if (test_a_ != test_b_) {                                               \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__,   \
              __LINE__, #a, #b, test_a_, test_b_);                          \
      abort();                                                              \
    }                                                                       \
  } while (0)

/* The detail of the last failure must contain the text. */
#define ASSERT_DETAIL_HAS(text)                                             \
  do {                                                                      \
    if (strstr(mgpu_error_detail(), (text)) == NULL) {                      \
      fprintf(stderr, "%s:%d: detail \"%s\" does not mention \"%s\"\n",     \
              __FILE__, __LINE__, mgpu_error_detail(), (text));             \
      abort();                                                              \
    }                                                                       \
  } while (0)

/* mgpu_init from the environment, or host:4 if MGPU_DEVICES is unset and no
 * GPU is found. Returns the device count. */
static inline int test_init(void) {
  ASSERT_OK(mgpu_init(NULL));
  int n = mgpu_device_count();
  ASSERT(n > 0);
  return n;
}

/* 1 when device dev is a host device (the tests that look inside the host
 * backend, or time its workers, skip elsewhere). */
/* A symbol of libmgpu-cuda-testkern.so (the CUDA test kernels, built by
 * nvcc beside the plugin; tests/cuda-testkern.cu), opened once per process
 * from the test binary's ../lib, so that tests stay plain C. NULL, with a
 * message, where the library or the symbol is missing. */
static inline const void *test_testkern_sym(const char *name) {
  static void *tk;
  if (tk == NULL) {
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(path, sizeof path, "%s/../lib/libmgpu-cuda-testkern.so", exe);
    tk = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (tk == NULL) {
      fprintf(stderr, "cannot open %s: %s\n", path, dlerror());
      return NULL;
    }
  }
  const void *p = dlsym(tk, name);
  if (p == NULL) fprintf(stderr, "libmgpu-cuda-testkern.so lacks %s\n", name);
  return p;
}

static inline int test_device_is_host(int dev) {
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(dev, &p));
  return p.backend_kind == MGPU_BACKEND_HOST;
}

/* The devices of device 0's backend, in order, at most max of them:
 * collectives, channels and stream barriers span devices of one backend. */
static inline int test_same_backend(int *out, int max) {
  mgpu_device_props p0 = {.size = sizeof p0}, p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  int m = 0;
  for (int d = 0; d < mgpu_device_count() && m < max; d++) {
    ASSERT_OK(mgpu_device_get_props(d, &p));
    if (p.backend_kind == p0.backend_kind) out[m++] = d;
  }
  return m;
}

/* A deterministic generator for test data (xorshift64*). */
static inline uint64_t test_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 2685821657736338717ull;
}

/* A gate a host callback (test_gate_wait, as the callback's function)
 * waits at until the test opens it (test_gate_open). */
typedef struct test_gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int open;
} test_gate;
#define TEST_GATE_INITIALIZER \
  {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static inline void test_gate_wait(void *arg) {
  test_gate *g = arg;
  pthread_mutex_lock(&g->lock);
  while (!g->open) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static inline void test_gate_open(test_gate *g) {
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

/* The fault sites a sweep tries: every stride-th from first
 * (MGPU_SWEEP_STRIDE=k, default 1, and MGPU_SWEEP_OFFSET=o, the o-th of
 * each k: first = 1 + o % k), so that a pass that tries a share of the
 * sites can try another share at the next run (.ci/run takes o from the
 * commit). Printed, to repeat a run. */
static inline void test_sweep_sites(const char *what, uint64_t *first,
                                    uint64_t *stride) {
  const char *k = getenv("MGPU_SWEEP_STRIDE");
  const char *o = getenv("MGPU_SWEEP_OFFSET");
  *stride = k != NULL ? strtoull(k, NULL, 10) : 1;
  if (*stride == 0) *stride = 1;
  *first = 1 + (o != NULL ? strtoull(o, NULL, 10) : 0) % *stride;
  if (*stride > 1)
    printf("%s: one site in %llu, from site %llu (MGPU_SWEEP_STRIDE=%llu "
           "MGPU_SWEEP_OFFSET=%llu)\n", what, (unsigned long long)*stride,
           (unsigned long long)*first, (unsigned long long)*stride,
           (unsigned long long)(*first - 1));
}

#endif /* MGPU_TEST_TASK_H */
