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

void mgpu__cuda_green_open(mgpu__bdevice *d) {
  const mgpu__cuda_driver *drv = &mgpu__cuda_drv;
  const char *why = NULL;
  CUresult r = CUDA_SUCCESS;
  if (!mgpu__cuda_env->config->cuda_green) {
    why = "MGPU_CUDA_GREEN=0";
  } else if (drv->device_get_dev_resource == NULL ||
             drv->sm_resource_split_by_count == NULL ||
             drv->resource_generate_desc == NULL ||
             drv->green_ctx_create == NULL || drv->ctx_from_green_ctx == NULL) {
    why = "the driver has no green contexts (CUDA 12.4 or later needed)";
  } else if (drv->green_ctx_stream_create == NULL) {
    why = "the driver has no cuGreenCtxStreamCreate (CUDA 12.5 or later "
          "needed)";
  } else if (d->split_count > MAX_SPLIT) {
    why = "too many splits";
  }

  CUdevResource all, groups[MAX_SPLIT];
  unsigned made = 0, per = 0;
  if (why == NULL) {
    memset(&all, 0, sizeof all);
    r = drv->device_get_dev_resource((CUdevice)d->ordinal, &all,
                                     CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS) why = "cuDeviceGetDevResource failed";
  }
  if (why == NULL) {
    unsigned n = (unsigned)d->split_count;
    unsigned align = all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : 1;
    per = all.sm.smCount / n / align * align;
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
    if (made < n) why = "the GPU has too few SMs for this split";
  }

  CUdevResourceDesc desc = NULL;
  CUgreenCtx green = NULL;
  CUcontext ctx = NULL;
  if (why == NULL) {
    r = drv->resource_generate_desc(&desc, &groups[d->split_index], 1);
    if (r == CUDA_SUCCESS)
      r = drv->green_ctx_create(&green, desc, (CUdevice)d->ordinal,
                                CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_SUCCESS) r = drv->ctx_from_green_ctx(&ctx, green);
    if (r != CUDA_SUCCESS) {
      why = cu_name(r);
      if (green != NULL && drv->green_ctx_destroy != NULL)
        drv->green_ctx_destroy(green);
      green = NULL;
    }
  }

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
