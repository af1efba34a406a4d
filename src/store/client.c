/* The store's client library (include/mgpu/store.h).
 *
 * A connection is a blocking request/reply exchange over the daemon's UNIX
 * socket, serialized by the connection's lock. Every wait for the daemon is
 * bounded (REPLY_TIMEOUT_MS), and a daemon that closes the socket, answers
 * garbage or does not answer in time marks the connection dead: every later
 * call returns MGPU_ESTORE with the first failure's detail, and never
 * blocks. What is mapped stays mapped until released.
 *
 * Handles are checked before they are used: every live connection and every
 * object held is listed in a registry (reg_lock), and a pointer that is not
 * listed is reported as a bad handle, never dereferenced.
 *
 * Every call counts itself inside the connection (and the object) it uses
 * while it finds the handle listed (enter_store, enter_object), so that
 * mgpu_store_disconnect and mgpu_store_release, which unlist the handle
 * first, can wait for the calls already inside before they free anything.
 * A disconnect shuts the socket down first, so a call waiting for the
 * daemon fails at once with MGPU_ESTORE instead of keeping it waiting.
 *
 * A connection's lock comes before reg_lock (an object mapped during a
 * round trip is listed), and reg_lock is never held across a round trip
 * (docs/ARCHITECTURE.md, "Lock order").
 */
#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "mgpu/copy.h"
#include "mgpu/store.h"
#include "store/store-internal.h"
#include "util/fault.h"

#define REPLY_TIMEOUT_MS 30000

struct mgpu_store {
  int fd;
  char path[108];
  mgpu__mutex lock; /* serializes round trips; guards everything below */
  uint32_t seq;
  int dead;
  char dead_why[MGPU__STORE_DETAIL_MAX + 1];
  uint64_t instance;
  int users;                /* calls inside (reg_lock) */
  _Atomic int closing;      /* set by mgpu_store_disconnect */
  struct mgpu_store *next; /* registry (reg_lock) */
};

struct mgpu_store_object {
  mgpu_store *store;
  uint64_t id;
  size_t size;
  int dev;          /* local device, -1 none */
  int writable;     /* created here and not sealed */
  mgpu__ipc_mem mem;
  void *ptr;
  void *mirror;     /* host copy while a mirror is open */
  mgpu_buffer *mirror_buf; /* its pinned buffer, when the object has one */
  mgpu_buffer *buffer;
  int users;        /* calls inside (reg_lock) */
  struct mgpu_store_object *next; /* registry (reg_lock) */
};

static mgpu__mutex reg_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_STORE_REG);
static mgpu__cond reg_idle = PTHREAD_COND_INITIALIZER; /* a users count fell */
static mgpu_store *stores;          /* reg_lock */
static mgpu_store_object *objects;  /* reg_lock */

static int store_listed(const mgpu_store *st) {
  for (mgpu_store *s = stores; s != NULL; s = s->next)
    if (s == st) return 1;
  return 0;
}

static int object_listed(const mgpu_store_object *obj) {
  for (mgpu_store_object *o = objects; o != NULL; o = o->next)
    if (o == obj) return 1;
  return 0;
}

/* Counts a call inside st, which must be open. Pair with leave_store. */
static int enter_store(mgpu_store *st) {
  mgpu__mutex_lock(&reg_lock);
  int ok = st != NULL && store_listed(st);
  if (ok) st->users++;
  mgpu__mutex_unlock(&reg_lock);
  if (!ok)
    return mgpu__error(MGPU_EBADHANDLE, "store connection %p is not open",
                       (const void *)st);
  return 0;
}

static void leave_store(mgpu_store *st) {
  mgpu__mutex_lock(&reg_lock);
  if (--st->users == 0) mgpu__cond_broadcast(&reg_idle);
  mgpu__mutex_unlock(&reg_lock);
}

static int object_gone(const mgpu_store_object *obj) {
  return mgpu__error(obj == NULL ? MGPU_EBADHANDLE : MGPU_EFREED,
                     "store object %p is not held (released, or never "
                     "returned by the store)", (const void *)obj);
}

/* Counts a call inside obj and its connection. Pair with leave_object. */
static int enter_object(mgpu_store_object *obj) {
  mgpu__mutex_lock(&reg_lock);
  int ok = obj != NULL && object_listed(obj);
  if (ok) {
    obj->users++;
    obj->store->users++;
  }
  mgpu__mutex_unlock(&reg_lock);
  return ok ? 0 : object_gone(obj);
}

static void leave_object(mgpu_store_object *obj) {
  mgpu__mutex_lock(&reg_lock);
  obj->users--;
  obj->store->users--;
  mgpu__cond_broadcast(&reg_idle);
  mgpu__mutex_unlock(&reg_lock);
}

/* ---- the wire ---- */

/* How long a request watches for its reply before it sleeps
 * (mgpu__store_poll): the daemon answers most requests within tens of
 * microseconds. */
#define REPLY_WATCH_US 200u

