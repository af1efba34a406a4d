/* The trace recorder: the internal API every layer records into.
 *
 * It sits on the floor of the library (it uses src/util/ only), so core,
 * copy, sched, coll and chan call it without anything running back up.
 *
 * What it records, each on a track of a trace process:
 *   - spans: a name, a device, a track, a real start and end (mgpu__now_ns
 *     clock, or a device clock mapped onto it), up to MGPU__TRACE_ARGS
 *     arguments;
 *   - flows: an arrow from a point on one track to a point on another (an
 *     event's record to a stream that waited on it, a channel send to its
 *     receive, a task's owner to the device that stole it);
 *   - counters: a named value over time per device (memory in use).
 *
 * Processes and tracks: trace process d is device d (named with its
 * properties by mgpu__trace_name_device), MGPU__TRACE_HOST is the host
 * process of threads that belong to no device. A track is a stream
 * (mgpu__trace_track_new) or a host thread (mgpu__trace_thread_track).
 *
 * Memory: each recording thread appends to its own buffer, grown in chunks
 * of MGPU__TRACE_CHUNK events up to MGPU__TRACE_CAP events per thread and
 * per recording; events past the cap are counted as dropped (the count goes
 * into the file's metadata and a warning). Off, a recording call costs one
 * predictable branch (mgpu__trace_on).
 *
 * Threads: any thread may record at any time. A buffer's events are written
 * by its own thread only and published by a release store of its count;
 * mgpu_trace_stop reads each buffer up to the count it acquires.
 */
#ifndef MGPU_OBS_TRACE_H
#define MGPU_OBS_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

#include "mgpu/trace.h"

/* Trace process of threads and counters that belong to no device. */
#define MGPU__TRACE_HOST 1000
/* Events per chunk of a thread's buffer and the cap per thread. */
#define MGPU__TRACE_CHUNK 4096
#define MGPU__TRACE_CAP (64 * MGPU__TRACE_CHUNK)
/* Arguments per span; keys are static strings. */
#define MGPU__TRACE_ARGS 4
/* Longest span name kept (longer names are cut). */
#define MGPU__TRACE_NAME 40

/* Nonzero while a trace is being recorded. Read it through
 * mgpu__trace_enabled() before building a span's arguments. */
extern _Atomic int mgpu__trace_on;

static inline int mgpu__trace_enabled(void) {
  return __builtin_expect(
      atomic_load_explicit(&mgpu__trace_on, memory_order_relaxed), 0);
}

/* One argument of a span: an integer, or a static string when s != NULL. */
typedef struct mgpu__trace_arg {
  const char *key;
  const char *s;
  int64_t i;
} mgpu__trace_arg;

#define MGPU__TARG_I(k, v) ((mgpu__trace_arg){(k), NULL, (int64_t)(v)})
#define MGPU__TARG_S(k, v) ((mgpu__trace_arg){(k), (v), 0})

/* A point on a track: where a flow starts or ends. */
typedef struct mgpu__trace_point {
  int dev;        /* trace process: a device id or MGPU__TRACE_HOST */
  uint32_t track; /* track within it */
  uint64_t ts;    /* ns, mgpu__now_ns clock */
} mgpu__trace_point;

/* Records a span [start_ns, end_ns] named name (copied, cut at
 * MGPU__TRACE_NAME-1 bytes) with nargs arguments (keys and string values
 * must be static). Does nothing when tracing is off. */
void mgpu__trace_span(int dev, uint32_t track, const char *name,
                      uint64_t start_ns, uint64_t end_ns,
                      const mgpu__trace_arg *args, int nargs);

/* Records a span on the calling thread's own track (its process: the one
 * it was named in, else the host). */
void mgpu__trace_thread_span(const char *name, uint64_t start_ns,
                             uint64_t end_ns, const mgpu__trace_arg *args,
                             int nargs);

/* Records an arrow from `from` to `to`, named name (static; Perfetto pairs
 * both ends by name and id), with a fresh id. */
void mgpu__trace_flow(const char *name, mgpu__trace_point from,
                      mgpu__trace_point to);

/* Records counter `name` (static) of trace process dev = value at ts. */
void mgpu__trace_counter(int dev, const char *name, uint64_t ts,
                         int64_t value);

/* The calling thread's own track; the first call gives the thread a track
 * number. Every host thread has one track in its process. */
uint32_t mgpu__trace_thread_track(void);

/* Names the calling thread's track ("device 1 host thread", "pool worker")
 * and puts it in trace process dev. The name is copied. Kept across
 * recordings. */
void mgpu__trace_name_thread(int dev, const char *name);

/* A new track of trace process dev, named name, or "stream N" when name
 * is NULL (N counts the tracks of the process's streams). Kept across
 * recordings. Streams and the pool's workers get theirs this way. */
uint32_t mgpu__trace_track_new(int dev, const char *name);
/* Makes (dev, track) the calling thread's own track (a pool worker takes
 * the track its pool made for it). */
void mgpu__trace_thread_adopt(int dev, uint32_t track);

/* What the operations a thread hands to a backend are (their spans' name
 * and arguments), for the spans the backend records when they really run:
 * on a host device's worker, or between CUDA events. A layer pushes a tag
 * before its backend calls and pops it after; the outermost tag wins, so
 * the chunks a collective queues through the copy layer are named by the
 * collective. The backend copies the tag when it queues an operation.
 * Push only while mgpu__trace_enabled(). */
typedef struct mgpu__trace_tag {
  char name[MGPU__TRACE_NAME];
  int nargs;
  mgpu__trace_arg args[MGPU__TRACE_ARGS];
} mgpu__trace_tag;

/* Sets the tag unless one is set; returns 1 when it did (then pop it). */
int mgpu__trace_tag_push(const char *name, const mgpu__trace_arg *args,
                         int nargs);
void mgpu__trace_tag_pop(int pushed);
/* A new copy of the calling thread's tag that the caller frees, or NULL
 * when none is set (or memory is short). */
mgpu__trace_tag *mgpu__trace_tag_copy(void);
/* Records a span described by tag. */
void mgpu__trace_span_tag(int dev, uint32_t track, const mgpu__trace_tag *tag,
                          uint64_t start_ns, uint64_t end_ns);

/* Names trace process dev ("device 1: host device 1"); copied. */
void mgpu__trace_name_device(int dev, const char *name);

/* Forgets every process and track name (mgpu_shutdown: the next init may
 * open other devices). */
void mgpu__trace_forget_names(void);

#endif /* MGPU_OBS_TRACE_H */
