/* mgpu bench store: what sharing through the store daemon costs.
 *
 *   mgpu bench store [--json] [--quick] [--reps N]
 *
 * Starts mgpud (the one next to this mgpu binary) on a private socket and
 * measures, on device 0:
 * - the round trips of an object's life (create, seal, get, release,
 *   release, delete: six requests) and of a get + release of a sealed
 *   object (two requests), next to the same round trips over a bare
 *   UNIX socket with what a program sharing memory without the store would
 *   do: the same message sizes, a descriptor passed (SCM_RIGHTS) where the
 *   store's reply carries one (create, get) and mapped and unmapped on
 *   arrival as the store's client does, the peer a child process that waits
 *   in poll() like the daemon, both watching before they sleep as the
 *   store's client and daemon do; ratio = store / baseline (target: at
 *   most 2);
 * - a get + release of a sealed 256 MiB object (32 MiB with --quick), as
 *   the bandwidth it would take to hand the bytes over by copying, next to a
 *   single-thread memcpy of the same size; ratio = get / memcpy (a get maps,
 *   it does not copy: target at least 20). Gets are timed 20 in a row.
 * Every figure is a median of reps batches after a warm-up, the store and
 * its baseline timed alternately, batch for batch, in the order ABBA (a
 * batch right after the other side's is not favoured). */
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "cmd.h"
#include "mgpu/store.h"

#define REQ_BYTES 40   /* a create request with a short name */
#define REPLY_BYTES 160 /* a create or get reply */

typedef struct store_bench {
  char dir[64], path[96];
  pid_t daemon, echo;
  int echo_fd;
  int memfd; /* what the baseline's peer passes (REPLY_FD requests) */
  mgpu_store *st;
} store_bench;

static int start_daemon(store_bench *b) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  char mgpud[PATH_MAX + 8];
  snprintf(mgpud, sizeof mgpud, "%s/mgpud", dirname(exe));
  snprintf(b->dir, sizeof b->dir, "/tmp/mgpu-bench-store-XXXXXX");
  if (mkdtemp(b->dir) == NULL) return -1;
  snprintf(b->path, sizeof b->path, "%s/store.sock", b->dir);
  fflush(NULL);
  b->daemon = fork();
  if (b->daemon < 0) return -1;
  if (b->daemon == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    execl(mgpud, "mgpud", "--socket", b->path, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 2000; i++) {
    if (mgpu_store_connect(&b->st, b->path) == 0) return 0;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "mgpu bench store: %s did not start\n", mgpud);
  return -1;
}

/* A request of the baseline whose reply carries a descriptor. */
#define REPLY_FD 1

/* The baseline waits as the store's client and daemon do: it watches
 * (polls without blocking, yielding the CPU between looks) for up to as
 * long as they do before it sleeps in poll(): the client 200 us for a
 * reply, the daemon 100 us for the next request. A peer that sleeps pays a
 * wake-up each way, tens of microseconds on a machine whose idle CPUs halt,
 * and whether it does would otherwise depend on where the scheduler put
 * the two processes, not on what is measured. */
#define REPLY_WATCH_US 200
#define REQUEST_WATCH_US 100

static int watch_then_poll(int fd, int watch_us) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  double until = bench_now() + watch_us * 1e-6;
  int r;
  while ((r = poll(&p, 1, 0)) == 0 && bench_now() < until) sched_yield();
  return r != 0 ? r : poll(&p, 1, -1);
}

/* The baseline's other end, shaped like the daemon: waits in poll(), reads
 * a request of REQ_BYTES, answers REPLY_BYTES, with fd attached when the
 * request's first byte is REPLY_FD. Only poll, read, sendmsg, sched_yield,
 * clock_gettime and _exit run in the child. */
static void echo_loop(int sock, int fd) {
  char req[REQ_BYTES], reply[REPLY_BYTES] = {0};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  for (;;) {
    if (watch_then_poll(sock, REQUEST_WATCH_US) < 0) _exit(1);
    size_t got = 0;
    while (got < REQ_BYTES) {
      ssize_t r = read(sock, req + got, REQ_BYTES - got);
      if (r <= 0) _exit(0);
      got += (size_t)r;
    }
    struct iovec iov = {reply, REPLY_BYTES};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (req[0] == REPLY_FD) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    if (sendmsg(sock, &mh, MSG_NOSIGNAL) != REPLY_BYTES) _exit(1);
  }
}

