/* The CUDA backend plugin: its entry symbol, the function table, and the
 * device life cycle (probe, open, close, properties, make_current).
 *
 * The core opens libmgpu-cuda.so with dlopen (src/backend/plugin.c), looks
 * up the entry named after its backend ABI (MGPU__PLUGIN_ENTRY) and calls it
 * with its environment. The entry hands back one of two const tables: with
 * the NCCL collective sub-table when libnccl could be opened and no GPU is
 * split (NCCL refuses two ranks on one GPU), else without it so the core
 * runs its own ring.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"
#include "mgpu/dlpack.h"

#define PLUGIN_EXPORT __attribute__((visibility("default")))

const mgpu__backend_env *mgpu__cuda_env;
mgpu__cuda_driver mgpu__cuda_drv;
int mgpu__cuda_busy_time = 1;

/* The open devices, so that props can say whether a device has a peer.
 * open_lock guards open_devs; open and close are called by mgpu_init and
 * mgpu_shutdown, props by any thread. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static mgpu__bdevice *open_devs[MGPU_MAX_DEVICES];

static void registry_set(mgpu__bdevice *d, mgpu__bdevice *value) {
  if (d->id < 0 || d->id >= MGPU_MAX_DEVICES) return;
  pthread_mutex_lock(&open_lock);
  open_devs[d->id] = value;
  pthread_mutex_unlock(&open_lock);
}

/* 1 if some other open device is on the same GPU or a peer GPU. */
static int has_peer(mgpu__bdevice *d) {
  int yes = 0;
  pthread_mutex_lock(&open_lock);
  for (int i = 0; i < MGPU_MAX_DEVICES && !yes; i++) {
    mgpu__bdevice *o = open_devs[i];
    if (o == NULL || o == d) continue;
    int can = 0;
    if (o->ordinal == d->ordinal)
      can = 1;
    else if (cudaDeviceCanAccessPeer(&can, d->ordinal, o->ordinal) !=
             cudaSuccess)
      (void)cudaGetLastError();
    yes = can;
  }
  pthread_mutex_unlock(&open_lock);
  return yes;
}

/* ---- errors ---- */

/* 1 for an error that poisons the CUDA context until the process ends (an
 * illegal address, a launch failure, ...): mgpu__cuda_fail then marks the
 * device (and every device on the same GPU) lost and returns
 * MGPU_EDEVLOST. */
static int sticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
#if CUDART_VERSION >= 11040
    case cudaErrorExternalDevice:
#endif
      return 1;
    default:
      return 0;
  }
}

/* Guards lost_why of every device against two losses at once. */
static pthread_mutex_t lost_lock = PTHREAD_MUTEX_INITIALIZER;

static void lose_one(mgpu__bdevice *d, const char *why) {
  pthread_mutex_lock(&lost_lock);
  if (!__atomic_load_n(&d->lost, __ATOMIC_RELAXED)) {
    snprintf(d->lost_why, sizeof d->lost_why, "%s", why);
    __atomic_store_n(&d->lost, 1, __ATOMIC_RELEASE);
    mgpu__cuda_env->log(MGPU_LOG_WARN, "cuda device %d lost: %s", d->id, why);
  }
  pthread_mutex_unlock(&lost_lock);
}

static void cuda_lose(mgpu__bdevice *d, const char *why) { lose_one(d, why); }

static int cuda_lost(mgpu__bdevice *d, char *why, size_t why_size) {
  if (!__atomic_load_n(&d->lost, __ATOMIC_ACQUIRE)) return 0;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", d->lost_why);
  return 1;
}

/* A sticky error of device dev poisons its GPU's context, which every mgpu
 * device on that GPU (its splits) shares: all of them are lost. */
static void lose_gpu_of(int dev, const char *why) {
  if (dev < 0 || dev >= MGPU_MAX_DEVICES) return;
  pthread_mutex_lock(&open_lock);
  mgpu__bdevice *d = open_devs[dev];
  mgpu__bdevice *same[MGPU_MAX_DEVICES];
  int n = 0;
  for (int i = 0; d != NULL && i < MGPU_MAX_DEVICES; i++)
    if (open_devs[i] != NULL && open_devs[i]->ordinal == d->ordinal)
      same[n++] = open_devs[i];
  pthread_mutex_unlock(&open_lock);
  for (int i = 0; i < n; i++) lose_one(same[i], why);
}

