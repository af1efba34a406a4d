/* The store daemon: one thread, one poll loop, every socket non-blocking.
 * After a round that read a request the loop watches (mgpu__store_poll)
 * before it sleeps, since a client's next request is microseconds away.
 *
 * A client can only harm itself: its bytes are framed and decoded with every
 * field checked (proto.c), and a malformed message, an unknown version or a
 * client that stops reading its replies closes that connection alone, with
 * the reason logged. Replies are queued per connection and written when the
 * socket takes them; a file descriptor travels with the first byte of its
 * reply.
 *
 * Lifetimes follow Plasma's: create takes a reference for the creating
 * connection; get takes one (only of sealed objects); release drops one.
 * References are kept per connection (its lease table), so a connection
 * that closes, however it ends, drops all of its references and aborts the
 * objects it created and never sealed. Delete makes an object ungettable
 * and frees it once no reference is left. The daemon never maps what it
 * exports. With a capacity, a create that does not fit evicts sealed
 * objects no one holds, least recently used first.
 *
 * All state below belongs to the thread running mgpu_store_serve.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "mgpu/store.h"
#include "store/store-internal.h"
#include "util/fault.h"

#define MAX_CONNS 1024
/* A client that lets this many reply bytes, or replies carrying a
 * descriptor, pile up unsent is not reading: it is dropped. A client of
 * this library has one request out at a time. */
#define OUT_LIMIT (4u * MGPU__STORE_MSG_MAX)
#define FDS_LIMIT 16

typedef struct object {
  uint64_t id;
  char name[MGPU__STORE_NAME_MAX + 1];
  int dev;
  size_t size;
  mgpu__ipc_mem mem;
  void *alloc;
  int sealed, deleted;
  uint32_t refs;          /* leases over every connection */
  struct conn *creator;   /* until sealed */
  uint64_t last_use;      /* LRU tick */
  struct object *prev, *next;
} object;

typedef struct lease {
  object *obj;
  uint32_t count;
  struct lease *next;
} lease;

typedef struct pending_fd {
  size_t at; /* offset in out where its reply begins */
  int fd;
  struct pending_fd *next;
} pending_fd;

typedef struct conn {
  int fd;
  int id;
  pid_t pid;
  uid_t uid;
  int greeted;
  uint8_t *in;
  size_t in_len, in_cap;
  mgpu__store_wbuf out;
  pending_fd *fds, *fds_tail;
  int nfds;    /* descriptors in fds */
  int closing; /* close once out is flushed */
  lease *leases;
  struct conn *next;
} conn;

typedef struct store_dev {
  char uuid[MGPU__STORE_UUID_MAX + 1];
  int kind;
  uint64_t capacity, in_use, objects;
} store_dev;

static struct {
  int listen_fd;
  char path[108];
  int lock_fd;              /* PATH.lock, flock'ed while serving */
  int spare_fd;             /* given up to refuse a client at EMFILE */
  char lock_path[128];
  gid_t allow_gid;
  int allow_group;
  uint64_t instance;
  uint64_t next_id;
  uint64_t tick;
  uint64_t evictions;
  int next_conn_id;
  int nconns;
  conn *conns;
  object *head, *tail;
  int ndev;
  store_dev devs[MGPU_MAX_DEVICES];
} S;

static volatile sig_atomic_t stop_requested;
static int wake_pipe[2] = {-1, -1};

void mgpu_store_server_stop(void) {
  stop_requested = 1;
  if (wake_pipe[1] >= 0) {
    ssize_t r = write(wake_pipe[1], "x", 1);
    (void)r;
  }
}

static void on_signal(int sig) {
  (void)sig;
  mgpu_store_server_stop();
}

/* ---- objects ---- */

static object *find_id(uint64_t id) {
  for (object *o = S.head; o != NULL; o = o->next)
    if (o->id == id) return o;
  return NULL;
}

static object *find_name(const char *name) {
  for (object *o = S.head; o != NULL; o = o->next)
    if (!o->deleted && o->name[0] != '\0' && strcmp(o->name, name) == 0)
      return o;
  return NULL;
}

static void object_free(object *o) {
  if (o->prev) o->prev->next = o->next; else S.head = o->next;
  if (o->next) o->next->prev = o->prev; else S.tail = o->prev;
  store_dev *d = &S.devs[o->dev];
  d->in_use -= o->size;
  d->objects--;
  mgpu__log(MGPU_LOG_DEBUG, "store: object %llu freed (%zu bytes, device %s)",
            (unsigned long long)o->id, o->size, d->uuid);
  mgpu__store_mem_free(o->dev, o->alloc);
  mgpu__free(o);
}

/* Frees the object when deleted and unreferenced. */
static void object_settle(object *o) {
  if (o->deleted && o->refs == 0) object_free(o);
}

static uint64_t held_bytes(int dev) {
  uint64_t h = 0;
  for (object *o = S.head; o != NULL; o = o->next)
    if (o->dev == dev && o->refs > 0) h += o->size;
  return h;
}

static int evictable(const object *o, int dev) {
  return o->dev == dev && o->sealed && !o->deleted && o->refs == 0;
}

