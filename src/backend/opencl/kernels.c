/* Kernels of OpenCL devices: the OpenCL C variant of mgpu_kernel, and the
 * built-in kernels (fill, scale, axpy, element-wise) in OpenCL C.
 *
 * Programs are built once per physical device and kept in the device's
 * list (mgpu__ocl_phys.progs) for the life of the process, keyed by the
 * mgpu_kernel's address, its source and name pointers (or by builtins_key). An
 * entry is put in the list before it is built, and built under its own
 * lock, so that two launches of one new kernel build it once and launches
 * of other kernels do not wait for the build. A failed build is kept with
 * its log: every later launch fails at once with the same detail. Once
 * built, an entry is found and read without a lock.
 *
 * A cl_kernel holds its arguments, so clSetKernelArg and the enqueue that
 * uses them must not interleave with another thread's: each stream makes
 * its own cl_kernel of each kernel it launches (mgpu__ocl_skern), and sets
 * arguments and enqueues under the stream's lock, which the enqueue takes
 * anyway. A launch takes that one lock and nothing else.
 *
 * The built-ins compute as the host's loops do (src/backend/host/kernels.c,
 * src/util/elementwise.c): scale and axpy in double (float where the device
 * has no double), integers converted back with saturation and NaN as 0,
 * integer sums and products wrapping; float16 and bfloat16 as the CUDA
 * kernels do (src/backend/cuda/kernels.cu): in float, rounded to nearest
 * even.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl-internal.h"

static const char builtins_key = 0;

static const char builtins_src[] =
    "#ifdef cl_khr_fp64\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "typedef double acc_t;\n"
    "#else\n"
    "typedef float acc_t;\n"
    "#endif\n"
    "#define TO_float(x) ((float)(x))\n"
    "#define TO_double(x) ((double)(x))\n"
    "#define TO_int(x) convert_int_sat_rtz(x)\n"
    "#define TO_long(x) convert_long_sat_rtz(x)\n"
    "#define WRAP_float(x) (x)\n"
    "#define WRAP_double(x) (x)\n"
    "#define WRAP_int(x) as_int(x)\n"
    "#define WRAP_long(x) as_long(x)\n"
    "#define DEF(T, U, S)                                                  \\\n"
    "__kernel void fill_##S(__global T *d, T v, ulong n) {                 \\\n"
    "  size_t i = get_global_id(0); if (i < n) d[i] = v; }                 \\\n"
    "__kernel void scale_##S(__global T *d, acc_t a, ulong n) {            \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i < n) d[i] = TO_##T((acc_t)d[i] * a); }                        \\\n"
    "__kernel void axpy_##S(__global T *y, __global const T *x, acc_t a,   \\\n"
    "                       ulong n) {                                     \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i < n) y[i] = TO_##T((acc_t)y[i] + a * (acc_t)x[i]); }          \\\n"
    "__kernel void ew_##S(__global T *d, __global const T *a,              \\\n"
    "                     __global const T *b, int op, ulong n) {          \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i >= n) return;                                                 \\\n"
    "  T x = a[i], y = b[i], r;                                            \\\n"
    "  switch (op) {                                                       \\\n"
    "    case 0: r = WRAP_##T((U)x + (U)y); break;                         \\\n"
    "    case 1: r = WRAP_##T((U)x * (U)y); break;                         \\\n"
    "    case 2: r = y < x ? y : x; break;                                 \\\n"
    "    default: r = y > x ? y : x; break;                                \\\n"
    "  }                                                                   \\\n"
    "  d[i] = r; }\n"
    "DEF(float, float, f32)\n"
    "#ifdef cl_khr_fp64\n"
    "DEF(double, double, f64)\n"
    "#endif\n"
    "DEF(int, uint, i32)\n"
    "DEF(long, ulong, i64)\n"
    /* The 16-bit types, kept as ushort and computed in float: half through
     * vload_half / vstore_half_rte (core OpenCL C, no extension needed),
     * bfloat16 by its bits (round to nearest even, as the core's to_bf16).
     * min and max keep an operand's bits. */
    "float up_f16(__global const ushort *p, size_t i) {\n"
    "  return vload_half(0, (__global const half *)(p + i)); }\n"
    "void down_f16(float v, __global ushort *p, size_t i) {\n"
    "  vstore_half_rte(v, 0, (__global half *)(p + i)); }\n"
    "float up_bf16(__global const ushort *p, size_t i) {\n"
    "  return as_float((uint)p[i] << 16); }\n"
    "void down_bf16(float v, __global ushort *p, size_t i) {\n"
    "  uint x = as_uint(v);\n"
    "  if (isnan(v)) { p[i] = (ushort)((x >> 16) | 0x40); return; }\n"
    "  p[i] = (ushort)((x + 0x7fff + ((x >> 16) & 1)) >> 16); }\n"
    "__kernel void fill_u16(__global ushort *d, ushort v, ulong n) {\n"
    "  size_t i = get_global_id(0); if (i < n) d[i] = v; }\n"
    "#define DEF16(S)                                                      \\\n"
    "__kernel void scale_##S(__global ushort *d, float a, ulong n) {       \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i < n) down_##S(up_##S(d, i) * a, d, i); }                      \\\n"
    "__kernel void axpy_##S(__global ushort *y, __global const ushort *x,  \\\n"
    "                       float a, ulong n) {                            \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i < n) down_##S(up_##S(y, i) + a * up_##S(x, i), y, i); }       \\\n"
    "__kernel void ew_##S(__global ushort *d, __global const ushort *a,    \\\n"
    "                     __global const ushort *b, int op, ulong n) {     \\\n"
    "  size_t i = get_global_id(0);                                        \\\n"
    "  if (i >= n) return;                                                 \\\n"
    "  float x = up_##S(a, i), y = up_##S(b, i);                           \\\n"
    "  ushort xa = a[i], yb = b[i];                                        \\\n"
    "  switch (op) {                                                       \\\n"
    "    case 0: down_##S(x + y, d, i); break;                             \\\n"
    "    case 1: down_##S(x * y, d, i); break;                             \\\n"
    "    case 2: d[i] = y < x ? yb : xa; break;                            \\\n"
    "    default: d[i] = x < y ? yb : xa; break;                           \\\n"
    "  } }\n"
    "DEF16(f16)\n"
    "DEF16(bf16)\n";

