/* The trace recorder (see trace.h): per-thread event buffers, the names of
 * processes and tracks, and the writer of the Chrome trace-event JSON file.
 *
 * Recording: a thread's first event gives it a buffer, linked into the
 * registry. Each recording has a session number; a buffer last used in an
 * older session is emptied by its own thread before its next event, so
 * start never touches a buffer another thread may be filling.
 *
 * Writing (mgpu_trace_stop): recording is switched off, then every buffer
 * of the session is read up to its published count, the events are sorted
 * by time and written with timestamps relative to the session's base (kept
 * in the metadata), so microseconds keep their nanoseconds. Buffers of
 * threads that have exited are freed afterwards.
 *
 * Locks: ctl_lock serializes start, stop and stats (it guards path, file,
 * base_ns, last_stats); reg_lock guards the registry list; names_lock the
 * name table. Order: ctl_lock, then reg_lock or names_lock.
 */
#include "obs/trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs.h"
#include "util/log.h"
#include "util/thread.h"

_Atomic int mgpu__trace_on;

typedef struct trace_event {
  char ph;      /* 'X' span, 's'/'f' flow ends, 'C' counter */
  uint8_t nargs;
  int32_t dev;
  uint32_t track;
  uint64_t ts, dur;
  uint64_t id; /* flow id */
  char name[MGPU__TRACE_NAME];
  mgpu__trace_arg args[MGPU__TRACE_ARGS];
} trace_event;

enum { NCHUNKS = MGPU__TRACE_CAP / MGPU__TRACE_CHUNK };
_Static_assert(MGPU__TRACE_CAP == MGPU_TRACE_EVENTS_PER_THREAD,
               "the public cap and the recorder's disagree");

typedef struct trace_buf {
  struct trace_buf *next; /* registry, guarded by reg_lock */
  _Atomic unsigned session;
  _Atomic uint32_t count;   /* events published; written by the owner */
  _Atomic uint64_t dropped; /* events past the cap this session */
  _Atomic int dead;         /* the owner thread has exited */
  trace_event *chunks[NCHUNKS]; /* allocated by the owner */
} trace_buf;

static mgpu__mutex ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static mgpu__mutex reg_lock = PTHREAD_MUTEX_INITIALIZER;
static mgpu__mutex names_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_buf *registry;
static _Atomic unsigned session;
static _Atomic uint64_t flow_ids;
static _Atomic uint32_t thread_tracks;

/* Guarded by ctl_lock. */
static char *trace_path;
static FILE *trace_file;
static uint64_t base_ns;
static mgpu_trace_stats last_stats;

static _Thread_local trace_buf *my_buf;
static _Thread_local uint32_t my_track;
static _Thread_local int my_dev_set;
static _Thread_local int my_dev;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t buf_key;

