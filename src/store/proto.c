/* The store's wire protocol: encoder and the checking decoder (proto.h).
 *
 * It uses libc, the error codes and the allocation seam (util/fault.h)
 * alone; its fuzz target is tests/fuzz/fuzz-store-proto.c. */
#include "store/proto.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgpu/error.h"
#include "util/fault.h"
#include "util/thread.h"

/* ---- decoding ---------------------------------------------------------- */

typedef struct reader {
  const uint8_t *p;
  size_t left;
  int bad;          /* a field did not fit or was malformed */
  const char *what; /* the first bad field */
} reader;

static int why_set(char *why, size_t n, const char *fmt, ...) {
  if (why != NULL && n > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
  }
  return MGPU_EINVAL;
}

static void fail(reader *r, const char *what) {
  if (!r->bad) r->what = what;
  r->bad = 1;
}

static uint64_t get_le(reader *r, size_t n, const char *what) {
  if (r->bad || r->left < n) {
    fail(r, what);
    return 0;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
  r->p += n;
  r->left -= n;
  return v;
}

#define GET8(r, w) ((uint8_t)get_le((r), 1, (w)))
#define GET16(r, w) ((uint16_t)get_le((r), 2, (w)))
#define GET32(r, w) ((uint32_t)get_le((r), 4, (w)))
#define GET64(r, w) (get_le((r), 8, (w)))

static void get_bytes(reader *r, void *out, size_t n, const char *what) {
  if (r->bad || r->left < n) {
    fail(r, what);
    return;
  }
  memcpy(out, r->p, n);
  r->p += n;
  r->left -= n;
}

int mgpu__store_name_valid(const char *s, size_t n) {
  if (n == 0 || n > MGPU__STORE_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) return 0;
  }
  return 1;
}

/* A string of at most max bytes into out (max + 1 bytes). kind: 'n' a name
 * (may be empty when allow_empty), 'u' a UUID (letters, digits, '-'), 'd'
 * free text (a detail: control characters refused except none). */
static void get_str(reader *r, char *out, size_t max, int kind,
                    int allow_empty, const char *what) {
  out[0] = '\0';
  uint16_t n = GET16(r, what);
  if (r->bad) return;
  if (n > max || r->left < n) {
    fail(r, what);
    return;
  }
  const char *s = (const char *)r->p;
  if (n == 0 && !allow_empty) {
    fail(r, what);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    int ok;
    if (kind == 'u')
      ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
           (c >= 'A' && c <= 'Z') || c == '-';
    else
      ok = c >= 0x20 && c != 0x7f;
    if (!ok) {
      fail(r, what);
      return;
    }
  }
  memcpy(out, s, n);
  out[n] = '\0';
  r->p += n;
  r->left -= n;
}

static void get_objdesc(reader *r, mgpu__store_objdesc *o) {
  o->id = GET64(r, "object id");
  o->size = GET64(r, "object size");
  o->map_size = GET64(r, "map size");
  o->offset = GET64(r, "offset");
  o->instance = GET64(r, "instance");
  o->handle_kind = GET8(r, "handle kind");
  o->sealed = GET8(r, "sealed");
  get_bytes(r, o->legacy, sizeof o->legacy, "legacy handle");
  get_str(r, o->uuid, MGPU__STORE_UUID_MAX, 'u', 0, "device uuid");
  get_str(r, o->name, MGPU__STORE_NAME_MAX, 'n', 1, "object name");
  if (r->bad) return;
  if (o->id == 0) fail(r, "object id 0");
  else if (o->size == 0) fail(r, "object size 0");
  else if (o->handle_kind < MGPU__SH_MEMFD ||
           o->handle_kind > MGPU__SH_CUDA_LEGACY)
    fail(r, "handle kind");
  else if (o->sealed > 1) fail(r, "sealed flag");
  else if (o->map_size < o->size || o->offset > o->map_size - o->size)
    fail(r, "offset + size beyond the mapping");
}

/* Entries of fixed minimum size: checks count * min_each <= left before
 * allocating, so a huge count in a short message allocates nothing. */
static void *alloc_entries(reader *r, uint32_t count, size_t min_each,
                           size_t each, const char *what) {
  if (r->bad) return NULL;
  if (count == 0) return NULL;
  if ((uint64_t)count * min_each > r->left) {
    fail(r, what);
    return NULL;
  }
  void *p = mgpu__calloc(count, each);
  if (p == NULL) fail(r, "out of memory");
  return p;
}