/* Built-in kernels by [kind][dtype] (float, double, int32, int64, half,
 * bfloat16: mgpu_dtype's order). */
#define NTYPES 6
static const char *const builtin_names[4][NTYPES] = {
    {"fill_f32", "fill_f64", "fill_i32", "fill_i64", "fill_u16", "fill_u16"},
    {"scale_f32", "scale_f64", "scale_i32", "scale_i64", "scale_f16",
     "scale_bf16"},
    {"axpy_f32", "axpy_f64", "axpy_i32", "axpy_i64", "axpy_f16", "axpy_bf16"},
    {"ew_f32", "ew_f64", "ew_i32", "ew_i64", "ew_f16", "ew_bf16"}};

/* ---- the program cache ---- */

/* Builds e (its lock held, not built yet) for ph; keeps the outcome, and
 * publishes it (built) last. */
static void build(mgpu__ocl_phys *ph, mgpu__ocl_prog *e) {
  cl_int err = CL_SUCCESS;
  e->program = clCreateProgramWithSource(ph->ctx, 1, &e->src, NULL, &err);
  if (err != CL_SUCCESS) {
    e->program = NULL;
    e->rc = MGPU_EBACKEND;
    e->log = mgpu__malloc(96);
    if (e->log != NULL)
      snprintf(e->log, 96, "(clCreateProgramWithSource failed: %s, %d)",
               mgpu__ocl_err_name(err), (int)err);
  } else if ((err = clBuildProgram(e->program, 1, &ph->dev, "", NULL,
                                   NULL)) != CL_SUCCESS) {
    size_t n = 0;
    (void)clGetProgramBuildInfo(e->program, ph->dev, CL_PROGRAM_BUILD_LOG, 0,
                                NULL, &n);
    e->log = mgpu__calloc(n + 1, 1);
    if (e->log != NULL && n > 0)
      (void)clGetProgramBuildInfo(e->program, ph->dev, CL_PROGRAM_BUILD_LOG,
                                  n, e->log, NULL);
    e->rc = err == CL_BUILD_PROGRAM_FAILURE ? MGPU_EINVAL : MGPU_EBACKEND;
  }
  __atomic_store_n(&e->built, 1, __ATOMIC_RELEASE);
}

/* The detail of e's failed build, set again for this call; name: the user
 * kernel's name, NULL for the built-ins. */
static int build_failed(mgpu__ocl_phys *ph, mgpu__ocl_prog *e, int id,
                        const char *name) {
  char what[96];
  if (name != NULL)
    snprintf(what, sizeof what, "the OpenCL C of kernel '%.40s'", name);
  else
    snprintf(what, sizeof what, "the built-in kernels");
  return mgpu__error(
      e->rc, "device %d: %s did not build for OpenCL device '%s'; the build "
      "log: %.900s", id, what, ph->name,
      e->log != NULL && e->log[0] ? e->log : "(empty)");
}