/* Evicts unheld sealed objects of dev, least recently used first, until
 * need more bytes fit. Returns 1 when they fit. A request that would not
 * fit even with every evictable object gone evicts nothing. */
static int make_room(int dev, uint64_t need) {
  store_dev *d = &S.devs[dev];
  uint64_t can_go = 0;
  for (object *o = S.head; o != NULL; o = o->next)
    if (evictable(o, dev)) can_go += o->size;
  uint64_t must_stay = d->in_use - can_go;
  if (must_stay > d->capacity || need > d->capacity - must_stay) return 0;
  while (d->capacity - d->in_use < need || d->in_use > d->capacity) {
    object *victim = NULL;
    for (object *o = S.head; o != NULL; o = o->next)
      if (evictable(o, dev) &&
          (victim == NULL || o->last_use < victim->last_use))
        victim = o;
    if (victim == NULL) return 0;
    mgpu__log(MGPU_LOG_INFO, "store: evicting object %llu '%s' (%zu bytes) "
              "of device %s", (unsigned long long)victim->id, victim->name,
              victim->size, d->uuid);
    S.evictions++;
    victim->deleted = 1;
    object_free(victim);
  }
  return 1;
}

/* ---- connections ---- */

static lease *lease_find(conn *c, object *o) {
  for (lease *l = c->leases; l != NULL; l = l->next)
    if (l->obj == o) return l;
  return NULL;
}

static int lease_take(conn *c, object *o) {
  lease *l = lease_find(c, o);
  if (l == NULL) {
    l = mgpu__calloc(1, sizeof *l);
    if (l == NULL) return MGPU_ENOMEM;
    l->obj = o;
    l->next = c->leases;
    c->leases = l;
  }
  l->count++;
  o->refs++;
  o->last_use = ++S.tick;
  return 0;
}

/* Drops one reference; 0 or MGPU_ENOENT when c holds none on o. */
static int lease_drop(conn *c, object *o) {
  for (lease **p = &c->leases; *p != NULL; p = &(*p)->next) {
    lease *l = *p;
    if (l->obj != o) continue;
    o->refs--;
    o->last_use = ++S.tick;
    if (--l->count == 0) {
      *p = l->next;
      mgpu__free(l);
    }
    object_settle(o);
    return 0;
  }
  return MGPU_ENOENT;
}

