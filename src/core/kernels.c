/* The built-in kernels' public entry points: fill, scale, axpy and
 * element-wise ops. The checks (device, ranges, type) are made here, once,
 * for every backend; each backend then runs its own variant (host loops in
 * src/backend/host/kernels.c, CUDA kernels in the plugin). Offsets are in bytes. */
#include <string.h>

#include "core/capture.h"
#include "core/core-internal.h"
#include "util/half.h"

size_t mgpu_dtype_size(mgpu_dtype dtype) {
  switch (dtype) {
    case MGPU_FLOAT32: return 4;
    case MGPU_FLOAT64: return 8;
    case MGPU_INT32: return 4;
    case MGPU_INT64: return 8;
    case MGPU_FLOAT16: return 2;
    case MGPU_BFLOAT16: return 2;
  }
  return 0;
}

const char *mgpu_dtype_name(mgpu_dtype dtype) {
  switch (dtype) {
    case MGPU_FLOAT32: return "float32";
    case MGPU_FLOAT64: return "float64";
    case MGPU_INT32: return "int32";
    case MGPU_INT64: return "int64";
    case MGPU_FLOAT16: return "float16";
    case MGPU_BFLOAT16: return "bfloat16";
  }
  return "unknown";
}

const char *mgpu_op_name(mgpu_op op) {
  switch (op) {
    case MGPU_SUM: return "sum";
    case MGPU_PROD: return "prod";
    case MGPU_MIN: return "min";
    case MGPU_MAX: return "max";
  }
  return "unknown";
}

/* Resolves stream and type (every backend takes every type). */
static int prepare(mgpu_stream *h, mgpu_dtype dtype, const char *what,
                   mgpu__stream **s, mgpu__device **d, size_t *esize) {
  /* held: the caller puts it; a capturing stream records (submit) */
  int rc = mgpu__stream_get_capturing(h, s);
  if (rc != 0) return rc;
  *d = mgpu__device_get((*s)->dev);
  *esize = mgpu_dtype_size(dtype);
  if (*esize == 0)
    return mgpu__error(MGPU_EINVAL, "device %d: %s with unknown type %d",
                       (*s)->dev, what, (int)dtype);
  return 0;
}

/* Resolves a buffer operand: on the stream's device, range in bounds. */
static int operand(const mgpu_buffer *h, const char *what, size_t offset,
                   size_t count, size_t esize, const mgpu__stream *s,
                   mgpu__buf **out) {
  int rc = mgpu__buf_get(h, what, out); /* held: the caller puts it */
  if (rc != 0) return rc;
  if ((*out)->dev != s->dev && (*out)->kind == MGPU_MEM_DEVICE)
    return mgpu__error(MGPU_EWRONGDEV, "%s: buffer of device %d used on a "
                       "stream of device %d", what, (*out)->dev, s->dev);
  if (count != 0 && esize > SIZE_MAX / count)
    return mgpu__error(MGPU_ERANGE, "%s: %zu elements overflow", what, count);
  /* Buffers start aligned; a misaligned element faults on a GPU (a sticky
   * error) and is undefined behaviour in the host loops. */
  if (offset % esize != 0)
    return mgpu__error(MGPU_EINVAL, "%s: offset %zu in the buffer of device %d "
                       "is not a multiple of the %zu-byte element", what,
                       offset, (*out)->dev, esize);
  return mgpu__buf_check_range(*out, what, offset, count * esize);
}

/* Queues b, or records op (the public call) when s captures. */
static int submit(mgpu__device *d, mgpu__stream *s, mgpu__builtin *b,
                  const mgpu__graph_op *op) {
  if (b->count == 0) return 0;
  if (mgpu__stream_capture(s) != NULL) return mgpu__capture_record(s, op);
  int pushed = 0;
  static const char *const names[] = {"kernel fill", "kernel scale",
                                      "kernel axpy", "kernel elementwise"};
  mgpu__flight_record(s->dev, names[b->kind], b->count, s->handle);
  if (mgpu__trace_enabled()) {
    mgpu__trace_arg a[] = {MGPU__TARG_I("count", b->count),
                           MGPU__TARG_S("dtype", mgpu_dtype_name(b->dtype))};
    pushed = mgpu__trace_tag_push(names[b->kind], a, 2);
  }
  int rc = d->ops->builtin(d->bdev, s->bstream, b);
  mgpu__trace_tag_pop(pushed);
  if (rc == 0) mgpu__metric_add(s->dev, MGPU__M_kernels_launched, 1);
  return rc;
}

int mgpu_fill(mgpu_stream *stream, mgpu_buffer *buf, size_t offset,
              size_t count, mgpu_dtype dtype, const void *value) {
  mgpu__stream *s = NULL;
  mgpu__device *d;
  mgpu__buf *dst = NULL;
  size_t es;
  int rc = prepare(stream, dtype, "mgpu_fill", &s, &d, &es);
  if (rc == 0) rc = operand(buf, "mgpu_fill dst", offset, count, es, s, &dst);
  if (rc == 0) rc = mgpu__buf_check_writable(dst, "mgpu_fill dst");
  if (rc == 0 && value == NULL)
    rc = mgpu__error(MGPU_EINVAL, "mgpu_fill: NULL value for %zu %s "
                     "elements on device %d", count, mgpu_dtype_name(dtype),
                     s->dev);
  if (rc != 0) goto out;
  mgpu__builtin b = {.kind = MGPU__BUILTIN_FILL, .dtype = dtype,
                     .count = count, .dst = (char *)dst->ptr + offset};
  switch (dtype) {
    case MGPU_FLOAT32: memcpy(&b.value.f32, value, 4); break;
    case MGPU_FLOAT64: memcpy(&b.value.f64, value, 8); break;
    case MGPU_INT32: memcpy(&b.value.i32, value, 4); break;
    case MGPU_INT64: memcpy(&b.value.i64, value, 8); break;
    case MGPU_FLOAT16:
      b.value.bits16 = mgpu__float_to_half((float)*(const double *)value);
      break;
    case MGPU_BFLOAT16:
      b.value.bits16 = mgpu__float_to_bf16((float)*(const double *)value);
      break;
  }
  mgpu__graph_op op = {.kind = MGPU__GOP_FILL, .dev = s->dev, .dst = buf,
                       .dst_offset = offset, .size = count, .dtype = dtype};
  /* 16-bit types take their value as a double. */
  memcpy(op.fill, value, es == 2 ? sizeof(double) : es);
  rc = submit(d, s, &b, &op);
out:
  mgpu__buf_put(dst);
  mgpu__stream_put(s);
  return rc;
}

