/* mgpu_init and mgpu_shutdown: the device table and its life cycle.
 *
 * mgpu_init resolves the configuration, turns MGPU_DEVICES into a list of
 * (backend, physical device, split) entries, opens each device through its
 * backend and starts its host thread. Anything that fails unwinds what was
 * opened, in reverse order. With MGPU_DEVICES unset it asks the CUDA plugin
 * for GPUs and falls back to four host devices (saying why under
 * MGPU_LOG=info).
 *
 * init_lock guards the table while it is built and torn down; between the
 * two, `devices` and `ndevices` are read-only and `initialized` (an atomic)
 * tells readers the table is complete.
 *
 * fork: a child forked after mgpu_init has none of the library's threads.
 * pthread_atfork handlers (registered at the first mgpu_init) hold
 * init_lock across fork, so the table is never copied half-built, and mark
 * the child: `initialized` drops to 0 and mgpu__forked_set names the parent,
 * which turns every later call into MGPU_EFORK (util/error.c, handle.c). Nothing
 * is freed in the child: the copies belong to threads that are not there.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/capture.h"
#include "core/core-internal.h"
#include "util/fault.h"
#include "util/numa.h"

static mgpu__mutex init_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_INIT);
static mgpu__device *devices[MGPU_MAX_DEVICES];
static int ndevices;
static _Atomic int initialized;
static pid_t initialized_by;      /* getpid() of the mgpu_init that worked */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void) { mgpu__mutex_lock(&init_lock); }
static void atfork_parent(void) { mgpu__mutex_unlock(&init_lock); }
static void atfork_child(void) {
  if (initialized) {
    mgpu__forked_set((int)initialized_by);
    initialized = 0;
  }
  mgpu__mutex_unlock_in_child(&init_lock); /* taken in prepare */
}
static void atfork_register(void) {
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}


static _Atomic unsigned init_epoch;
unsigned mgpu__init_epoch(void) { return init_epoch; }

static mgpu_config config;      /* resolved, valid while initialized */
static char devices_spec[256];  /* config.devices points here */
static char plugin_path[1024];  /* config.plugin_path points here */
static char metrics_path[1024]; /* config.metrics points here */
static int trace_from_init;     /* mgpu_init started the trace (MGPU_TRACE) */
static const mgpu__backend_ops *cuda_ops;
static const mgpu__backend_ops *opencl_ops;

static void env_metric_add(int dev, mgpu__bmetric metric, uint64_t value) {
  if (metric == MGPU__BMETRIC_BUSY_NS)
    mgpu__metric_add(dev, MGPU__M_busy_ns, value);
}

static const mgpu__obs_api obs_api = {
    .trace_enabled = mgpu_trace_active,
    .tag_copy = mgpu__trace_tag_copy,
    .span_tag = mgpu__trace_span_tag,
    .track_new = mgpu__trace_track_new,
    .path = mgpu__obs_path,
    .copy_ran = mgpu__obs_copy_ran,
    .now_ns = mgpu__now_ns,
};

static mgpu__backend_env backend_env = {
    .abi = MGPU__BACKEND_ABI,
    .log = mgpu__log,
    .set_error = mgpu__error,
    .metric_add = env_metric_add,
    .config = &config,
    .numa_node_of_bus_id = mgpu__numa_node_of_bus_id,
    .obs = &obs_api,
    .thread_role_set = mgpu__thread_role_set,
    .malloc_fn = mgpu__malloc,
    .calloc_fn = mgpu__calloc,
    .realloc_fn = mgpu__realloc,
    .aligned_alloc_fn = mgpu__aligned_alloc,
    .free_fn = mgpu__free,
};

/* Shutdown hooks of the layers below the core (mgpu__on_shutdown), kept
 * sorted by layer, the lowest layer first and, within a layer, the last
 * registered first: the order they run in. Registered from constructors or
 * before mgpu_init; hooks_lock guards the list. */
#define MAX_HOOKS 32
static mgpu__mutex hooks_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_HOOKS);
static struct {
  mgpu__hook_fn fn;
  mgpu__layer layer;
} shutdown_hooks[MAX_HOOKS];
static int nshutdown_hooks;

