/* Error codes, names and the thread-local detail.
 *
 * The detail is written where a failure is found and names what was wrong
 * (device, buffer, offset, size). It lives in thread-local storage, so two
 * threads failing at once never overwrite each other's message. */
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

int mgpu__verror(int code, const char *fmt, va_list ap) {
  vsnprintf(detail, sizeof detail, fmt, ap);
  mgpu__log(MGPU_LOG_DEBUG, "%s: %s", mgpu_err_name(code), detail);
  return code;
}

int mgpu__error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mgpu__verror(code, fmt, ap);
  va_end(ap);
  return code;
}
