/* The trace recorder (see trace.h): per-thread event buffers, the names of
 * processes and tracks, the tags; trace-file.c writes the file.
 *
 * Recording: a thread's first event gives it a buffer, linked into the
 * registry. Each recording has a session number; a buffer last used in an
 * older session is emptied by its own thread before its next event, so
 * starting never touches a buffer another thread may be filling. The writer
 * reads every buffer of the session up to the count its owner published;
 * buffers of threads that have exited are freed after a recording.
 *
 * Locks: reg_lock guards the registry list; names_lock the name table.
 * Neither is held while the other is taken; trace-file.c's ctl_lock comes
 * before both (docs/ARCHITECTURE.md, "Lock order").
 */
#include "obs/trace.h"
#include "obs/obs-internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgpu/error.h"
#include "util/thread.h"
#include "util/fault.h"

_Atomic int mgpu__trace_on;

enum { NCHUNKS = MGPU__TRACE_CAP / MGPU__TRACE_CHUNK };
_Static_assert(MGPU__TRACE_CAP == MGPU_TRACE_EVENTS_PER_THREAD,
               "the public cap and the recorder's disagree");

typedef struct trace_buf {
  struct trace_buf *next; /* registry, guarded by reg_lock */
  _Atomic unsigned session;
  _Atomic uint32_t count;   /* events published; written by the owner */
  _Atomic uint64_t dropped; /* events past the cap this session */
  _Atomic int dead;         /* the owner thread has exited */
  mgpu__trace_event *chunks[NCHUNKS]; /* allocated by the owner */
} trace_buf;

static mgpu__mutex reg_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_TRACE_REG);
static mgpu__mutex names_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_TRACE_NAMES);
static trace_buf *registry;
static _Atomic unsigned session;
static _Atomic uint64_t flow_ids;
static _Atomic uint32_t thread_tracks;

static _Thread_local trace_buf *my_buf;
static _Thread_local uint32_t my_track;
static _Thread_local int my_dev_set;
static _Thread_local int my_dev;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t buf_key;

static void copy_name(char *dst, const char *src) {
  size_t i = 0;
  if (src != NULL)
    for (; i < MGPU__TRACE_NAME - 1 && src[i] != '\0'; i++) dst[i] = src[i];
  dst[i] = '\0';
}

/* ---- names ---- */

typedef struct track_name {
  int dev;
  uint32_t track; /* UINT32_MAX: the process itself */
  char name[128];
} track_name;

static track_name *names;        /* guarded by names_lock */
static size_t nnames, names_cap; /* guarded by names_lock */

static void set_name(int dev, uint32_t track, const char *name) {
  mgpu__mutex_lock(&names_lock);
  size_t i = 0;
  while (i < nnames && !(names[i].dev == dev && names[i].track == track)) i++;
  if (i == nnames) {
    if (nnames == names_cap) {
      size_t cap = names_cap ? 2 * names_cap : 64;
      track_name *grown = mgpu__realloc(names, cap * sizeof *grown);
      if (grown == NULL) { /* a name is a nicety: keep the number */
        mgpu__mutex_unlock(&names_lock);
        return;
      }
      names = grown;
      names_cap = cap;
    }
    nnames++;
  }
  names[i].dev = dev;
  names[i].track = track;
  snprintf(names[i].name, sizeof names[i].name, "%s", name);
  mgpu__mutex_unlock(&names_lock);
}

/* Copies the name of (dev, track) into out; returns 0 when there is none. */
int mgpu__trace_name_of(int dev, uint32_t track, char *out, size_t size) {
  int found = 0;
  mgpu__mutex_lock(&names_lock);
  for (size_t i = 0; i < nnames && !found; i++) {
    if (names[i].dev == dev && names[i].track == track) {
      snprintf(out, size, "%s", names[i].name);
      found = 1;
    }
  }
  mgpu__mutex_unlock(&names_lock);
  return found;
}

void mgpu__trace_name_device(int dev, const char *name) {
  set_name(dev, UINT32_MAX, name);
}

void mgpu__trace_forget_names(void) {
  mgpu__mutex_lock(&names_lock);
  nnames = 0;
  mgpu__mutex_unlock(&names_lock);
}


uint32_t mgpu__trace_thread_track(void) {
  if (my_track == 0)
    my_track = MGPU__TRACE_THREAD_TRACK0 + atomic_fetch_add(&thread_tracks, 1);
  return my_track;
}

static int thread_dev(void) { return my_dev_set ? my_dev : MGPU__TRACE_HOST; }

void mgpu__trace_name_thread(int dev, const char *name) {
  my_dev = dev;
  my_dev_set = 1;
  set_name(dev, mgpu__trace_thread_track(), name);
}