void mgpu__on_shutdown(mgpu__hook_fn fn, mgpu__layer layer) {
  mgpu__mutex_lock(&hooks_lock);
  int known = 0;
  for (int i = 0; i < nshutdown_hooks; i++) known |= shutdown_hooks[i].fn == fn;
  if (!known && nshutdown_hooks == MAX_HOOKS)
    abort(); /* a fixed table too small is a bug in mgpu, caught at load */
  if (!known) {
    int at = 0; /* before the first hook of this layer or a higher one */
    while (at < nshutdown_hooks && shutdown_hooks[at].layer > layer) at++;
    for (int i = nshutdown_hooks; i > at; i--)
      shutdown_hooks[i] = shutdown_hooks[i - 1];
    shutdown_hooks[at].fn = fn;
    shutdown_hooks[at].layer = layer;
    nshutdown_hooks++;
  }
  mgpu__mutex_unlock(&hooks_lock);
}

static void run_shutdown_hooks(void) {
  mgpu__mutex_lock(&hooks_lock);
  int n = nshutdown_hooks;
  mgpu__hook_fn hooks[MAX_HOOKS];
  for (int i = 0; i < n; i++) hooks[i] = shutdown_hooks[i].fn;
  mgpu__mutex_unlock(&hooks_lock);
  for (int i = 0; i < n; i++) hooks[i]();
}

/* The gate of the calls that reach the device table without holding a
 * handle that mgpu_shutdown would wait for (allocation, stream and event
 * creation, synchronize, the destroys once their handle is closed...).
 * `library` is a handle of the table (MGPU__H_LIBRARY) made by mgpu_init;
 * mgpu_shutdown closes it, so later calls are MGPU_ENOINIT, and waits for
 * the calls inside before it frees anything. A thread passes freely while
 * it is already inside (gate_depth), and so does the thread running
 * mgpu_shutdown (its hooks call the public functions). */
static _Atomic uintptr_t library;
static _Thread_local int gate_depth;
static _Thread_local uintptr_t gate_held;
static _Thread_local int shutdown_thread;
static _Thread_local const char *thread_owner; /* see mgpu__thread_owned_by */

void mgpu__thread_owned_by(const char *what) { thread_owner = what; }

int mgpu__lib_enter(const char *what) {
  if (gate_depth > 0 || shutdown_thread) {
    gate_depth++;
    return 0;
  }
  uintptr_t h = atomic_load_explicit(&library, memory_order_acquire);
  if (h == 0 || mgpu__handle_hold(h, MGPU__H_LIBRARY) == NULL)
    return mgpu__error(MGPU_ENOINIT, "%s: mgpu_init has not been called%s",
                       what, initialized ? " (mgpu_shutdown is under way)"
                                         : "");
  gate_held = h;
  gate_depth = 1;
  return 0;
}

void mgpu__lib_leave(void) {
  if (--gate_depth == 0 && gate_held != 0) {
    mgpu__handle_put(gate_held);
    gate_held = 0;
  }
}

int mgpu__device_enter(int id, mgpu__device **out) {
  char what[32];
  snprintf(what, sizeof what, "device %d", id);
  int rc = mgpu__lib_enter(what);
  if (rc != 0) return rc;
  rc = mgpu__device_check(id, out);
  if (rc != 0) mgpu__lib_leave();
  return rc;
}

mgpu__device *mgpu__device_get(int id) {
  if (!initialized || id < 0 || id >= ndevices) return NULL;
  return devices[id];
}

int mgpu__device_check(int id, mgpu__device **out) {
  if (!initialized)
    return mgpu__error(MGPU_ENOINIT, "device %d: mgpu_init has not been called",
                       id);
  if (id < 0 || id >= ndevices)
    return mgpu__error(MGPU_ENODEV, "device %d does not exist (%d devices are "
                       "open: 0 to %d)", id, ndevices, ndevices - 1);
  *out = devices[id];
  return 0;
}

int mgpu__ndevices(void) { return initialized ? ndevices : 0; }

const mgpu_config *mgpu__config(void) { return &config; }

int mgpu_is_initialized(void) { return initialized; }