static void conn_close(conn *c, const char *why) {
  if (why != NULL)
    mgpu__log(MGPU_LOG_WARN, "store: client %d (pid %d): closed: %s", c->id,
              (int)c->pid, why);
  else
    mgpu__log(MGPU_LOG_INFO, "store: client %d (pid %d) disconnected", c->id,
              (int)c->pid);
  /* Abort what it created and never sealed (freed now when it holds no
   * reference any more), then drop its references. */
  for (object *o = S.head, *next; o != NULL; o = next) {
    next = o->next;
    if (o->creator == c && !o->sealed) {
      o->deleted = 1;
      o->creator = NULL;
      object_settle(o);
    }
  }
  while (c->leases != NULL) {
    lease *l = c->leases;
    c->leases = l->next;
    object *o = l->obj;
    o->refs -= l->count;
    mgpu__free(l);
    object_settle(o);
  }
  for (conn **p = &S.conns; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  while (c->fds != NULL) {
    pending_fd *f = c->fds;
    c->fds = f->next;
    close(f->fd);
    mgpu__free(f);
  }
  close(c->fd);
  mgpu__free(c->in);
  mgpu__store_wbuf_free(&c->out);
  mgpu__free(c);
  S.nconns--;
}

/* Queues the message just ended in c->out, with fd (>= 0) beside it. */
static void queue_fd(conn *c, size_t at, int fd) {
  if (fd < 0) return;
  pending_fd *f = mgpu__calloc(1, sizeof *f);
  if (f == NULL) {
    close(fd);
    return;
  }
  f->at = at;
  f->fd = fd;
  if (c->fds_tail) c->fds_tail->next = f; else c->fds = f;
  c->fds_tail = f;
  c->nfds++;
}

static void reply_error(conn *c, uint32_t seq, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(conn *c, uint32_t seq, int code, const char *fmt, ...) {
  char detail[MGPU__STORE_DETAIL_MAX + 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  mgpu__store_wbuf_begin(&c->out, MGPU__SM_ERROR, seq);
  mgpu__store_put_u32(&c->out, (uint32_t)code);
  mgpu__store_put_str(&c->out, detail, MGPU__STORE_DETAIL_MAX);
  if (mgpu__store_wbuf_end(&c->out) != 0) c->closing = 1;
}

static void begin_reply(conn *c, const mgpu__store_msg *m) {
  mgpu__store_wbuf_begin(&c->out, (uint16_t)(m->type | MGPU__SM_REPLY),
                         m->seq);
}

static void end_reply(conn *c) {
  if (mgpu__store_wbuf_end(&c->out) != 0) c->closing = 1;
}

static void describe(const object *o, mgpu__store_objdesc *d) {
  memset(d, 0, sizeof *d);
  d->id = o->id;
  d->size = o->size;
  d->map_size = o->mem.map_size;
  d->offset = o->mem.offset;
  d->instance = S.instance;
  d->handle_kind = (uint8_t)o->mem.kind;
  d->sealed = (uint8_t)o->sealed;
  memcpy(d->legacy, o->mem.legacy, sizeof d->legacy);
  snprintf(d->uuid, sizeof d->uuid, "%s", S.devs[o->dev].uuid);
  snprintf(d->name, sizeof d->name, "%s", o->name);
}

/* Replies with the object's description and a descriptor of its memory. */
static void reply_object(conn *c, const mgpu__store_msg *m, object *o,
                         int writable) {
  int fd = -1;
  if (o->mem.fd >= 0) {
    fd = mgpu__store_mem_export_fd(o->dev, o->alloc, &o->mem, writable);
    if (fd < 0) {
      lease_drop(c, o);
      reply_error(c, m->seq, MGPU_EIO, "object %llu: cannot export its "
                  "memory: %s", (unsigned long long)o->id, strerror(errno));
      return;
    }
  }
  mgpu__store_objdesc d;
  describe(o, &d);
  size_t at = c->out.len;
  begin_reply(c, m);
  mgpu__store_put_objdesc(&c->out, &d);
  end_reply(c);
  queue_fd(c, at, fd);
}

static int dev_of_uuid(const char *uuid) {
  for (int i = 0; i < S.ndev; i++)
    if (strcmp(S.devs[i].uuid, uuid) == 0) return i;
  return -1;
}

static void do_create(conn *c, const mgpu__store_msg *m) {
  int dev = dev_of_uuid(m->uuid);
  if (dev < 0) {
    reply_error(c, m->seq, MGPU_ENODEV, "the store has no device of UUID %s",
                m->uuid);
    return;
  }
  if (m->name[0] != '\0' && find_name(m->name) != NULL) {
    reply_error(c, m->seq, MGPU_EEXIST, "an object named '%s' exists "
                "(object %llu)", m->name,
                (unsigned long long)find_name(m->name)->id);
    return;
  }
  store_dev *d = &S.devs[dev];
  if (!make_room(dev, m->size)) {
    uint64_t held = held_bytes(dev);
    reply_error(c, m->seq, MGPU_ENOMEM, "device %s: cannot create %llu bytes "
                "for client %d: capacity %llu, %llu in use by %llu objects, "
                "%llu of them held by clients or not sealed", d->uuid,
                (unsigned long long)m->size, c->id,
                (unsigned long long)d->capacity,
                (unsigned long long)d->in_use,
                (unsigned long long)d->objects,
                (unsigned long long)(held > d->in_use ? d->in_use : held));
    return;
  }
  object *o = mgpu__calloc(1, sizeof *o);
  if (o == NULL) {
    reply_error(c, m->seq, MGPU_ENOMEM, "store daemon out of host memory");
    return;
  }
  int rc = mgpu__store_mem_alloc(dev, m->size, &o->mem, &o->alloc);
  if (rc != 0) {
    mgpu__free(o);
    reply_error(c, m->seq, rc, "device %s: %s", d->uuid, mgpu_error_detail());
    return;
  }
  o->id = S.next_id++;
  o->mem.key[0] = S.instance;
  o->mem.key[1] = o->id;
  snprintf(o->name, sizeof o->name, "%s", m->name);
  o->dev = dev;
  o->size = m->size;
  o->creator = c;
  o->prev = S.tail;
  if (S.tail) S.tail->next = o; else S.head = o;
  S.tail = o;
  d->in_use += o->size;
  d->objects++;
  if (lease_take(c, o) != 0) {
    o->deleted = 1;
    object_free(o);
    reply_error(c, m->seq, MGPU_ENOMEM, "store daemon out of host memory");
    return;
  }
  reply_object(c, m, o, 1);
}

static object *lookup(conn *c, const mgpu__store_msg *m, int gettable) {
  object *o = m->id != 0 ? find_id(m->id) : find_name(m->name);
  if (o == NULL || (gettable && o->deleted)) {
    if (m->id != 0)
      reply_error(c, m->seq, MGPU_ENOENT, "no object %llu%s",
                  (unsigned long long)m->id,
                  o != NULL ? " (deleted)" : "");
    else
      reply_error(c, m->seq, MGPU_ENOENT, "no object named '%s'", m->name);
    return NULL;
  }
  return o;
}

static void do_seal(conn *c, const mgpu__store_msg *m) {
  object *o = lookup(c, m, 0);
  if (o == NULL) return;
  if (o->sealed) {
    reply_error(c, m->seq, MGPU_EALREADY, "object %llu is already sealed",
                (unsigned long long)o->id);
    return;
  }
  if (o->deleted) {
    reply_error(c, m->seq, MGPU_ENOENT, "object %llu was deleted before it "
                "was sealed", (unsigned long long)o->id);
    return;
  }
  if (o->creator != c) {
    reply_error(c, m->seq, MGPU_EACCES, "object %llu: only the connection "
                "that created it may seal it", (unsigned long long)o->id);
    return;
  }
  /* The memory itself refuses writes from now on, whoever holds it. */
  int rc = mgpu__store_mem_seal(o->dev, o->alloc, &o->mem);
  if (rc != 0) {
    reply_error(c, m->seq, rc, "object %llu: %s",
                (unsigned long long)o->id, mgpu_error_detail());
    return;
  }
  o->sealed = 1;
  o->creator = NULL;
  o->last_use = ++S.tick;
  begin_reply(c, m);
  end_reply(c);
}

static void do_get(conn *c, const mgpu__store_msg *m) {
  object *o = lookup(c, m, 1);
  if (o == NULL) return;
  if (!o->sealed) {
    reply_error(c, m->seq, MGPU_EAGAIN, "object %llu is not sealed yet",
                (unsigned long long)o->id);
    return;
  }
  if (lease_take(c, o) != 0) {
    reply_error(c, m->seq, MGPU_ENOMEM, "store daemon out of host memory");
    return;
  }
  reply_object(c, m, o, 0);
}

static void do_release(conn *c, const mgpu__store_msg *m) {
  object *o = find_id(m->id);
  if (o == NULL || lease_drop(c, o) != 0) {
    reply_error(c, m->seq, MGPU_ENOENT, "client %d holds no reference on "
                "object %llu", c->id, (unsigned long long)m->id);
    return;
  }
  begin_reply(c, m);
  end_reply(c);
}

static void do_delete(conn *c, const mgpu__store_msg *m) {
  object *o = lookup(c, m, 1);
  if (o == NULL) return;
  uint64_t id = o->id;
  int deferred = o->refs > 0;
  o->deleted = 1;
  o->creator = NULL;
  object_settle(o);
  begin_reply(c, m);
  mgpu__store_put_u64(&c->out, id);
  mgpu__store_put_u8(&c->out, (uint8_t)deferred);
  end_reply(c);
}

static void do_list(conn *c, const mgpu__store_msg *m) {
  /* Count what fits, then write: a reply never exceeds the maximum. */
  size_t budget = MGPU__STORE_MSG_MAX - 64, used = 0;
  uint32_t count = 0;
  int more = 0;
  for (object *o = S.head; o != NULL; o = o->next) {
    if (o->id <= m->id) continue;
    size_t sz = 8 + 8 + 4 + 2 + 2 + strlen(S.devs[o->dev].uuid) + 2 +
                strlen(o->name);
    if (used + sz > budget) {
      more = 1;
      break;
    }
    used += sz;
    count++;
  }
  begin_reply(c, m);
  mgpu__store_put_u32(&c->out, count);
  mgpu__store_put_u8(&c->out, (uint8_t)more);
  uint32_t n = 0;
  for (object *o = S.head; o != NULL && n < count; o = o->next) {
    if (o->id <= m->id) continue;
    mgpu__store_put_u64(&c->out, o->id);
    mgpu__store_put_u64(&c->out, o->size);
    mgpu__store_put_u32(&c->out, o->refs);
    mgpu__store_put_u8(&c->out, (uint8_t)o->sealed);
    mgpu__store_put_u8(&c->out, (uint8_t)o->deleted);
    mgpu__store_put_str(&c->out, S.devs[o->dev].uuid, MGPU__STORE_UUID_MAX);
    mgpu__store_put_str(&c->out, o->name, MGPU__STORE_NAME_MAX);
    n++;
  }
  end_reply(c);
}

static void do_stats(conn *c, const mgpu__store_msg *m) {
  uint64_t objects = 0, refs = 0;
  for (object *o = S.head; o != NULL; o = o->next) {
    objects++;
    refs += o->refs;
  }
  begin_reply(c, m);
  mgpu__store_put_u32(&c->out, (uint32_t)S.nconns);
  mgpu__store_put_u64(&c->out, objects);
  mgpu__store_put_u64(&c->out, refs);
  mgpu__store_put_u64(&c->out, S.evictions);
  mgpu__store_put_u16(&c->out, (uint16_t)S.ndev);
  for (int i = 0; i < S.ndev; i++) {
    mgpu__store_put_str(&c->out, S.devs[i].uuid, MGPU__STORE_UUID_MAX);
    mgpu__store_put_u8(&c->out, (uint8_t)S.devs[i].kind);
    mgpu__store_put_u64(&c->out, S.devs[i].capacity);
    mgpu__store_put_u64(&c->out, S.devs[i].in_use);
    mgpu__store_put_u64(&c->out, held_bytes(i));
    mgpu__store_put_u64(&c->out, S.devs[i].objects);
  }
  end_reply(c);
}

static void do_hello(conn *c, const mgpu__store_msg *m) {
  c->greeted = 1;
  begin_reply(c, m);
  mgpu__store_put_u64(&c->out, S.instance);
  mgpu__store_put_u32(&c->out, MGPU__STORE_MSG_MAX);
  mgpu__store_put_u16(&c->out, (uint16_t)S.ndev);
  for (int i = 0; i < S.ndev; i++) {
    mgpu__store_put_str(&c->out, S.devs[i].uuid, MGPU__STORE_UUID_MAX);
    mgpu__store_put_u8(&c->out, (uint8_t)S.devs[i].kind);
    mgpu__store_put_u64(&c->out, S.devs[i].capacity);
  }
  end_reply(c);
}

/* Handles one decoded request. Returns 0, or -1 with why set when the
 * connection must close. */
static int dispatch(conn *c, const mgpu__store_msg *m, char *why, size_t n) {
  if (m->type & MGPU__SM_REPLY) {
    snprintf(why, n, "sent a reply (type 0x%04x) as a request", m->type);
    return -1;
  }
  if (!c->greeted && m->type != MGPU__SM_HELLO) {
    snprintf(why, n, "first message is type %u, not hello", m->type);
    return -1;
  }
  switch (m->type) {
    case MGPU__SM_HELLO: do_hello(c, m); break;
    case MGPU__SM_CREATE: do_create(c, m); break;
    case MGPU__SM_SEAL: do_seal(c, m); break;
    case MGPU__SM_GET: do_get(c, m); break;
    case MGPU__SM_RELEASE: do_release(c, m); break;
    case MGPU__SM_DELETE: do_delete(c, m); break;
    case MGPU__SM_LIST: do_list(c, m); break;
    case MGPU__SM_STATS: do_stats(c, m); break;
  }
  return 0;
}

static int conn_flush(conn *c, char *why, size_t n);

/* Reads what the socket holds into c->in, growing it up to twice the
 * largest message. Returns 0, or -1 with why set ("" for a plain
 * disconnect). */
static int conn_fill(conn *c, char *why, size_t n) {
  for (;;) {
    if (c->in_cap - c->in_len < 4096) {
      size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
      if (cap > 2 * (size_t)MGPU__STORE_MSG_MAX) cap = 2 * MGPU__STORE_MSG_MAX;
      if (cap > c->in_cap) {
        uint8_t *p = mgpu__realloc(c->in, cap);
        if (p == NULL) {
          snprintf(why, n, "out of memory for its input");
          return -1;
        }
        c->in = p;
        c->in_cap = cap;
      }
    }
    size_t room = c->in_cap - c->in_len;
    if (room == 0) break;
    ssize_t r = recv(c->fd, c->in + c->in_len, room, MSG_DONTWAIT);
    if (r == 0) {
      if (c->in_len != 0)
        snprintf(why, n, "disconnected in the middle of a message (%zu bytes "
                 "of it read)", c->in_len);
      else
        why[0] = '\0';
      return -1;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      snprintf(why, n, "read failed: %s", strerror(errno));
      return -1;
    }
    c->in_len += (size_t)r;
    if ((size_t)r < room) break;
  }
  return 0;
}

/* Handles every whole message in c->in and keeps the rest. Returns 0, or
 * -1 with why set when the connection must close. */
static int conn_handle(conn *c, char *why, size_t n) {
  size_t off = 0;
  while (c->in_len - off >= MGPU__STORE_HDR && !c->closing) {
    uint32_t plen;
    if (mgpu__store_header_check(c->in + off, &plen, why, n) != 0) return -1;
    size_t total = MGPU__STORE_HDR + (size_t)plen;
    if (c->in_len - off < total) break;
    mgpu__store_msg m;
    char reason[256];
    int rc = mgpu__store_decode(c->in + off, total, &m, reason, sizeof reason);
    if (rc != 0) {
      mgpu__store_msg_free(&m);
      snprintf(why, n, "malformed message: %s", reason);
      return -1;
    }
    rc = dispatch(c, &m, why, n);
    mgpu__store_msg_free(&m);
    if (rc != 0) return -1;
    off += total;
    if (c->nfds >= FDS_LIMIT && conn_flush(c, why, n) != 0) return -1;
    if (c->out.len > OUT_LIMIT || c->nfds >= FDS_LIMIT) {
      snprintf(why, n, "does not read its replies (%zu bytes and %d "
               "descriptors queued)", c->out.len, c->nfds);
      return -1;
    }
  }
  memmove(c->in, c->in + off, c->in_len - off);
  c->in_len -= off;
  return 0;
}

/* Reads what is there and handles every whole message. Returns 0, or -1
 * with why set ("" for a plain disconnect). */
static int conn_read(conn *c, char *why, size_t n) {
  if (conn_fill(c, why, n) != 0) return -1;
  return conn_handle(c, why, n);
}

/* Writes what the socket takes. Returns 0 or -1 with why set. */
static int conn_flush(conn *c, char *why, size_t n) {
  while (c->out.len > 0) {
    size_t len = c->out.len;
    int fd = -1;
    if (c->fds != NULL) {
      if (c->fds->at == 0) {
        fd = c->fds->fd;
        if (c->fds->next != NULL && c->fds->next->at < len)
          len = c->fds->next->at;
      } else if (c->fds->at < len) {
        len = c->fds->at;
      }
    }
    struct iovec iov = {c->out.data, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (fd >= 0) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    ssize_t w = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      snprintf(why, n, "write failed: %s", strerror(errno));
      return -1;
    }
    if (fd >= 0) {
      pending_fd *f = c->fds;
      c->fds = f->next;
      c->nfds--;
      if (c->fds == NULL) c->fds_tail = NULL;
      close(f->fd);
      mgpu__free(f);
    }
    for (pending_fd *f = c->fds; f != NULL; f = f->next) f->at -= (size_t)w;
    mgpu__store_wbuf_consume(&c->out, (size_t)w);
  }
  return 0;
}

static void accept_one(void) {
  int fd = accept4(S.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0 && (errno == EMFILE || errno == ENFILE) && S.spare_fd >= 0) {
    /* Out of descriptors: the waiting client would keep the listening
     * socket readable and the loop spinning. Take it with the spare
     * descriptor and close it, so that it sees a refusal. */
    mgpu__log(MGPU_LOG_WARN, "store: refused a client: the daemon is out of "
              "file descriptors (%d clients)", S.nconns);
    close(S.spare_fd);
    fd = accept4(S.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) close(fd);
    S.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return;
  }
  if (fd < 0) return;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    mgpu__log(MGPU_LOG_WARN, "store: refused a client: SO_PEERCRED: %s",
              strerror(errno));
    close(fd);
    return;
  }
  conn *c = mgpu__calloc(1, sizeof *c);
  if (c == NULL) {
    close(fd);
    return;
  }
  c->fd = fd;
  c->id = ++S.next_conn_id;
  c->pid = cred.pid;
  c->uid = cred.uid;
  c->next = S.conns;
  S.conns = c;
  S.nconns++;
  uid_t me = geteuid();
  const char *refusal = NULL;
  char detail[200];
  if (cred.uid != me && !(S.allow_group && cred.gid == S.allow_gid)) {
    snprintf(detail, sizeof detail, "the store daemon at %s serves uid %d "
             "only; this process runs as uid %d", S.path, (int)me,
             (int)cred.uid);
    refusal = detail;
  } else if (S.nconns > MAX_CONNS) {
    snprintf(detail, sizeof detail, "the store daemon at %s has %d clients, "
             "its maximum", S.path, MAX_CONNS);
    refusal = detail;
  }
  if (refusal != NULL) {
    mgpu__log(MGPU_LOG_WARN, "store: refused client %d (pid %d, uid %d): %s",
              c->id, (int)cred.pid, (int)cred.uid, refusal);
    reply_error(c, 0, MGPU_EACCES, "%s", refusal);
    char why[16];
    conn_flush(c, why, sizeof why);
    conn_close(c, NULL);
    return;
  }
  mgpu__log(MGPU_LOG_INFO, "store: client %d connected (pid %d)", c->id,
            (int)cred.pid);
}

/* ---- set-up ---- */

int mgpu_store_default_path(char *buf, size_t n) {
  const char *xdg = mgpu__env("XDG_RUNTIME_DIR");
  int w;
  if (xdg != NULL && xdg[0] == '/')
    w = snprintf(buf, n, "%s/mgpu/store.sock", xdg);
  else
    w = snprintf(buf, n, "/tmp/mgpu-%d/store.sock", (int)geteuid());
  if (w < 0 || (size_t)w >= n || (size_t)w >= sizeof S.path)
    return mgpu__error(MGPU_EINVAL, "the store's socket path is longer than "
                       "%zu bytes", sizeof S.path - 1);
  return 0;
}

/* Makes the default directory: mode 0700, ours, not a symbolic link. */
static int private_dir(const char *path) {
  char dir[sizeof S.path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) return 0;
  *slash = '\0';
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    /* A missing parent (XDG_RUNTIME_DIR naming a folder that is not there)
     * is not a matter of permission. */
    return mgpu__error(errno == ENOENT || errno == ENOTDIR ? MGPU_ENOENT
                                                           : MGPU_EACCES,
                       "cannot create the store directory %s: %s", dir,
                       strerror(errno));
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return mgpu__error(MGPU_EACCES, "the store directory %s is not a "
                       "directory", dir);
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0)
    return mgpu__error(MGPU_EACCES, "the store directory %s must belong to "
                       "uid %d with mode 0700 (it is uid %d, mode %03o)", dir,
                       (int)geteuid(), (int)st.st_uid,
                       (unsigned)(st.st_mode & 0777));
  return 0;
}

/* The pid of the daemon holding the lock file (it writes it there once
 * locked), or 0 when it has not written it yet. */
static long lock_owner(int fd) {
  char buf[32] = "";
  ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
  if (r <= 0) return 0;
  buf[r] = '\0';
  return strtol(buf, NULL, 10);
}

static int already_serving(const char *path, long pid) {
  if (pid > 0)
    return mgpu__error(MGPU_EALREADY, "a daemon is already serving %s (pid "
                       "%ld)", path, pid);
  return mgpu__error(MGPU_EALREADY, "a daemon is already serving %s (it is "
                     "starting)", path);
}

/* Takes PATH.lock with flock, so that of two daemons started at once on
 * one path exactly one goes on. A lock file is removed only by its holder,
 * so a daemon that locked a file someone removed meanwhile tries again. */
static int take_lock(const char *path) {
  snprintf(S.lock_path, sizeof S.lock_path, "%s.lock", path);
  for (int tries = 0; tries < 100; tries++) {
    int fd = open(S.lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                  0600);
    if (fd < 0)
      return mgpu__error(errno == EACCES || errno == EPERM ? MGPU_EACCES
                                                           : MGPU_EIO,
                         "cannot open the lock file %s: %s", S.lock_path,
                         strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      long pid = lock_owner(fd);
      close(fd);
      if (e == EWOULDBLOCK) return already_serving(path, pid);
      return mgpu__error(MGPU_EIO, "cannot lock %s: %s", S.lock_path,
                         strerror(e));
    }
    struct stat held, now;
    if (fstat(fd, &held) == 0 && stat(S.lock_path, &now) == 0 &&
        held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
      char pid[32];
      int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
      if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        /* The pid is only for messages: the lock is what counts. */
      }
      S.lock_fd = fd;
      return 0;
    }
    close(fd); /* removed by its last holder meanwhile: take the new one */
  }
  return mgpu__error(MGPU_EIO, "cannot take the lock file %s", S.lock_path);
}

