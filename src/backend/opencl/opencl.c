/* The OpenCL backend plugin: its entry symbol, the function table, the
 * probe of platforms and devices, the device life cycle and the errors.
 *
 * The core opens libmgpu-opencl.so with dlopen (src/backend/plugin.c),
 * looks up the entry named after its backend ABI (MGPU__PLUGIN_ENTRY) and
 * calls it with its environment.
 * The probe runs once per process: it lists every platform's devices, keeps
 * those with SVM and 64-bit addresses, and makes one context per platform
 * (see opencl-internal.h for why).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl-internal.h"
#include "mgpu/dlpack.h"

#define PLUGIN_EXPORT __attribute__((visibility("default")))

const mgpu__backend_env *mgpu__ocl_env;
/* The probe's result: nphys devices, set once. */
static mgpu__ocl_phys *phys_list;
static int nphys;

/* probe_lock guards the probe (once) and its result's publication. */
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static int probed;       /* the probe ran (guarded by probe_lock) */
static int probe_rc;     /* its result */
static char probe_detail[256];

/* The open devices, for props (peers) and for losing every split of one
 * physical device together. registry_lock guards open_devs and lost_why. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mgpu__bdevice *open_devs[MGPU_MAX_DEVICES];

/* ---- errors ---- */

const char *mgpu__ocl_err_name(cl_int err) {
  switch (err) {
#define N(x) \
  case x:    \
    return #x;
    N(CL_SUCCESS) N(CL_DEVICE_NOT_FOUND) N(CL_DEVICE_NOT_AVAILABLE)
    N(CL_COMPILER_NOT_AVAILABLE) N(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    N(CL_OUT_OF_RESOURCES) N(CL_OUT_OF_HOST_MEMORY)
    N(CL_PROFILING_INFO_NOT_AVAILABLE) N(CL_BUILD_PROGRAM_FAILURE)
    N(CL_MAP_FAILURE) N(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    N(CL_INVALID_VALUE) N(CL_INVALID_DEVICE) N(CL_INVALID_CONTEXT)
    N(CL_INVALID_COMMAND_QUEUE) N(CL_INVALID_MEM_OBJECT)
    N(CL_INVALID_PROGRAM) N(CL_INVALID_PROGRAM_EXECUTABLE)
    N(CL_INVALID_KERNEL_NAME) N(CL_INVALID_KERNEL) N(CL_INVALID_ARG_INDEX)
    N(CL_INVALID_ARG_VALUE) N(CL_INVALID_ARG_SIZE)
    N(CL_INVALID_KERNEL_ARGS) N(CL_INVALID_WORK_DIMENSION)
    N(CL_INVALID_WORK_GROUP_SIZE) N(CL_INVALID_WORK_ITEM_SIZE)
    N(CL_INVALID_GLOBAL_WORK_SIZE) N(CL_INVALID_EVENT_WAIT_LIST)
    N(CL_INVALID_EVENT) N(CL_INVALID_OPERATION) N(CL_INVALID_BUFFER_SIZE)
    N(CL_INVALID_BUILD_OPTIONS) N(CL_INVALID_PLATFORM)
#undef N
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "CL error";
  }
}

static int code_of(cl_int err) {
  switch (err) {
    case CL_SUCCESS: return 0;
    case CL_OUT_OF_HOST_MEMORY:
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
    case CL_INVALID_BUFFER_SIZE: return MGPU_ENOMEM;
    case CL_DEVICE_NOT_FOUND: return MGPU_ENODEV;
    case CL_INVALID_VALUE:
    case CL_INVALID_ARG_SIZE:
    case CL_INVALID_ARG_VALUE:
    case CL_INVALID_KERNEL_ARGS:
    case CL_INVALID_KERNEL_NAME:
    case CL_INVALID_WORK_GROUP_SIZE:
    case CL_INVALID_WORK_ITEM_SIZE:
    case CL_INVALID_GLOBAL_WORK_SIZE:
    case CL_BUILD_PROGRAM_FAILURE: return MGPU_EINVAL;
    default: return MGPU_EBACKEND;
  }
}

static void lose_one(mgpu__bdevice *d, const char *why) {
  /* registry_lock held */
  if (__atomic_load_n(&d->lost, __ATOMIC_RELAXED)) return;
  snprintf(d->lost_why, sizeof d->lost_why, "%s", why);
  __atomic_store_n(&d->lost, 1, __ATOMIC_RELEASE);
  mgpu__ocl_env->log(MGPU_LOG_WARN, "opencl device %d lost: %s", d->id, why);
}

static void ocl_lose(mgpu__bdevice *d, const char *why) {
  pthread_mutex_lock(&registry_lock);
  lose_one(d, why);
  pthread_mutex_unlock(&registry_lock);
}

int mgpu__ocl_lost(mgpu__bdevice *d, char *why, size_t why_size) {
  if (!__atomic_load_n(&d->lost, __ATOMIC_ACQUIRE)) return 0;
  if (why != NULL && why_size > 0) {
    pthread_mutex_lock(&registry_lock);
    snprintf(why, why_size, "%s", d->lost_why);
    pthread_mutex_unlock(&registry_lock);
  }
  return 1;
}

/* The implementation says the device stopped working: every mgpu device
 * cut from it is lost. */
static void lose_physical(mgpu__bdevice *d, const char *why) {
  pthread_mutex_lock(&registry_lock);
  lose_one(d, why);
  for (int i = 0; i < MGPU_MAX_DEVICES; i++)
    if (open_devs[i] != NULL && open_devs[i]->phys == d->phys)
      lose_one(open_devs[i], why);
  pthread_mutex_unlock(&registry_lock);
}

int mgpu__ocl_fail(mgpu__bdevice *d, cl_int err, const char *what) {
  int id = d != NULL ? d->id : -1;
  if (d != NULL &&
      (err == CL_DEVICE_NOT_AVAILABLE || err == CL_OUT_OF_RESOURCES)) {
    char why[160];
    snprintf(why, sizeof why, "%s in %s", mgpu__ocl_err_name(err), what);
    lose_physical(d, why);
    return mgpu__error(MGPU_EDEVLOST, "device %d: %s: %s (%d): "
                       "the OpenCL device is lost", id, what,
                       mgpu__ocl_err_name(err), (int)err);
  }
  return mgpu__error(code_of(err), "device %d: %s: %s (%d)", id,
                     what, mgpu__ocl_err_name(err), (int)err);
}

/* ---- probe ---- */

/* Whether device dev of platform pname can be an mgpu device: coarse-grained
 * SVM, 64-bit addresses, not PoCL's basic driver. Logs why not. */
static int device_usable(cl_device_id dev, const char *pname) {
  cl_device_svm_capabilities svm = 0;
  cl_uint bits = 0;
  char dname[96] = "";
  (void)clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL);
  if (clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm,
                      NULL) != CL_SUCCESS)
    svm = 0;
  (void)clGetDeviceInfo(dev, CL_DEVICE_ADDRESS_BITS, sizeof bits, &bits, NULL);
  /* PoCL's "basic" driver runs a command that waits for a user event or
   * another queue's event in the thread that completes that event, with
   * the implementation's locks held (it deadlocks), or lets clFinish
   * return before such a command ran: mgpu's ordering rests on exactly
   * those waits, so its devices are not used. */
  int pocl_basic = strstr(pname, "Portable Computing Language") != NULL &&
                   strncmp(dname, "basic", 5) == 0;
  if ((svm & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER) && bits == 64 && !pocl_basic)
    return 1;
  mgpu__ocl_env->log(MGPU_LOG_INFO, "opencl: %s on %s skipped (%s)", dname,
                     pname, pocl_basic ? "PoCL's basic driver orders "
                     "waits across queues wrongly"
                     : bits != 64 ? "not 64-bit"
                                  : "no shared virtual memory");
  return 0;
}

