/* pthread wrappers: see thread.h. Conditions use CLOCK_MONOTONIC so that
 * timeouts do not jump with the wall clock. */
#include "util/thread.h"

#include "util/fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "mgpu: fatal: %s failed: %s\n", what, strerror(rc));
    abort();
  }
}

void mgpu__mutex_init(mgpu__mutex *m) {
  check(pthread_mutex_init(m, NULL), "pthread_mutex_init");
}
void mgpu__mutex_destroy(mgpu__mutex *m) {
  check(pthread_mutex_destroy(m), "pthread_mutex_destroy");
}
void mgpu__mutex_lock(mgpu__mutex *m) {
  check(pthread_mutex_lock(m), "pthread_mutex_lock");
}
void mgpu__mutex_unlock(mgpu__mutex *m) {
  check(pthread_mutex_unlock(m), "pthread_mutex_unlock");
}

void mgpu__cond_init(mgpu__cond *c) {
  pthread_condattr_t attr;
  check(pthread_condattr_init(&attr), "pthread_condattr_init");
  check(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC),
        "pthread_condattr_setclock");
  check(pthread_cond_init(c, &attr), "pthread_cond_init");
  pthread_condattr_destroy(&attr);
}
void mgpu__cond_destroy(mgpu__cond *c) {
  check(pthread_cond_destroy(c), "pthread_cond_destroy");
}
void mgpu__cond_wait(mgpu__cond *c, mgpu__mutex *m) {
  check(pthread_cond_wait(c, m), "pthread_cond_wait");
}
int mgpu__cond_timedwait(mgpu__cond *c, mgpu__mutex *m, uint64_t deadline_ns) {
  struct timespec ts;
  ts.tv_sec = (time_t)(deadline_ns / 1000000000u);
  ts.tv_nsec = (long)(deadline_ns % 1000000000u);
  int rc = pthread_cond_timedwait(c, m, &ts);
  if (rc == ETIMEDOUT) return rc;
  check(rc, "pthread_cond_timedwait");
  return 0;
}
void mgpu__cond_signal(mgpu__cond *c) {
  check(pthread_cond_signal(c), "pthread_cond_signal");
}
void mgpu__cond_broadcast(mgpu__cond *c) {
  check(pthread_cond_broadcast(c), "pthread_cond_broadcast");
}

int mgpu__thread_create(mgpu__thread *t, void *(*fn)(void *), void *arg) {
  /* A fault site: an injected failure is what the system says when it is
   * out of threads. */
  if (mgpu__fault_hit(MGPU__FAULT_THREAD, NULL)) return EAGAIN;
  return pthread_create(t, NULL, fn, arg);
}
void mgpu__thread_join(mgpu__thread t) {
  check(pthread_join(t, NULL), "pthread_join");
}

uint64_t mgpu__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t mgpu__now_coarse_ns(void) {
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Thread_local const char *thread_role;

void mgpu__thread_role_set(const char *role) { thread_role = role; }
const char *mgpu__thread_role(void) { return thread_role; }