/* With the lock held: refuses a path that is anything but a socket, and a
 * socket a daemon answers on; removes a socket a dead daemon left. */
static int clear_path(const char *path, const struct sockaddr_un *sa) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    return mgpu__error(errno == EACCES ? MGPU_EACCES : MGPU_EIO,
                       "cannot inspect %s: %s", path, strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode))
    return mgpu__error(MGPU_EEXIST, "%s exists and is not a socket (a %s); "
                       "the store daemon removes nothing but a socket a dead "
                       "daemon left: give another --socket path or remove it",
                       path, S_ISREG(st.st_mode) ? "regular file"
                             : S_ISDIR(st.st_mode) ? "directory"
                             : S_ISLNK(st.st_mode) ? "symbolic link"
                                                   : "special file");
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return mgpu__error(MGPU_EIO, "socket: %s", strerror(errno));
  if (connect(probe, (const struct sockaddr *)sa, sizeof *sa) == 0) {
    /* A daemon that holds no lock (an older one) still answers. */
    struct ucred cred = {0};
    socklen_t len = sizeof cred;
    if (getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
      cred.pid = 0;
    close(probe);
    return already_serving(path, (long)cred.pid);
  }
  close(probe);
  if (unlink(path) != 0 && errno != ENOENT)
    return mgpu__error(errno == EACCES || errno == EPERM ? MGPU_EACCES
                                                         : MGPU_EIO,
                       "cannot remove the stale socket %s: %s", path,
                       strerror(errno));
  mgpu__log(MGPU_LOG_INFO, "store: removed the stale socket %s", path);
  return 0;
}

