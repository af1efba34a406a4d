/* Helper processes for the store tests: a daemon in a child process, client
 * children, and bounded waits on both. Every wait ends: children that
 * outlive their deadline are killed and reported. */
#ifndef MGPU_TEST_STORE_HELPERS_H
#define MGPU_TEST_STORE_HELPERS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mgpu/store.h"
#include "task.h"

typedef struct store_env {
  char dir[64];
  char path[96];
  char log[96];
  pid_t daemon;
} store_env;

static inline void store_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits up to timeout_ms for the child; kills it after. Returns its wait
 * status, or -1 when it had to be killed. */
static inline int store_wait(pid_t pid, int timeout_ms) {
  int status;
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    store_sleep_ms(5);
  }
  fprintf(stderr, "child %d did not end in %d ms: killed\n", (int)pid,
          timeout_ms);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

/* The child ended normally with exit code 0. */
#define ASSERT_CHILD_OK(pid, timeout_ms)                                   \
  do {                                                                     \
    int st_ = store_wait((pid), (timeout_ms));                             \
    if (!(st_ != -1 && WIFEXITED(st_) && WEXITSTATUS(st_) == 0)) {         \
      fprintf(stderr, "%s:%d: child %d failed (status 0x%x)\n", __FILE__,  \
              __LINE__, (int)(pid), st_);                                  \
      abort();                                                             \
    }                                                                      \
  } while (0)

/* Runs fn(arg) in a child process that exits with its result. The child
 * initializes mgpu itself when it needs to. */
static inline pid_t store_spawn(int (*fn)(store_env *env, void *arg),
                                store_env *env, void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    /* A test that fails aborts: its children must not outlive it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = fn(env, arg);
    mgpu_shutdown();
    exit(rc);
  }
  return pid;
}

/* Forks a child that dies with this process, its stderr appended to the
 * daemon's log. Returns as fork does. */
static inline pid_t store_fork_logged(store_env *env) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int log = open(env->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (log >= 0) {
      dup2(log, 2);
      close(log);
    }
  }
  return pid;
}

/* Runs the mgpud binary of this build in a child process, its stderr
 * appended to the log. Returns its pid. */
static inline pid_t store_daemon_exec(store_env *env, size_t capacity) {
  char cap[32];
  snprintf(cap, sizeof cap, "%zu", capacity);
  pid_t pid = store_fork_logged(env);
  if (pid == 0) {
    if (capacity != 0)
      execl(MGPU_TEST_BIN_DIR "/mgpud", "mgpud", "--socket", env->path,
            "--capacity", cap, (char *)NULL);
    else
      execl(MGPU_TEST_BIN_DIR "/mgpud", "mgpud", "--socket", env->path,
            (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Connects, retrying while env->daemon starts: until it answers, exits,
 * or 60 s have passed. A daemon on GPUs starts as slowly as the driver
 * opens them: over 10 s on an H100 while other processes opened it too. */
static inline int store_connect_wait(store_env *env, mgpu_store **st) {
  int rc = MGPU_ESTORE;
  for (int i = 0; i < 12000; i++) {
    rc = mgpu_store_connect(st, env->path);
    if (rc != MGPU_ESTORE) return rc;
    siginfo_t info = {0};
    if (env->daemon > 0 &&
        waitid(P_PID, (id_t)env->daemon, &info,
               WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0)
      return rc; /* it exited: left for the caller to reap */
    store_sleep_ms(5);
  }
  return rc;
}

/* Starts a daemon (capacity 0: the devices' memory) and waits until it
 * answers. */
static inline void store_daemon_start(store_env *env, size_t capacity) {
  env->daemon = store_daemon_exec(env, capacity);
  mgpu_store *st;
  ASSERT_OK(store_connect_wait(env, &st));
  ASSERT_OK(mgpu_store_disconnect(st));
}

/* Stops the daemon with SIGTERM; it must exit cleanly (and, under ASan,
 * without leaks). */
static inline void store_daemon_stop(store_env *env) {
  kill(env->daemon, SIGTERM);
  ASSERT_CHILD_OK(env->daemon, 20000);
  env->daemon = 0;
}

static inline void store_env_init(store_env *env) {
  memset(env, 0, sizeof *env);
  snprintf(env->dir, sizeof env->dir, "/tmp/mgpu-store-test-XXXXXX");
  ASSERT(mkdtemp(env->dir) != NULL);
  snprintf(env->path, sizeof env->path, "%s/store.sock", env->dir);
  snprintf(env->log, sizeof env->log, "%s/daemon.log", env->dir);
}

static inline void store_env_cleanup(store_env *env) {
  if (env->daemon > 0) {
    kill(env->daemon, SIGKILL);
    store_wait(env->daemon, 5000);
  }
  char lock[sizeof env->path + 8];
  snprintf(lock, sizeof lock, "%s.lock", env->path);
  unlink(env->path);
  unlink(lock); /* left by a daemon that was killed */
  unlink(env->log);
  rmdir(env->dir);
}

/* 1 when the daemon's log holds text. */
static inline int store_log_has(store_env *env, const char *text) {
  FILE *f = fopen(env->log, "r");
  if (f == NULL) return 0;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof line, f) != NULL)
    found = strstr(line, text) != NULL;
  fclose(f);
  return found;
}

/* One byte through a pipe, with a deadline. */
static inline void store_signal(int fd) {
  ASSERT(write(fd, "x", 1) == 1);
}

static inline int store_await(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? 0 : -1;
}

/* The daemon's counts, which every test checks return to zero. */
static inline void store_expect_counts(store_env *env, uint64_t objects,
                                       uint64_t refs) {
  mgpu_store *st;
  mgpu_store_stats s = {.size = sizeof s};
  /* Closed clients are noticed by the daemon's next poll turn: give it a
   * moment, bounded. */
  for (int i = 0; i < 400; i++) {
    ASSERT_OK(mgpu_store_connect(&st, env->path));
    ASSERT_OK(mgpu_store_stats_get(st, &s));
    ASSERT_OK(mgpu_store_disconnect(st));
    if (s.objects == objects && s.refs == refs && s.clients == 1) return;
    store_sleep_ms(10);
  }
  fprintf(stderr, "store counts: objects %llu refs %llu clients %u, "
          "expected %llu %llu 1\n", (unsigned long long)s.objects,
          (unsigned long long)s.refs, s.clients,
          (unsigned long long)objects, (unsigned long long)refs);
  abort();
}

#endif /* MGPU_TEST_STORE_HELPERS_H */