static int poll_one(int fd, short events, int timeout_ms) {
  struct pollfd p = {fd, events, 0};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

static int send_all(int sock, const void *buf, size_t len,
                    int timeout_ms) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = send(sock, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (poll_one(sock, POLLOUT, timeout_ms) <= 0) {
          errno = ETIMEDOUT;
          return -1;
        }
        continue;
      }
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Reads exactly len bytes; a descriptor that comes along lands in *fd
 * (extra ones are closed). Returns 0, or -1 with errno (0 for EOF). */
static int recv_all(int sock, uint8_t *buf, size_t len, int *fd,
                    int timeout_ms) {
  while (len > 0) {
    struct pollfd p = {sock, POLLIN, 0};
    if (mgpu__store_poll(&p, 1, timeout_ms, REPLY_WATCH_US) <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct iovec iov = {buf, len};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
        continue;
      size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; i++) {
        int got;
        memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof got);
        if (*fd < 0) *fd = got;
        else close(got);
      }
    }
    if (r == 0) {
      errno = 0;
      return -1;
    }
    buf += r;
    len -= (size_t)r;
  }
  return 0;
}

static int store_dead(mgpu_store *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int store_dead(mgpu_store *st, const char *fmt, ...) {
  if (!st->dead) {
    char what[201];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(st->dead_why, sizeof st->dead_why, "store daemon at %.107s: %.200s; "
             "objects already mapped stay readable until released; connect "
             "again to reach a new daemon", st->path, what);
    st->dead = 1;
  }
  return mgpu__error(MGPU_ESTORE, "%s", st->dead_why);
}

/* Reads one reply, its header within timeout ms and then its payload, and
 * decodes it into *reply; a descriptor that came with it lands in *got_fd.
 * send_errno is why the request could not be sent (0: it was sent). */
static int reply_read(mgpu_store *st, int send_errno, int timeout,
                      mgpu__store_msg *reply, int *got_fd) {
  uint8_t hdr[MGPU__STORE_HDR];
  if (recv_all(st->fd, hdr, sizeof hdr, got_fd, timeout) != 0) {
    if (send_errno != 0)
      return store_dead(st, "cannot send a request: %s",
                        send_errno == EPIPE ? "the daemon closed the "
                        "connection" : strerror(send_errno));
    return errno == 0 ? store_dead(st, "the daemon closed the connection "
                                   "(it died or restarted)")
                      : store_dead(st, "no reply: %s", strerror(errno));
  }
  uint32_t plen;
  char why[256];
  if (mgpu__store_header_check(hdr, &plen, why, sizeof why) != 0)
    return store_dead(st, "bad reply: %s", why);
  uint8_t small[256];
  uint8_t *msg = MGPU__STORE_HDR + (size_t)plen <= sizeof small
                     ? small
                     : mgpu__malloc(MGPU__STORE_HDR + (size_t)plen);
  if (msg == NULL)
    return store_dead(st, "out of memory for a reply of %u bytes", plen);
  memcpy(msg, hdr, sizeof hdr);
  int rc = 0;
  if (recv_all(st->fd, msg + MGPU__STORE_HDR, plen, got_fd,
               REPLY_TIMEOUT_MS) != 0)
    rc = store_dead(st, "reply cut short: %s",
                    errno == 0 ? "the daemon closed the connection"
                               : strerror(errno));
  else if (mgpu__store_decode(msg, MGPU__STORE_HDR + plen, reply, why,
                              sizeof why) != 0)
    rc = store_dead(st, "malformed reply: %s", why);
  if (msg != small) mgpu__free(msg);
  return rc;
}

/* Checks that a decoded reply answers the request in w, whose number was
 * seq; an error reply becomes its code and detail. */
static int reply_check(mgpu_store *st, const mgpu__store_wbuf *w,
                       const mgpu__store_msg *reply, uint32_t seq) {
  if (reply->seq != seq && reply->type != MGPU__SM_ERROR)
    return store_dead(st, "reply %u out of order (expected %u)", reply->seq,
                      seq);
  if (reply->type == MGPU__SM_ERROR) {
    int rc = mgpu__error(reply->code, "%s", reply->detail);
    if (reply->seq != seq) store_dead(st, "%s", reply->detail);
    return rc;
  }
  if (reply->type != (uint16_t)(w->data[6] | w->data[7] << 8 | MGPU__SM_REPLY))
    return store_dead(st, "reply of type 0x%04x to a request of type %u",
                      reply->type, w->data[6] | w->data[7] << 8);
  return 0;
}

/* Sends the message in w and waits for its reply, decoded into *reply (free
 * with mgpu__store_msg_free) with a descriptor in *fd (or -1). An error
 * reply becomes its code and detail. st->lock held. */
static int roundtrip(mgpu_store *st, mgpu__store_wbuf *w,
                     mgpu__store_msg *reply, int *fd) {
  memset(reply, 0, sizeof *reply);
  if (fd) *fd = -1;
  if (atomic_load(&st->closing))
    store_dead(st, "the connection is being closed by "
               "mgpu_store_disconnect");
  if (st->dead) return mgpu__error(MGPU_ESTORE, "%s", st->dead_why);
  uint32_t seq = st->seq;
  int timeout = REPLY_TIMEOUT_MS, send_errno = 0;
  if (send_all(st->fd, w->data, w->len, REPLY_TIMEOUT_MS) !=
      0) {
    /* The daemon may have said why it closed (a refusal): read that. */
    send_errno = errno;
    timeout = 1000;
  }
  int got_fd = -1;
  int rc = reply_read(st, send_errno, timeout, reply, &got_fd);
  if (rc == 0) rc = reply_check(st, w, reply, seq);
  st->seq++;
  if (rc != 0 || fd == NULL) {
    if (got_fd >= 0) close(got_fd);
  } else {
    *fd = got_fd;
  }
  if (rc != 0) mgpu__store_msg_free(reply);
  return rc;
}

static void begin(mgpu_store *st, mgpu__store_wbuf *w, uint16_t type) {
  memset(w, 0, sizeof *w);
  mgpu__store_wbuf_begin(w, type, st->seq);
}

static int end(mgpu__store_wbuf *w) {
  int rc = mgpu__store_wbuf_end(w);
  if (rc != 0)
    return mgpu__error(rc, "store request cannot be encoded (%s)",
                       mgpu_err_name(rc));
  return 0;
}

/* ---- whom to trust ---- */

/* A daemon is trusted when it runs as this process's user, as root, or as
 * a user MGPU_STORE_TRUST names (comma-separated names or uids: the owner
 * of a daemon started with --allow-group). Anything else listening on the
 * path may be another user's, who would read what this process stores. */
static int uid_trusted(uid_t uid) {
  if (uid == geteuid() || uid == 0) return 1;
  const char *list = mgpu__env("MGPU_STORE_TRUST");
  if (list == NULL) return 0;
  char item[64];
  while (*list != '\0') {
    size_t n = strcspn(list, ",");
    if (n > 0 && n < sizeof item) {
      memcpy(item, list, n);
      item[n] = '\0';
      char *end;
      unsigned long v = strtoul(item, &end, 10);
      if (*end == '\0' && v == uid) return 1;
      struct passwd pw, *found = NULL;
      char buf[1024];
      if (*end != '\0' && getpwnam_r(item, &pw, buf, sizeof buf, &found) == 0 &&
          found != NULL && found->pw_uid == uid)
        return 1;
    }
    list += n;
    if (*list == ',') list++;
  }
  return 0;
}

/* The default path's directory is this user's, and no one else may write
 * into it (else another user could put a socket of theirs there). */
static int check_default_dir(const char *path) {
  char dir[108];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir) return 0;
  *slash = '\0';
  struct stat st;
  if (lstat(dir, &st) != 0) return 0; /* connect will say no daemon */
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 022) != 0)
    return mgpu__error(MGPU_EACCES, "the store directory %s is not this "
                       "user's own (%s, owner uid %d, mode %03o; this process "
                       "runs as uid %d): refusing to trust a daemon there",
                       dir, S_ISDIR(st.st_mode) ? "a directory" : "not a "
                       "directory", (int)st.st_uid,
                       (unsigned)(st.st_mode & 0777), (int)geteuid());
  return 0;
}

