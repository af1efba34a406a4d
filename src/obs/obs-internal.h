/* What the trace recorder (trace.c) hands the writer of the file
 * (trace-file.c). Internal to src/obs/. */
#ifndef MGPU_OBS_INTERNAL_H
#define MGPU_OBS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "obs/trace.h"

/* Thread tracks are numbered from here, stream tracks below it. */
#define MGPU__TRACE_THREAD_TRACK0 1000000u

/* One recorded event, as it sits in a thread's buffer. */
typedef struct mgpu__trace_event {
  char ph;      /* 'X' span, 's'/'f' flow ends, 'C' counter */
  uint8_t nargs;
  int32_t dev;
  uint32_t track;
  uint64_t ts, dur;
  uint64_t id; /* flow id */
  char name[MGPU__TRACE_NAME];
  mgpu__trace_arg args[MGPU__TRACE_ARGS];
} mgpu__trace_event;


/* The events of the current session, gathered from every buffer: pointers
 * into the buffers (valid until the next session), the events dropped and
 * the threads that recorded. */
typedef struct mgpu__trace_gathered {
  const mgpu__trace_event **ev;
  size_t n;
  uint64_t dropped, threads;
} mgpu__trace_gathered;

/* Starts a new session: every buffer is emptied by its own thread before
 * its next event. */
void mgpu__trace_session_begin(void);
/* Fills *g (the caller frees g->ev); 0 or MGPU_ENOMEM. */
int mgpu__trace_gather(mgpu__trace_gathered *g);
/* Frees the buffers of threads that have exited (recording off). */
void mgpu__trace_free_dead(void);
/* Copies the name of (dev, track) into out; 0 when there is none. track
 * UINT32_MAX: the process's name. */
int mgpu__trace_name_of(int dev, uint32_t track, char *out, size_t size);

#endif /* MGPU_OBS_INTERNAL_H */
