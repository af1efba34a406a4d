/* The host backend's work: copies, memsets, kernel launches, built-ins and
 * host callbacks, each queued on its stream as one operation. */
#include <stdio.h>
#include <string.h>

#include "backend/host/host-internal.h"
#include "mgpu/error.h"
#include "obs/obs.h"
#include "obs/trace.h"
#include "util/fault.h"

int mgpu__host_memcpy_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                            const void *src, size_t size,
                            mgpu__copy_kind kind) {
  op *o = mgpu__host_op_new(OP_COPY);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.copy.dst = dst;
  o->u.copy.src = src;
  o->u.copy.size = size;
  o->u.copy.streaming = (kind == MGPU__COPY_H2D || kind == MGPU__COPY_D2D) &&
                        size >= STREAMING_MIN;
  /* The path the copy layer chose, else the kind's. */
  static const int kind_path[] = {MGPU_METRIC_PATH_H2D, MGPU_METRIC_PATH_D2H,
                                  MGPU_METRIC_PATH_D2D, -1};
  int path = mgpu__obs_path();
  o->u.copy.path = path >= 0 ? path : kind_path[kind];
  mgpu__host_enqueue(s, o);
  return 0;
}

int mgpu__host_memcpy2d_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                              size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height,
                              mgpu__copy_kind kind) {
  (void)kind;
  op *o = mgpu__host_op_new(OP_COPY2D);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.copy2d.dst = dst;
  o->u.copy2d.src = src;
  o->u.copy2d.dpitch = dpitch;
  o->u.copy2d.spitch = spitch;
  o->u.copy2d.width = width;
  o->u.copy2d.height = height;
  mgpu__host_enqueue(s, o);
  return 0;
}

int mgpu__host_memset_async(mgpu__bdevice *d, mgpu__bstream *s, void *dst,
                            int value, size_t size) {
  op *o = mgpu__host_op_new(OP_MEMSET);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.memset.dst = dst;
  o->u.memset.value = value;
  o->u.memset.size = size;
  mgpu__host_enqueue(s, o);
  return 0;
}

int mgpu__host_launch(mgpu__bdevice *d, mgpu__bstream *s,
                      const mgpu_kernel *k, mgpu_dim3 grid, mgpu_dim3 block,
                      const void *args, size_t args_size) {
  op *o = mgpu__host_op_new(OP_LAUNCH);
  if (o == NULL) return mgpu__host_op_nomem(d);
  if (args_size > 0) {
    o->u.launch.args = mgpu__malloc(args_size);
    if (o->u.launch.args == NULL) {
      mgpu__host_op_free(o);
      return mgpu__host_op_nomem(d);
    }
    memcpy(o->u.launch.args, args, args_size);
  }
  o->u.launch.fn = k->host_fn;
  snprintf(o->u.launch.name, sizeof o->u.launch.name, "%s",
           k->name != NULL ? k->name : "?");
  if (mgpu__trace_enabled() && o->tag == NULL) {
    mgpu__trace_arg a[] = {MGPU__TARG_I("grid_x", grid.x),
                           MGPU__TARG_I("grid_y", grid.y),
                           MGPU__TARG_I("grid_z", grid.z),
                           MGPU__TARG_I("block_x", block.x)};
    char name[MGPU__TRACE_NAME];
    snprintf(name, sizeof name, "kernel %s", k->name ? k->name : "?");
    int pushed = mgpu__trace_tag_push(name, a, 4);
    o->tag = mgpu__trace_tag_copy();
    mgpu__trace_tag_pop(pushed);
  }
  o->u.launch.grid = grid;
  o->u.launch.block = block;
  mgpu__host_enqueue(s, o);
  return 0;
}

int mgpu__host_builtin(mgpu__bdevice *d, mgpu__bstream *s,
                       const mgpu__builtin *b) {
  op *o = mgpu__host_op_new(OP_BUILTIN);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.builtin = *b;
  mgpu__host_enqueue(s, o);
  return 0;
}

int mgpu__host_host_callback(mgpu__bdevice *d, mgpu__bstream *s,
                             void (*fn)(void *), void *arg) {
  op *o = mgpu__host_op_new(OP_CALLBACK);
  if (o == NULL) return mgpu__host_op_nomem(d);
  o->u.callback.fn = fn;
  o->u.callback.arg = arg;
  mgpu__host_enqueue(s, o);
  return 0;
}
