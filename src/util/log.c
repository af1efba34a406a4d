/* The library's only printer. It prints nothing unless MGPU_LOG (or the
 * config's log_level) asks; the level is set once by mgpu_init. */
#include <stdatomic.h>
#include <stdio.h>

#include "util/log.h"

static _Atomic int log_level = MGPU_LOG_NONE;

void mgpu__log_set_level(int level) { log_level = level; }
int mgpu__log_level(void) { return log_level; }

void mgpu__log(int level, const char *fmt, ...) {
  static const char *names[] = {"", "warn", "info", "debug"};
  if (level > log_level || level <= MGPU_LOG_NONE) return;
  char line[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line keeps lines of concurrent threads whole. */
  fprintf(stderr, "mgpu %s: %s\n", names[level], line);
}