/* Fills ph, the entry of device dev (platform pi, context ctx). */
static void phys_fill(mgpu__ocl_phys *ph, cl_device_id dev, cl_context ctx,
                      int pi, const char *pname) {
  memset(ph, 0, sizeof *ph);
  ph->dev = dev;
  ph->ctx = ctx;
  ph->platform = pi;
  snprintf(ph->platform_name, sizeof ph->platform_name, "%s", pname);
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_NAME, sizeof ph->name - 1,
                        ph->name, NULL);
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_GLOBAL_MEM_SIZE,
                        sizeof ph->global_mem, &ph->global_mem, NULL);
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_MAX_COMPUTE_UNITS,
                        sizeof ph->compute_units, &ph->compute_units, NULL);
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_SVM_CAPABILITIES, sizeof ph->svm,
                        &ph->svm, NULL);
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE,
                        sizeof ph->max_work_group, &ph->max_work_group,
                        NULL);
  cl_device_fp_config fp64 = 0;
  (void)clGetDeviceInfo(ph->dev, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64,
                        &fp64, NULL);
  ph->has_fp64 = fp64 != 0;
  pthread_mutex_init(&ph->progs_lock, NULL);
}

/* Adds the usable devices of platform p (index pi) to the list and makes
 * its context. Returns 0, or a CL error only for a failure of the host. */