/* The mgpu code for a CUDA error (MGPU_ENOMEM, MGPU_EBACKEND ...). */
static int cuda_code(cudaError_t err) {
  if (sticky(err)) return MGPU_EDEVLOST;
  switch (err) {
    case cudaSuccess: return 0;
    case cudaErrorMemoryAllocation: return MGPU_ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice: return MGPU_ENODEV;
    case cudaErrorNotReady: return MGPU_EAGAIN;
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorNotSupported: return MGPU_ENOTSUP;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration: return MGPU_EINVAL;
    default: return MGPU_EBACKEND;
  }
}

int mgpu__cuda_fail(int dev, cudaError_t err, const char *what) {
  /* A non-sticky error stays in the thread's last-error slot and would be
   * returned again by an unrelated later call: take it out. */
  (void)cudaGetLastError();
  const char *hint = "";
  if (err == cudaErrorInvalidDeviceFunction)
    hint = " (a kernel launched through mgpu must be compiled for this GPU's "
           "architecture and linked with the shared CUDA runtime, "
           "-cudart shared)";
  if (sticky(err)) {
    hint = " (a sticky error: the device's context is unusable until the "
           "process ends; the device is lost)";
    char why[160];
    snprintf(why, sizeof why, "%s in %s", cudaGetErrorName(err), what);
    lose_gpu_of(dev, why);
  }
  if (dev >= 0)
    return mgpu__error(cuda_code(err),
                       "device %d: %s: %s (%s)%s", dev, what,
                       cudaGetErrorName(err),
                       cudaGetErrorString(err), hint);
  return mgpu__error(cuda_code(err), "%s: %s (%s)%s", what,
                     cudaGetErrorName(err),
                     cudaGetErrorString(err), hint);
}

/* ---- driver entry points ---- */

static int driver_loaded;

static void *entry_point(const char *sym, unsigned version) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(sym, &fn, version, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

/* Fetches the entry points once; 0 or a negative code with the detail. */
static int driver_load(void) {
  if (driver_loaded) return 0;
  mgpu__cuda_driver *v = &mgpu__cuda_drv;
  *(void **)&v->ctx_get_current = entry_point("cuCtxGetCurrent", 12000);
  *(void **)&v->ctx_set_current = entry_point("cuCtxSetCurrent", 12000);
  *(void **)&v->get_error_name = entry_point("cuGetErrorName", 12000);
  if (v->ctx_get_current == NULL || v->ctx_set_current == NULL)
    return mgpu__error(
        MGPU_EBACKEND, "the CUDA driver lacks cuCtxGetCurrent/cuCtxSetCurrent");
  /* Green contexts: the versions in which each entry point appeared. */
  *(void **)&v->device_get_dev_resource =
      entry_point("cuDeviceGetDevResource", 12040);
  *(void **)&v->sm_resource_split_by_count =
      entry_point("cuDevSmResourceSplitByCount", 12040);
  *(void **)&v->resource_generate_desc =
      entry_point("cuDevResourceGenerateDesc", 12040);
  *(void **)&v->green_ctx_create = entry_point("cuGreenCtxCreate", 12040);
  *(void **)&v->green_ctx_destroy = entry_point("cuGreenCtxDestroy", 12040);
  *(void **)&v->ctx_from_green_ctx = entry_point("cuCtxFromGreenCtx", 12040);
  *(void **)&v->green_ctx_stream_create =
      entry_point("cuGreenCtxStreamCreate", 12050);
  driver_loaded = 1;
  return 0;
}

/* ---- probe, open, close ---- */

/* Why cudaGetDeviceCount failed, in the user's terms. The runtime says
 * "driver version is insufficient" also where no driver is installed at all
 * (libcuda.so.1 cannot be loaded), which is what a machine without a GPU
 * looks like: tell the two apart, and call both "no GPU". */
static int probe_fail(cudaError_t err) {
  (void)cudaGetLastError();
  const char *name = cudaGetErrorName(err);
  if (err == cudaErrorNoDevice)
    return mgpu__error(
        MGPU_ENODEV, "no GPU was found: the NVIDIA driver sees no CUDA device "
        "(cudaGetDeviceCount: %s)", name);
  if (err == cudaErrorInsufficientDriver) {
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (drv == NULL)
      return mgpu__error(
          MGPU_ENODEV, "no GPU or driver was found: the NVIDIA driver "
          "(libcuda.so.1) is not installed or cannot be loaded "
          "(cudaGetDeviceCount: %s)", name);
    dlclose(drv);
    int drv_version = 0, rt_version = 0;
    (void)cudaDriverGetVersion(&drv_version);
    (void)cudaRuntimeGetVersion(&rt_version);
    (void)cudaGetLastError();
    return mgpu__error(
        MGPU_EBACKEND, "the NVIDIA driver supports CUDA %d.%d, older than the "
        "CUDA runtime %d.%d mgpu was built with: update the driver "
        "(cudaGetDeviceCount: %s)", drv_version / 1000,
        drv_version % 1000 / 10, rt_version / 1000, rt_version % 1000 / 10,
        name);
  }
  return mgpu__error(
      MGPU_EBACKEND, "no CUDA device can be used: cudaGetDeviceCount returned "
      "%s (%s)", name, cudaGetErrorString(err));
}

static int cuda_probe(int *count) {
  *count = 0;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return probe_fail(err);
  if (n > 0) {
    int rc = driver_load();
    if (rc != 0) return rc;
  }
  *count = n;
  return 0;
}

/* The properties, PCI bus id and NUMA node of d's GPU (d's context
 * current). */
static int read_identity(mgpu__bdevice *d) {
  cudaError_t err = cudaGetDeviceProperties(&d->prop, d->ordinal);
  if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err,
                                                 "cudaGetDeviceProperties");
  d->sm_count = d->prop.multiProcessorCount;
  if (cudaDeviceGetPCIBusId(d->pci_bus_id, sizeof d->pci_bus_id,
                            d->ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    d->pci_bus_id[0] = '\0';
  }
  for (char *c = d->pci_bus_id; *c; c++) *c = (char)tolower((unsigned char)*c);
  d->numa_node = d->pci_bus_id[0]
                    ? mgpu__cuda_env->numa_node_of_bus_id(d->pci_bus_id)
                    : -1;
  return 0;
}

/* This device's own mempool: freed blocks stay cached (release threshold
 * at its maximum) until trimmed. Without one (d->mempool NULL) the core's
 * mempool is used. */
static void make_mempool(mgpu__bdevice *d) {
  struct cudaMemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = cudaMemAllocationTypePinned;
  pp.handleTypes = cudaMemHandleTypeNone;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = d->ordinal;
  cudaError_t err = cudaMemPoolCreate(&d->mempool, &pp);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    d->mempool = NULL;
    mgpu__cuda_env->log(MGPU_LOG_INFO, "cuda: device %d: no memory pool (%s); "
                        "the core's mempool is used", d->id,
                        cudaGetErrorName(err));
    return;
  }
  uint64_t threshold = UINT64_MAX;
  (void)cudaMemPoolSetAttribute(d->mempool, cudaMemPoolAttrReleaseThreshold,
                                &threshold);
}