static void get_devents(reader *r, mgpu__store_msg *m, int stats) {
  m->count = GET16(r, "device count");
  if (r->bad) return;
  if (m->count > MGPU__STORE_MAX_DEVICES) {
    fail(r, "device count");
    return;
  }
  size_t min_each = 2 + 1 + 8 + (stats ? 24 : 0);
  m->devices = alloc_entries(r, m->count, min_each, sizeof *m->devices,
                             "device count");
  for (uint32_t i = 0; i < m->count && !r->bad; i++) {
    mgpu__store_devent *d = &m->devices[i];
    get_str(r, d->uuid, MGPU__STORE_UUID_MAX, 'u', 0, "device uuid");
    d->backend_kind = GET8(r, "backend kind");
    d->capacity = GET64(r, "capacity");
    if (stats) {
      d->in_use = GET64(r, "in use");
      d->held = GET64(r, "held");
      d->objects = GET64(r, "objects");
    }
    if (!r->bad && d->backend_kind > 2) /* host, cuda, opencl */
      fail(r, "backend kind");
  }
}

/* The payload of a request whose type, less the reply bit, is base. */
static void decode_request(reader *r, mgpu__store_msg *m, uint16_t base) {
  switch (base) {
    case MGPU__SM_HELLO:
      m->pid = GET32(r, "pid");
      break;
    case MGPU__SM_CREATE:
      get_str(r, m->uuid, MGPU__STORE_UUID_MAX, 'u', 0, "device uuid");
      m->size = GET64(r, "size");
      get_str(r, m->name, MGPU__STORE_NAME_MAX, 'n', 1, "name");
      if (!r->bad && m->size == 0) fail(r, "size 0");
      break;
    case MGPU__SM_SEAL:
    case MGPU__SM_RELEASE:
      m->id = GET64(r, "object id");
      if (!r->bad && m->id == 0) fail(r, "object id 0");
      break;
    case MGPU__SM_GET:
    case MGPU__SM_DELETE:
      m->id = GET64(r, "object id");
      get_str(r, m->name, MGPU__STORE_NAME_MAX, 'n', 1, "name");
      /* Exactly one of the two keys. */
      if (!r->bad && (m->id == 0) == (m->name[0] == '\0'))
        fail(r, "key: give exactly one of id and name");
      break;
    case MGPU__SM_LIST:
      m->id = GET64(r, "after id");
      break;
    case MGPU__SM_STATS:
      break;
    default:
      fail(r, "type");
  }
}

/* The payload of a LIST reply: its entries. */
static void decode_list_reply(reader *r, mgpu__store_msg *m) {
  m->count = GET32(r, "entry count");
  m->more = GET8(r, "more flag");
  if (!r->bad && m->more > 1) fail(r, "more flag");
  m->entries = alloc_entries(r, m->count, 8 + 8 + 4 + 2 + 2 + 2,
                             sizeof *m->entries, "entry count");
  for (uint32_t i = 0; i < m->count && !r->bad; i++) {
    mgpu__store_listent *e = &m->entries[i];
    e->id = GET64(r, "entry id");
    e->size = GET64(r, "entry size");
    e->refs = GET32(r, "entry refs");
    e->sealed = GET8(r, "entry sealed");
    e->deleted = GET8(r, "entry deleted");
    get_str(r, e->uuid, MGPU__STORE_UUID_MAX, 'u', 0, "entry uuid");
    get_str(r, e->name, MGPU__STORE_NAME_MAX, 'n', 1, "entry name");
    if (!r->bad && (e->sealed > 1 || e->deleted > 1))
      fail(r, "entry flags");
  }
}

/* The payload of a reply whose type, less the reply bit, is base. */
static void decode_reply(reader *r, mgpu__store_msg *m, uint16_t base) {
  switch (base) {
    case MGPU__SM_HELLO:
      m->instance = GET64(r, "instance");
      m->max_msg = GET32(r, "max message size");
      get_devents(r, m, 0);
      if (!r->bad && (m->max_msg < 4096 || m->max_msg > MGPU__STORE_MSG_MAX))
        fail(r, "max message size");
      break;
    case MGPU__SM_CREATE:
    case MGPU__SM_GET:
      get_objdesc(r, &m->obj);
      break;
    case MGPU__SM_SEAL:
    case MGPU__SM_RELEASE:
      break;
    case MGPU__SM_DELETE:
      m->id = GET64(r, "object id");
      m->deferred = GET8(r, "deferred");
      if (!r->bad && m->deferred > 1) fail(r, "deferred flag");
      break;
    case MGPU__SM_LIST:
      decode_list_reply(r, m);
      break;
    case MGPU__SM_STATS:
      m->clients = GET32(r, "clients");
      m->objects = GET64(r, "objects");
      m->refs = GET64(r, "refs");
      m->evictions = GET64(r, "evictions");
      get_devents(r, m, 1);
      break;
    default:
      fail(r, "type");
  }
}