static cl_int probe_platform(cl_platform_id p, int pi, mgpu__ocl_phys **list,
                             int *n, int *cap) {
  cl_uint nd = 0;
  cl_int err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
  if (err == CL_DEVICE_NOT_FOUND || nd == 0) return CL_SUCCESS;
  if (err != CL_SUCCESS) return err;
  cl_device_id *ids = mgpu__calloc(nd, sizeof *ids);
  cl_device_id *usable = mgpu__calloc(nd, sizeof *usable);
  if (ids == NULL || usable == NULL) {
    mgpu__free(ids);
    mgpu__free(usable);
    return CL_OUT_OF_HOST_MEMORY;
  }
  err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ids, NULL);
  char pname[64] = "";
  (void)clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
  cl_uint nu = 0;
  for (cl_uint i = 0; err == CL_SUCCESS && i < nd; i++)
    if (device_usable(ids[i], pname)) usable[nu++] = ids[i];
  cl_context ctx = NULL;
  if (err == CL_SUCCESS && nu > 0) {
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                     (cl_context_properties)p, 0};
    ctx = clCreateContext(props, nu, usable, NULL, NULL, &err);
  }
  if (err == CL_SUCCESS && *n + (int)nu > *cap) {
    int ncap = *n + (int)nu + 8;
    mgpu__ocl_phys *l = mgpu__realloc(*list, (size_t)ncap * sizeof *l);
    if (l == NULL) {
      err = CL_OUT_OF_HOST_MEMORY;
    } else {
      *list = l;
      *cap = ncap;
    }
  }
  for (cl_uint i = 0; err == CL_SUCCESS && i < nu; i++)
    phys_fill(&(*list)[(*n)++], usable[i], ctx, pi, pname);
  if (err != CL_SUCCESS && ctx != NULL) clReleaseContext(ctx);
  mgpu__free(ids);
  mgpu__free(usable);
  return err;
}

static int probe_all(void) {
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(0, NULL, &np);
  if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ || np == 0) return 0;
  if (err != CL_SUCCESS) goto fail;
  cl_platform_id *ps = mgpu__calloc(np, sizeof *ps);
  if (ps == NULL) {
    err = CL_OUT_OF_HOST_MEMORY;
    goto fail;
  }
  err = clGetPlatformIDs(np, ps, NULL);
  mgpu__ocl_phys *list = NULL;
  int n = 0, cap = 0;
  for (cl_uint i = 0; err == CL_SUCCESS && i < np; i++)
    err = probe_platform(ps[i], (int)i, &list, &n, &cap);
  mgpu__free(ps);
  if (err != CL_SUCCESS) {
    /* Contexts made for earlier platforms are kept by nobody: release. */
    for (int i = 0; i < n; i++)
      if (i == 0 || list[i].ctx != list[i - 1].ctx) clReleaseContext(list[i].ctx);
    mgpu__free(list);
    goto fail;
  }
  phys_list = list;
  nphys = n;
  return 0;
