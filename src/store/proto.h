/* The store's wire protocol: versioned, length-prefixed binary messages over
 * a UNIX stream socket.
 *
 * Every message is a 16-byte header and a payload:
 *   u32 magic "MGST" | u16 version | u16 type | u32 seq | u32 payload length
 * all little-endian, the payload at most MGPU__STORE_MSG_MAX - 16 bytes.
 * Fields are fixed-width little-endian integers and strings (u16 length, then
 * the bytes, no NUL). A reply carries the request's type with
 * MGPU__SM_REPLY set and the request's seq; a failure is an MGPU__SM_ERROR
 * (i32 code, string detail). File descriptors travel beside a reply with
 * SCM_RIGHTS and are never part of the bytes.
 *
 * mgpu__store_decode checks every field: the header, the length against the
 * type, every string's length and characters, every count against the bytes
 * that hold it, and that nothing is left over. It never reads past len and
 * allocates only what the counts (already checked against len) ask for, so
 * a fuzzer can drive it with any bytes (tests/fuzz/fuzz-store-proto.c).
 */
#ifndef MGPU_STORE_PROTO_H
#define MGPU_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define MGPU__STORE_MAGIC 0x5453474Du /* "MGST" */
#define MGPU__STORE_VERSION 1
#define MGPU__STORE_HDR 16
#define MGPU__STORE_MSG_MAX (1u << 20) /* header included */
#define MGPU__STORE_UUID_MAX 39
#define MGPU__STORE_NAME_MAX 255
#define MGPU__STORE_DETAIL_MAX 511
#define MGPU__STORE_LEGACY_BYTES 64
#define MGPU__STORE_MAX_DEVICES 64

typedef enum mgpu__store_type {
  MGPU__SM_HELLO = 1,
  MGPU__SM_CREATE = 2,
  MGPU__SM_SEAL = 3,
  MGPU__SM_GET = 4,
  MGPU__SM_RELEASE = 5,
  MGPU__SM_DELETE = 6,
  MGPU__SM_LIST = 7,
  MGPU__SM_STATS = 8,
  MGPU__SM_TYPE_LAST = 8,
  MGPU__SM_REPLY = 0x8000, /* or'ed with the request's type */
  MGPU__SM_ERROR = 0xFFFF
} mgpu__store_type;

/* How an object's memory reaches another process. */
typedef enum mgpu__store_handle_kind {
  MGPU__SH_MEMFD = 1,       /* host: memfd, mmap */
  MGPU__SH_CUMEM_FD = 2,    /* CUDA: cuMem POSIX fd, import + map */
  MGPU__SH_CUDA_LEGACY = 3  /* CUDA: cudaIpcMemHandle_t + offset */
} mgpu__store_handle_kind;

/* An object as a CREATE or GET reply describes it. */
typedef struct mgpu__store_objdesc {
  uint64_t id;
  uint64_t size;       /* bytes the user asked for */
  uint64_t map_size;   /* bytes to map (rounded to the granularity) */
  uint64_t offset;     /* of the object in the mapping (legacy IPC) */
  uint64_t instance;   /* the daemon's instance: keys the import map */
  uint8_t handle_kind; /* mgpu__store_handle_kind */
  uint8_t sealed;
  uint8_t legacy[MGPU__STORE_LEGACY_BYTES];
  char uuid[MGPU__STORE_UUID_MAX + 1];
  char name[MGPU__STORE_NAME_MAX + 1];
} mgpu__store_objdesc;

typedef struct mgpu__store_listent {
  uint64_t id, size;
  uint32_t refs;
  uint8_t sealed, deleted;
  char uuid[MGPU__STORE_UUID_MAX + 1];
  char name[MGPU__STORE_NAME_MAX + 1];
} mgpu__store_listent;

typedef struct mgpu__store_devent {
  char uuid[MGPU__STORE_UUID_MAX + 1];
  uint8_t backend_kind;
  uint64_t capacity, in_use, held, objects;
} mgpu__store_devent;