static void decode_payload(reader *r, mgpu__store_msg *m) {
  uint16_t t = m->type;
  if (t == MGPU__SM_ERROR) {
    m->code = (int32_t)GET32(r, "error code");
    get_str(r, m->detail, MGPU__STORE_DETAIL_MAX, 'd', 1, "error detail");
    if (!r->bad && (m->code >= 0 || m->code < -1000)) fail(r, "error code");
    return;
  }
  uint16_t base = t & (uint16_t)~MGPU__SM_REPLY;
  if (t & MGPU__SM_REPLY)
    decode_reply(r, m, base);
  else
    decode_request(r, m, base);
}

int mgpu__store_header_check(const uint8_t *hdr, uint32_t *payload_len,
                             char *why, size_t why_len) {
  reader r = {hdr, MGPU__STORE_HDR, 0, NULL};
  uint32_t magic = GET32(&r, "magic");
  uint16_t version = GET16(&r, "version");
  uint16_t type = GET16(&r, "type");
  (void)GET32(&r, "seq");
  uint32_t len = GET32(&r, "length");
  if (magic != MGPU__STORE_MAGIC)
    return why_set(why, why_len, "bad magic 0x%08x", magic);
  if (version != MGPU__STORE_VERSION)
    return why_set(why, why_len, "unknown protocol version %u (this side "
                   "speaks %u)", version, MGPU__STORE_VERSION);
  uint16_t base = type & (uint16_t)~MGPU__SM_REPLY;
  if (type != MGPU__SM_ERROR && (base < 1 || base > MGPU__SM_TYPE_LAST))
    return why_set(why, why_len, "unknown message type 0x%04x", type);
  if (len > MGPU__STORE_MSG_MAX - MGPU__STORE_HDR)
    return why_set(why, why_len, "payload of %u bytes over the maximum %u",
                   len, MGPU__STORE_MSG_MAX - MGPU__STORE_HDR);
  *payload_len = len;
  return 0;
}