static void unlock_path(void) {
  if (S.lock_fd < 0) return;
  unlink(S.lock_path); /* before the unlock: see take_lock */
  close(S.lock_fd);
  S.lock_fd = -1;
}

static int listen_on(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int rc = take_lock(path);
  if (rc == 0) rc = clear_path(path, &sa);
  if (rc != 0) {
    unlock_path();
    return rc;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      chmod(path, S.allow_group ? 0660 : 0600) != 0 ||
      (S.allow_group && chown(path, (uid_t)-1, S.allow_gid) != 0) ||
      listen(fd, 128) != 0) {
    int e = errno;
    if (fd >= 0) {
      struct stat st;
      if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path);
      close(fd);
    }
    unlock_path();
    return mgpu__error(e == EACCES || e == EPERM ? MGPU_EACCES : MGPU_EIO,
                       "cannot listen on %s: %s", path, strerror(e));
  }
  S.listen_fd = fd;
  return 0;
}

static int devices_init(size_t capacity) {
  S.ndev = mgpu_device_count();
  if (S.ndev < 0) return S.ndev;
  for (int i = 0; i < S.ndev; i++) {
    mgpu_device_props p = {.size = sizeof p};
    int rc = mgpu_device_get_props(i, &p);
    if (rc == 0) rc = mgpu__store_device_uuid(i, S.devs[i].uuid,
                                              sizeof S.devs[i].uuid);
    if (rc != 0) return rc;
    S.devs[i].kind = (int)p.backend_kind;
    S.devs[i].capacity = capacity != 0 ? capacity : p.total_mem;
  }
  return 0;
}