static int start_echo(store_bench *b) {
  int sv[2];
  b->memfd = memfd_create("mgpu-bench-store", MFD_CLOEXEC);
  if (b->memfd < 0 || ftruncate(b->memfd, 4096) != 0) return -1;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  fflush(NULL);
  b->echo = fork();
  if (b->echo < 0) return -1;
  if (b->echo == 0) {
    close(sv[0]);
    echo_loop(sv[1], b->memfd);
  }
  close(sv[1]);
  b->echo_fd = sv[0];
  return 0;
}

/* One round trip of the baseline, as the store's client makes one: send the
 * request, wait in poll(), receive the reply with recvmsg; a descriptor
 * that came with it is mapped, unmapped and closed. */
static int round_trip(store_bench *b, int with_fd) {
  char req[REQ_BYTES] = {(char)(with_fd ? REPLY_FD : 0)}, reply[REPLY_BYTES];
  if (write(b->echo_fd, req, sizeof req) != (ssize_t)sizeof req) return -1;
  size_t got = 0;
  int fd = -1;
  while (got < sizeof reply) {
    if (watch_then_poll(b->echo_fd, REPLY_WATCH_US) < 0) return -1;
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {reply + got, sizeof reply - got};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(b->echo_fd, &mh, MSG_CMSG_CLOEXEC);
    if (r <= 0) return -1;
    got += (size_t)r;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm != NULL && cm->cmsg_type == SCM_RIGHTS)
      memcpy(&fd, CMSG_DATA(cm), sizeof fd);
  }
  if (with_fd) {
    if (fd < 0) return -1;
    void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return -1;
    munmap(m, 4096);
  }
  if (fd >= 0) close(fd);
  return 0;
}

/* The baseline of one store case: its requests' round trips in order
 * (fds[i]: whether request i's reply carries a descriptor). */
static int baseline(store_bench *b, const int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (round_trip(b, fds[i]) != 0) return -1;
  return 0;
}

/* One object's life: six requests. */
static int lifecycle(mgpu_store *st) {
  mgpu_store_object *o, *g;
  int rc = mgpu_store_create(st, 0, 4096, "bench-object", &o);
  if (rc != 0) return rc;
  rc = mgpu_store_seal(o);
  if (rc == 0) rc = mgpu_store_get(st, mgpu_store_object_id(o), &g);
  if (rc == 0) rc = mgpu_store_release(g);
  uint64_t id = mgpu_store_object_id(o);
  int r2 = mgpu_store_release(o);
  if (rc == 0) rc = r2;
  r2 = mgpu_store_delete(st, id, NULL);
  return rc ? rc : r2;
}

static int get_release(mgpu_store *st, uint64_t id) {
  mgpu_store_object *g;
  int rc = mgpu_store_get(st, id, &g);
  return rc ? rc : mgpu_store_release(g);
}

/* The requests of each store case, and whether each one's reply carries a
 * descriptor: create, seal, get, release, release, delete; get, release. */
static const int LIFECYCLE_FDS[] = {1, 0, 1, 0, 0, 0};
static const int GET_RELEASE_FDS[] = {1, 0};

/* Median seconds per op of the store case (kind 0 lifecycle, 1 get+release
 * of id) and of its baseline, in alternate batches (ABBA). */
static int latency(store_bench *b, int kind, uint64_t id, int batch,
                   int reps, double *store_s, double *base_s) {
  const int *fds = kind == 0 ? LIFECYCLE_FDS : GET_RELEASE_FDS;
  int nfds = kind == 0 ? 6 : 2;
  double *t = calloc((size_t)reps, sizeof *t), *u = calloc((size_t)reps, sizeof *u);
  int rc = t && u ? 0 : MGPU_ENOMEM;
  for (int r = -1; r < reps && rc == 0; r++) { /* r = -1: warm-up */
    double ts = 0, tb = 0;
    for (int side = 0; side < 2 && rc == 0; side++) {
      int store_side = (side == 0) == ((r & 1) == 0);
      double t0 = bench_now();
      for (int i = 0; i < batch && rc == 0; i++) {
        if (store_side)
          rc = kind == 0 ? lifecycle(b->st) : get_release(b->st, id);
        else if (baseline(b, fds, nfds) != 0)
          rc = MGPU_EIO;
      }
      *(store_side ? &ts : &tb) = (bench_now() - t0) / batch;
    }
    if (r >= 0) {
      t[r] = ts;
      u[r] = tb;
    }
  }
  if (rc == 0) {
    *store_s = bench_median(t, reps);
    *base_s = bench_median(u, reps);
  }
  free(t);
  free(u);
  return rc;
}