/* The daemon at the other end of fd runs as a trusted user. */
static int check_daemon(int fd, const char *path) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return mgpu__error(MGPU_EACCES, "store daemon at %s: its credentials "
                       "cannot be read (SO_PEERCRED: %s)", path,
                       strerror(errno));
  if (!uid_trusted(cred.uid))
    return mgpu__error(MGPU_EACCES, "the store daemon at %s (pid %d) runs as "
                       "uid %d, not as this process's uid %d: not trusted "
                       "(MGPU_STORE_TRUST names other users to trust)", path,
                       (int)cred.pid, (int)cred.uid, (int)geteuid());
  return 0;
}

/* ---- connections ---- */

/* Chooses the socket path of st (path, or the default one when NULL, whose
 * directory must be this user's). */
static int store_path(mgpu_store *st, const char *path) {
  if (path == NULL) {
    int rc = mgpu_store_default_path(st->path, sizeof st->path);
    return rc != 0 ? rc : check_default_dir(st->path);
  }
  if (strlen(path) >= sizeof st->path)
    return mgpu__error(MGPU_EINVAL, "store socket path %s is longer than %zu "
                       "bytes", path, sizeof st->path - 1);
  snprintf(st->path, sizeof st->path, "%s", path);
  return 0;
}

/* Connects st->fd to the daemon at st->path and checks who runs it; on
 * failure the socket is closed. */
