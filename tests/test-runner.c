/* The test runner itself (tests/runner.c): a test that crashes or hangs is
 * named with how it ended, and the tests after it still run. The
 * runner_child_* helpers are the subjects (ctest does not run them): they
 * only misbehave when this file runs itself with MGPU_RUNNER_SELFTEST=1. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "task.h"

static int subject(void) {
  const char *s = getenv("MGPU_RUNNER_SELFTEST");
  return s != NULL && strcmp(s, "1") == 0;
}

TEST_IMPL(runner_child_crash) {
  if (!subject()) return TEST_SKIP;
  abort(); /* not SIGSEGV: ASan would catch that and exit */
  return 0;
}

TEST_IMPL(runner_child_hang) {
  if (!subject()) return TEST_SKIP;
  for (;;) pause();
  return 0;
}

TEST_IMPL(runner_child_fails) {
  if (!subject()) return TEST_SKIP;
  return 3;
}

TEST_IMPL(runner_child_ok) {
  if (!subject()) return TEST_SKIP;
  /* On a host device, whatever MGPU_DEVICES says: it runs under a timeout
   * of 1 s, which opening a GPU can take on its own. */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:1";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_EQ(mgpu_device_count(), 1);
  return 0;
}

/* Runs this executable with args under the subject environment; returns its
 * exit status and its output in out. */
static int run_self(const char *args, char *out, size_t size) {
  char exe[1024];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT(len > 0);
  exe[len] = '\0';
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "MGPU_RUNNER_SELFTEST=1 MGPU_TEST_TIMEOUT=1 '%s' %s 2>/dev/null",
           exe, args);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  size_t got = fread(out, 1, size - 1, p);
  out[got] = '\0';
  int status = pclose(p);
  ASSERT(status != -1);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST_IMPL(runner_names_crash_and_hang) {
  if (subject()) return TEST_SKIP;
  static char out[8192];
  ASSERT_EQ(run_self("runner_child_crash", out, sizeof out), 1);
  ASSERT(strstr(out, "FAIL runner_child_crash (signal 6") != NULL);

  ASSERT_EQ(run_self("runner_child_hang", out, sizeof out), 1);
  ASSERT(strstr(out, "FAIL runner_child_hang (timeout after 1 s)") != NULL);

  ASSERT_EQ(run_self("runner_child_fails", out, sizeof out), 1);
  ASSERT(strstr(out, "FAIL runner_child_fails (3)") != NULL);

  ASSERT_EQ(run_self("runner_child_ok", out, sizeof out), 0);
  ASSERT(strstr(out, "ok runner_child_ok") != NULL);

  /* The whole list: every test is reported, the ones after a crash and a
   * hang included. */
  ASSERT_EQ(run_self("", out, sizeof out), 1);
  const char *expect[] = {"FAIL runner_child_crash", "FAIL runner_child_hang",
                          "FAIL runner_child_fails", "ok runner_child_ok",
                          "skip runner_names_crash_and_hang"};
  const char *at = out;
  for (size_t i = 0; i < sizeof expect / sizeof *expect; i++) {
    const char *hit = strstr(at, expect[i]);
    if (hit == NULL) {
      fprintf(stderr, "missing \"%s\" in order in:\n%s\n", expect[i], out);
      ASSERT(0);
    }
    at = hit;
  }
  return 0;
}

TEST_LIST_BEGIN
TEST_HELPER(runner_child_crash)
TEST_HELPER(runner_child_hang)
TEST_HELPER(runner_child_fails)
TEST_HELPER(runner_child_ok)
TEST_ENTRY(runner_names_crash_and_hang)
TEST_LIST_END
