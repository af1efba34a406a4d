/* mgpu trace: a timeline of what every device did, as a Chrome trace-event
 * JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing open as
 * they are, and that `mgpu trace view` draws as a picture.
 *
 * Recording starts with mgpu_trace_start(path), or at mgpu_init when
 * MGPU_TRACE (or mgpu_config.trace) names a file, and ends with
 * mgpu_trace_stop() or at mgpu_shutdown. The file holds one trace process
 * per device, one track per stream and per host thread, a span for every
 * launch, copy, memset, callback, task, collective, barrier and channel
 * message, flow arrows (event record to wait, send to receive, steals) and a
 * counter of memory in use per device. docs/trace.md says what each span is.
 *
 * Cost: off, one predictable branch per operation; on, a few tens of
 * nanoseconds per recorded operation (see `mgpu bench trace`). Each thread
 * keeps at most MGPU_TRACE_EVENTS_PER_THREAD events per recording; later
 * events are dropped and counted (mgpu_trace_stats, the file's metadata,
 * and a warning under MGPU_LOG=warn).
 *
 * Threads: every call may be made from any thread; start and stop are
 * serialized with each other.
 */
#ifndef MGPU_TRACE_H
#define MGPU_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/visibility.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most events one thread records in one recording. */
#define MGPU_TRACE_EVENTS_PER_THREAD (64 * 4096)

/* Starts recording into path (the caller keeps ownership of the string; it
 * is copied). The file is written when recording stops, first to
 * "<path>.tmp", then renamed to path, so a reader never sees half a file.
 * Works with or without mgpu_init. Errors: MGPU_EINVAL (path NULL or
 * empty), MGPU_EALREADY (already recording; the detail names the file),
 * MGPU_EIO (the temporary file cannot be created; the detail names it and
 * the reason). */
MGPU_EXTERN int mgpu_trace_start(const char *path);

/* Stops recording and writes the file. Events recorded by other threads
 * while stop runs may be left out. Errors: MGPU_EINVAL (not recording),
 * MGPU_EIO (writing or renaming failed; the temporary file is removed). */
MGPU_EXTERN int mgpu_trace_stop(void);

/* Nonzero while recording. */
MGPU_EXTERN int mgpu_trace_active(void);

/* Figures of the current recording, or of the last one once stopped. */
typedef struct mgpu_trace_stats {
  size_t size;       /* sizeof(mgpu_trace_stats), set by the caller */
  uint64_t events;   /* events kept */
  uint64_t dropped;  /* events dropped at a thread's cap */
  uint64_t threads;  /* threads that recorded */
} mgpu_trace_stats;

/* Fills *out. Errors: MGPU_EINVAL (out NULL or size not set). */
MGPU_EXTERN int mgpu_trace_stats_get(mgpu_trace_stats *out);

/* Records a span of the caller's own on its thread's track, from start_ns
 * to end_ns of mgpu_trace_now_ns(), named name (copied; at most 39 bytes
 * kept). Does nothing when not recording. For marking phases of a program
 * ("setup", "check") in the same timeline as mgpu's own spans. */
MGPU_EXTERN void mgpu_trace_span(const char *name, uint64_t start_ns,
                                 uint64_t end_ns);

/* The clock of every timestamp in a trace (monotonic, nanoseconds). */
MGPU_EXTERN uint64_t mgpu_trace_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_TRACE_H */