static _Atomic uint32_t stream_tracks;

uint32_t mgpu__trace_track_new(int dev, const char *name) {
  uint32_t track = 1 + atomic_fetch_add(&stream_tracks, 1) % (MGPU__TRACE_THREAD_TRACK0 - 1);
  char def[32];
  if (name == NULL) {
    snprintf(def, sizeof def, "stream %u", track);
    name = def;
  }
  set_name(dev, track, name);
  return track;
}

void mgpu__trace_thread_adopt(int dev, uint32_t track) {
  my_dev = dev;
  my_dev_set = 1;
  my_track = track;
}

/* ---- tags ---- */

static _Thread_local mgpu__trace_tag my_tag;
static _Thread_local int my_tag_set;

int mgpu__trace_tag_push(const char *name, const mgpu__trace_arg *args,
                         int nargs) {
  if (my_tag_set) return 0;
  copy_name(my_tag.name, name);
  if (nargs > MGPU__TRACE_ARGS) nargs = MGPU__TRACE_ARGS;
  my_tag.nargs = nargs > 0 ? nargs : 0;
  for (int k = 0; k < my_tag.nargs; k++) my_tag.args[k] = args[k];
  my_tag_set = 1;
  return 1;
}

void mgpu__trace_tag_pop(int pushed) {
  if (pushed) my_tag_set = 0;
}

mgpu__trace_tag *mgpu__trace_tag_copy(void) {
  if (!my_tag_set) return NULL;
  mgpu__trace_tag *t = mgpu__malloc(sizeof *t);
  if (t != NULL) *t = my_tag;
  return t;
}

void mgpu__trace_span_tag(int dev, uint32_t track, const mgpu__trace_tag *tag,
                          uint64_t start_ns, uint64_t end_ns) {
  mgpu__trace_span(dev, track, tag->name, start_ns, end_ns, tag->args,
                   tag->nargs);
}

/* ---- buffers ---- */

static void buf_thread_exit(void *arg) {
  trace_buf *b = arg;
  atomic_store_explicit(&b->dead, 1, memory_order_release);
}

static void make_key(void) {
  if (pthread_key_create(&buf_key, buf_thread_exit) != 0) abort();
}

static trace_buf *buf_new(void) {
  pthread_once(&key_once, make_key);
  trace_buf *b = mgpu__calloc(1, sizeof *b);
  if (b == NULL) return NULL;
  mgpu__mutex_lock(&reg_lock);
  b->next = registry;
  registry = b;
  mgpu__mutex_unlock(&reg_lock);
  pthread_setspecific(buf_key, b);
  my_buf = b;
  return b;
}

/* The calling thread's next free event, or NULL (counted as dropped) when
 * its buffer is full or memory is short. Publish it with commit(). */
static mgpu__trace_event *reserve(trace_buf **out) {
  trace_buf *b = my_buf != NULL ? my_buf : buf_new();
  if (b == NULL) return NULL;
  unsigned s = atomic_load_explicit(&session, memory_order_acquire);
  if (atomic_load_explicit(&b->session, memory_order_relaxed) != s) {
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    atomic_store_explicit(&b->dropped, 0, memory_order_relaxed);
    atomic_store_explicit(&b->session, s, memory_order_release);
  }
  uint32_t n = atomic_load_explicit(&b->count, memory_order_relaxed);
  mgpu__trace_event **chunk = n < MGPU__TRACE_CAP ? &b->chunks[n / MGPU__TRACE_CHUNK]
                                            : NULL;
  if (chunk != NULL && *chunk == NULL)
    *chunk = mgpu__malloc(MGPU__TRACE_CHUNK * sizeof **chunk);
  if (chunk == NULL || *chunk == NULL) {
    atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
    return NULL;
  }
  *out = b;
  return &(*chunk)[n % MGPU__TRACE_CHUNK];
}

static void commit(trace_buf *b) {
  uint32_t n = atomic_load_explicit(&b->count, memory_order_relaxed);
  atomic_store_explicit(&b->count, n + 1, memory_order_release);
}

/* ---- recording ---- */

/* The calling thread's next event with its common fields filled, or NULL;
 * publish it with commit(*b). */
static mgpu__trace_event *event_new(char ph, int dev, uint32_t track, uint64_t ts,
                              const char *name, trace_buf **b) {
  mgpu__trace_event *e = reserve(b);
  if (e == NULL) return NULL;
  e->ph = ph;
  e->nargs = 0;
  e->dev = dev;
  e->track = track;
  e->ts = ts;
  e->dur = 0;
  copy_name(e->name, name);
  return e;
}

