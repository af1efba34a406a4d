/* Shared state of the OpenCL backend plugin (libmgpu-opencl.so).
 *
 * Devices: every device of every platform the ICD loader offers that has
 * shared virtual memory (SVM, OpenCL 2.0 and later) with 64-bit addresses,
 * numbered platform by platform in the loader's order. Each platform gets
 * one context holding all its usable devices, made at the first probe and
 * kept for the life of the process (the implementation's threads outlive
 * mgpu_shutdown anyway), so that SVM allocations of one device are usable
 * by every other device of the same platform: those are peers.
 *
 * Memory: device buffers are coarse-grained SVM (clSVMAlloc), so a device
 * pointer is an address that offsets and mgpu_buffer_ptr work on, and that
 * clEnqueueSVMMemcpy / clSetKernelArgSVMPointer accept anywhere inside an
 * allocation. Unified buffers are fine-grained SVM where the device offers
 * it (the host may touch them), pinned buffers are CL_MEM_ALLOC_HOST_PTR
 * buffers mapped once for their whole life.
 *
 * Streams are in-order command queues, with profiling on unless
 * MGPU_OPENCL_BUSY=0 turned it off (stream.c, mgpu__ocl_stream_create);
 * every command queued keeps its event as the stream's last one (only that
 * one: the one before is released when the next is queued), which query
 * and synchronize read for errors, and the busy interval reads for busy
 * time (trace.c).
 *
 * The plugin's locks and where they sit in the library's lock order:
 * docs/ARCHITECTURE.md, "Lock order". Nothing is called back into the
 * core with a lock held except set_error and log.
 */
#ifndef MGPU_OPENCL_INTERNAL_H
#define MGPU_OPENCL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdint.h>

#include "backend/backend.h"
#include "mgpu/error.h"
#include "mgpu/metrics.h"

/* Set by the entry function, read-only afterwards. Plugin code reaches the
 * core's allocator and error setter through plugin-seam.h (mgpu__calloc,
 * mgpu__free, mgpu__error). */
extern const mgpu__backend_env *mgpu__ocl_env;
#define MGPU__PLUGIN_ENV mgpu__ocl_env
#include "backend/plugin-seam.h"

/* A cached program of one physical device: the built-ins, or the OpenCL C
 * variant of one mgpu_kernel. lock serializes the build only; built is
 * set (with __atomic release, after program, rc and log) once the build
 * ran, and from then on the entry is read without a lock. Its cl_kernels
 * are per stream (mgpu__ocl_skern): a cl_kernel's arguments are shared
 * state, so two streams must not set them on one. */
typedef struct mgpu__ocl_prog {
  const void *key; /* the mgpu_kernel, or &builtins_key */
  const char *src; /* the text it was built from */
  const char *name; /* the kernel's name (NULL for the built-ins) */
  cl_program program;
  int built;            /* the build ran (see above) */
  int rc;               /* 0, or the build's error code (kept) */
  char *log;            /* the build log of a failed build (owned) */
  pthread_mutex_t lock; /* see above */
  struct mgpu__ocl_prog *next; /* set before the entry is published */
} mgpu__ocl_prog;

/* One kernel of a program as one stream uses it (kernels.c): made on the
 * stream's first launch of it, under and guarded by the stream's lock,
 * released with the stream. slot: 0 for a user kernel, 1 + the built-in's
 * index. */
typedef struct mgpu__ocl_skern {
  const mgpu__ocl_prog *prog;
  int slot;
  cl_kernel kernel;
  int nargs; /* its parameter count, asked once */
  /* The bytes a user kernel's one argument was last set to (args_known),
   * owned, args_cap bytes. */
  int args_known;
  void *args;
  size_t args_size, args_cap;
  struct mgpu__ocl_skern *next;
} mgpu__ocl_skern;

/* One physical device, found by the probe. Fields are set once. */
typedef struct mgpu__ocl_phys {
  cl_device_id dev;
  cl_context ctx; /* the platform's context */
  int platform;   /* index of the platform */
  char name[96];
  char platform_name[64];
  cl_ulong global_mem;
  cl_uint compute_units;
  cl_device_svm_capabilities svm;
  int has_fp64;
  size_t max_work_group;
  /* Programs of this device: entries are put at the head under
   * progs_lock and published with __atomic release, never removed before
   * the process ends, so a lookup walks the list without the lock. */
  pthread_mutex_t progs_lock;
  mgpu__ocl_prog *progs;
} mgpu__ocl_phys;

struct mgpu__bdevice {
  int id; /* mgpu device id */
  int ordinal;
  int split_index, split_count;
  mgpu__ocl_phys *phys;
  /* The sub-device a split runs its queues on (subdev.c), or NULL: the
   * whole physical device. Owned, released at close. */
  cl_device_id sub;
  /* Set by lose (or an error that loses the device), never cleared; read
   * with __atomic builtins. lost_why is written before lost, under the
   * registry lock. */
  int lost;
  char lost_why[160];
};

/* A copy whose time is read from its profiling event once it completed. */
typedef struct mgpu__ocl_timed_copy {
  cl_event ev;
  int path; /* MGPU_METRIC_PATH_... */
  size_t bytes;
  struct mgpu__ocl_timed_copy *next;
} mgpu__ocl_timed_copy;

/* A command whose profiling times go to busy_ns and a span (trace.c). */
typedef struct mgpu__ocl_span mgpu__ocl_span;