/* Whether e is the entry of (key, src, name). */
static int prog_is(const mgpu__ocl_prog *e, const void *key, const char *src,
                   const char *name) {
  return e->key == key && e->src == src && e->name == name;
}

/* The entry of (key, src, name) in the list from head on, or NULL. */
static mgpu__ocl_prog *prog_find(mgpu__ocl_prog *head, const void *key,
                                 const char *src, const char *name) {
  mgpu__ocl_prog *e = head;
  while (e != NULL && !prog_is(e, key, src, name)) e = e->next;
  return e;
}

/* The entry of (key, src, name) on ph, put in the list on first use; NULL
 * when memory ran out. The list is walked without its lock (entries are
 * published whole, at the head, and never removed); the lock only orders
 * two threads adding the same entry. */
static mgpu__ocl_prog *prog_entry(mgpu__ocl_phys *ph, const void *key,
                                  const char *src, const char *name) {
  mgpu__ocl_prog *head = __atomic_load_n(&ph->progs, __ATOMIC_ACQUIRE);
  mgpu__ocl_prog *e = prog_find(head, key, src, name);
  if (e != NULL) return e;
  pthread_mutex_lock(&ph->progs_lock);
  e = prog_find(ph->progs, key, src, name);
  if (e == NULL && (e = mgpu__calloc(1, sizeof *e)) != NULL) {
    e->key = key;
    e->src = src;
    e->name = name;
    pthread_mutex_init(&e->lock, NULL);
    e->next = ph->progs;
    __atomic_store_n(&ph->progs, e, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&ph->progs_lock);
  return e;
}

/* The built entry of (key, src) on ph in *out, built on first use (under
 * its lock, so that two launches of one new kernel build it once and
 * launches of other kernels do not wait for the build); a negative code
 * with the detail set when the build failed or memory ran out. name: the
 * user kernel's name, NULL for the built-ins. The entry s used last is
 * tried first: a burst of one kernel skips the list. Once built, no lock
 * is taken. */
static int program_get(mgpu__ocl_phys *ph, mgpu__bstream *s, const void *key,
                       const char *src, const char *name, int id,
                       mgpu__ocl_prog **out) {
  *out = NULL;
  mgpu__ocl_prog *e = __atomic_load_n(&s->prog_hint, __ATOMIC_ACQUIRE);
  if (e == NULL || !prog_is(e, key, src, name)) {
    e = prog_entry(ph, key, src, name);
    if (e == NULL)
      return mgpu__error(MGPU_ENOMEM, "device %d: out of host "
                         "memory for a program", id);
    __atomic_store_n(&s->prog_hint, e, __ATOMIC_RELEASE);
  }
  if (!__atomic_load_n(&e->built, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&e->lock);
    if (!e->built) build(ph, e);
    pthread_mutex_unlock(&e->lock);
  }
  if (e->rc != 0) return build_failed(ph, e, id, name);
  *out = e;
  return 0;
}

/* ---- the streams' kernels (s->lock held) ---- */

/* s's own kernel slot of e, named name, made on first use and moved to the
 * front of s's list; NULL with *err and *step set when a call failed. */
static mgpu__ocl_skern *stream_kernel(mgpu__bstream *s,
                                      const mgpu__ocl_prog *e, int slot,
                                      const char *name, cl_int *err,
                                      const char **step) {
  mgpu__ocl_skern **pp = &s->kerns, *k;
  while ((k = *pp) != NULL && (k->prog != e || k->slot != slot)) pp = &k->next;
  if (k != NULL) {
    if (pp != &s->kerns) { /* the last used first */
      *pp = k->next;
      k->next = s->kerns;
      s->kerns = k;
    }
    return k;
  }
  cl_uint nargs = 0;
  *step = "clCreateKernel";
  cl_kernel kern = clCreateKernel(e->program, name, err);
  if (*err == CL_SUCCESS) {
    *step = "clGetKernelInfo";
    *err = clGetKernelInfo(kern, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs,
                           NULL);
  }
  if (*err == CL_SUCCESS && (k = mgpu__calloc(1, sizeof *k)) == NULL) {
    *step = "keeping the kernel";
    *err = CL_OUT_OF_HOST_MEMORY;
  }
  if (*err != CL_SUCCESS) {
    if (kern != NULL) clReleaseKernel(kern);
    return NULL;
  }
  k->prog = e;
  k->slot = slot;
  k->kernel = kern;
  k->nargs = (int)nargs;
  k->next = s->kerns;
  s->kerns = k;
  return k;
}

void mgpu__ocl_stream_kernels_free(mgpu__bstream *s) {
  while (s->kerns != NULL) {
    mgpu__ocl_skern *k = s->kerns;
    s->kerns = k->next;
    clReleaseKernel(k->kernel);
    mgpu__free(k->args);
    mgpu__free(k);
  }
}

/* ---- launches ---- */

/* Enqueues kern (arguments set, s->lock held) on s over the sizes; while
 * a trace is recorded it becomes a span named name (trace.c). */
static cl_int enqueue_locked(mgpu__bstream *s, cl_kernel kern, cl_uint dims,
                             const size_t *global, const size_t *local,
                             const char *name) {
  cl_event ev = NULL;
  cl_int err = clEnqueueNDRangeKernel(s->q, kern, dims, NULL, global, local, 0,
                                      NULL, &ev);
  if (err == CL_SUCCESS) mgpu__ocl_op_timed(s, ev, name, 0);
  mgpu__ocl_enqueue_end(s, err, ev);
  return err;
}

/* Sets the user kernel's one argument (s->lock held) unless it holds
 * these bytes already: a cl_kernel keeps its arguments between launches,
 * and an implementation may copy the value into fresh memory each time
 * (PoCL does), a cost a burst of equal launches need not pay. */
static cl_int user_args_set(mgpu__ocl_skern *k, const void *args,
                            size_t args_size) {
  if (k->args_known && k->args_size == args_size &&
      memcmp(k->args, args, args_size) == 0)
    return CL_SUCCESS;
  k->args_known = 0;
  cl_int err = clSetKernelArg(k->kernel, 0, args_size, args);
  if (err != CL_SUCCESS) return err;
  if (args_size > k->args_cap) {
    void *grown = mgpu__malloc(args_size);
    if (grown == NULL) return CL_SUCCESS; /* set, only not remembered */
    mgpu__free(k->args);
    k->args = grown;
    k->args_cap = args_size;
  }
  memcpy(k->args, args, args_size);
  k->args_size = args_size;
  k->args_known = 1;
  return CL_SUCCESS;
}

int mgpu__ocl_launch(mgpu__bdevice *d, mgpu__bstream *s, const mgpu_kernel *k,
                     mgpu_dim3 grid, mgpu_dim3 block, const void *args,
                     size_t args_size) {
  const char *name = k->name ? k->name : "?";
  if (k->opencl_src == NULL || k->name == NULL)
    return mgpu__error(MGPU_ENOTSUP, "device %d: kernel '%s' "
                       "has no OpenCL variant (opencl_src and "
                       "name)", d->id, name);
  mgpu__ocl_prog *e;
  int rc = program_get(d->phys, s, k, k->opencl_src, k->name, d->id, &e);
  if (rc != 0) return rc;
  cl_int err = CL_SUCCESS;
  const char *step = "";
  mgpu__ocl_enqueue_begin(s);
  mgpu__ocl_skern *sk = stream_kernel(s, e, 0, k->name, &err, &step);
  if (sk != NULL && sk->nargs != (args_size > 0 ? 1 : 0)) {
    int nargs = sk->nargs;
    mgpu__ocl_enqueue_end(s, CL_INVALID_KERNEL_ARGS, NULL);
    return mgpu__error(
        MGPU_EINVAL, "device %d: kernel '%s' takes %d parameters in its "
        "OpenCL C; an mgpu kernel takes its argument struct (%zu bytes here) "
        "as its one parameter, or none", d->id, name, nargs, args_size);
  }
  if (err == CL_SUCCESS && args_size > 0) {
    step = "clSetKernelArg (the argument struct's size must match the "
           "kernel's parameter)";
    err = user_args_set(sk, args, args_size);
  }
  size_t global[3] = {(size_t)grid.x * block.x, (size_t)grid.y * block.y,
                      (size_t)grid.z * block.z};
  size_t local[3] = {block.x, block.y, block.z};
  if (err == CL_SUCCESS) {
    step = "clEnqueueNDRangeKernel";
    char span[48] = "kernel"; /* named only for a trace: cheaper */
    if (s->profiling && mgpu__ocl_env->obs->trace_enabled())
      snprintf(span, sizeof span, "kernel %s", name);
    err = enqueue_locked(s, sk->kernel, 3, global, local, span);
  } else {
    mgpu__ocl_enqueue_end(s, err, NULL);
  }
  if (err != CL_SUCCESS) {
    char msg[256];
    snprintf(msg, sizeof msg, "launch of kernel '%.40s' (grid %ux%ux%u, block "
             "%ux%ux%u): %s", name, grid.x, grid.y, grid.z, block.x, block.y,
             block.z, step);
    return mgpu__ocl_fail(d, err, msg);
  }
  return 0;
}

/* The index of b's type among the built-ins (di) and its element size
 * (es); an error when d cannot run b. */
static int builtin_type(mgpu__bdevice *d, const mgpu__builtin *b, int *di,
                        size_t *es) {
  switch (b->dtype) {
    case MGPU_FLOAT32: *di = 0; *es = 4; break;
    case MGPU_FLOAT64: *di = 1; *es = 8; break;
    case MGPU_INT32: *di = 2; *es = 4; break;
    case MGPU_INT64: *di = 3; *es = 8; break;
    case MGPU_FLOAT16: *di = 4; *es = 2; break;
    case MGPU_BFLOAT16: *di = 5; *es = 2; break;
    default:
      return mgpu__error(MGPU_EINVAL, "device %d: built-in "
                         "kernel of unknown type %d", d->id,
                         (int)b->dtype);
  }
  if ((unsigned)b->kind > 3)
    return mgpu__error(MGPU_EINVAL, "device %d: unknown built-in "
                       "kernel %d", d->id, (int)b->kind);
  if (*di == 1 && !d->phys->has_fp64)
    return mgpu__error(MGPU_ENOTSUP, "device %d: OpenCL device "
                       "'%s' has no double precision",
                       d->id, d->phys->name);
  return 0;
}

/* Sets the arguments of kern, the built-in for b (elements of es bytes)
 * on d; the stream's lock held (kern is the stream's own). */
static cl_int builtin_args(cl_kernel kern, mgpu__bdevice *d,
                           const mgpu__builtin *b, size_t es) {
  cl_int err = CL_SUCCESS;
  cl_ulong n = b->count;
  /* The accumulation type: float for the 16-bit types, else the program's
   * (double where the device has it, else float). */
  double alpha = b->alpha;
  float alpha_f = (float)b->alpha;
  int wide = d->phys->has_fp64 && es > 2;
  const void *alpha_p = wide ? (const void *)&alpha : (const void *)&alpha_f;
  size_t alpha_size = wide ? sizeof alpha : sizeof alpha_f;
  cl_uint a = 0;
#define ARG(size, ptr) \
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, a++, size, ptr)
#define SVM(ptr) \
  if (err == CL_SUCCESS) err = clSetKernelArgSVMPointer(kern, a++, ptr)
  SVM(b->dst);
  switch (b->kind) {
    case MGPU__BUILTIN_FILL: ARG(es, &b->value); break;
    case MGPU__BUILTIN_SCALE: ARG(alpha_size, alpha_p); break;
    case MGPU__BUILTIN_AXPY:
      SVM(b->a);
      ARG(alpha_size, alpha_p);
      break;
    case MGPU__BUILTIN_ELEMENTWISE: {
      int op = (int)b->op;
      SVM(b->a);
      SVM(b->b);
      ARG(sizeof op, &op);
      break;
    }
  }
  ARG(sizeof n, &n);
#undef ARG
#undef SVM
  return err;
}

int mgpu__ocl_builtin(mgpu__bdevice *d, mgpu__bstream *s,
                      const mgpu__builtin *b) {
  int di = 0;
  size_t es = 0;
  int rc = builtin_type(d, b, &di, &es);
  if (rc != 0 || b->count == 0) return rc;
  mgpu__ocl_prog *e;
  rc = program_get(d->phys, s, &builtins_key, builtins_src, NULL, d->id, &e);
  if (rc != 0) return rc;
  cl_int err = CL_SUCCESS;
  const char *step = "";
  const char *name = builtin_names[b->kind][di];
  mgpu__ocl_enqueue_begin(s);
  mgpu__ocl_skern *sk =
      stream_kernel(s, e, 1 + (int)b->kind * NTYPES + di, name, &err, &step);
  if (err == CL_SUCCESS) err = builtin_args(sk->kernel, d, b, es);
  size_t global = b->count;
  if (err == CL_SUCCESS)
    err = enqueue_locked(s, sk->kernel, 1, &global, NULL, "kernel builtin");
  else
    mgpu__ocl_enqueue_end(s, err, NULL);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "built-in kernel %s of %zu elements", name,
             b->count);
    return mgpu__ocl_fail(d, err, what);
  }
  return 0;
}