fail:
  snprintf(probe_detail, sizeof probe_detail, "no OpenCL device can be used: "
           "listing platforms and devices failed with %s (%d)",
           mgpu__ocl_err_name(err), (int)err);
  return err == CL_OUT_OF_HOST_MEMORY ? MGPU_ENOMEM : MGPU_EBACKEND;
}

static int ocl_probe(int *count) {
  *count = 0;
  pthread_mutex_lock(&probe_lock);
  if (!probed) {
    probe_rc = probe_all();
    probed = 1;
  }
  int rc = probe_rc;
  pthread_mutex_unlock(&probe_lock);
  if (rc != 0) return mgpu__error(rc, "%s", probe_detail);
  *count = nphys;
  return 0;
}

/* ---- open, close, props ---- */

static int ocl_open(const mgpu__device_spec *spec, mgpu__bdevice **out) {
  *out = NULL;
  int count = 0;
  int rc = ocl_probe(&count);
  if (rc != 0) return rc;
  if (spec->ordinal < 0 || spec->ordinal >= count)
    return mgpu__error(MGPU_ENODEV, "device %d: OpenCL device %d "
                       "does not exist (%d found)", spec->id,
                       spec->ordinal, count);
  mgpu__bdevice *d = mgpu__calloc(1, sizeof *d);
  if (d == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory opening OpenCL device %d",
                       spec->id, spec->ordinal);
  d->id = spec->id;
  d->ordinal = spec->ordinal;
  d->split_index = spec->split_index;
  d->split_count = spec->split_count > 0 ? spec->split_count : 1;
  d->phys = &phys_list[spec->ordinal];
  if (d->split_count > 1)
    d->sub = mgpu__ocl_subdevice_get(d->phys, d->id, d->split_index,
                                     d->split_count);
  if (mgpu__ocl_relay_start() != 0) {
    mgpu__ocl_subdevice_release(d->sub);
    mgpu__free(d);
    return mgpu__error(MGPU_ENOMEM, "device %d: cannot start "
                       "the OpenCL plugin's relay thread",
                       spec->id);
  }
  pthread_mutex_lock(&registry_lock);
  if (d->id >= 0 && d->id < MGPU_MAX_DEVICES) open_devs[d->id] = d;
  pthread_mutex_unlock(&registry_lock);
  *out = d;
  return 0;
}

static void ocl_close(mgpu__bdevice *d) {
  if (d == NULL) return;
  pthread_mutex_lock(&registry_lock);
  if (d->id >= 0 && d->id < MGPU_MAX_DEVICES && open_devs[d->id] == d)
    open_devs[d->id] = NULL;
  pthread_mutex_unlock(&registry_lock);
  mgpu__ocl_relay_stop();
  mgpu__ocl_subdevice_release(d->sub);
  mgpu__free(d);
}

/* 1 if another open device shares d's platform (its context). */
static int has_peer(mgpu__bdevice *d) {
  int yes = 0;
  pthread_mutex_lock(&registry_lock);
  for (int i = 0; i < MGPU_MAX_DEVICES && !yes; i++)
    yes = open_devs[i] != NULL && open_devs[i] != d &&
          open_devs[i]->phys->ctx == d->phys->ctx;
  pthread_mutex_unlock(&registry_lock);
  return yes;
}