static int store_socket(mgpu_store *st) {
  st->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", st->path);
  int rc;
  if (st->fd < 0 || connect(st->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    if (e == EACCES || e == EPERM)
      rc = mgpu__error(MGPU_EACCES, "the store socket %s refuses this "
                       "process (uid %d): %s", st->path, (int)geteuid(),
                       strerror(e));
    else
      rc = mgpu__error(MGPU_ESTORE, "no store daemon answers at %s: %s "
                       "(start one with mgpud or mgpu store serve)", st->path,
                       strerror(e));
    if (st->fd >= 0) close(st->fd);
    return rc;
  }
  rc = check_daemon(st->fd, st->path);
  if (rc != 0) close(st->fd);
  return rc;
}

/* Greets the daemon (HELLO with this process's pid) and keeps the instance
 * it answers with. */
static int store_hello(mgpu_store *st) {
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_HELLO);
  mgpu__store_put_u32(&w, (uint32_t)getpid());
  int rc = end(&w);
  mgpu__store_msg m;
  if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
  mgpu__store_wbuf_free(&w);
  if (rc != 0) return rc;
  st->instance = m.instance;
  mgpu__store_msg_free(&m);
  return 0;
}

int mgpu_store_connect(mgpu_store **out, const char *path) {
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_connect: NULL output");
  *out = NULL;
  mgpu_store *st = mgpu__calloc(1, sizeof *st);
  if (st == NULL) return mgpu__error(MGPU_ENOMEM, "out of host memory");
  int rc = store_path(st, path);
  if (rc == 0) rc = store_socket(st);
  if (rc != 0) {
    mgpu__free(st);
    return rc;
  }
  mgpu__mutex_init(&st->lock, MGPU__LOCK_STORE_CONN);
  st->seq = 1;
  rc = store_hello(st);
  if (rc != 0) {
    close(st->fd);
    mgpu__mutex_destroy(&st->lock);
    mgpu__free(st);
    return rc;
  }
  mgpu__mutex_lock(&reg_lock);
  st->next = stores;
  stores = st;
  mgpu__mutex_unlock(&reg_lock);
  *out = st;
  return 0;
}

static void object_unmap(mgpu_store_object *o) {
  /* mgpu_free waits for the work queued on the device, which may still
   * read the mapping. After mgpu_shutdown the handles are stale: fine. */
  if (o->buffer != NULL) {
    mgpu__buffer_set_owned(o->buffer, 0);
    mgpu_free(o->buffer);
  }
  if (o->mirror_buf != NULL) mgpu_free(o->mirror_buf);
  else mgpu__free(o->mirror);
  mgpu__store_mem_unimport(o->dev, &o->mem, o->ptr);
  mgpu__free(o);
}

int mgpu_store_disconnect(mgpu_store *st) {
  mgpu__mutex_lock(&reg_lock);
  if (st == NULL || !store_listed(st)) {
    mgpu__mutex_unlock(&reg_lock);
    return mgpu__error(MGPU_EBADHANDLE, "store connection %p is not open",
                       (void *)st);
  }
  /* Unlisted, no new call gets in; the calls inside end at once (the
   * socket is shut down under them) and are waited for. */
  for (mgpu_store **p = &stores; *p != NULL; p = &(*p)->next)
    if (*p == st) {
      *p = st->next;
      break;
    }
  mgpu_store_object *mine = NULL;
  for (mgpu_store_object **p = &objects; *p != NULL;) {
    mgpu_store_object *o = *p;
    if (o->store == st) {
      *p = o->next;
      o->next = mine;
      mine = o;
    } else {
      p = &o->next;
    }
  }
  atomic_store(&st->closing, 1);
  shutdown(st->fd, SHUT_RDWR);
  while (st->users > 0) mgpu__cond_wait(&reg_idle, &reg_lock);
  mgpu__mutex_unlock(&reg_lock);
  /* Closing the socket releases every reference at the daemon at once. */
  close(st->fd);
  while (mine != NULL) {
    mgpu_store_object *o = mine;
    mine = o->next;
    object_unmap(o);
  }
  mgpu__mutex_destroy(&st->lock);
  mgpu__free(st);
  return 0;
}

/* ---- objects ---- */

/* Imports into o the memory that a CREATE or GET reply describes (d),
 * with the descriptor fd that came with it, which it closes. */
static int object_import(mgpu_store_object *o, const mgpu__store_objdesc *d,
                         int fd, int writable) {
  o->mem.kind = d->handle_kind;
  o->mem.fd = fd;
  o->mem.size = d->size;
  o->mem.map_size = d->map_size;
  o->mem.offset = d->offset;
  memcpy(o->mem.legacy, d->legacy, sizeof o->mem.legacy);
  o->mem.key[0] = d->instance;
  o->mem.key[1] = d->id;
  int rc = 0;
  if ((d->handle_kind == MGPU__SH_MEMFD || d->handle_kind == MGPU__SH_CUMEM_FD)
      && fd < 0)
    rc = mgpu__error(MGPU_EIO, "object %llu: the daemon sent no descriptor "
                     "of its memory", (unsigned long long)d->id);
  else if (d->handle_kind != MGPU__SH_MEMFD && o->dev < 0)
    rc = mgpu__error(MGPU_ENODEV, "object %llu lives on device %s, which this "
                     "process has not opened", (unsigned long long)d->id,
                     d->uuid);
  if (rc == 0) rc = mgpu__store_mem_import(o->dev, &o->mem, writable, &o->ptr);
  if (fd >= 0) close(fd);
  o->mem.fd = -1;
  return rc;
}