static int cuda_open(const mgpu__device_spec *spec, mgpu__bdevice **out) {
  *out = NULL;
  int rc = driver_load();
  if (rc != 0) return rc;
  mgpu__bdevice *d = mgpu__calloc(1, sizeof *d);
  if (d == NULL)
    return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                       "memory opening CUDA device %d",
                       spec->id, spec->ordinal);
  d->id = spec->id;
  d->ordinal = spec->ordinal;
  d->split_index = spec->split_index;
  d->split_count = spec->split_count > 0 ? spec->split_count : 1;

  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(NULL, &sc); /* only to save the caller's context */
  cudaError_t err = cudaSetDevice(d->ordinal);
  if (err == cudaSuccess) err = cudaFree(NULL); /* creates the context */
  if (err != cudaSuccess) {
    rc = mgpu__cuda_fail(d->id, err, "cudaSetDevice");
    goto fail;
  }
  if (mgpu__cuda_drv.ctx_get_current(&d->primary) != CUDA_SUCCESS ||
      d->primary == NULL) {
    rc = mgpu__error(MGPU_EBACKEND, "device %d: no primary "
                     "context on CUDA device %d", d->id,
                     d->ordinal);
    goto fail;
  }
  d->ctx = d->primary;
  if ((rc = read_identity(d)) != 0) goto fail;
  make_mempool(d);

  if (d->split_count > 1) mgpu__cuda_green_open(d);
  mgpu__cuda_leave(&sc);
  registry_set(d, d);
  *out = d;
  return 0;

fail:
  mgpu__cuda_leave(&sc);
  mgpu__free(d);
  return rc;
}