void mgpu__trace_span(int dev, uint32_t track, const char *name,
                      uint64_t start_ns, uint64_t end_ns,
                      const mgpu__trace_arg *args, int nargs) {
  if (!mgpu__trace_enabled()) return;
  trace_buf *b;
  mgpu__trace_event *e = event_new('X', dev, track, start_ns, name, &b);
  if (e == NULL) return;
  e->dur = end_ns > start_ns ? end_ns - start_ns : 0;
  if (nargs > MGPU__TRACE_ARGS) nargs = MGPU__TRACE_ARGS;
  e->nargs = (uint8_t)(nargs > 0 ? nargs : 0);
  for (int i = 0; i < nargs; i++) e->args[i] = args[i];
  commit(b);
}

static void flow_end(char ph, const char *name, mgpu__trace_point p,
                     uint64_t id) {
  trace_buf *b;
  mgpu__trace_event *e = event_new(ph, p.dev, p.track, p.ts, name, &b);
  if (e == NULL) return;
  e->id = id;
  commit(b);
}

void mgpu__trace_flow(const char *name, mgpu__trace_point from,
                      mgpu__trace_point to) {
  if (!mgpu__trace_enabled()) return;
  uint64_t id = atomic_fetch_add_explicit(&flow_ids, 1, memory_order_relaxed) + 1;
  flow_end('s', name, from, id);
  flow_end('f', name, to, id);
}

void mgpu__trace_counter(int dev, const char *name, uint64_t ts,
                         int64_t value) {
  if (!mgpu__trace_enabled()) return;
  trace_buf *b;
  mgpu__trace_event *e = event_new('C', dev, 0, ts, name, &b);
  if (e == NULL) return;
  e->nargs = 1;
  e->args[0] = MGPU__TARG_I("value", value);
  commit(b);
}

void mgpu__trace_thread_span(const char *name, uint64_t start_ns,
                             uint64_t end_ns, const mgpu__trace_arg *args,
                             int nargs) {
  if (!mgpu__trace_enabled()) return;
  mgpu__trace_span(thread_dev(), mgpu__trace_thread_track(), name, start_ns,
                   end_ns, args, nargs);
}

void mgpu_trace_span(const char *name, uint64_t start_ns, uint64_t end_ns) {
  mgpu__trace_thread_span(name != NULL ? name : "span", start_ns, end_ns,
                          NULL, 0);
}

uint64_t mgpu_trace_now_ns(void) { return mgpu__now_ns(); }

int mgpu_trace_active(void) { return mgpu__trace_enabled(); }

/* ---- what the writer reads ---- */

void mgpu__trace_session_begin(void) {
  atomic_fetch_add_explicit(&session, 1, memory_order_release);
}

int mgpu__trace_gather(mgpu__trace_gathered *g) {
  unsigned s = atomic_load_explicit(&session, memory_order_acquire);
  size_t cap = 0;
  memset(g, 0, sizeof *g);
  mgpu__mutex_lock(&reg_lock);
  for (trace_buf *b = registry; b != NULL; b = b->next)
    if (atomic_load_explicit(&b->session, memory_order_acquire) == s)
      cap += atomic_load_explicit(&b->count, memory_order_acquire);
  g->ev = mgpu__malloc((cap ? cap : 1) * sizeof *g->ev);
  if (g->ev == NULL) {
    mgpu__mutex_unlock(&reg_lock);
    return MGPU_ENOMEM;
  }
  for (trace_buf *b = registry; b != NULL; b = b->next) {
    if (atomic_load_explicit(&b->session, memory_order_acquire) != s) continue;
    uint32_t n = atomic_load_explicit(&b->count, memory_order_acquire);
    g->dropped += atomic_load_explicit(&b->dropped, memory_order_relaxed);
    if (n > 0) g->threads++;
    for (uint32_t i = 0; i < n && g->n < cap; i++)
      g->ev[g->n++] = &b->chunks[i / MGPU__TRACE_CHUNK][i % MGPU__TRACE_CHUNK];
  }
  mgpu__mutex_unlock(&reg_lock);
  return 0;
}

/* Frees the buffers of threads that have exited (their events are
 * written). Called with recording off, by one
 * thread at a time (mgpu_trace_stop). */
void mgpu__trace_free_dead(void) {
  mgpu__mutex_lock(&reg_lock);
  for (trace_buf **p = &registry; *p != NULL;) {
    trace_buf *b = *p;
    if (atomic_load_explicit(&b->dead, memory_order_acquire)) {
      *p = b->next;
      for (int i = 0; i < NCHUNKS; i++) mgpu__free(b->chunks[i]);
      mgpu__free(b);
    } else {
      p = &b->next;
    }
  }
  mgpu__mutex_unlock(&reg_lock);
}