/* The device of this process an object of the device named uuid lives on:
 * want (the device a create asked for) where it is that device, else the
 * first device with that uuid (the parts of a split GPU share their GPU's),
 * -1 where this process has none or mgpu is not initialized. */
static int object_device(const char *uuid, int want) {
  if (!mgpu_is_initialized()) return -1;
  char u[64];
  if (want >= 0 && mgpu__store_device_uuid(want, u, sizeof u) == 0 &&
      strcmp(u, uuid) == 0)
    return want;
  return mgpu__store_device_of_uuid(uuid);
}

/* What a call returns when mapping object id failed with rc: a disconnect
 * that began meanwhile dropped the daemon's reference, and memory shared
 * without a driver count (legacy CUDA IPC) may be gone before it was
 * mapped, so the call failed for the disconnect. */
static int import_failed(mgpu_store *st, uint64_t id, int rc) {
  if (!atomic_load(&st->closing)) return rc;
  char why[256];
  snprintf(why, sizeof why, "%s", mgpu_error_detail());
  return mgpu__error(MGPU_ESTORE, "store connection to %s was closed by "
                     "mgpu_store_disconnect during the call (mapping object "
                     "%llu failed: %s)", st->path, (unsigned long long)id,
                     why);
}

/* Maps what a CREATE or GET reply describes and lists the object. */
static int object_map(mgpu_store *st, const mgpu__store_objdesc *d, int fd,
                      int writable, int want, mgpu_store_object **out) {
  mgpu_store_object *o = mgpu__calloc(1, sizeof *o);
  if (o == NULL) {
    if (fd >= 0) close(fd); /* the object_import below would have */
    return mgpu__error(MGPU_ENOMEM, "out of host memory");
  }
  o->store = st;
  o->id = d->id;
  o->size = d->size;
  o->writable = writable;
  o->dev = object_device(d->uuid, want);
  /* A window between the reply and the mapping, for a test's disconnect
   * (store.import_cut_by_disconnect). */
  mgpu__fault_stall("store_import");
  int rc = object_import(o, d, fd, writable);
  if (rc != 0) {
    mgpu__free(o);
    return import_failed(st, d->id, rc);
  }
  /* On a device of this process the object is a buffer like any other,
   * read-only unless this process created it and has not sealed it. Host
   * memory held for a device that cannot use it as device memory (OpenCL)
   * is a buffer of pinned memory there: copies take it, kernels do not. */
  if (o->dev >= 0) {
    mgpu_mem_kind kind = mgpu__store_mem_is_buffer(o->dev, &o->mem)
                             ? MGPU_MEM_DEVICE
                             : MGPU_MEM_PINNED;
    rc = mgpu_buffer_wrap(&o->buffer, o->dev, kind, o->ptr, o->size,
                          writable ? 0 : MGPU_BUFFER_READONLY, NULL, NULL);
    if (rc == 0) mgpu__buffer_set_owned(o->buffer, 1); /* not mgpu_free's */
    if (rc != 0) {
      mgpu__store_mem_unimport(o->dev, &o->mem, o->ptr);
      mgpu__free(o);
      return rc;
    }
  }
  /* A disconnect that began meanwhile has collected the objects to free:
   * this one is not listed and the reference goes with the socket. */
  mgpu__mutex_lock(&reg_lock);
  int closing = atomic_load(&st->closing);
  if (!closing) {
    o->next = objects;
    objects = o;
  }
  mgpu__mutex_unlock(&reg_lock);
  if (closing) {
    object_unmap(o);
    return mgpu__error(MGPU_ESTORE, "store connection to %s was closed by "
                       "mgpu_store_disconnect during the call", st->path);
  }
  *out = o;
  return 0;
}

/* Tells the daemon to drop a reference it gave (after a local failure),
 * aborting the object first when this connection created it, so that
 * nothing is left behind. The requests are built on the stack and their
 * replies are small: a failed allocation is often what brought us here. */
static void drop_remote(mgpu_store *st, uint64_t id, int created) {
  for (int step = created ? 0 : 1; step < 2; step++) {
    uint8_t room[64];
    mgpu__store_wbuf w = {.data = room, .cap = sizeof room};
    mgpu__store_wbuf_begin(&w, step == 0 ? MGPU__SM_DELETE : MGPU__SM_RELEASE,
                           st->seq);
    mgpu__store_put_u64(&w, id);
    if (step == 0) mgpu__store_put_str(&w, NULL, MGPU__STORE_NAME_MAX);
    mgpu__store_msg m;
    if (mgpu__store_wbuf_end(&w) == 0 && roundtrip(st, &w, &m, NULL) == 0)
      mgpu__store_msg_free(&m);
  }
}

/* Sends the CREATE or GET request in w (freed here), maps the object its
 * reply describes (on device want, where that is its device: a create's),
 * and gives the daemon its reference back when mapping fails. st->lock
 * held. */