static void cuda_close(mgpu__bdevice *d) {
  if (d == NULL) return;
  registry_set(d, NULL);
  mgpu__cuda_scope sc;
  mgpu__cuda_enter_ctx(d->primary, &sc);
  if (d->mempool != NULL) {
    (void)cudaDeviceSynchronize();
    (void)cudaMemPoolDestroy(d->mempool);
  }
  /* The calling thread may have the green context current (it called
   * mgpu_set_device for this device): leave it on the GPU's primary
   * context rather than on a destroyed one. */
  if (d->green != NULL && sc.saved == d->ctx) sc.saved = d->primary;
  mgpu__cuda_green_close(d);
  (void)cudaGetLastError();
  mgpu__cuda_leave(&sc);
  mgpu__free(d);
}

/* The 36-character form of the UUID (nvidia-smi prints it after "GPU-";
 * props.uuid has room for the bare form only). */
static void format_uuid(const cudaUUID_t *u, char *out, size_t n) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  snprintf(out, n,
           "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

static int cuda_props(mgpu__bdevice *d, mgpu_device_props *p) {
  if (d->split_count > 1)
    snprintf(p->name, sizeof p->name, "%.80s [%d/%d]", d->prop.name,
             d->split_index, d->split_count);
  else
    snprintf(p->name, sizeof p->name, "%.95s", d->prop.name);
  snprintf(p->backend, sizeof p->backend, "cuda");
  p->backend_kind = MGPU_BACKEND_CUDA;
  p->ordinal = d->ordinal;
  p->split_index = d->split_index;
  p->split_count = d->split_count;
  int rc = mgpu__cuda_mem_info(d, &p->free_mem, &p->total_mem);
  if (rc != 0) return rc;
  p->cc_major = d->prop.major;
  p->cc_minor = d->prop.minor;
  p->multiprocessors = d->sm_count;
  p->numa_node = d->numa_node;
  p->peer_capable = has_peer(d);
  snprintf(p->pci_bus_id, sizeof p->pci_bus_id, "%s", d->pci_bus_id);
  format_uuid(&d->prop.uuid, p->uuid, sizeof p->uuid);
  return 0;
}

static int cuda_make_current(mgpu__bdevice *d) {
  if (d->green == NULL) {
    cudaError_t err = cudaSetDevice(d->ordinal);
    if (err != cudaSuccess) return mgpu__cuda_fail(d->id, err, "cudaSetDevice");
    return 0;
  }
  /* A green context is made current through the driver; the runtime then
   * runs the thread's cudaXxx calls and launches inside it. */
  if (mgpu__cuda_drv.ctx_set_current(d->ctx) != CUDA_SUCCESS)
    return mgpu__error(MGPU_EBACKEND, "device %d: cannot make "
                       "the green context of CUDA device %d "
                       "current", d->id, d->ordinal);
  return 0;
}

/* ---- the tables ---- */

static const mgpu__backend_mempool_ops cuda_mempool_ops = {
    .alloc_async = mgpu__cuda_mempool_alloc_async,
    .free_async = mgpu__cuda_mempool_free_async,
    .trim = mgpu__cuda_mempool_trim,
};

static const mgpu__backend_ipc_ops cuda_ipc_ops = {
    .alloc = mgpu__cuda_ipc_alloc,
    .free = mgpu__cuda_ipc_free,
    .export_fd = mgpu__cuda_ipc_export_fd,
    .import = mgpu__cuda_ipc_import,
    .protect = mgpu__cuda_ipc_protect,
    .unimport = mgpu__cuda_ipc_unimport,
};

static const mgpu__backend_loss_ops cuda_loss_ops = {
    .lose = cuda_lose,
    .lost = cuda_lost,
};

static const mgpu__backend_graph_ops cuda_graph_ops = {
    .create = mgpu__cuda_graph_create,
    .launch = mgpu__cuda_graph_launch,
    .cancel = mgpu__cuda_graph_cancel,
    .destroy = mgpu__cuda_graph_destroy,
};

/* Device memory is the GPU's; pinned and managed memory the CPU reaches.
 * A staged chunk is a DMA transfer with a fixed cost: 8 MiB keeps that cost
 * small against its time (docs/PERF.md). */
#define CUDA_CAPS                                                 \
  {.mem_model = MGPU__MEM_MODEL_DEVICE,                           \
   .host_visible = 1u << MGPU_MEM_PINNED | 1u << MGPU_MEM_UNIFIED, \
   .splits_share_memory = 1,                                      \
   .kernel_variant = MGPU__KERNEL_CUDA_FN,                        \
   .dlpack_device = kDLCUDA,                                      \
   .dlpack_unified = kDLCUDAManaged,                              \
   .dlpack_pinned = kDLCUDAHost,                                  \
   .staging_chunk = (size_t)8 << 20,                              \
   .graph_fill_16bit = 1}

#define CUDA_OPS_COMMON                                       \
  .name = "cuda", .kind = MGPU_BACKEND_CUDA, .caps = CUDA_CAPS, \
  .probe = cuda_probe,                                            \
  .open = cuda_open, .close = cuda_close, .props = cuda_props,    \
  .make_current = cuda_make_current,                              \
  .mem_alloc = mgpu__cuda_mem_alloc, .mem_free = mgpu__cuda_mem_free, \
  .mem_info = mgpu__cuda_mem_info,                                \
  .stream_create = mgpu__cuda_stream_create,                      \
  .stream_destroy = mgpu__cuda_stream_destroy,                    \
  .stream_synchronize = mgpu__cuda_stream_synchronize,            \
  .stream_query = mgpu__cuda_stream_query,                        \
  .stream_native = mgpu__cuda_stream_native,                      \
  .stream_order_native = mgpu__cuda_stream_order_native,          \
  .event_create = mgpu__cuda_event_create,                        \
  .event_destroy = mgpu__cuda_event_destroy,                      \
  .event_record = mgpu__cuda_event_record,                        \
  .event_synchronize = mgpu__cuda_event_synchronize,              \
  .event_query = mgpu__cuda_event_query,                          \
  .event_elapsed_ms = mgpu__cuda_event_elapsed_ms,                \
  .stream_wait_event = mgpu__cuda_stream_wait_event,              \
  .memcpy_async = mgpu__cuda_memcpy_async,                        \
  .memcpy2d_async = mgpu__cuda_memcpy2d_async,                    \
  .memset_async = mgpu__cuda_memset_async,                        \
  .launch = mgpu__cuda_launch, .builtin = mgpu__cuda_builtin,     \
  .host_callback = mgpu__cuda_host_callback,                      \
  .peer_can_access = mgpu__cuda_peer_can_access,                  \
  .peer_enable = mgpu__cuda_peer_enable,                          \
  .peer_disable = mgpu__cuda_peer_disable,                        \
  .memcpy_peer_async = mgpu__cuda_memcpy_peer_async,              \
  .mempool = &cuda_mempool_ops, .ipc = &cuda_ipc_ops, .loss = &cuda_loss_ops, \
  .graph = &cuda_graph_ops

static const mgpu__backend_ops cuda_ops = {CUDA_OPS_COMMON};

#ifdef MGPU_HAVE_NCCL
static const mgpu__backend_coll_ops cuda_coll_ops = {
    .comm_create = mgpu__cuda_coll_comm_create,
    .comm_destroy = mgpu__cuda_coll_comm_destroy,
    .comm_abort = mgpu__cuda_coll_comm_abort,
    .group_start = mgpu__cuda_coll_group_start,
    .group_end = mgpu__cuda_coll_group_end,
    .run = mgpu__cuda_coll_run,
};

static const mgpu__backend_ops cuda_ops_nccl = {
    CUDA_OPS_COMMON,
    .coll = &cuda_coll_ops,
};
#endif

/* 1 if MGPU_DEVICES splits a GPU ("cuda:0/4"). */
static int config_splits_a_gpu(const mgpu_config *cfg) {
  return cfg != NULL && cfg->devices != NULL &&
         strchr(cfg->devices, '/') != NULL;
}

PLUGIN_EXPORT const mgpu__backend_ops *MGPU__PLUGIN_ENTRY_FN(
    const mgpu__backend_env *env) {
  if (env == NULL || env->abi != MGPU__BACKEND_ABI) {
    if (env != NULL && env->set_error != NULL)
      env->set_error(MGPU_EPLUGIN, "libmgpu-cuda.so has backend ABI %d, the "
                     "core offers %d", MGPU__BACKEND_ABI, env->abi);
    return NULL;
  }
  mgpu__cuda_env = env;
  mgpu__cuda_busy_time = env->config->cuda_busy != 0; /* per mgpu_init */
#ifdef MGPU_HAVE_NCCL
  if (!config_splits_a_gpu(env->config) && mgpu__cuda_nccl_load())
    return &cuda_ops_nccl;
#else
  (void)config_splits_a_gpu;
#endif
  return &cuda_ops;
}