/* A decoded message. Which fields are meaningful depends on type. */
typedef struct mgpu__store_msg {
  uint16_t type;
  uint32_t seq;
  /* requests */
  uint32_t pid;                         /* HELLO */
  uint64_t id;                          /* SEAL GET RELEASE DELETE, LIST after */
  uint64_t size;                        /* CREATE */
  char uuid[MGPU__STORE_UUID_MAX + 1];  /* CREATE */
  char name[MGPU__STORE_NAME_MAX + 1];  /* CREATE GET DELETE */
  /* replies */
  int32_t code;                         /* ERROR */
  char detail[MGPU__STORE_DETAIL_MAX + 1];
  uint64_t instance;                    /* HELLO */
  uint32_t max_msg;                     /* HELLO */
  uint8_t deferred;                     /* DELETE */
  mgpu__store_objdesc obj;              /* CREATE GET */
  uint32_t clients;                     /* STATS */
  uint64_t objects, refs, evictions;    /* STATS */
  uint8_t more;                         /* LIST: entries after these */
  uint32_t count;                       /* LIST entries, HELLO/STATS devices */
  mgpu__store_listent *entries;         /* LIST (malloc'ed) */
  mgpu__store_devent *devices;          /* HELLO, STATS (malloc'ed) */
} mgpu__store_msg;

/* poll() that first watches: for up to watch_us it polls without blocking,
 * yielding the CPU between looks, then blocks for the rest of timeout_ms
 * (-1: for ever). A peer on another CPU that answers within the watch is
 * seen without a sleep and the wake-up after it, which on a machine whose
 * idle CPUs halt (a virtual machine's) took 30-40 us each way of every
 * request; a peer on this CPU runs in the yields. Returns what poll does
 * (EINTR is retried). */
struct pollfd;
int mgpu__store_poll(struct pollfd *p, unsigned long n, int timeout_ms,
                     unsigned watch_us);

/* Checks a header: magic, version, type, length. On success *payload_len is
 * the payload length still to read. Returns 0 or MGPU_EINVAL with a reason
 * in why (unknown version: the reason says so). */
int mgpu__store_header_check(const uint8_t *hdr, uint32_t *payload_len,
                             char *why, size_t why_len);

/* Decodes one whole message (header + payload, len bytes). Returns 0 or
 * MGPU_EINVAL/MGPU_ENOMEM with a reason in why. Free with
 * mgpu__store_msg_free, also after a failure. */
int mgpu__store_decode(const uint8_t *buf, size_t len, mgpu__store_msg *msg,
                       char *why, size_t why_len);
void mgpu__store_msg_free(mgpu__store_msg *msg);

/* The encoder: a growable buffer. A message is begun, fields are put, and
 * end writes the length; a message over MGPU__STORE_MSG_MAX fails end.
 * put calls after an allocation failure are ignored and end reports it. */
typedef struct mgpu__store_wbuf {
  uint8_t *data;
  size_t len, cap;
  size_t start; /* of the message being written */
  int failed;
} mgpu__store_wbuf;

void mgpu__store_wbuf_begin(mgpu__store_wbuf *w, uint16_t type, uint32_t seq);
void mgpu__store_put_u8(mgpu__store_wbuf *w, uint8_t v);
void mgpu__store_put_u16(mgpu__store_wbuf *w, uint16_t v);
void mgpu__store_put_u32(mgpu__store_wbuf *w, uint32_t v);
void mgpu__store_put_u64(mgpu__store_wbuf *w, uint64_t v);
void mgpu__store_put_bytes(mgpu__store_wbuf *w, const void *p, size_t n);
/* Writes a string, cut to max bytes. */
void mgpu__store_put_str(mgpu__store_wbuf *w, const char *s, size_t max);
void mgpu__store_put_objdesc(mgpu__store_wbuf *w, const mgpu__store_objdesc *o);
/* Returns 0, or MGPU_ENOMEM / MGPU_ERANGE (over the maximum size). */
int mgpu__store_wbuf_end(mgpu__store_wbuf *w);
/* Drops the first n bytes (sent). */
void mgpu__store_wbuf_consume(mgpu__store_wbuf *w, size_t n);
void mgpu__store_wbuf_free(mgpu__store_wbuf *w);

/* A name is 1..255 bytes with no control characters. */
int mgpu__store_name_valid(const char *s, size_t n);

#endif /* MGPU_STORE_PROTO_H */