static int serve(mgpu_store_server_config *cfg);

int mgpu_store_serve(const mgpu_store_server_config *config) {
  mgpu_store_server_config cfg = MGPU_STORE_SERVER_CONFIG_INITIALIZER;
  if (config != NULL) {
    if (config->size < sizeof cfg)
      return mgpu__error(MGPU_EINVAL, "store server config of size %zu, "
                         "expected %zu", config->size, sizeof cfg);
    cfg = *config;
  }
  if (!mgpu_is_initialized())
    return mgpu__error(MGPU_ENOINIT, "mgpu_store_serve needs mgpu_init");
  /* The daemon's state is this file's: one daemon per process. */
  static atomic_flag serving = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&serving))
    return mgpu__error(MGPU_EALREADY, "mgpu_store_serve is already running "
                       "in this process");
  int rc = serve(&cfg);
  atomic_flag_clear(&serving);
  return rc;
}

/* Resets the daemon state from cfg and opens what it serves on: the
 * socket path, the devices, the listening socket and the wake pipe. */
static int serve_open(mgpu_store_server_config cfg) {
  memset(&S, 0, sizeof S);
  S.listen_fd = -1;
  S.lock_fd = -1;
  S.spare_fd = -1;
  if (cfg.capacity == 0) {
    const char *env = mgpu__env("MGPU_STORE_CAPACITY");
    if (env != NULL && mgpu__parse_size(env, &cfg.capacity) != 0)
      return mgpu__error(MGPU_EINVAL, "MGPU_STORE_CAPACITY=%s is not a size "
                         "(512M, 2G)", env);
  }
  S.allow_group = cfg.allow_gid >= 0;
  S.allow_gid = (gid_t)cfg.allow_gid;
  if (cfg.path != NULL) {
    if (strlen(cfg.path) >= sizeof S.path)
      return mgpu__error(MGPU_EINVAL, "socket path %s is longer than %zu "
                         "bytes", cfg.path, sizeof S.path - 1);
    snprintf(S.path, sizeof S.path, "%s", cfg.path);
  } else {
    int rc = mgpu_store_default_path(S.path, sizeof S.path);
    if (rc == 0) rc = private_dir(S.path);
    if (rc != 0) return rc;
  }
  int rc = devices_init(cfg.capacity);
  if (rc != 0) return rc;
  if (getrandom(&S.instance, sizeof S.instance, 0) != sizeof S.instance)
    S.instance = mgpu__now_ns() ^ ((uint64_t)getpid() << 32);
  S.next_id = 1;
  rc = listen_on(S.path);
  if (rc != 0) return rc;
  S.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(S.listen_fd);
    unlink(S.path);
    unlock_path();
    if (S.spare_fd >= 0) close(S.spare_fd);
    return mgpu__error(MGPU_EIO, "pipe: %s", strerror(errno));
  }
  return 0;
}

