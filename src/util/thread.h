/* Thin wrappers over pthreads. A failed lock, unlock, wait or signal is a bug
 * in mgpu, not a condition to handle: it aborts with a message. */
#ifndef MGPU_UTIL_THREAD_H
#define MGPU_UTIL_THREAD_H

#include <pthread.h>
#include <stdint.h>

typedef pthread_mutex_t mgpu__mutex;
typedef pthread_cond_t mgpu__cond;
typedef pthread_t mgpu__thread;

void mgpu__mutex_init(mgpu__mutex *m);
void mgpu__mutex_destroy(mgpu__mutex *m);
void mgpu__mutex_lock(mgpu__mutex *m);
void mgpu__mutex_unlock(mgpu__mutex *m);

void mgpu__cond_init(mgpu__cond *c);
void mgpu__cond_destroy(mgpu__cond *c);
void mgpu__cond_wait(mgpu__cond *c, mgpu__mutex *m);
/* Returns 0, or ETIMEDOUT once deadline_ns (mgpu__now_ns clock) passed. */
int mgpu__cond_timedwait(mgpu__cond *c, mgpu__mutex *m, uint64_t deadline_ns);
void mgpu__cond_signal(mgpu__cond *c);
void mgpu__cond_broadcast(mgpu__cond *c);

/* Returns 0 or an errno value. */
int mgpu__thread_create(mgpu__thread *t, void *(*fn)(void *), void *arg);
void mgpu__thread_join(mgpu__thread t);

/* What the calling thread is to the library, for calls it must not make
 * (mgpu_shutdown would wait for the thread itself): a static phrase such
 * as "a device's host thread", set by the thread when it starts; NULL for
 * every thread the library did not start. */
void mgpu__thread_role_set(const char *role);
const char *mgpu__thread_role(void);

/* Monotonic clock in nanoseconds. */
uint64_t mgpu__now_ns(void);
/* The same clock read coarsely (to a few milliseconds) and cheaply, where
 * a record must cost next to nothing (the flight recorder). */
uint64_t mgpu__now_coarse_ns(void);

#endif /* MGPU_UTIL_THREAD_H */
