/* The trace file: mgpu_trace_start and mgpu_trace_stop, and the writer of
 * the Chrome trace-event JSON (see trace.h for the recorder).
 *
 * Stop switches recording off, gathers every buffer of the session up to
 * its published count (trace.c), sorts the events by time and writes them
 * with timestamps relative to the session's base (kept in the metadata as
 * base_ns), so microseconds keep their nanoseconds; the file goes to
 * "<path>.tmp" first and is renamed when complete. Each process and track
 * that recorded something is named once (metadata events).
 *
 * Lock: ctl_lock serializes start, stop and stats; it guards trace_path,
 * trace_file, base_ns and last_stats. It is taken before the recorder's
 * locks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs.h"
#include "obs/obs-internal.h"
#include "obs/trace.h"
#include "util/log.h"
#include "util/thread.h"
#include "util/fault.h"

static mgpu__mutex ctl_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_TRACE_CTL);
/* Guarded by ctl_lock. */
static char *trace_path;
static FILE *trace_file;
static uint64_t base_ns;
static mgpu_trace_stats last_stats;

/* Returns code with a detail: what, then 'arg' when given, then why. */
static int fail(int code, const char *what, const char *arg, const char *why) {
  return mgpu__error(code, "%s%s%s%s%s", what, arg ? " '" : "", arg ? arg : "",
                     arg ? "'" : "", why ? why : "");
}

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
  char *copy = mgpu__malloc(len + 5);
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
    mgpu__free(copy);
    mgpu__mutex_unlock(&ctl_lock);
    return rc;
  }
  copy[len] = '\0';
  trace_path = copy;
  trace_file = f;
  memset(&last_stats, 0, sizeof last_stats);
  base_ns = mgpu__now_ns();
  mgpu__trace_session_begin();
  atomic_store_explicit(&mgpu__trace_on, 1, memory_order_release);
  mgpu__obs_trace_gauges(); /* the counters start where they stand */
  mgpu__mutex_unlock(&ctl_lock);
  return 0;
}

static int by_time(const void *a, const void *b) {
  const mgpu__trace_event *x = *(const mgpu__trace_event *const *)a;
  const mgpu__trace_event *y = *(const mgpu__trace_event *const *)b;
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

static void put_event(FILE *f, const mgpu__trace_event *e, uint64_t base) {
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

static void put_names(FILE *f, const mgpu__trace_gathered *g) {
  track_key *keys = mgpu__malloc((g->n ? g->n : 1) * sizeof *keys);
  if (keys == NULL) return;
  size_t n = 0;
  for (size_t i = 0; i < g->n; i++)
    if (g->ev[i]->ph != 'C')
      keys[n++] = (track_key){g->ev[i]->dev, g->ev[i]->track};
  for (size_t i = 0; i < g->n; i++) /* counters name their process too */
    if (g->ev[i]->ph == 'C') keys[n++] = (track_key){g->ev[i]->dev, UINT32_MAX};
  qsort(keys, n, sizeof *keys, by_track);
  char name[128];
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && by_track(&keys[i], &keys[i - 1]) == 0) continue;
    if (i == 0 || keys[i].dev != keys[i - 1].dev) {
      if (!mgpu__trace_name_of(keys[i].dev, UINT32_MAX, name, sizeof name)) {
        if (keys[i].dev == MGPU__TRACE_HOST)
          snprintf(name, sizeof name, "host");
        else
          snprintf(name, sizeof name, "device %d", keys[i].dev);
      }
      put_meta(f, "process_name", keys[i].dev, NULL, name);
    }
    if (keys[i].track == UINT32_MAX) continue;
    if (!mgpu__trace_name_of(keys[i].dev, keys[i].track, name, sizeof name)) {
      if (keys[i].track >= MGPU__TRACE_THREAD_TRACK0)
        snprintf(name, sizeof name, "thread %u", keys[i].track - MGPU__TRACE_THREAD_TRACK0);
      else
        snprintf(name, sizeof name, "stream %u", keys[i].track);
    }
    put_meta(f, "thread_name", keys[i].dev, &keys[i], name);
  }
  mgpu__free(keys);
}

static int write_file(FILE *f, const mgpu__trace_gathered *g, uint64_t base) {
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

  mgpu__trace_gathered g;
  int rc = mgpu__trace_gather(&g);
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
  mgpu__free(g.ev);
  mgpu__free(path);
  mgpu__trace_free_dead();
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
    mgpu__trace_gathered g;
    int rc = mgpu__trace_gather(&g);
    memset(out, 0, sizeof *out);
    if (rc == 0) {
      out->events = g.n;
      out->dropped = g.dropped;
      out->threads = g.threads;
    }
    mgpu__free(g.ev);
  }
  out->size = sizeof *out;
  mgpu__mutex_unlock(&ctl_lock);
  return 0;
}
