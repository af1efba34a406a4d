/* Sharing a device buffer between two processes through the store.
 *
 * Process 1 creates a buffer on device 0, fills it with a kernel and seals
 * it under the name "vec". Process 2 gets it by name (a read-only buffer of
 * its own device 0, mapped, not copied) and prints it through a host mirror.
 * Process 1 then deletes it while process 2 still maps it: the delete is
 * deferred, and process 2 still reads it until it releases it.
 *
 * To run on its own, the example starts the daemon too (as `mgpud` would)
 * on a socket in a fresh private directory, in a third process. */
#define _GNU_SOURCE /* fork, kill, mkdtemp, nanosleep */
#include <mgpu.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                        \
  do {                                                                     \
    int rc_ = (call);                                                      \
    if (rc_ != 0) {                                                        \
      fprintf(stderr, "%s: %s: %s\n", #call, mgpu_strerror(rc_),           \
              mgpu_error_detail());                                        \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

enum { N = 1 << 16 };

static char socket_path[96];

/* One byte through a pipe; a peer silent for 30 s is a failure. */
static void tell(int fd) {
  if (write(fd, "x", 1) != 1) exit(1);
}
static void await(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  char c;
  if (poll(&p, 1, 30000) != 1 || read(fd, &c, 1) != 1) {
    fprintf(stderr, "store_share: the other process did not answer\n");
    exit(1);
  }
}

static int reader(int from_creator, int to_creator) {
  CHECK(mgpu_init(NULL));
  mgpu_store *st;
  CHECK(mgpu_store_connect(&st, socket_path));
  await(from_creator); /* "vec" is sealed */
  mgpu_store_object *obj;
  CHECK(mgpu_store_get_by_name(st, "vec", &obj));
  mgpu_buffer *buf = mgpu_store_object_buffer(obj);
  printf("process 2: got \"vec\" (object %llu), %zu bytes on device %d, "
         "read-only: %d\n", (unsigned long long)mgpu_store_object_id(obj),
         mgpu_buffer_size(buf), mgpu_buffer_device(buf),
         mgpu_buffer_is_readonly(buf));
  float *host;
  CHECK(mgpu_store_mirror_begin(obj, 1, (void **)&host));
  printf("process 2: vec[0..3] = %g %g %g %g\n", host[0], host[1], host[2],
         host[3]);
  int ok = host[0] == 3.0f && host[N - 1] == 3.0f;
  CHECK(mgpu_store_mirror_end(obj));
  tell(to_creator);
  await(from_creator); /* process 1 deleted it */
  CHECK(mgpu_store_mirror_begin(obj, 1, (void **)&host));
  printf("process 2: after the delete, vec[%d] = %g (still mapped)\n", N - 1,
         host[N - 1]);
  ok = ok && host[N - 1] == 3.0f;
  CHECK(mgpu_store_mirror_end(obj));
  CHECK(mgpu_store_release(obj)); /* the daemon frees it now */
  CHECK(mgpu_store_disconnect(st));
  CHECK(mgpu_shutdown());
  tell(to_creator);
  return ok ? 0 : 1;
}

static int creator(int to_reader, int from_reader) {
  CHECK(mgpu_init(NULL));
  mgpu_store *st;
  CHECK(mgpu_store_connect(&st, socket_path));
  mgpu_store_object *obj;
  CHECK(mgpu_store_create(st, 0, N * sizeof(float), "vec", &obj));
  mgpu_buffer *buf = mgpu_store_object_buffer(obj);
  mgpu_stream *s;
  CHECK(mgpu_stream_create(&s, 0));
  float value = 1.5f;
  CHECK(mgpu_fill(s, buf, 0, N, MGPU_FLOAT32, &value));
  CHECK(mgpu_scale(s, buf, 0, N, MGPU_FLOAT32, 2.0));
  CHECK(mgpu_stream_synchronize(s));
  CHECK(mgpu_stream_destroy(s));
  CHECK(mgpu_store_seal(obj)); /* read-only from now on, here too */
  uint64_t id = mgpu_store_object_id(obj);
  CHECK(mgpu_store_release(obj));
  printf("process 1: created and sealed \"vec\" (object %llu)\n",
         (unsigned long long)id);
  tell(to_reader);
  await(from_reader); /* process 2 maps it */
  int deferred = 0;
  CHECK(mgpu_store_delete_by_name(st, "vec", &deferred));
  printf("process 1: deleted \"vec\"%s\n",
         deferred ? "; freed once process 2 releases it" : "");
  tell(to_reader);
  await(from_reader); /* process 2 released it */
  mgpu_store_stats stats = {.size = sizeof stats};
  CHECK(mgpu_store_stats_get(st, &stats));
  printf("process 1: the store now holds %llu objects\n",
         (unsigned long long)stats.objects);
  CHECK(mgpu_store_disconnect(st));
  CHECK(mgpu_shutdown());
  return deferred == 1 && stats.objects == 0 ? 0 : 1;
}

static int daemon_main(void) {
  CHECK(mgpu_init(NULL));
  mgpu_store_server_config cfg = MGPU_STORE_SERVER_CONFIG_INITIALIZER;
  cfg.path = socket_path;
  int rc = mgpu_store_serve(&cfg);
  mgpu_shutdown();
  return rc == 0 ? 0 : 1;
}

static int wait_for(pid_t pid) {
  int status;
  for (int i = 0; i < 6000; i++) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 1;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* the three processes' lines in order */
  char dir[] = "/tmp/mgpu-store-share-XXXXXX";
  if (mkdtemp(dir) == NULL) return 1;
  snprintf(socket_path, sizeof socket_path, "%s/store.sock", dir);
  fflush(NULL);
  pid_t daemon = fork();
  if (daemon == 0) exit(daemon_main());
  mgpu_store *probe = NULL;
  for (int i = 0; i < 1000 && mgpu_store_connect(&probe, socket_path); i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  if (probe == NULL) return 1;
  mgpu_store_disconnect(probe);

  int to_reader[2], to_creator[2];
  if (pipe(to_reader) != 0 || pipe(to_creator) != 0) return 1;
  fflush(NULL);
  pid_t second = fork();
  if (second == 0) exit(reader(to_reader[0], to_creator[1]));
  int rc = creator(to_reader[1], to_creator[0]);
  if (wait_for(second) != 0) rc = 1;
  kill(daemon, SIGTERM);
  if (wait_for(daemon) != 0) rc = 1;
  rmdir(dir);
  printf("store_share: %s\n", rc == 0 ? "ok" : "FAILED");
  return rc;
}