struct mgpu__bstream {
  cl_command_queue q;
  mgpu__bdevice *d;
  /* Set at creation, read-only afterwards. profiling: q has
   * CL_QUEUE_PROFILING_ENABLE (MGPU_OPENCL_BUSY=1, or a trace recorded
   * when the stream was made): its commands may be timed (copies, spans,
   * event times). busy: busy time is counted (MGPU_OPENCL_BUSY=1; implies
   * profiling). */
  int profiling;
  int busy;
  pthread_mutex_t lock; /* orders enqueues with last; guards copies */
  cl_event last;        /* the newest command's event, or NULL */
  mgpu__ocl_timed_copy *copies; /* not yet handed to the metrics */
  int ncopies;
  /* trace.c, under lock: commands not yet read, in queue order; spare
   * entries; the device-to-host clock offset once measured. */
  mgpu__ocl_span *spans, *spans_tail, *spare_spans;
  int nspans;
  uint64_t span_seq; /* entries ever queued: the number of the newest */
  int clock_known;
  int64_t clock_offset;
  uint32_t track; /* the stream's trace track */
  /* The program entry of the stream's last launch (kernels.c), a hint
   * read and written with __atomic builtins; entries live as long as the
   * process. */
  struct mgpu__ocl_prog *prog_hint;
  /* kernels.c, under lock: the stream's own cl_kernels, the last used
   * first. */
  mgpu__ocl_skern *kerns;
  /* trace.c, under lock: the first command of the stream's open busy
   * interval (a reference), or NULL when none is open. */
  cl_event busy_first;
};

struct mgpu__bevent {
  pthread_mutex_t lock; /* guards ev */
  cl_event ev;          /* the marker of the last record, or NULL */
  cl_command_queue q;   /* the queue it was recorded on (compared only) */
  int timed;            /* that queue has profiling (ev has times) */
};

/* ---- errors (opencl.c) ---- */

/* The name of a CL error code ("CL_OUT_OF_RESOURCES"). */
const char *mgpu__ocl_err_name(cl_int err);
/* Sets the detail "device N: what: CL_X" and returns the fitting code;
 * CL_DEVICE_NOT_AVAILABLE and CL_OUT_OF_RESOURCES lose the device (and
 * every split of the same physical device) and return MGPU_EDEVLOST. */
int mgpu__ocl_fail(mgpu__bdevice *d, cl_int err, const char *what);
int mgpu__ocl_lost(mgpu__bdevice *d, char *why, size_t why_size);

/* ---- the table's slots ---- */

/* memory.c */
/* The core table's slots: mgpu__ocl_<slot>, declared from backend.h's list
 * so that each signature is written once (a slot this backend leaves NULL
 * is declared and not defined). */
#define MGPU__OCL_SLOT(group, seam, ret, name, params, args, dev)             \
  ret mgpu__ocl_##name params;
MGPU__BACKEND_CORE_SLOTS(MGPU__OCL_SLOT)
#undef MGPU__OCL_SLOT

/* stream.c */
/* The relay thread (stream.c), running while a device is open: start
 * returns 0 or MGPU_ENOMEM (without the detail). */
int mgpu__ocl_relay_start(void);
void mgpu__ocl_relay_stop(void);

/* The enqueue helpers of stream.c, for kernels.c: s->lock held by the
 * caller between begin and end; end keeps ev as the stream's last event
 * (taking the caller's reference) when err is CL_SUCCESS. */
void mgpu__ocl_enqueue_begin(mgpu__bstream *s);
void mgpu__ocl_enqueue_end(mgpu__bstream *s, cl_int err, cl_event ev);
/* Between begin and end: ev (queued) is a copy of bytes on path, whose
 * time goes to the metrics once it completed. */
void mgpu__ocl_copy_timed(mgpu__bstream *s, cl_event ev, int path,
                          size_t bytes);

/* trace.c. op_timed: between enqueue_begin and enqueue_end, while a trace
 * is recorded and s has profiling, ev (queued: a kernel, copy or fill)
 * becomes a span (the core's tag, else name with bytes). busy_queued:
 * s->lock held, s->busy set, ev queued and about to become s->last: closes
 * the open busy interval if s->last completed, opens one at ev if none is
 * open. busy_drop: s->lock held,
 * ends the open interval uncounted. harvest: reads what completed; seen:
 * the stream's last event, which the caller saw complete without error
 * (the queue was idle then, so the clock may be measured and the busy
 * interval closed), or NULL; done: the entries numbered up to it completed
 * without error, seen from a later command, so their status need not be
 * asked; 0: none known. stream_free: at destroy, after clFinish. */
void mgpu__ocl_op_timed(mgpu__bstream *s, cl_event ev, const char *name,
                        size_t bytes);
void mgpu__ocl_busy_queued(mgpu__bstream *s, cl_event ev);
void mgpu__ocl_busy_drop(mgpu__bstream *s);
void mgpu__ocl_trace_harvest(mgpu__bstream *s, cl_event seen, uint64_t done);
void mgpu__ocl_trace_stream_free(mgpu__bstream *s);

/* subdev.c: sub-device index of ph partitioned equally into count (for
 * mgpu device id), or NULL (logged at info) where the device cannot be;
 * the caller owns it (release). */
cl_device_id mgpu__ocl_subdevice_get(mgpu__ocl_phys *ph, int id, int index,
                                     int count);
void mgpu__ocl_subdevice_release(cl_device_id sub);

/* kernels.c: releases the stream's own kernels (at destroy). */
void mgpu__ocl_stream_kernels_free(mgpu__bstream *s);

#endif /* MGPU_OPENCL_INTERNAL_H */