int mgpu__store_decode(const uint8_t *buf, size_t len, mgpu__store_msg *msg,
                       char *why, size_t why_len) {
  memset(msg, 0, sizeof *msg);
  if (len < MGPU__STORE_HDR)
    return why_set(why, why_len, "message of %zu bytes, shorter than its "
                   "header", len);
  uint32_t plen;
  int rc = mgpu__store_header_check(buf, &plen, why, why_len);
  if (rc != 0) return rc;
  if ((size_t)plen != len - MGPU__STORE_HDR)
    return why_set(why, why_len, "header says %u payload bytes, message "
                   "has %zu", plen, len - MGPU__STORE_HDR);
  msg->type = (uint16_t)(buf[6] | buf[7] << 8);
  msg->seq = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 |
             (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
  reader r = {buf + MGPU__STORE_HDR, plen, 0, NULL};
  decode_payload(&r, msg);
  if (r.bad)
    return why_set(why, why_len, "type 0x%04x: bad or truncated field '%s'",
                   msg->type, r.what);
  if (r.left != 0)
    return why_set(why, why_len, "type 0x%04x: %zu bytes left over after "
                   "the last field", msg->type, r.left);
  return 0;
}

void mgpu__store_msg_free(mgpu__store_msg *msg) {
  mgpu__free(msg->entries);
  mgpu__free(msg->devices);
  msg->entries = NULL;
  msg->devices = NULL;
}

/* ---- encoding ---------------------------------------------------------- */

static void reserve(mgpu__store_wbuf *w, size_t n) {
  if (w->failed) return;
  if (w->len + n <= w->cap) return;
  size_t cap = w->cap ? w->cap : 256;
  while (cap < w->len + n) cap *= 2;
  uint8_t *p = mgpu__realloc(w->data, cap);
  if (p == NULL) {
    w->failed = 1;
    return;
  }
  w->data = p;
  w->cap = cap;
}

static void put_le(mgpu__store_wbuf *w, uint64_t v, size_t n) {
  reserve(w, n);
  if (w->failed) return;
  for (size_t i = 0; i < n; i++) w->data[w->len++] = (uint8_t)(v >> (8 * i));
}

void mgpu__store_put_u8(mgpu__store_wbuf *w, uint8_t v) { put_le(w, v, 1); }
void mgpu__store_put_u16(mgpu__store_wbuf *w, uint16_t v) { put_le(w, v, 2); }
void mgpu__store_put_u32(mgpu__store_wbuf *w, uint32_t v) { put_le(w, v, 4); }
void mgpu__store_put_u64(mgpu__store_wbuf *w, uint64_t v) { put_le(w, v, 8); }

void mgpu__store_put_bytes(mgpu__store_wbuf *w, const void *p, size_t n) {
  if (n == 0) return;
  reserve(w, n);
  if (w->failed) return;
  memcpy(w->data + w->len, p, n);
  w->len += n;
}

void mgpu__store_put_str(mgpu__store_wbuf *w, const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  if (n > max) n = max;
  mgpu__store_put_u16(w, (uint16_t)n);
  mgpu__store_put_bytes(w, s, n);
}

void mgpu__store_put_objdesc(mgpu__store_wbuf *w,
                             const mgpu__store_objdesc *o) {
  mgpu__store_put_u64(w, o->id);
  mgpu__store_put_u64(w, o->size);
  mgpu__store_put_u64(w, o->map_size);
  mgpu__store_put_u64(w, o->offset);
  mgpu__store_put_u64(w, o->instance);
  mgpu__store_put_u8(w, o->handle_kind);
  mgpu__store_put_u8(w, o->sealed);
  mgpu__store_put_bytes(w, o->legacy, sizeof o->legacy);
  mgpu__store_put_str(w, o->uuid, MGPU__STORE_UUID_MAX);
  mgpu__store_put_str(w, o->name, MGPU__STORE_NAME_MAX);
}

void mgpu__store_wbuf_begin(mgpu__store_wbuf *w, uint16_t type, uint32_t seq) {
  w->start = w->len;
  mgpu__store_put_u32(w, MGPU__STORE_MAGIC);
  mgpu__store_put_u16(w, MGPU__STORE_VERSION);
  mgpu__store_put_u16(w, type);
  mgpu__store_put_u32(w, seq);
  mgpu__store_put_u32(w, 0); /* length, written by end */
}

int mgpu__store_wbuf_end(mgpu__store_wbuf *w) {
  if (w->failed) {
    w->failed = 0;
    w->len = w->start;
    return MGPU_ENOMEM;
  }
  size_t total = w->len - w->start;
  if (total > MGPU__STORE_MSG_MAX) {
    w->len = w->start;
    return MGPU_ERANGE;
  }
  uint32_t plen = (uint32_t)(total - MGPU__STORE_HDR);
  for (int i = 0; i < 4; i++)
    w->data[w->start + 12 + i] = (uint8_t)(plen >> (8 * i));
  return 0;
}

void mgpu__store_wbuf_consume(mgpu__store_wbuf *w, size_t n) {
  if (n >= w->len) {
    w->len = 0;
  } else {
    memmove(w->data, w->data + n, w->len - n);
    w->len -= n;
  }
  w->start = 0;
}

void mgpu__store_wbuf_free(mgpu__store_wbuf *w) {
  mgpu__free(w->data);
  memset(w, 0, sizeof *w);
}

/* ---- waiting ---- */

int mgpu__store_poll(struct pollfd *p, unsigned long n, int timeout_ms,
                     unsigned watch_us) {
  uint64_t start = mgpu__now_ns(), watch_ns = (uint64_t)watch_us * 1000u;
  if (timeout_ms == 0) watch_ns = 0; /* a look, not a wait */
  for (;;) {
    int r = poll(p, (nfds_t)n, 0);
    if (r != 0 && !(r < 0 && errno == EINTR)) return r;
    if (mgpu__now_ns() - start >= watch_ns) break;
    sched_yield();
  }
  int left = timeout_ms;
  if (timeout_ms > 0) {
    uint64_t spent_ms = (mgpu__now_ns() - start) / 1000000u;
    left = spent_ms >= (uint64_t)timeout_ms ? 0 : timeout_ms - (int)spent_ms;
  }
  for (;;) {
    int r = poll(p, (nfds_t)n, left);
    if (!(r < 0 && errno == EINTR)) return r;
  }
}