int mgpu_scale(mgpu_stream *stream, mgpu_buffer *x, size_t offset,
               size_t count, mgpu_dtype dtype, double alpha) {
  mgpu__stream *s = NULL;
  mgpu__device *d;
  mgpu__buf *xb = NULL;
  size_t es;
  int rc = prepare(stream, dtype, "mgpu_scale", &s, &d, &es);
  if (rc == 0) rc = operand(x, "mgpu_scale x", offset, count, es, s, &xb);
  if (rc == 0) rc = mgpu__buf_check_writable(xb, "mgpu_scale x");
  if (rc == 0) {
    mgpu__builtin b = {.kind = MGPU__BUILTIN_SCALE, .dtype = dtype,
                       .count = count, .dst = (char *)xb->ptr + offset,
                       .alpha = alpha};
    rc = submit(d, s, &b, &(mgpu__graph_op){
        .kind = MGPU__GOP_SCALE, .dev = s->dev, .dst = x, .dst_offset = offset,
        .size = count, .dtype = dtype, .alpha = alpha});
  }
  mgpu__buf_put(xb);
  mgpu__stream_put(s);
  return rc;
}

int mgpu_axpy(mgpu_stream *stream, mgpu_buffer *y, size_t y_offset,
              const mgpu_buffer *x, size_t x_offset, size_t count,
              mgpu_dtype dtype, double alpha) {
  mgpu__stream *s = NULL;
  mgpu__device *d;
  mgpu__buf *yb = NULL, *xb = NULL;
  size_t es;
  int rc = prepare(stream, dtype, "mgpu_axpy", &s, &d, &es);
  if (rc == 0) rc = operand(y, "mgpu_axpy y", y_offset, count, es, s, &yb);
  if (rc == 0) rc = mgpu__buf_check_writable(yb, "mgpu_axpy y");
  if (rc == 0) rc = operand(x, "mgpu_axpy x", x_offset, count, es, s, &xb);
  if (rc == 0) {
    mgpu__builtin b = {.kind = MGPU__BUILTIN_AXPY, .dtype = dtype,
                       .count = count, .dst = (char *)yb->ptr + y_offset,
                       .a = (const char *)xb->ptr + x_offset, .alpha = alpha};
    rc = submit(d, s, &b, &(mgpu__graph_op){
        .kind = MGPU__GOP_AXPY, .dev = s->dev, .dst = y, .dst_offset = y_offset,
        .a = x, .a_offset = x_offset, .size = count, .dtype = dtype,
        .alpha = alpha});
  }
  mgpu__buf_put(xb);
  mgpu__buf_put(yb);
  mgpu__stream_put(s);
  return rc;
}

int mgpu_elementwise(mgpu_stream *stream, mgpu_buffer *dst, size_t dst_offset,
                     const mgpu_buffer *a, size_t a_offset,
                     const mgpu_buffer *b, size_t b_offset, size_t count,
                     mgpu_dtype dtype, mgpu_op op) {
  mgpu__stream *s = NULL;
  mgpu__device *d;
  mgpu__buf *db = NULL, *ab = NULL, *bb = NULL;
  size_t es;
  int rc = prepare(stream, dtype, "mgpu_elementwise", &s, &d, &es);
  if (rc == 0 && (op < MGPU_SUM || op > MGPU_MAX))
    rc = mgpu__error(MGPU_EINVAL, "device %d: mgpu_elementwise with unknown "
                     "op %d", s->dev, (int)op);
  if (rc == 0) rc = operand(dst, "mgpu_elementwise dst", dst_offset, count, es, s, &db);
  if (rc == 0) rc = mgpu__buf_check_writable(db, "mgpu_elementwise dst");
  if (rc == 0) rc = operand(a, "mgpu_elementwise a", a_offset, count, es, s, &ab);
  if (rc == 0) rc = operand(b, "mgpu_elementwise b", b_offset, count, es, s, &bb);
  if (rc == 0) {
    mgpu__builtin k = {.kind = MGPU__BUILTIN_ELEMENTWISE, .dtype = dtype,
                       .op = op, .count = count,
                       .dst = (char *)db->ptr + dst_offset,
                       .a = (const char *)ab->ptr + a_offset,
                       .b = (const char *)bb->ptr + b_offset};
    rc = submit(d, s, &k, &(mgpu__graph_op){
        .kind = MGPU__GOP_ELEMENTWISE, .dev = s->dev, .dst = dst,
        .dst_offset = dst_offset, .a = a, .a_offset = a_offset, .b = b,
        .b_offset = b_offset, .size = count, .dtype = dtype, .op = op});
  }
  mgpu__buf_put(bb);
  mgpu__buf_put(ab);
  mgpu__buf_put(db);
  mgpu__stream_put(s);
  return rc;
}