static int request_object(mgpu_store *st, mgpu__store_wbuf *w, int writable,
                          int want, mgpu_store_object **obj) {
  mgpu__store_msg m;
  int fd = -1;
  int rc = end(w);
  if (rc == 0) rc = roundtrip(st, w, &m, &fd);
  mgpu__store_wbuf_free(w);
  if (rc != 0) return rc;
  rc = object_map(st, &m.obj, fd, writable, want, obj);
  if (rc != 0) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
    drop_remote(st, m.obj.id, writable);
    mgpu__error(rc, "%s", detail);
  }
  mgpu__store_msg_free(&m);
  return rc;
}

/* A key is an id (name NULL) or a valid name. */
static int check_key(uint64_t id, const char *name) {
  if (name != NULL && !mgpu__store_name_valid(name, strlen(name)))
    return mgpu__error(MGPU_EINVAL, "object name '%.40s' must be 1..%d bytes "
                       "without control characters", name,
                       MGPU__STORE_NAME_MAX);
  if (name == NULL && id == 0)
    return mgpu__error(MGPU_EINVAL, "object id 0 names no object");
  return 0;
}

static void put_key(mgpu__store_wbuf *w, uint64_t id, const char *name) {
  mgpu__store_put_u64(w, name ? 0 : id);
  mgpu__store_put_str(w, name, MGPU__STORE_NAME_MAX);
}

static int create_in(mgpu_store *st, int dev, size_t size, const char *name,
                     mgpu_store_object **obj) {
  if (obj == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_create: NULL output");
  *obj = NULL;
  if (size == 0)
    return mgpu__error(MGPU_EINVAL, "device %d: store object of size 0", dev);
  if (name != NULL && name[0] != '\0' &&
      !mgpu__store_name_valid(name, strlen(name)))
    return mgpu__error(MGPU_EINVAL, "object name '%.40s' must be 1..%d bytes "
                       "without control characters", name,
                       MGPU__STORE_NAME_MAX);
  char uuid[64];
  int rc = mgpu__store_device_uuid(dev, uuid, sizeof uuid);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_CREATE);
  mgpu__store_put_str(&w, uuid, MGPU__STORE_UUID_MAX);
  mgpu__store_put_u64(&w, size);
  mgpu__store_put_str(&w, name, MGPU__STORE_NAME_MAX);
  rc = request_object(st, &w, 1, dev, obj);
  mgpu__mutex_unlock(&st->lock);
  return rc;
}

int mgpu_store_create(mgpu_store *st, int dev, size_t size, const char *name,
                      mgpu_store_object **obj) {
  int rc = enter_store(st);
  if (rc != 0) return rc;
  rc = create_in(st, dev, size, name, obj);
  leave_store(st);
  return rc;
}

static int get_in(mgpu_store *st, uint64_t id, const char *name,
                  mgpu_store_object **obj) {
  if (obj == NULL) return mgpu__error(MGPU_EINVAL, "mgpu_store_get: NULL output");
  *obj = NULL;
  int rc = check_key(id, name);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_GET);
  put_key(&w, id, name);
  rc = request_object(st, &w, 0, -1, obj);
  mgpu__mutex_unlock(&st->lock);
  return rc;
}

static int get_key(mgpu_store *st, uint64_t id, const char *name,
                   mgpu_store_object **obj) {
  int rc = enter_store(st);
  if (rc != 0) return rc;
  rc = get_in(st, id, name, obj);
  leave_store(st);
  return rc;
}

int mgpu_store_get(mgpu_store *st, uint64_t id, mgpu_store_object **obj) {
  return get_key(st, id, NULL, obj);
}

int mgpu_store_get_by_name(mgpu_store *st, const char *name,
                           mgpu_store_object **obj) {
  if (name == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_get_by_name: NULL name");
  return get_key(st, 0, name, obj);
}

int mgpu_store_seal(mgpu_store_object *obj) {
  int rc = enter_object(obj);
  if (rc != 0) return rc;
  mgpu_store *st = obj->store;
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_SEAL);
  mgpu__store_put_u64(&w, obj->id);
  mgpu__store_msg m;
  rc = end(&w);
  if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
  mgpu__store_wbuf_free(&w);
  if (rc == 0) {
    mgpu__store_msg_free(&m);
    obj->writable = 0;
    if (obj->buffer != NULL) mgpu__buffer_set_readonly(obj->buffer);
    rc = mgpu__store_mem_protect(obj->dev, &obj->mem, obj->ptr);
  }
  mgpu__mutex_unlock(&st->lock);
  leave_object(obj);
  return rc;
}

