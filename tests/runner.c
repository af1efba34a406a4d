/* Runs one test of the file's list by name (as ctest does), or every test in
 * turn when given none. Each test runs in a child process of its own under a
 * timeout (MGPU_TEST_TIMEOUT seconds, default 240: less than ctest's 300, so
 * the runner is the one that names a hang), as libuv's runner does: a crash
 * or a hang is reported with the test's name and the signal, and when running
 * the whole list the remaining tests still run.
 *
 * `--no-fork` (or MGPU_TEST_NO_FORK=1) runs in this process instead, for a
 * debugger. The child is the leader of its own process group, so a timeout
 * also ends the helper processes a test started; SIGINT and SIGTERM given to
 * the runner are passed on to that group. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"

extern const test_entry mgpu_test_list[];

/* A child that did not exit by itself: already reported. */
#define ENDED INT_MIN

static volatile sig_atomic_t child_group;

static void forward_signal(int sig) {
  if (child_group > 0) kill(-child_group, SIGKILL);
  signal(sig, SIG_DFL);
  raise(sig);
}

static int run_here(const test_entry *t) {
  int rc = t->fn();
  mgpu_shutdown();
  return rc;
}

static double timeout_seconds(void) {
  const char *s = getenv("MGPU_TEST_TIMEOUT");
  double v = s ? strtod(s, NULL) : 0;
  return v > 0 ? v : 240;
}

/* Runs t in a child; returns its exit status as run_here would, or ENDED after
 * printing how it ended when it did not exit (signal, timeout). */
static int run_forked(const test_entry *t) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    printf("FAIL %s (cannot fork: %s)\n", t->name, strerror(errno));
    return ENDED;
  }
  if (pid == 0) {
    setpgid(0, 0);
    /* What the test printed before a crash is part of its report. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = run_here(t);
    fflush(stdout);
    _exit(rc < 0 || rc > 255 ? 1 : rc);
  }
  setpgid(pid, pid); /* also here, so no race with the child's own call */
  child_group = pid;
  struct timespec nap = {0, 1000000}; /* 1 ms, doubling up to 50 ms */
  double limit = timeout_seconds(), waited = 0;
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      printf("FAIL %s (waitpid: %s)\n", t->name, strerror(errno));
      child_group = 0;
      return ENDED;
    }
    if (waited >= limit) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      child_group = 0;
      printf("FAIL %s (timeout after %.0f s)\n", t->name, limit);
      return ENDED;
    }
    nanosleep(&nap, NULL);
    waited += (double)nap.tv_nsec / 1e9;
    if (nap.tv_nsec < 50000000) nap.tv_nsec *= 2;
  }
  kill(-pid, SIGKILL); /* helpers the test left behind */
  child_group = 0;
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    printf("FAIL %s (signal %d, %s)\n", t->name, sig, strsignal(sig));
    return ENDED;
  }
  return WEXITSTATUS(status);
}

int main(int argc, char **argv) {
  int fork_each = 1;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--no-fork") == 0) fork_each = 0;
    else only = argv[i];
  }
  const char *no_fork = getenv("MGPU_TEST_NO_FORK");
  if (no_fork != NULL && strcmp(no_fork, "1") == 0) fork_each = 0;
  if (fork_each) {
    signal(SIGINT, forward_signal);
    signal(SIGTERM, forward_signal);
  }
  int failed = 0, ran = 0;
  for (const test_entry *t = mgpu_test_list; t->name; t++) {
    if (only != NULL && strcmp(only, t->name) != 0) continue;
    ran++;
    int rc = fork_each ? run_forked(t) : run_here(t);
    if (rc == TEST_SKIP) {
      printf("skip %s\n", t->name);
      if (only != NULL) return TEST_SKIP;
    } else if (rc == ENDED) {
      failed++; /* already said how */
    } else if (rc != 0) {
      printf("FAIL %s (%d)\n", t->name, rc);
      failed++;
    } else {
      printf("ok %s\n", t->name);
    }
    fflush(stdout);
  }
  if (ran == 0) {
    fprintf(stderr, "no test named %s\n", only != NULL ? only : "(any)");
    return 2;
  }
  return failed ? 1 : 0;
}
