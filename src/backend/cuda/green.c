/* SM partitions of split GPUs (MGPU_DEVICES=cuda:0/4) through green
 * contexts.
 *
 * Each logical device of a GPU asks the driver for the GPU's SM resource,
 * splits it into split_count equal groups (cuDevSmResourceSplitByCount),
 * and builds a green context from its own group (cuDevResourceGenerateDesc,
 * cuGreenCtxCreate). The split is deterministic, so the logical devices get
 * disjoint partitions without talking to each other. Its streams are made
 * with cuGreenCtxStreamCreate, so its kernels run on its SMs only.
 *
 * Where the driver has no green contexts (before CUDA 12.4), the GPU has too
 * few SMs for the split, or MGPU_CUDA_GREEN=0 is set, the logical device
 * runs on the primary context with plain streams: it still has its own
 * streams, host thread and memory budget, but its kernels may use every SM.
 * MGPU_LOG=info says which way each split device went.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

#define MAX_SPLIT 64

static const char *cu_name(CUresult r) {
  const char *name = NULL;
  if (mgpu__cuda_drv.get_error_name == NULL ||
      mgpu__cuda_drv.get_error_name(r, &name) != CUDA_SUCCESS || name == NULL)
    return "CUDA_ERROR_UNKNOWN";
  return name;
}

/* Splits input into n groups of min_count SMs; returns the count made. */
static unsigned split(CUdevResource *groups, unsigned n,
                      const CUdevResource *input, unsigned flags,
                      unsigned min_count) {
  unsigned nb = n;
  if (mgpu__cuda_drv.sm_resource_split_by_count(groups, &nb, input, NULL,
                                                flags, min_count) !=
      CUDA_SUCCESS)
    return 0;
  return nb;
}

/* Why d cannot have a green context with this driver and configuration, or
 * NULL. */
static const char *green_refused(const mgpu__bdevice *d) {
  const mgpu__cuda_driver *drv = &mgpu__cuda_drv;
  if (!mgpu__cuda_env->config->cuda_green) return "MGPU_CUDA_GREEN=0";
  if (drv->device_get_dev_resource == NULL ||
      drv->sm_resource_split_by_count == NULL ||
      drv->resource_generate_desc == NULL || drv->green_ctx_create == NULL ||
      drv->ctx_from_green_ctx == NULL)
    return "the driver has no green contexts (CUDA 12.4 or later needed)";
  if (drv->green_ctx_stream_create == NULL)
    return "the driver has no cuGreenCtxStreamCreate (CUDA 12.5 or later "
           "needed)";
  if (d->split_count > MAX_SPLIT) return "too many splits";
  return NULL;
}

/* Splits d's GPU's SMs into d->split_count groups (groups[]), aligned to
 * the co-scheduling granule where the GPU has enough SMs, else finer. Why
 * not, or NULL. */
static const char *split_sms(const mgpu__bdevice *d, CUdevResource *groups) {
  CUdevResource all;
  memset(&all, 0, sizeof all);
  if (mgpu__cuda_drv.device_get_dev_resource((CUdevice)d->ordinal, &all,
                                             CU_DEV_RESOURCE_TYPE_SM) !=
      CUDA_SUCCESS)
    return "cuDeviceGetDevResource failed";
  unsigned n = (unsigned)d->split_count, made = 0;
  unsigned align = all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : 1;
  unsigned per = all.sm.smCount / n / align * align;
  if (per >= all.sm.minSmPartitionSize && per > 0)
    made = split(groups, n, &all, 0, per);
  if (made < n) {
    /* Finer partitions at the cost of large thread clusters. */
    per = all.sm.smCount / n;
    per -= per % 2;
    if (per > 0)
      made = split(groups, n, &all,
                   CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, per);
  }
  return made < n ? "the GPU has too few SMs for this split" : NULL;
}

/* A green context over one group of SMs; why not, or NULL. */
static const char *green_create(const mgpu__bdevice *d,
                                CUdevResource *group, CUgreenCtx *green,
                                CUcontext *ctx) {
  const mgpu__cuda_driver *drv = &mgpu__cuda_drv;
  CUdevResourceDesc desc = NULL;
  *green = NULL;
  CUresult r = drv->resource_generate_desc(&desc, group, 1);
  if (r == CUDA_SUCCESS)
    r = drv->green_ctx_create(green, desc, (CUdevice)d->ordinal,
                              CU_GREEN_CTX_DEFAULT_STREAM);
  if (r == CUDA_SUCCESS) r = drv->ctx_from_green_ctx(ctx, *green);
  if (r == CUDA_SUCCESS) return NULL;
  if (*green != NULL && drv->green_ctx_destroy != NULL)
    drv->green_ctx_destroy(*green);
  *green = NULL;
  return cu_name(r);
}

void mgpu__cuda_green_open(mgpu__bdevice *d) {
  CUdevResource groups[MAX_SPLIT];
  CUgreenCtx green = NULL;
  CUcontext ctx = NULL;
  const char *why = green_refused(d);
  if (why == NULL) why = split_sms(d, groups);
  if (why == NULL)
    why = green_create(d, &groups[d->split_index], &green, &ctx);
  if (why != NULL) {
    mgpu__cuda_env->log(MGPU_LOG_INFO, "cuda: device %d (GPU %d, split %d/%d): "
                        "plain streams on all %d SMs (%s)", d->id, d->ordinal,
                        d->split_index, d->split_count, d->sm_count, why);
    return;
  }
  d->green = green;
  d->ctx = ctx;
  d->sm_count = (int)groups[d->split_index].sm.smCount;
  mgpu__cuda_env->log(MGPU_LOG_INFO, "cuda: device %d (GPU %d, split %d/%d): "
                      "green context on %d SMs", d->id, d->ordinal,
                      d->split_index, d->split_count, d->sm_count);
}

void mgpu__cuda_green_close(mgpu__bdevice *d) {
  if (d->green != NULL && mgpu__cuda_drv.green_ctx_destroy != NULL)
    mgpu__cuda_drv.green_ctx_destroy(d->green);
  d->green = NULL;
  d->ctx = d->primary;
}
