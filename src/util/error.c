/* Error codes, names and the thread-local detail.
 *
 * The detail is written where a failure is found and names what was wrong
 * (device, buffer, offset, size). It lives in thread-local storage, so two
 * threads failing at once never overwrite each other's message. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util/log.h"

/* Large enough for a timeout's list of missing devices and their last
 * operations. */
static _Thread_local char detail[1024];

const char *mgpu_strerror(int code) {
  switch (code) {
    case 0:
      return "success";
#define MGPU__STRERROR_CASE(name, value, msg) \
  case MGPU_##name:                           \
    return msg;
    MGPU_ERRNO_MAP(MGPU__STRERROR_CASE)
#undef MGPU__STRERROR_CASE
  }
  return "unknown error";
}

const char *mgpu_err_name(int code) {
  switch (code) {
    case 0:
      return "MGPU_OK";
#define MGPU__ERRNAME_CASE(name, value, msg) \
  case MGPU_##name:                          \
    return "MGPU_" #name;
    MGPU_ERRNO_MAP(MGPU__ERRNAME_CASE)
#undef MGPU__ERRNAME_CASE
  }
  return "MGPU_EUNKNOWN";
}

const char *mgpu_error_detail(void) { return detail; }

void mgpu_error_clear(void) { detail[0] = '\0'; }

/* The pid of the process that initialized mgpu, in a child forked from it
 * after mgpu_init (set by the core's fork handler); 0 otherwise. Kept here,
 * on the floor, because the error path itself asks for it. */
static _Atomic int forked_from;

void mgpu__forked_set(int pid) { forked_from = pid; }
int mgpu__forked_from(void) { return forked_from; }

int mgpu__fork_error(const char *what) {
  snprintf(detail, sizeof detail, "%s: this process was forked from process "
           "%d after it called mgpu_init; mgpu cannot be used in the child "
           "(fork before mgpu_init, or exec)", what, mgpu__forked_from());
  return MGPU_EFORK;
}

int mgpu__verror(int code, const char *fmt, va_list ap) {
  /* In a child forked after mgpu_init the library looks uninitialized and
   * the handle table refuses every handle: say why, once, here. */
  if ((code == MGPU_ENOINIT || code == MGPU_EFORK) && mgpu__forked_from()) {
    char what[160];
    vsnprintf(what, sizeof what, fmt, ap);
    char *colon = strchr(what, ':');
    if (colon != NULL) *colon = '\0';
    return mgpu__fork_error(what);
  }
  vsnprintf(detail, sizeof detail, fmt, ap);
  mgpu__log(MGPU_LOG_DEBUG, "%s: %s", mgpu_err_name(code), detail);
  return code;
}

int mgpu__error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  code = mgpu__verror(code, fmt, ap);
  va_end(ap);
  return code;
}