static int ocl_props(mgpu__bdevice *d, mgpu_device_props *p) {
  if (d->split_count > 1)
    snprintf(p->name, sizeof p->name, "%.80s [%d/%d]", d->phys->name,
             d->split_index, d->split_count);
  else
    snprintf(p->name, sizeof p->name, "%.95s", d->phys->name);
  snprintf(p->backend, sizeof p->backend, "opencl");
  p->backend_kind = MGPU_BACKEND_OPENCL;
  p->ordinal = d->ordinal;
  p->split_index = d->split_index;
  p->split_count = d->split_count;
  int rc = mgpu__ocl_mem_info(d, &p->free_mem, &p->total_mem);
  if (rc != 0) return rc;
  p->cc_major = p->cc_minor = 0;
  int cu = (int)d->phys->compute_units / d->split_count;
  p->multiprocessors = cu > 0 ? cu : 1;
  p->numa_node = -1;
  p->peer_capable = has_peer(d);
  p->pci_bus_id[0] = '\0';
  p->uuid[0] = '\0';
  return 0;
}

static int ocl_make_current(mgpu__bdevice *d) {
  (void)d; /* OpenCL has no current device: every call names its queue */
  return 0;
}

/* ---- the table ---- */

static const mgpu__backend_loss_ops ocl_loss_ops = {
    .lose = ocl_lose,
    .lost = mgpu__ocl_lost,
};

static const mgpu__backend_ops ocl_ops = {
    .name = "opencl",
    .kind = MGPU_BACKEND_OPENCL,
    .caps = {
        .mem_model = MGPU__MEM_MODEL_DEVICE,
        /* Device memory is coarse-grained SVM, not the host's to read;
         * pinned and unified memory are fine-grained SVM, which it is. */
        .host_visible = 1u << MGPU_MEM_PINNED | 1u << MGPU_MEM_UNIFIED,
        .splits_share_memory = 0,
        .kernel_variant = MGPU__KERNEL_OPENCL_SRC,
        .dlpack_device = kDLOpenCL,
        .dlpack_unified = kDLCPU,
        .dlpack_pinned = 0,
        .staging_chunk = (size_t)8 << 20,
        .graph_fill_16bit = 0,
    },
    .probe = ocl_probe,
    .open = ocl_open,
    .close = ocl_close,
    .props = ocl_props,
    .make_current = ocl_make_current,
    .mem_alloc = mgpu__ocl_mem_alloc,
    .mem_free = mgpu__ocl_mem_free,
    .mem_info = mgpu__ocl_mem_info,
    .stream_create = mgpu__ocl_stream_create,
    .stream_destroy = mgpu__ocl_stream_destroy,
    .stream_synchronize = mgpu__ocl_stream_synchronize,
    .stream_query = mgpu__ocl_stream_query,
    .stream_native = mgpu__ocl_stream_native,
    .event_create = mgpu__ocl_event_create,
    .event_destroy = mgpu__ocl_event_destroy,
    .event_record = mgpu__ocl_event_record,
    .event_synchronize = mgpu__ocl_event_synchronize,
    .event_query = mgpu__ocl_event_query,
    .event_elapsed_ms = mgpu__ocl_event_elapsed_ms,
    .stream_wait_event = mgpu__ocl_stream_wait_event,
    .memcpy_async = mgpu__ocl_memcpy_async,
    .memset_async = mgpu__ocl_memset_async,
    .memcpy2d_async = mgpu__ocl_memcpy2d_async,
    .launch = mgpu__ocl_launch,
    .builtin = mgpu__ocl_builtin,
    .host_callback = mgpu__ocl_host_callback,
    .peer_can_access = mgpu__ocl_peer_can_access,
    .peer_enable = mgpu__ocl_peer_enable,
    .peer_disable = mgpu__ocl_peer_disable,
    .memcpy_peer_async = mgpu__ocl_memcpy_peer_async,
    .loss = &ocl_loss_ops,
};

PLUGIN_EXPORT const mgpu__backend_ops *MGPU__PLUGIN_ENTRY_FN(
    const mgpu__backend_env *env) {
  if (env == NULL || env->abi != MGPU__BACKEND_ABI) {
    if (env != NULL && env->set_error != NULL)
      env->set_error(MGPU_EPLUGIN, "libmgpu-opencl.so has backend ABI %d, the "
                     "core offers %d", MGPU__BACKEND_ABI, env->abi);
    return NULL;
  }
  mgpu__ocl_env = env;
  return &ocl_ops;
}