int mgpu_device_count(void) {
  if (!initialized)
    return mgpu__error(MGPU_ENOINIT, "mgpu_device_count: mgpu_init has not "
                       "been called");
  return ndevices;
}

/* Frees the struct and the locks open_device made. */
static void free_device(mgpu__device *d) {
  mgpu__mutex_destroy(&d->mempool_lock);
  mgpu__mutex_destroy(&d->spare_lock);
  mgpu__cond_destroy(&d->streams_cond);
  mgpu__mutex_destroy(&d->streams_lock);
  mgpu__cond_destroy(&d->queue_cond);
  mgpu__mutex_destroy(&d->queue_lock);
  mgpu__free(d);
}

/* Opens one device as table entry `id`. */
static int open_device(const mgpu__backend_ops *ops, int ordinal, int split,
                       int nsplit) {
  ops = mgpu__backend_fault_wrap(ops); /* every backend call is a fault site */
  int id = ndevices;
  if (id == MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "MGPU_DEVICES='%s' names more than %d "
                       "devices", config.devices, MGPU_MAX_DEVICES);
  /* Aligned: the fast lane of mgpu_run_on_device is a cache line of its
   * own (internal.h). */
  mgpu__device *d = mgpu__aligned_alloc(64, sizeof *d);
  if (d == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host memory", id);
  memset(d, 0, sizeof *d);
  d->id = id;
  d->ops = ops;
  d->spec.id = id;
  d->spec.ordinal = ordinal;
  d->spec.split_index = split;
  d->spec.split_count = nsplit;
  mgpu__mutex_init(&d->queue_lock, MGPU__LOCK_DEV_QUEUE);
  mgpu__cond_init(&d->queue_cond);
  mgpu__mutex_init(&d->streams_lock, MGPU__LOCK_DEV_STREAMS);
  mgpu__cond_init(&d->streams_cond);
  mgpu__mutex_init(&d->spare_lock, MGPU__LOCK_DEV_SPARE);
  mgpu__mutex_init(&d->mempool_lock, MGPU__LOCK_DEV_MEMPOOL);
  int rc = ops->open(&d->spec, &d->bdev);
  if (rc != 0) goto fail_locks;
  if (ops->caps.mem_model == MGPU__MEM_MODEL_HOST) {
    d->budget = config.host_mem;
  } else if (nsplit > 1) {
    size_t free_b = 0, total_b = 0;
    if (ops->mem_info(d->bdev, &free_b, &total_b) == 0)
      d->budget = total_b / (size_t)nsplit;
  }
  devices[id] = d;
  ndevices++; /* the host thread may look itself up */
  rc = mgpu__device_thread_start(d);
  if (rc != 0) goto fail_close;
  mgpu__log(MGPU_LOG_INFO, "device %d: %s device %d%s", id, ops->name, ordinal,
            nsplit > 1 ? " (split)" : "");
  return 0;
fail_close:
  ndevices--;
  devices[id] = NULL;
  ops->close(d->bdev);
fail_locks:
  free_device(d);
  return rc;
}

static void close_device(mgpu__device *d) {
  mgpu__device_thread_stop(d);
  d->ops->close(d->bdev);
  free_device(d);
}

static int load_cuda(void) {
  if (cuda_ops == NULL) cuda_ops = mgpu__cuda_backend_load(&backend_env);
  return cuda_ops != NULL ? 0 : MGPU_EPLUGIN;
}

static int load_opencl(void) {
  if (opencl_ops == NULL) opencl_ops = mgpu__opencl_backend_load(&backend_env);
  return opencl_ops != NULL ? 0 : MGPU_EPLUGIN;
}

/* "local": GPU (local rank mod GPUs) when the CUDA plugin finds GPUs, else
 * one host device. */
static int open_local(const mgpu__devspec_entry *e) {
  int count = 0;
  int rc = load_cuda();
  if (rc == 0) rc = cuda_ops->probe(&count);
  if (rc != 0 || count == 0) {
    mgpu__log(MGPU_LOG_INFO, "MGPU_DEVICES=local: local rank %d, no GPU in "
              "use: one host device", e->ordinal);
    mgpu_error_clear();
    return open_device(mgpu__host_backend(&backend_env), ndevices, 0, 1);
  }
  int gpu = e->ordinal % count;
  if (e->ordinal >= count || (e->local_size > count))
    mgpu__log(MGPU_LOG_WARN, "MGPU_DEVICES=local: local rank %d of %d shares "
              "GPU %d (%d GPUs)", e->ordinal, e->local_size, gpu, count);
  else
    mgpu__log(MGPU_LOG_INFO, "MGPU_DEVICES=local: local rank %d uses GPU %d",
              e->ordinal, gpu);
  return open_device(cuda_ops, gpu, 0, 1);
}

static int open_entry(const mgpu__devspec_entry *e) {
  const mgpu__backend_ops *host = mgpu__host_backend(&backend_env);
  if (e->local) return open_local(e);
  if (e->backend == MGPU_BACKEND_HOST) {
    for (int i = 0; i < e->count; i++) {
      int rc = open_device(host, ndevices, 0, 1);
      if (rc != 0) return rc;
    }
    return 0;
  }
  int is_cuda = e->backend == MGPU_BACKEND_CUDA;
  int rc = is_cuda ? load_cuda() : load_opencl();
  if (rc != 0) return rc;
  const mgpu__backend_ops *ops = is_cuda ? cuda_ops : opencl_ops;
  int count = 0;
  rc = ops->probe(&count);
  if (rc != 0) return rc;
  if (count == 0)
    return mgpu__error(MGPU_ENODEV, "MGPU_DEVICES='%s': no %s device found",
                       config.devices, is_cuda ? "CUDA" : "OpenCL");
  int first = e->all ? 0 : e->ordinal, last = e->all ? count - 1 : e->ordinal;
  if (first >= count)
    return mgpu__error(MGPU_ENODEV, "MGPU_DEVICES='%s': %s %d does not exist "
                       "(%d found)", config.devices,
                       is_cuda ? "GPU" : "OpenCL device", first, count);
  for (int g = first; g <= last; g++)
    for (int s = 0; s < e->split; s++) {
      rc = open_device(ops, g, s, e->split);
      if (rc != 0) return rc;
    }
  return 0;
}

/* MGPU_DEVICES unset: every GPU if the plugin finds one, else host:4. */
static int open_default(void) {
  mgpu__devspec_entry e = {.backend = MGPU_BACKEND_CUDA, .all = 1, .split = 1};
  int count = 0;
  int rc = load_cuda();
  if (rc == 0) rc = cuda_ops->probe(&count);
  if (rc == 0 && count > 0) return open_entry(&e);
  /* A failed probe's detail names the CUDA error (no driver, no device). */
  mgpu__log(MGPU_LOG_INFO, "no GPU in use (%s); falling back to the host "
            "backend with 4 devices", rc == 0
                ? "the CUDA backend found no device"
                : mgpu_error_detail());
  mgpu_error_clear();
  e.backend = MGPU_BACKEND_HOST;
  e.count = 4;
  return open_entry(&e);
}

static void unwind_devices(void) {
  while (ndevices > 0) {
    ndevices--;
    close_device(devices[ndevices]);
    devices[ndevices] = NULL;
  }
  if (cuda_ops != NULL) {
    mgpu__cuda_backend_unload();
    cuda_ops = NULL;
  }
  if (opencl_ops != NULL) {
    mgpu__opencl_backend_unload();
    opencl_ops = NULL;
  }
}

/* Each device is a trace process named with its properties. */
static void name_devices(void) {
  mgpu__trace_forget_names();
  for (int i = 0; i < ndevices; i++) {
    mgpu_device_props p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    char name[160];
    if (devices[i]->ops->props(devices[i]->bdev, &p) == 0)
      snprintf(name, sizeof name, "device %d: %s", i, p.name);
    else
      snprintf(name, sizeof name, "device %d: %s", i, devices[i]->ops->name);
    mgpu_error_clear();
    mgpu__trace_name_device(i, name);
  }
}

/* MGPU_METRICS: "stderr", or a file (JSON when its name ends in .json). */
static int print_metrics(void) {
  const char *to = config.metrics;
  if (strcmp(to, "stderr") == 0) return mgpu_metrics_print(stderr, MGPU_METRICS_TABLE);
  size_t n = strlen(to);
  int json = n >= 5 && strcmp(to + n - 5, ".json") == 0;
  FILE *f = fopen(to, "w");
  if (f == NULL)
    return mgpu__error(MGPU_EIO, "MGPU_METRICS='%s': cannot create the file",
                       to);
  int rc = mgpu_metrics_print(f, json ? MGPU_METRICS_JSON : MGPU_METRICS_TABLE);
  if (fclose(f) != 0 && rc == 0)
    rc = mgpu__error(MGPU_EIO, "MGPU_METRICS='%s': writing failed", to);
  return rc;
}

/* Copies a string setting into the library's own buffer (the caller's may
 * not outlive mgpu_init) and points the field at it. */
static int keep_string(const char **field, char *buf, size_t size,
                       const char *var) {
  if (*field == NULL) return 0;
  if (strlen(*field) >= size)
    return mgpu__error(MGPU_EINVAL, "%s: longer than %zu characters", var,
                       size - 1);
  strcpy(buf, *field);
  *field = buf;
  return 0;
}

/* Resolves cfg into `config` and keeps what it points to (init_lock held). */
static int take_config(const mgpu_config *cfg) {
  int rc = mgpu__config_resolve(cfg, &config);
  if (rc != 0) return rc;
  init_epoch++; /* before the device threads start: they set theirs */
  if (config.fault != NULL) {
    char why[200];
    if (mgpu__fault_set(config.fault, why, sizeof why) != 0)
      return mgpu__error(MGPU_EINVAL, "MGPU_FAULT='%s': %s", config.fault, why);
  }
  if ((rc = keep_string(&config.devices, devices_spec, sizeof devices_spec,
                        "MGPU_DEVICES")) != 0 ||
      (rc = keep_string(&config.plugin_path, plugin_path, sizeof plugin_path,
                        "MGPU_PLUGIN_PATH")) != 0 ||
      (rc = keep_string(&config.metrics, metrics_path, sizeof metrics_path,
                        "MGPU_METRICS")) != 0)
    return rc;
  mgpu__log_set_level(config.log_level);
  return 0;
}

/* Opens the devices config.devices names, or the default ones; on failure
 * closes those it opened (init_lock held). */
static int open_devices(void) {
  int rc;
  if (config.devices == NULL) {
    rc = open_default();
  } else {
    mgpu__devspec_entry entries[MGPU_MAX_DEVICES];
    int n = 0;
    rc = mgpu__parse_devices(config.devices, entries, MGPU_MAX_DEVICES, &n);
    for (int i = 0; rc == 0 && i < n; i++) rc = open_entry(&entries[i]);
  }
  if (rc != 0) unwind_devices();
  return rc;
}

/* With the devices open: the recording floor, the trace MGPU_TRACE asks
 * for and the library's handle; on failure undoes all of it and closes the
 * devices (init_lock held). */
static int open_library(void) {
  mgpu__obs_open(ndevices);
  name_devices();
  int rc = 0;
  if (config.trace != NULL) {
    rc = mgpu_trace_start(config.trace);
    if (rc != 0) goto fail;
    trace_from_init = 1;
  }
  uintptr_t lib = mgpu__handle_new(MGPU__H_LIBRARY, devices);
  if (lib == 0) {
    if (trace_from_init) {
      trace_from_init = 0;
      mgpu_trace_stop();
    }
    rc = mgpu__error(MGPU_ENOMEM, "mgpu_init: no handle left for the device "
                     "table");
    goto fail;
  }
  atomic_store_explicit(&library, lib, memory_order_release);
  return 0;
fail:
  mgpu__obs_close();
  unwind_devices();
  return rc;
}

int mgpu_init(const mgpu_config *cfg) {
  if (mgpu__forked_from()) return mgpu__fork_error("mgpu_init");
  pthread_once(&atfork_once, atfork_register);
  mgpu__mutex_lock(&init_lock);
  int rc = 0;
  if (initialized) {
    rc = mgpu__error(MGPU_EALREADY, "mgpu_init: already initialized with %d "
                     "devices; call mgpu_shutdown first", ndevices);
    goto out;
  }
  if ((rc = take_config(cfg)) != 0 || (rc = open_devices()) != 0) goto out;
  initialized_by = getpid();
  if ((rc = open_library()) != 0) goto out;
  initialized = 1;
  mgpu__log(MGPU_LOG_INFO, "initialized %d device%s", ndevices,
            ndevices == 1 ? "" : "s");
out:
  mgpu__mutex_unlock(&init_lock);
  return rc;
}

static int drain_noop(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return 0;
}

/* MGPU_EBUSY where the calling thread is one mgpu_shutdown would wait for
 * or join, else 0. */
static int shutdown_refused(void) {
  /* Shutdown waits for every device and stops the library's threads: from
   * one of them it would wait for itself, then free what it is running. */
  const char *role = mgpu__thread_role();
  if (role != NULL)
    return mgpu__error(MGPU_EBUSY, "mgpu_shutdown called from %s: it waits "
                       "for that thread's own work; call it from a thread of "
                       "the program", role);
  int self = mgpu__current_host_thread_device();
  if (self >= 0)
    return mgpu__error(MGPU_EBUSY, "mgpu_shutdown called on device %d's host "
                       "thread (from a device function): it would wait for "
                       "itself", self);
  if (gate_depth > 0)
    return mgpu__error(MGPU_EBUSY, "mgpu_shutdown called from inside another "
                       "mgpu call (a callback): it would wait for itself");
  if (thread_owner != NULL)
    return mgpu__error(MGPU_EBUSY, "mgpu_shutdown called on %s: shutdown "
                       "joins that thread, it would wait for itself",
                       thread_owner);
  return 0;
}

/* Runs what was queued, synchronizes every device, then tears down the
 * layers below (hooks) and the core's streams, buffers and pools. The
 * first error of a device, or 0 (init_lock held). */
static int drain_and_release(void) {
  int rc = 0;
  /* Work queued with mgpu_run_on_device_async runs first, while its buffers
   * and streams still exist: a no-op queued behind it returns once it has
   * run (the queue is FIFO). */
  for (int i = 0; i < ndevices; i++) mgpu_run_on_device(i, drain_noop, NULL);
  mgpu__capture_drop_all(); /* a capturing stream refuses synchronize */
  for (int i = 0; i < ndevices; i++) {
    int r = mgpu_device_synchronize(i);
    if (rc == 0) rc = r;
  }
  run_shutdown_hooks();
  mgpu__streams_release_all(); /* events and user streams */
  mgpu__memory_release_all();
  for (int i = 0; i < ndevices; i++) {
    mgpu__spare_drain(devices[i]);
    mgpu__mempool_release(devices[i]);
  }
  return rc;
}

int mgpu_shutdown(void) {
  if (mgpu__forked_from()) return mgpu__fork_error("mgpu_shutdown");
  int rc = shutdown_refused();
  if (rc != 0) return rc;
  mgpu__mutex_lock(&init_lock);
  if (!initialized) {
    mgpu__mutex_unlock(&init_lock);
    return 0;
  }
  /* Later calls that need the device table are refused; the calls inside
   * finish first. The calls holding handles are waited for below, as each
   * kind of handle is closed. */
  uintptr_t lib = atomic_exchange_explicit(&library, 0, memory_order_acq_rel);
  int err = 0;
  if (mgpu__handle_close(lib, MGPU__H_LIBRARY, "mgpu_shutdown", &err) != NULL)
    mgpu__handle_retire(lib);
  shutdown_thread = 1;
  rc = drain_and_release();
  if (config.metrics != NULL) {
    int r = print_metrics();
    if (rc == 0) rc = r;
  }
  initialized = 0;
  mgpu__obs_close();
  unwind_devices();
  mgpu__numa_release();
  if (trace_from_init) {
    trace_from_init = 0;
    int r = mgpu_trace_stop();
    if (rc == 0) rc = r;
  }
  shutdown_thread = 0;
  mgpu__mutex_unlock(&init_lock);
  return rc;
}