/* Returns code with a detail: what, then 'arg' when given, then why. */
static int fail(int code, const char *what, const char *arg, const char *why) {
  return mgpu__error(code, "%s%s%s%s%s", what, arg ? " '" : "", arg ? arg : "",
                     arg ? "'" : "", why ? why : "");
}

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
  char name[64];
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
      track_name *grown = realloc(names, cap * sizeof *grown);
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
static int get_name(int dev, uint32_t track, char *out, size_t size) {
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

void mgpu__trace_name_track(int dev, uint32_t track, const char *name) {
  set_name(dev, track, name);
}

void mgpu__trace_forget_names(void) {
  mgpu__mutex_lock(&names_lock);
  nnames = 0;
  mgpu__mutex_unlock(&names_lock);
}

/* Thread tracks are numbered from here, stream tracks below it. */
#define THREAD_TRACK0 1000000u

uint32_t mgpu__trace_thread_track(void) {
  if (my_track == 0)
    my_track = THREAD_TRACK0 + atomic_fetch_add(&thread_tracks, 1);
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
  uint32_t track = 1 + atomic_fetch_add(&stream_tracks, 1) % (THREAD_TRACK0 - 1);
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

const char *mgpu__trace_tag_name(void) {
  return my_tag_set ? my_tag.name : NULL;
}

mgpu__trace_tag *mgpu__trace_tag_copy(void) {
  if (!my_tag_set) return NULL;
  mgpu__trace_tag *t = malloc(sizeof *t);
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
  trace_buf *b = calloc(1, sizeof *b);
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
static trace_event *reserve(trace_buf **out) {
  trace_buf *b = my_buf != NULL ? my_buf : buf_new();
  if (b == NULL) return NULL;
  unsigned s = atomic_load_explicit(&session, memory_order_acquire);
  if (atomic_load_explicit(&b->session, memory_order_relaxed) != s) {
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    atomic_store_explicit(&b->dropped, 0, memory_order_relaxed);
    atomic_store_explicit(&b->session, s, memory_order_release);
  }
  uint32_t n = atomic_load_explicit(&b->count, memory_order_relaxed);
  trace_event **chunk = n < MGPU__TRACE_CAP ? &b->chunks[n / MGPU__TRACE_CHUNK]
                                            : NULL;
  if (chunk != NULL && *chunk == NULL)
    *chunk = malloc(MGPU__TRACE_CHUNK * sizeof **chunk);
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
static trace_event *event_new(char ph, int dev, uint32_t track, uint64_t ts,
                              const char *name, trace_buf **b) {
  trace_event *e = reserve(b);
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
  trace_event *e = event_new('X', dev, track, start_ns, name, &b);
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
  trace_event *e = event_new(ph, p.dev, p.track, p.ts, name, &b);
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
  trace_event *e = event_new('C', dev, 0, ts, name, &b);
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

/* ---- start, stop, the file ---- */

int mgpu_trace_start(const char *path) {
  if (path == NULL || path[0] == '\0')
    return fail(MGPU_EINVAL, "mgpu_trace_start: path is NULL or empty", NULL,
                NULL);
  mgpu__mutex_lock(&ctl_lock);
  if (trace_path != NULL) {
    int rc = fail(MGPU_EALREADY, "mgpu_trace_start: already recording into",
                  trace_path, "; mgpu_trace_stop it first");
    mgpu__mutex_unlock(&ctl_lock);
    return rc;
  }
  size_t len = strlen(path);
  char *copy = malloc(len + 5);
  if (copy == NULL) {
    mgpu__mutex_unlock(&ctl_lock);
    return fail(MGPU_ENOMEM, "mgpu_trace_start: no memory for the path", path,
                NULL);
  }
  snprintf(copy, len + 5, "%s.tmp", path);
  FILE *f = fopen(copy, "w");
  if (f == NULL) {
    char why[128];
    snprintf(why, sizeof why, ": %s", strerror(errno));
    int rc = fail(MGPU_EIO, "mgpu_trace_start: cannot create", copy, why);
    free(copy);
    mgpu__mutex_unlock(&ctl_lock);
    return rc;
  }
  copy[len] = '\0';
  trace_path = copy;
  trace_file = f;
  memset(&last_stats, 0, sizeof last_stats);
  base_ns = mgpu__now_ns();
  atomic_fetch_add_explicit(&session, 1, memory_order_release);
  atomic_store_explicit(&mgpu__trace_on, 1, memory_order_release);
  mgpu__obs_trace_gauges(); /* the counters start where they stand */
  mgpu__mutex_unlock(&ctl_lock);
  return 0;
}

/* The events of the current session, gathered from every buffer. */
typedef struct gathered {
  const trace_event **ev;
  size_t n;
  uint64_t dropped, threads;
} gathered;

static int gather(gathered *g) {
  unsigned s = atomic_load_explicit(&session, memory_order_acquire);
  size_t cap = 0;
  memset(g, 0, sizeof *g);
  mgpu__mutex_lock(&reg_lock);
  for (trace_buf *b = registry; b != NULL; b = b->next)
    if (atomic_load_explicit(&b->session, memory_order_acquire) == s)
      cap += atomic_load_explicit(&b->count, memory_order_acquire);
  g->ev = malloc((cap ? cap : 1) * sizeof *g->ev);
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

static int by_time(const void *a, const void *b) {
  const trace_event *x = *(const trace_event *const *)a;
  const trace_event *y = *(const trace_event *const *)b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  /* A flow's start sorts before its end at the same time. */
  return (x->ph == 'f') - (y->ph == 'f');
}

static void put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s != '\0'; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* Microseconds since the base with three decimals: exact nanoseconds. */
static void put_us(FILE *f, const char *key, uint64_t ns, uint64_t base) {
  int neg = ns < base;
  uint64_t d = neg ? base - ns : ns - base;
  fprintf(f, ",\"%s\":%s%llu.%03u", key, neg ? "-" : "",
          (unsigned long long)(d / 1000), (unsigned)(d % 1000));
}

static void put_event(FILE *f, const trace_event *e, uint64_t base) {
  fprintf(f, "{\"ph\":\"%c\",\"pid\":%d", e->ph, (int)e->dev);
  if (e->ph != 'C') fprintf(f, ",\"tid\":%u", e->track);
  put_us(f, "ts", e->ts, base);
  if (e->ph == 'X') put_us(f, "dur", e->ts + e->dur, e->ts);
  fprintf(f, ",\"name\":");
  put_string(f, e->name);
  if (e->ph == 's' || e->ph == 'f') {
    fprintf(f, ",\"cat\":");
    put_string(f, e->name);
    fprintf(f, ",\"id\":%llu", (unsigned long long)e->id);
    if (e->ph == 'f') fprintf(f, ",\"bp\":\"e\"");
  }
  if (e->nargs > 0) {
    fprintf(f, ",\"args\":{");
    for (int i = 0; i < e->nargs; i++) {
      fprintf(f, "%s", i ? "," : "");
      put_string(f, e->args[i].key);
      fputc(':', f);
      if (e->args[i].s != NULL)
        put_string(f, e->args[i].s);
      else
        fprintf(f, "%lld", (long long)e->args[i].i);
    }
    fputc('}', f);
  }
  fputc('}', f);
}

/* (dev, track) pairs, to name each process and track once. */
typedef struct track_key {
  int dev;
  uint32_t track;
} track_key;

static int by_track(const void *a, const void *b) {
  const track_key *x = a, *y = b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  return x->track < y->track ? -1 : x->track > y->track;
}

static void put_meta(FILE *f, const char *what, int dev, const track_key *t,
                     const char *name) {
  fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d", dev);
  if (t != NULL) fprintf(f, ",\"tid\":%u", t->track);
  fprintf(f, ",\"name\":\"%s\",\"args\":{\"name\":", what);
  put_string(f, name);
  fprintf(f, "}}");
  /* Lanes in the order of their numbers: devices, then the host; streams,
   * then threads. */
  fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d", dev);
  if (t != NULL) fprintf(f, ",\"tid\":%u", t->track);
  fprintf(f, ",\"name\":\"%s_sort_index\",\"args\":{\"sort_index\":%lld}}",
          t != NULL ? "thread" : "process",
          t != NULL ? (long long)t->track : (long long)dev);
}

static void put_names(FILE *f, const gathered *g) {
  track_key *keys = malloc((g->n ? g->n : 1) * sizeof *keys);
  if (keys == NULL) return;
  size_t n = 0;
  for (size_t i = 0; i < g->n; i++)
    if (g->ev[i]->ph != 'C')
      keys[n++] = (track_key){g->ev[i]->dev, g->ev[i]->track};
  for (size_t i = 0; i < g->n; i++) /* counters name their process too */
    if (g->ev[i]->ph == 'C') keys[n++] = (track_key){g->ev[i]->dev, UINT32_MAX};
  qsort(keys, n, sizeof *keys, by_track);
  char name[80];
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && by_track(&keys[i], &keys[i - 1]) == 0) continue;
    if (i == 0 || keys[i].dev != keys[i - 1].dev) {
      if (!get_name(keys[i].dev, UINT32_MAX, name, sizeof name)) {
        if (keys[i].dev == MGPU__TRACE_HOST)
          snprintf(name, sizeof name, "host");
        else
          snprintf(name, sizeof name, "device %d", keys[i].dev);
      }
      put_meta(f, "process_name", keys[i].dev, NULL, name);
    }
    if (keys[i].track == UINT32_MAX) continue;
    if (!get_name(keys[i].dev, keys[i].track, name, sizeof name)) {
      if (keys[i].track >= THREAD_TRACK0)
        snprintf(name, sizeof name, "thread %u", keys[i].track - THREAD_TRACK0);
      else
        snprintf(name, sizeof name, "stream %u", keys[i].track);
    }
    put_meta(f, "thread_name", keys[i].dev, &keys[i], name);
  }
  free(keys);
}

static int write_file(FILE *f, const gathered *g, uint64_t base) {
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\n\"otherData\":{"
             "\"generator\":\"mgpu\",\"clock\":\"CLOCK_MONOTONIC\","
             "\"base_ns\":%llu,\"timestamps\":\"microseconds since base_ns\","
             "\"events\":%zu,\"dropped_events\":%llu,"
             "\"events_per_thread_cap\":%d},\n\"traceEvents\":[\n",
          (unsigned long long)base, g->n, (unsigned long long)g->dropped,
          MGPU__TRACE_CAP);
  fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\","
             "\"args\":{\"name\":\"host\"}}", MGPU__TRACE_HOST);
  put_names(f, g);
  for (size_t i = 0; i < g->n; i++) {
    fprintf(f, ",\n");
    put_event(f, g->ev[i], base);
  }
  fprintf(f, "\n]}\n");
  return ferror(f) ? MGPU_EIO : 0;
}

/* Frees the buffers of threads that have exited (their events are
 * written). Called with ctl_lock held, recording off. */
static void free_dead_buffers(void) {
  mgpu__mutex_lock(&reg_lock);
  for (trace_buf **p = &registry; *p != NULL;) {
    trace_buf *b = *p;
    if (atomic_load_explicit(&b->dead, memory_order_acquire)) {
      *p = b->next;
      for (int i = 0; i < NCHUNKS; i++) free(b->chunks[i]);
      free(b);
    } else {
      p = &b->next;
    }
  }
  mgpu__mutex_unlock(&reg_lock);
}

int mgpu_trace_stop(void) {
  mgpu__mutex_lock(&ctl_lock);
  if (trace_path == NULL) {
    mgpu__mutex_unlock(&ctl_lock);
    return fail(MGPU_EINVAL, "mgpu_trace_stop: no trace is being recorded",
                NULL, NULL);
  }
  mgpu__obs_trace_gauges(); /* and run to the end */
  atomic_store_explicit(&mgpu__trace_on, 0, memory_order_release);
  char *path = trace_path, tmp[4096];
  FILE *f = trace_file;
  trace_path = NULL;
  trace_file = NULL;
  snprintf(tmp, sizeof tmp, "%s.tmp", path);

  gathered g;
  int rc = gather(&g);
  if (rc == 0) {
    qsort(g.ev, g.n, sizeof *g.ev, by_time);
    rc = write_file(f, &g, base_ns);
    last_stats.events = g.n;
    last_stats.dropped = g.dropped;
    last_stats.threads = g.threads;
  }
  if (fclose(f) != 0 && rc == 0) rc = MGPU_EIO;
  if (rc == 0 && rename(tmp, path) != 0) rc = MGPU_EIO;
  if (rc != 0) {
    char why[128];
    snprintf(why, sizeof why, ": %s", rc == MGPU_ENOMEM ? "out of memory"
                                                        : strerror(errno));
    rc = fail(rc, "mgpu_trace_stop: writing", path, why);
    remove(tmp);
  } else if (g.dropped > 0) {
    mgpu__log(MGPU_LOG_WARN, "trace %s: %llu events dropped at the cap of %d events per "
               "thread", path, (unsigned long long)g.dropped, MGPU__TRACE_CAP);
  }
  free(g.ev);
  free(path);
  free_dead_buffers();
  mgpu__mutex_unlock(&ctl_lock);
  return rc;
}

int mgpu_trace_stats_get(mgpu_trace_stats *out) {
  if (out == NULL || out->size != sizeof *out)
    return fail(MGPU_EINVAL, "mgpu_trace_stats_get: out is NULL or its size "
                "field is not sizeof(mgpu_trace_stats)", NULL, NULL);
  mgpu__mutex_lock(&ctl_lock);
  if (trace_path == NULL) {
    *out = last_stats;
  } else {
    gathered g;
    int rc = gather(&g);
    memset(out, 0, sizeof *out);
    if (rc == 0) {
      out->events = g.n;
      out->dropped = g.dropped;
      out->threads = g.threads;
    }
    free(g.ev);
  }
  out->size = sizeof *out;
  mgpu__mutex_unlock(&ctl_lock);
  return 0;
}