static int big_get(store_bench *b, size_t size, int reps, double *get_gbps,
                   double *memcpy_gbps) {
  mgpu_store_object *o;
  int rc = mgpu_store_create(b->st, 0, size, "bench-big", &o);
  if (rc != 0) return rc;
  memset(mgpu_store_object_ptr(o), 7, size); /* the pages exist */
  rc = mgpu_store_seal(o);
  uint64_t id = mgpu_store_object_id(o);
  mgpu_store_release(o);
  char *src = malloc(size), *dst = malloc(size);
  double *t = calloc((size_t)reps, sizeof *t), *u = calloc((size_t)reps, sizeof *u);
  if (rc == 0 && (!src || !dst || !t || !u)) rc = MGPU_ENOMEM;
  if (rc == 0) {
    memset(src, 1, size);
    memset(dst, 2, size);
  }
  /* Gets are timed in batches, like the small cases: a single get right
   * after a 256 MiB memcpy measures mostly how long the sleeping daemon
   * takes to be scheduled again on a loaded machine. */
  enum { GETS = 20 };
  for (int r = -1; r < reps && rc == 0; r++) {
    double t0 = bench_now();
    for (int i = 0; i < GETS && rc == 0; i++) rc = get_release(b->st, id);
    double t1 = bench_now();
    memcpy(dst, src, size);
    double t2 = bench_now();
    if (r >= 0) {
      t[r] = (t1 - t0) / GETS;
      u[r] = t2 - t1;
    }
  }
  if (rc == 0) {
    *get_gbps = (double)size / bench_median(t, reps) / 1e9;
    *memcpy_gbps = (double)size / bench_median(u, reps) / 1e9;
  }
  mgpu_store_delete(b->st, id, NULL);
  free(src);
  free(dst);
  free(t);
  free(u);
  return rc;
}

static void stop(store_bench *b) {
  if (b->st) mgpu_store_disconnect(b->st);
  if (b->echo > 0) {
    close(b->echo_fd);
    waitpid(b->echo, NULL, 0);
  }
  if (b->memfd >= 0) close(b->memfd);
  if (b->daemon > 0) {
    kill(b->daemon, SIGTERM);
    waitpid(b->daemon, NULL, 0);
  }
  unlink(b->path);
  rmdir(b->dir);
}

int mgpu_bench_store(int argc, char **argv) {
  static const char usage[] = "mgpu bench store [--json] [--quick] [--reps N]";
  bench_opts o;
  char *rest[1];
  int nrest = 0;
  if (bench_parse(argc, argv, usage, &o, rest, 0, &nrest) != 0) return 2;
  store_bench b = {.echo_fd = -1, .memfd = -1};
  if (start_daemon(&b) != 0 || start_echo(&b) != 0) {
    stop(&b);
    return mgpu_cmd_fail("bench store: start", MGPU_EIO);
  }
  bench_report *r = bench_report_new("store");
  int batch = o.quick ? 50 : 500;
  double s, base;
  int rc = latency(&b, 0, 0, batch, o.reps, &s, &base);
  if (rc == 0)
    bench_report_add(r, "create+seal+get+release+release+delete (6 requests)",
                     "latency", s * 1e6, "us",
                     "6 UNIX-socket round trips, 2 passing an fd", base * 1e6);
  mgpu_store_object *kept = NULL;
  if (rc == 0) rc = mgpu_store_create(b.st, 0, 4096, "bench-kept", &kept);
  if (rc == 0) rc = mgpu_store_seal(kept);
  if (rc == 0)
    rc = latency(&b, 1, mgpu_store_object_id(kept), batch, o.reps, &s,
                 &base);
  if (rc == 0)
    bench_report_add(r, "get+release of a sealed 4KiB object (2 requests)",
                     "latency", s * 1e6, "us",
                     "2 UNIX-socket round trips, 1 passing an fd", base * 1e6);
  if (kept) mgpu_store_release(kept);
  size_t big = (size_t)(o.quick ? 32 : 256) << 20;
  double get_gbps, memcpy_gbps;
  if (rc == 0) rc = big_get(&b, big, o.reps, &get_gbps, &memcpy_gbps);
  if (rc == 0) {
    char name[64];
    snprintf(name, sizeof name, "get+release of a sealed %zuMiB object",
             big >> 20);
    bench_report_add(r, name, "bandwidth", get_gbps, "GB/s",
                     "memcpy 1 thread", memcpy_gbps);
  }
  stop(&b);
  if (rc != 0) {
    bench_report_finish(r, o.json);
    return mgpu_cmd_fail("bench store", rc);
  }
  bench_report_finish(r, o.json);
  return 0;
}