int mgpu_store_release(mgpu_store_object *obj) {
  /* Unlisted, no new call gets in; the calls inside it are waited for.
   * Counted inside the connection, so a disconnect waits for this. */
  mgpu__mutex_lock(&reg_lock);
  int found = 0;
  for (mgpu_store_object **p = &objects; *p != NULL; p = &(*p)->next)
    if (*p == obj) {
      *p = obj->next;
      found = 1;
      break;
    }
  if (found) {
    obj->store->users++;
    while (obj->users > 0) mgpu__cond_wait(&reg_idle, &reg_lock);
  }
  mgpu__mutex_unlock(&reg_lock);
  if (!found)
    return mgpu__error(obj == NULL ? MGPU_EBADHANDLE : MGPU_EFREED,
                       "store object %p is not held (released twice?)",
                       (void *)obj);
  mgpu_store *st = obj->store;
  uint64_t id = obj->id;
  object_unmap(obj);
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_RELEASE);
  mgpu__store_put_u64(&w, id);
  mgpu__store_msg m;
  int rc = end(&w);
  if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
  mgpu__store_wbuf_free(&w);
  if (rc == 0) mgpu__store_msg_free(&m);
  mgpu__mutex_unlock(&st->lock);
  leave_store(st);
  return rc;
}

static int delete_in(mgpu_store *st, uint64_t id, const char *name,
                     int *deferred) {
  int rc = check_key(id, name);
  if (rc != 0) return rc;
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_DELETE);
  put_key(&w, id, name);
  mgpu__store_msg m;
  rc = end(&w);
  if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
  mgpu__store_wbuf_free(&w);
  if (rc == 0) {
    if (deferred) *deferred = m.deferred;
    mgpu__store_msg_free(&m);
  }
  mgpu__mutex_unlock(&st->lock);
  return rc;
}

static int delete_key(mgpu_store *st, uint64_t id, const char *name,
                      int *deferred) {
  int rc = enter_store(st);
  if (rc != 0) return rc;
  rc = delete_in(st, id, name, deferred);
  leave_store(st);
  return rc;
}

int mgpu_store_delete(mgpu_store *st, uint64_t id, int *deferred) {
  return delete_key(st, id, NULL, deferred);
}