/* How long the daemon watches for a client's next request before it
 * sleeps (mgpu__store_poll), after a round that read one. */
#define NEXT_REQUEST_WATCH_US 100u

/* Polls the listening socket, the wake pipe and every client until a
 * stop is requested or poll fails. */
static int serve_loop(void) {
  struct pollfd *pfd = mgpu__calloc(MAX_CONNS + 3, sizeof *pfd);
  conn **owner = mgpu__calloc(MAX_CONNS + 3, sizeof *owner);
  int rc = (pfd == NULL || owner == NULL)
               ? mgpu__error(MGPU_ENOMEM, "out of host memory")
               : 0;
  int active = 0; /* the last round read a request */
  while (rc == 0 && !stop_requested) {
    int n = 0;
    pfd[n] = (struct pollfd){S.listen_fd, POLLIN, 0};
    owner[n++] = NULL;
    pfd[n] = (struct pollfd){wake_pipe[0], POLLIN, 0};
    owner[n++] = NULL;
    for (conn *c = S.conns; c != NULL && n < MAX_CONNS + 3; c = c->next) {
      pfd[n] = (struct pollfd){c->fd, (short)(c->closing ? 0 : POLLIN), 0};
      if (c->out.len > 0) pfd[n].events |= POLLOUT;
      owner[n++] = c;
    }
    /* After a request, watch for the client's next one a while (a
     * sequence of requests comes microseconds apart) rather than sleep and
     * be woken for each. */
    if (mgpu__store_poll(pfd, (unsigned long)n, -1,
                         active ? NEXT_REQUEST_WATCH_US : 0) < 0) {
      rc = mgpu__error(MGPU_EIO, "poll: %s", strerror(errno));
      break;
    }
    active = 0;
    for (int i = 2; i < n; i++) {
      conn *c = owner[i];
      active |= (pfd[i].revents & POLLIN) != 0;
      char why[320] = "";
      int bad = 0;
      if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
        bad = conn_read(c, why, sizeof why) != 0;
      if (!bad && c->out.len > 0) bad = conn_flush(c, why, sizeof why) != 0;
      if (!bad && c->closing && c->out.len == 0) {
        bad = 1;
        snprintf(why, sizeof why, "a reply could not be encoded");
      }
      if (bad) conn_close(c, why[0] ? why : NULL);
    }
    if (pfd[0].revents & POLLIN) accept_one();
    if (pfd[1].revents & POLLIN) {
      char buf[16];
      while (read(wake_pipe[0], buf, sizeof buf) > 0) {
      }
    }
  }
  mgpu__free(pfd);
  mgpu__free(owner);
  return rc;
}

static int serve(mgpu_store_server_config *cfgp) {
  int rc = serve_open(*cfgp);
  if (rc != 0) return rc;
  stop_requested = 0;
  struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term, old_pipe;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ign, &old_pipe);
  mgpu__log(MGPU_LOG_INFO, "store: serving %d devices on %s (pid %d)", S.ndev,
            S.path, (int)getpid());
  rc = serve_loop();
  mgpu__log(MGPU_LOG_INFO, "store: stopping, %d clients connected", S.nconns);
  while (S.conns != NULL) conn_close(S.conns, NULL);
  while (S.head != NULL) object_free(S.head);
  close(S.listen_fd);
  unlink(S.path);
  unlock_path();
  if (S.spare_fd >= 0) close(S.spare_fd);
  close(wake_pipe[0]);
  close(wake_pipe[1]);
  wake_pipe[0] = wake_pipe[1] = -1;
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGPIPE, &old_pipe, NULL);
  return rc;
}
