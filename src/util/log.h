/* Errors and the log: the thread-local error detail (error.c) and the
 * library's only printer (log.c). A platform service every layer may use;
 * it depends on nothing of mgpu but the public error codes. */
#ifndef MGPU_UTIL_LOG_H
#define MGPU_UTIL_LOG_H

#include <stdarg.h>

#include "mgpu/core.h"
#include "mgpu/error.h"

/* Writes the thread's detail ("device 2: ...") and returns code. */
int mgpu__error(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int mgpu__verror(int code, const char *fmt, va_list ap);

/* fork: in a child forked after mgpu_init, the pid of the parent that
 * initialized mgpu (the core's fork handler sets it); 0 otherwise. While it
 * is set, a MGPU_ENOINIT or MGPU_EFORK error becomes MGPU_EFORK with a detail
 * that names the parent. mgpu__fork_error writes that detail for `what` and
 * returns MGPU_EFORK, for entry points that check by themselves. */
void mgpu__forked_set(int pid);
int mgpu__forked_from(void);
int mgpu__fork_error(const char *what);
/* Prints one line on stderr when level is at most the level set (MGPU_LOG). */
void mgpu__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mgpu__log_set_level(int level);
int mgpu__log_level(void);

#endif /* MGPU_UTIL_LOG_H */