int mgpu_store_delete_by_name(mgpu_store *st, const char *name,
                              int *deferred) {
  if (name == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_delete_by_name: NULL name");
  return delete_key(st, 0, name, deferred);
}

/* Reads a field of obj under reg_lock, so that a concurrent release cannot
 * free it under the read. */
#define OBJECT_FIELD(obj, field, none)                       \
  do {                                                       \
    mgpu__mutex_lock(&reg_lock);                             \
    int listed_ = (obj) != NULL && object_listed(obj);       \
    __typeof__((obj)->field) v_ = listed_ ? (obj)->field : (none); \
    mgpu__mutex_unlock(&reg_lock);                           \
    if (!listed_) object_gone(obj);                          \
    return v_;                                               \
  } while (0)

uint64_t mgpu_store_object_id(const mgpu_store_object *obj) {
  OBJECT_FIELD(obj, id, 0);
}

size_t mgpu_store_object_size(const mgpu_store_object *obj) {
  OBJECT_FIELD(obj, size, 0);
}

int mgpu_store_object_device(const mgpu_store_object *obj) {
  OBJECT_FIELD(obj, dev, -1);
}

void *mgpu_store_object_ptr(const mgpu_store_object *obj) {
  OBJECT_FIELD(obj, ptr, NULL);
}

mgpu_buffer *mgpu_store_object_buffer(const mgpu_store_object *obj) {
  OBJECT_FIELD(obj, buffer, NULL);
}

/* ---- host mirror ---- */

static int mirror_begin_in(mgpu_store_object *obj, int fill, void **host) {
  int rc = 0;
  if (host == NULL)
    return mgpu__error(MGPU_EINVAL, "object %llu: NULL mirror pointer",
                       (unsigned long long)obj->id);
  if (obj->mirror != NULL)
    return mgpu__error(MGPU_EALREADY, "object %llu already has a host "
                       "mirror", (unsigned long long)obj->id);
  *host = NULL;
  if (obj->buffer != NULL) {
    /* A pinned buffer of the object's device: copies at full speed. */
    rc = mgpu_malloc_host(&obj->mirror_buf, obj->dev, obj->size);
    if (rc != 0) return rc;
    void *m = mgpu_buffer_ptr(obj->mirror_buf);
    if (fill) rc = mgpu_memcpy_dtoh(m, obj->buffer, 0, obj->size);
    if (rc != 0) {
      mgpu_free(obj->mirror_buf);
      obj->mirror_buf = NULL;
      return rc;
    }
    obj->mirror = m;
  } else if (obj->mem.kind == MGPU__IPC_MEMFD) {
    obj->mirror = mgpu__malloc(obj->size);
    if (obj->mirror == NULL)
      return mgpu__error(MGPU_ENOMEM, "object %llu: no host memory for a "
                         "%zu-byte mirror", (unsigned long long)obj->id,
                         obj->size);
    if (fill) memcpy(obj->mirror, obj->ptr, obj->size);
  } else {
    return mgpu__error(MGPU_ENODEV, "object %llu: a mirror of device memory "
                       "needs its device open in this process",
                       (unsigned long long)obj->id);
  }
  *host = obj->mirror;
  return 0;
}

int mgpu_store_mirror_begin(mgpu_store_object *obj, int fill, void **host) {
  int rc = enter_object(obj);
  if (rc != 0) return rc;
  rc = mirror_begin_in(obj, fill, host);
  leave_object(obj);
  return rc;
}

static int mirror_end_in(mgpu_store_object *obj) {
  int rc = 0;
  if (obj->mirror == NULL)
    return mgpu__error(MGPU_EINVAL, "object %llu has no host mirror open",
                       (unsigned long long)obj->id);
  if (obj->mirror_buf != NULL) {
    if (obj->writable)
      rc = mgpu_memcpy_htod(obj->buffer, 0, obj->mirror, obj->size);
    mgpu_free(obj->mirror_buf);
    obj->mirror_buf = NULL;
  } else {
    if (obj->writable) memcpy(obj->ptr, obj->mirror, obj->size);
    mgpu__free(obj->mirror);
  }
  obj->mirror = NULL;
  return rc;
}

int mgpu_store_mirror_end(mgpu_store_object *obj) {
  int rc = enter_object(obj);
  if (rc != 0) return rc;
  rc = mirror_end_in(obj);
  leave_object(obj);
  return rc;
}

/* ---- list and stats ---- */

static int list_in(mgpu_store *st, mgpu_store_entry **entries,
                   size_t *count) {
  int rc = 0;
  if (entries == NULL || count == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_list: NULL output");
  *entries = NULL;
  *count = 0;
  mgpu_store_entry *all = NULL;
  size_t n = 0;
  uint64_t after = 0;
  mgpu__mutex_lock(&st->lock);
  for (;;) {
    mgpu__store_wbuf w;
    begin(st, &w, MGPU__SM_LIST);
    mgpu__store_put_u64(&w, after);
    mgpu__store_msg m;
    rc = end(&w);
    if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
    mgpu__store_wbuf_free(&w);
    if (rc != 0) break;
    mgpu_store_entry *grown = mgpu__realloc(all, (n + m.count + 1) * sizeof *all);
    if (grown == NULL) {
      mgpu__store_msg_free(&m);
      rc = mgpu__error(MGPU_ENOMEM, "out of host memory for %zu entries",
                       n + m.count);
      break;
    }
    all = grown;
    for (uint32_t i = 0; i < m.count; i++) {
      mgpu_store_entry *e = &all[n++];
      memset(e, 0, sizeof *e);
      e->id = m.entries[i].id;
      snprintf(e->name, sizeof e->name, "%s", m.entries[i].name);
      snprintf(e->device_uuid, sizeof e->device_uuid, "%s",
               m.entries[i].uuid);
      e->bytes = m.entries[i].size;
      e->sealed = m.entries[i].sealed;
      e->deleted = m.entries[i].deleted;
      e->refs = m.entries[i].refs;
      after = e->id;
    }
    int more = m.more && m.count > 0;
    mgpu__store_msg_free(&m);
    if (!more) break;
  }
  mgpu__mutex_unlock(&st->lock);
  if (rc != 0) {
    mgpu__free(all);
    return rc;
  }
  *entries = all;
  *count = n;
  return 0;
}

int mgpu_store_list(mgpu_store *st, mgpu_store_entry **entries,
                    size_t *count) {
  int rc = enter_store(st);
  if (rc != 0) return rc;
  rc = list_in(st, entries, count);
  leave_store(st);
  return rc;
}

void mgpu_store_list_free(mgpu_store_entry *entries) { mgpu__free(entries); }

static int stats_in(mgpu_store *st, mgpu_store_stats *stats) {
  int rc = 0;
  if (stats == NULL || stats->size < sizeof *stats)
    return mgpu__error(MGPU_EINVAL, "mgpu_store_stats_get: stats->size must "
                       "be sizeof(mgpu_store_stats)");
  mgpu__mutex_lock(&st->lock);
  mgpu__store_wbuf w;
  begin(st, &w, MGPU__SM_STATS);
  mgpu__store_msg m;
  rc = end(&w);
  if (rc == 0) rc = roundtrip(st, &w, &m, NULL);
  mgpu__store_wbuf_free(&w);
  mgpu__mutex_unlock(&st->lock);
  if (rc != 0) return rc;
  size_t size = stats->size;
  memset(stats, 0, sizeof *stats);
  stats->size = size;
  stats->clients = m.clients;
  stats->objects = m.objects;
  stats->refs = m.refs;
  stats->evictions = m.evictions;
  stats->ndevices = (int)m.count;
  for (uint32_t i = 0; i < m.count && i < MGPU_MAX_DEVICES; i++) {
    mgpu_store_device_stats *d = &stats->devices[i];
    snprintf(d->uuid, sizeof d->uuid, "%s", m.devices[i].uuid);
    d->backend_kind = m.devices[i].backend_kind;
    d->capacity = m.devices[i].capacity;
    d->in_use = m.devices[i].in_use;
    d->held = m.devices[i].held;
    d->objects = m.devices[i].objects;
  }
  mgpu__store_msg_free(&m);
  return 0;
}

int mgpu_store_stats_get(mgpu_store *st, mgpu_store_stats *stats) {
  int rc = enter_store(st);
  if (rc != 0) return rc;
  rc = stats_in(st, stats);
  leave_store(st);
  return rc;
}
