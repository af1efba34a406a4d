/* mgpu_mpi_init: the node-local rank, this rank's share of the node's
 * devices, the path for device memory; and the helpers every call shares
 * (argument checks, deadlines, types and operators). */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mpi/mpi-internal.h"
#include "util/half.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

mpi_state mgpu__mpi;

/* Backend of each open device, read once after mgpu_init. */
static int device_is_host[MGPU_MAX_DEVICES];

#define UUID_LEN 64 /* a device UUID and its split index */

int mgpu__mpi_ready(const char *what) {
  if (!mgpu__mpi.initialized)
    return mgpu__error(MGPU_ENOINIT, "%s: mgpu_mpi_init has not run",
                       what);
  return 0;
}

int mgpu__mpi_err(int mpi_rc, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(mpi_rc, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  return mgpu__error(MGPU_EIO, "rank %d: %s failed: %s", mgpu__mpi.rank,
                     call, msg);
}

double mgpu__mpi_deadline(void) {
  if (mgpu__mpi.timeout_ms < 0) return 1e300;
  return MPI_Wtime() + mgpu__mpi.timeout_ms / 1000.0;
}

int mgpu__mpi_test_all(int n, MPI_Request *reqs, int *done) {
  *done = 1;
  for (int i = 0; i < n; i++) {
    int got = 1;
    if (reqs[i] != MPI_REQUEST_NULL) {
      int m = MPI_Test(&reqs[i], &got, MPI_STATUS_IGNORE);
      if (m != MPI_SUCCESS) return m;
    }
    if (!got) *done = 0;
  }
  return MPI_SUCCESS;
}

/* After a data step timed out: which ranks are still there. Every rank
 * whose step times out sends a note to every other rank and waits one more
 * timeout for theirs; ranks entered the step within less than a timeout of
 * each other, so every rank that is still there is heard from, and the
 * ranks not heard from (dead, or gone back to the program with an error of
 * their own) are the ones named. */
static void roll_call(MPI_Comm comm, char *missing, size_t cap) {
  static int note; /* send buffer: lives as long as the sends it feeds */
  int n = 1, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  note = me;
  snprintf(missing, cap, "unknown");
  int *got = mgpu_module_calloc((size_t)n, sizeof *got);
  MPI_Request *reqs = mgpu_module_calloc((size_t)n * 2, sizeof *reqs);
  if (got == NULL || reqs == NULL) {
    mgpu_module_free(got);
    mgpu_module_free(reqs);
    return;
  }
  for (int r = 0; r < 2 * n; r++) reqs[r] = MPI_REQUEST_NULL;
  for (int r = 0; r < n; r++) {
    if (r == me) continue;
    MPI_Irecv(&got[r], 1, MPI_INT, r, MPI_TAG_ROLL, comm, &reqs[r]);
    MPI_Isend(&note, 1, MPI_INT, r, MPI_TAG_ROLL, comm, &reqs[n + r]);
  }
  double deadline = mgpu__mpi_deadline();
  int all = 0;
  while (!all && mgpu__mpi_test_all(n, reqs, &all) == MPI_SUCCESS && !all &&
         MPI_Wtime() <= deadline)
    sched_yield();
  size_t len = 0;
  missing[0] = '\0';
  for (int r = 0; r < n; r++) {
    if (reqs[r] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&reqs[r], &done, MPI_STATUS_IGNORE);
      if (!done) {
        if (len < cap)
          len += (size_t)snprintf(missing + len, cap - len, "%s%d",
                                  len ? ", " : "", r);
        MPI_Cancel(&reqs[r]);
        MPI_Request_free(&reqs[r]);
      }
    }
    if (reqs[n + r] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[n + r]);
  }
  if (len == 0) snprintf(missing, cap, "none (every rank is waiting)");
  mgpu_module_free(got);
  mgpu_module_free(reqs);
}

int mgpu__mpi_wait_coll(MPI_Request *req, MPI_Comm comm, const char *what) {
  double deadline = mgpu__mpi_deadline();
  for (unsigned spins = 0;; spins++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, what);
    if (done) return 0;
    /* A small message completes within a few tests: only then yield the
     * core (ranks oversubscribe the cores) and look at the clock. */
    if (spins < 64) continue;
    if (MPI_Wtime() > deadline) break;
    sched_yield();
  }
  /* A collective request cannot be cancelled: it stays with MPI, which may
   * still write the buffers it was given, so the module takes no further
   * calls (mgpu__mpi_usable) and keeps its bounce buffers. */
  mgpu__mpi.failed = 1;
  char missing[256];
  roll_call(comm, missing, sizeof missing);
  snprintf(mgpu__mpi.failed_detail, sizeof mgpu__mpi.failed_detail,
           "%s did not complete within %d ms; rank(s) that did not come: %s",
           what, mgpu__mpi.timeout_ms, missing);
  return mgpu__error(MGPU_ETIMEDOUT, "rank %d: %s; the program should "
                     "call MPI_Abort", mgpu__mpi.rank,
                     mgpu__mpi.failed_detail);
}

/* What mgpu__mpi_keep holds: not in mgpu__mpi, which finalize clears.
 * Past the first 64, the memory stays all the same, unlisted. */
static void *kept[64];
static int nkept;

void mgpu__mpi_keep(void *p) {
  if (p != NULL && nkept < (int)(sizeof kept / sizeof kept[0]))
    kept[nkept++] = p;
}

int mgpu__mpi_usable(const char *what) {
  int rc = mgpu__mpi_ready(what);
  if (rc != 0 || !mgpu__mpi.failed) return rc;
  return mgpu__error(MGPU_ETIMEDOUT, "rank %d: %s: an earlier call "
                     "timed out (%s); the program should call MPI_Abort",
                     mgpu__mpi.rank, what, mgpu__mpi.failed_detail);
}

/* ---- types and operators ---- */

/* The module's own types (mgpu/mpi.h) after mgpu_dtype's: MPI type, size
 * and name. */
static const struct {
  int dtype;
  size_t size;
  const char *name;
} extra_types[] = {
    {32, 1, "int8"},   {33, 1, "uint8"},  {34, 2, "int16"},
    {35, 2, "uint16"}, {36, 4, "uint32"}, {37, 8, "uint64"},
    {38, 1, "bool"},   {39, 1, "bytes"}};
#define N_EXTRA (int)(sizeof extra_types / sizeof extra_types[0])

static int extra_index(mgpu_dtype dtype) {
  int i = (int)dtype - extra_types[0].dtype;
  return i >= 0 && i < N_EXTRA ? i : -1;
}

size_t mgpu__mpi_dtype_size(mgpu_dtype dtype) {
  int i = extra_index(dtype);
  return i >= 0 ? extra_types[i].size : mgpu_dtype_size(dtype);
}

const char *mgpu__mpi_dtype_name(mgpu_dtype dtype) {
  int i = extra_index(dtype);
  return i >= 0 ? extra_types[i].name : mgpu_dtype_name(dtype);
}

int mgpu__mpi_type(mgpu_dtype dtype, MPI_Datatype *type) {
  switch ((int)dtype) {
    case MGPU_FLOAT32: *type = MPI_FLOAT; return 0;
    case MGPU_FLOAT64: *type = MPI_DOUBLE; return 0;
    case MGPU_INT32: *type = MPI_INT32_T; return 0;
    case MGPU_INT64: *type = MPI_INT64_T; return 0;
    case MGPU_FLOAT16:
    case MGPU_BFLOAT16: *type = MPI_UINT16_T; return 0;
    case (int)MGPU_MPI_INT8: *type = MPI_INT8_T; return 0;
    case (int)MGPU_MPI_UINT8: *type = MPI_UINT8_T; return 0;
    case (int)MGPU_MPI_INT16: *type = MPI_INT16_T; return 0;
    case (int)MGPU_MPI_UINT16: *type = MPI_UINT16_T; return 0;
    case (int)MGPU_MPI_UINT32: *type = MPI_UINT32_T; return 0;
    case (int)MGPU_MPI_UINT64: *type = MPI_UINT64_T; return 0;
    case (int)MGPU_MPI_BOOL: *type = MPI_C_BOOL; return 0;
    case (int)MGPU_MPI_BYTES: *type = MPI_BYTE; return 0;
  }
  return mgpu__error(MGPU_EINVAL, "rank %d: unknown dtype %d",
                     mgpu__mpi.rank, (int)dtype);
}

#define SUM_OF(a, b) ((a) + (b))
#define PROD_OF(a, b) ((a) * (b))
#define MIN_OF(a, b) ((b) < (a) ? (b) : (a))
#define MAX_OF(a, b) ((b) > (a) ? (b) : (a))
#define HALF_OP(name, to_f, from_f, OP)                                    \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) { \
    (void)type;                                                            \
    const uint16_t *a = in;                                                \
    uint16_t *b = inout;                                                   \
    for (int i = 0; i < *len; i++)                                         \
      b[i] = from_f(OP(to_f(b[i]), to_f(a[i])));                           \
  }
HALF_OP(f16_sum, mgpu__half_to_float, mgpu__float_to_half, SUM_OF)
HALF_OP(f16_prod, mgpu__half_to_float, mgpu__float_to_half, PROD_OF)
HALF_OP(f16_min, mgpu__half_to_float, mgpu__float_to_half, MIN_OF)
HALF_OP(f16_max, mgpu__half_to_float, mgpu__float_to_half, MAX_OF)
HALF_OP(bf16_sum, mgpu__bf16_to_float, mgpu__float_to_bf16, SUM_OF)
HALF_OP(bf16_prod, mgpu__bf16_to_float, mgpu__float_to_bf16, PROD_OF)
HALF_OP(bf16_min, mgpu__bf16_to_float, mgpu__float_to_bf16, MIN_OF)
HALF_OP(bf16_max, mgpu__bf16_to_float, mgpu__float_to_bf16, MAX_OF)

/* Sums and products of 8- and 16-bit integers modulo 2^8 or 2^16, as C
 * and NumPy wrap them: the same bits for signed and unsigned (two's
 * complement), computed unsigned (no overflow in C). */
#define WRAP_OP(name, T, OP)                                               \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) { \
    (void)type;                                                            \
    const T *a = in;                                                       \
    T *b = inout;                                                          \
    for (int i = 0; i < *len; i++)                                         \
      b[i] = (T)OP((unsigned)b[i], (unsigned)a[i]);                        \
  }
WRAP_OP(u8_sum, uint8_t, SUM_OF)
WRAP_OP(u8_prod, uint8_t, PROD_OF)
WRAP_OP(u16_sum, uint16_t, SUM_OF)
WRAP_OP(u16_prod, uint16_t, PROD_OF)

/* The MPI reductions of float16 and bfloat16 (mgpu__mpi.half_ops), and
 * under Open MPI those of narrow integers (narrow_ops). */
static int user_ops_create(void) {
  MPI_User_function *fns[2][4] = {
      {f16_sum, f16_prod, f16_min, f16_max},
      {bf16_sum, bf16_prod, bf16_min, bf16_max}};
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 4; o++) {
      int rc = MPI_Op_create(fns[t][o], 1, &mgpu__mpi.half_ops[t][o]);
      if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Op_create");
    }
#ifdef OMPI_MAJOR_VERSION
  MPI_User_function *narrow[2][2] = {{u8_sum, u8_prod}, {u16_sum, u16_prod}};
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 2; o++) {
      int rc = MPI_Op_create(narrow[t][o], 1, &mgpu__mpi.narrow_ops[t][o]);
      if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Op_create");
    }
#else
  (void)u8_sum, (void)u8_prod, (void)u16_sum, (void)u16_prod;
#endif
  return 0;
}

static void user_ops_free(void) {
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 4; o++)
      if (mgpu__mpi.half_ops[t][o] != MPI_OP_NULL)
        MPI_Op_free(&mgpu__mpi.half_ops[t][o]);
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 2; o++)
      if (mgpu__mpi.narrow_ops[t][o] != MPI_OP_NULL)
        MPI_Op_free(&mgpu__mpi.narrow_ops[t][o]);
}

/* The module's own MPI_Op for a sum or product of narrow integers, or
 * MPI_OP_NULL (MPI's own is right: another type or op, or not Open MPI). */
static MPI_Op narrow_op(mgpu_dtype dtype, mgpu_op op) {
  int t = dtype == MGPU_MPI_INT8 || dtype == MGPU_MPI_UINT8     ? 0
          : dtype == MGPU_MPI_INT16 || dtype == MGPU_MPI_UINT16 ? 1
                                                                : -1;
  if (t < 0 || (op != MGPU_SUM && op != MGPU_PROD)) return MPI_OP_NULL;
  return mgpu__mpi.narrow_ops[t][op == MGPU_PROD];
}

int mgpu__mpi_op_on_host(mgpu_dtype dtype, mgpu_op op) {
  return dtype == MGPU_FLOAT16 || dtype == MGPU_BFLOAT16 ||
         narrow_op(dtype, op) != MPI_OP_NULL;
}

int mgpu__mpi_op(mgpu_dtype dtype, mgpu_op op, MPI_Op *mop) {
  if ((int)op < 0 || op > MGPU_MAX)
    return mgpu__error(MGPU_EINVAL, "rank %d: unknown op %d",
                       mgpu__mpi.rank, (int)op);
  if (dtype == MGPU_FLOAT16 || dtype == MGPU_BFLOAT16) {
    *mop = mgpu__mpi.half_ops[dtype == MGPU_BFLOAT16][op];
    return 0;
  }
  if (dtype == MGPU_MPI_BYTES ||
      (dtype == MGPU_MPI_BOOL && op != MGPU_MIN && op != MGPU_MAX))
    return mgpu__error(MGPU_EINVAL, "rank %d: %s cannot be reduced by "
                       "%s (%s)", mgpu__mpi.rank,
                       mgpu__mpi_dtype_name(dtype), mgpu_op_name(op),
                       dtype == MGPU_MPI_BOOL
                                 ? "bool takes min (and) and max (or)"
                                 : "bytes are moved, never reduced");
  if (dtype == MGPU_MPI_BOOL) {
    *mop = op == MGPU_MIN ? MPI_LAND : MPI_LOR;
    return 0;
  }
  if ((*mop = narrow_op(dtype, op)) != MPI_OP_NULL) return 0;
  switch (op) {
    case MGPU_SUM: *mop = MPI_SUM; break;
    case MGPU_PROD: *mop = MPI_PROD; break;
    case MGPU_MIN: *mop = MPI_MIN; break;
    case MGPU_MAX: *mop = MPI_MAX; break;
  }
  return 0;
}

/* ---- buffers ---- */

int mgpu__mpi_check_buffer(const char *what, const mgpu_buffer *buf,
                           size_t offset, size_t bytes, mgpu_stream *stream,
                           mgpu_buffer_view *view, int *path) {
  if (buf == NULL)
    return mgpu__error(MGPU_EBADHANDLE, "rank %d: %s buffer is NULL",
                       mgpu__mpi.rank, what);
  if (mgpu_module_buffer_view(buf, view) != 0 || view->size == 0)
    return mgpu__error(MGPU_EBADHANDLE,
                       "rank %d: %s buffer is invalid or freed",
                       mgpu__mpi.rank, what);
  int dev = view->device;
  if (offset > view->size || bytes > view->size - offset)
    return mgpu__error(MGPU_ERANGE,
                       "rank %d: %s buffer on device %d: offset %zu + "
                       "%zu bytes exceeds its %zu bytes",
                       mgpu__mpi.rank, what, dev, offset, bytes, view->size);
  if (stream != NULL) {
    int sdev = mgpu_stream_device(stream);
    if (sdev < 0)
      return mgpu__error(MGPU_EBADHANDLE,
                         "rank %d: %s: invalid or destroyed stream",
                         mgpu__mpi.rank, what);
    if (sdev != dev)
      return mgpu__error(MGPU_EWRONGDEV,
                         "rank %d: %s buffer is on device %d but the "
                         "stream on device %d", mgpu__mpi.rank, what, dev,
                         sdev);
  }
  if (mgpu__mpi.force_stage)
    *path = MPI_PATH_STAGED;
  else if (view->kind == MGPU_MEM_PINNED || view->kind == MGPU_MEM_UNIFIED ||
           dev >= MGPU_MAX_DEVICES || device_is_host[dev])
    *path = MPI_PATH_HOST;
  else
    *path = mgpu__mpi.cuda_aware ? MPI_PATH_DIRECT : MPI_PATH_STAGED;
  return 0;
}

int mgpu__mpi_sync_before(const mgpu_buffer_view *view, mgpu_stream *stream) {
  if (stream != NULL) return mgpu_stream_synchronize(stream);
  return mgpu_device_synchronize(view->device);
}

void *mgpu__mpi_addr(const mgpu_buffer_view *view, size_t offset) {
  return (unsigned char *)view->ptr + offset;
}

void mgpu__mpi_count(int dev, int path, size_t bytes) {
  static const char *const counter[] = {"mpi_host", "mpi_direct",
                                        "mpi_staged"};
  mgpu_module_metric_add(dev, counter[path], 1);
  mgpu_module_metric_add(dev, "bytes_mpi", bytes);
  mgpu_mpi_stats *s = &mgpu__mpi.stats;
  if (path == MPI_PATH_HOST) {
    s->calls_host++;
    s->bytes_host += bytes;
  } else if (path == MPI_PATH_DIRECT) {
    s->calls_direct++;
    s->bytes_direct += bytes;
  } else {
    s->calls_staged++;
    s->bytes_staged += bytes;
  }
}

/* ---- environment ---- */

typedef struct mpi_env {
  int ranks_per_node; /* 0: the machine is the node */
  int cuda_aware;     /* -1 auto, 0, 1 */
} mpi_env;

/* The module's variables, from libmgpu's table (src/core/config.c), which
 * also holds their defaults: a value is NULL only for a variable without
 * one (MGPU_MPI_RANKS_PER_NODE). */
static int read_env(mpi_env *env) {
  const char *v;
  env->ranks_per_node = 0;
  env->cuda_aware = -1;
  if ((v = mgpu_module_getenv("MGPU_MPI_RANKS_PER_NODE")) &&
      mgpu_module_parse_int(v, 1, INT_MAX, &env->ranks_per_node))
    return mgpu__error(MGPU_EINVAL, "MGPU_MPI_RANKS_PER_NODE: bad value "
                       "'%s' (expected a count of at least 1)", v);
  v = mgpu_module_getenv("MGPU_MPI_CUDA_AWARE");
  if (v == NULL || strcasecmp(v, "auto") == 0) env->cuda_aware = -1;
  else if (strcmp(v, "0") == 0) env->cuda_aware = 0;
  else if (strcmp(v, "1") == 0) env->cuda_aware = 1;
  else
    return mgpu__error(MGPU_EINVAL, "MGPU_MPI_CUDA_AWARE: bad value '%s' "
                       "(expected auto, 0 or 1)", v);
  if ((v = mgpu_module_getenv("MGPU_MPI_STAGE")) == NULL ||
      mgpu_module_parse_int(v, 0, 1, &mgpu__mpi.force_stage))
    return mgpu__error(MGPU_EINVAL, "MGPU_MPI_STAGE: bad value '%s' "
                       "(expected 0 or 1)", v ? v : "");
  /* 0 would fail every call that waits for another rank at all. */
  if ((v = mgpu_module_getenv("MGPU_MPI_TIMEOUT_MS")) == NULL ||
      mgpu_module_parse_int(v, -1, INT_MAX / 2, &mgpu__mpi.timeout_ms) ||
      mgpu__mpi.timeout_ms == 0)
    return mgpu__error(MGPU_EINVAL, "MGPU_MPI_TIMEOUT_MS: bad value '%s' "
                       "(expected milliseconds from 1, or -1 for none)",
                       v ? v : "");
  if ((v = mgpu_module_getenv("MGPU_MPI_CHUNK")) == NULL ||
      mgpu_module_parse_size(v, &mgpu__mpi.chunk) || mgpu__mpi.chunk < 4096 ||
      mgpu__mpi.chunk > ((size_t)1 << 30))
    return mgpu__error(MGPU_EINVAL, "MGPU_MPI_CHUNK: bad value '%s' "
                       "(expected 4K to 1G)", v ? v : "");
  return 0;
}

/* 1 when the MPI library takes CUDA device pointers, as it says itself. */
static int query_cuda_aware(void) {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) != MPI_SUCCESS)
    return 0;
  return yes ? 1 : 0;
#else
  return 0;
#endif
}

/* ---- the device share ---- */

typedef struct dev_list {
  int n;
  int host[MGPU_MAX_DEVICES];
  int ordinal[MGPU_MAX_DEVICES];
  int split[MGPU_MAX_DEVICES];
  int opencl[MGPU_MAX_DEVICES]; /* an OpenCL device (else CUDA or host) */
  char id[MGPU_MAX_DEVICES][UUID_LEN]; /* UUID, "host" on host devices */
} dev_list;

/* Opens what the configuration names, notes each device, closes again. */
static int list_devices(const mgpu_config *cfg, dev_list *out) {
  int rc = mgpu_init(cfg);
  if (rc != 0) return rc;
  memset(out, 0, sizeof *out);
  out->n = mgpu_device_count();
  for (int d = 0; d < out->n; d++) {
    mgpu_device_props p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    if ((rc = mgpu_device_get_props(d, &p)) != 0) break;
    out->host[d] = p.backend_kind == MGPU_BACKEND_HOST;
    out->ordinal[d] = p.ordinal;
    out->opencl[d] = p.backend_kind == MGPU_BACKEND_OPENCL;
    out->split[d] = p.split_count > 0 ? p.split_count : 1;
    if (out->host[d] || p.uuid[0] == '\0')
      snprintf(out->id[d], UUID_LEN, "%s:%d", out->host[d] ? "host" : "dev",
               out->host[d] ? 0 : p.ordinal);
    else
      snprintf(out->id[d], UUID_LEN, "%.40s/%d", p.uuid, p.split_index);
  }
  int rc2 = mgpu_shutdown();
  return rc != 0 ? rc : rc2;
}

/* The MGPU_DEVICES spec of devices [lo, hi) of the list. */
static int share_spec(const dev_list *l, int lo, int hi, char *spec,
                      size_t cap) {
  size_t len = 0;
  int nhost = 0;
  spec[0] = '\0';
  for (int d = lo; d < hi; d++) nhost += l->host[d];
  if (nhost > 0) len += (size_t)snprintf(spec, cap, "host:%d", nhost);
  for (int d = lo; d < hi; d++) {
    if (l->host[d]) continue;
    int seen = 0, count = 0;
#define SAME(e) (!l->host[e] && l->opencl[e] == l->opencl[d] && \
                 l->ordinal[e] == l->ordinal[d])
    for (int e = lo; e < d; e++) seen |= SAME(e);
    if (seen) continue;
    for (int e = d; e < hi; e++) count += SAME(e);
#undef SAME
    if (len >= cap) break;
    const char *kind = l->opencl[d] ? "opencl" : "cuda";
    if (count > 1)
      len += (size_t)snprintf(spec + len, cap - len, "%s%s:%d/%d",
                              len ? "," : "", kind, l->ordinal[d], count);
    else
      len += (size_t)snprintf(spec + len, cap - len, "%s%s:%d",
                              len ? "," : "", kind, l->ordinal[d]);
  }
  if (len >= cap)
    return mgpu__error(MGPU_EINVAL, "rank %d: device share too long",
                       mgpu__mpi.rank);
  return 0;
}

/* Among the ranks of the node, those that see the same devices as this
 * one (l): *g of them come before it, *group in all. Every rank of the
 * node takes part in the exchange, or all fail together. */
static int device_group(MPI_Comm node, const dev_list *l, int *g,
                        int *group) {
  size_t keylen = (size_t)MGPU_MAX_DEVICES * UUID_LEN;
  char *mine = mgpu_module_calloc(1, keylen);
  char *all = mgpu_module_calloc((size_t)mgpu__mpi.local_size, keylen);
  int ok = mine != NULL && all != NULL, all_ok = 0;
  int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node);
  if (rc == MPI_SUCCESS && all_ok) {
    for (int d = 0; d < l->n; d++)
      memcpy(mine + (size_t)d * UUID_LEN, l->id[d], UUID_LEN);
    rc = MPI_Allgather(mine, (int)keylen, MPI_CHAR, all, (int)keylen,
                       MPI_CHAR, node);
  }
  if (rc == MPI_SUCCESS && all_ok) {
    *g = *group = 0;
    for (int r = 0; r < mgpu__mpi.local_size; r++) {
      if (memcmp(all + (size_t)r * keylen, mine, keylen) != 0) continue;
      if (r < mgpu__mpi.local_rank) (*g)++;
      (*group)++;
    }
  }
  mgpu_module_free(mine);
  mgpu_module_free(all);
  if (rc != MPI_SUCCESS)
    return mgpu__mpi_err(rc, all_ok ? "MPI_Allgather" : "MPI_Allreduce");
  if (!all_ok)
    return mgpu__error(MGPU_ENOMEM, "rank %d: device key: %s",
                       mgpu__mpi.rank, ok ? "another rank of the node had "
                       "no memory for it" : "no memory");
  return 0;
}

/* Splits the devices among the ranks of the node that see the same ones:
 * returns [lo, hi) and whether the device is shared with another rank. */
static int choose_share(MPI_Comm node, const dev_list *l, int *lo, int *hi,
                        int *shared) {
  int g = 0, group = 0;
  int rc = device_group(node, l, &g, &group);
  if (rc != 0) return rc;
  int n = l->n;
  if (n == 0) return mgpu__error(MGPU_ENODEV, "rank %d: no devices",
                                 mgpu__mpi.rank);
  if (group <= n) {
    *lo = (int)((long)g * n / group);
    *hi = (int)((long)(g + 1) * n / group);
    *shared = 0;
  } else {
    *lo = (int)((long)g * n / group);
    *hi = *lo + 1;
    *shared = 1;
  }
  return 0;
}

static int split_node(MPI_Comm comm, int ranks_per_node, MPI_Comm *node) {
  MPI_Comm shm;
  int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, mgpu__mpi.rank,
                               MPI_INFO_NULL, &shm);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Comm_split_type");
  if (ranks_per_node <= 0) {
    *node = shm;
    return 0;
  }
  int shm_rank;
  MPI_Comm_rank(shm, &shm_rank);
  rc = MPI_Comm_split(shm, shm_rank / ranks_per_node, shm_rank, node);
  MPI_Comm_free(&shm);
  return rc == MPI_SUCCESS ? 0 : mgpu__mpi_err(rc, "MPI_Comm_split");
}

static int find_nodes(MPI_Comm node) {
  MPI_Comm leaders;
  int leader = mgpu__mpi.local_rank == 0;
  int rc = MPI_Comm_split(mgpu__mpi.world, leader ? 0 : MPI_UNDEFINED,
                          mgpu__mpi.rank, &leaders);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Comm_split");
  int ids[2] = {0, 0};
  if (leader) {
    MPI_Comm_rank(leaders, &ids[0]);
    MPI_Comm_size(leaders, &ids[1]);
    MPI_Comm_free(&leaders);
  }
  rc = MPI_Bcast(ids, 2, MPI_INT, 0, node);
  if (rc != MPI_SUCCESS) return mgpu__mpi_err(rc, "MPI_Bcast");
  mgpu__mpi.node = ids[0];
  mgpu__mpi.nnodes = ids[1];
  return 0;
}

/* The caller's configuration, or the defaults for NULL, into *conf. */
static int take_config(const mgpu_config *cfg, mgpu_config *conf) {
  mgpu_config init = MGPU_CONFIG_INITIALIZER;
  *conf = init;
  if (cfg == NULL) return 0;
  size_t n = cfg->size < sizeof *conf ? cfg->size : sizeof *conf;
  if (n < sizeof(size_t))
    return mgpu__error(MGPU_EINVAL, "mgpu_mpi_init: mgpu_config.size is %zu",
                       cfg->size);
  memcpy(conf, cfg, n);
  conf->size = sizeof *conf;
  return 0;
}

/* Finds this rank's node and its share of the node's devices, and opens
 * it: mgpu_init with conf's devices replaced by spec (cap bytes). Every
 * rank learns its device list, or all fail together. */
static int open_share(const mpi_env *env, mgpu_config *conf, char *spec,
                      size_t cap, int *node_devices) {
  MPI_Comm node = MPI_COMM_NULL;
  dev_list devs;
  int lo = 0, hi = 0;
  int rc = split_node(mgpu__mpi.world, env->ranks_per_node, &node);
  if (rc != 0) return rc;
  MPI_Comm_rank(node, &mgpu__mpi.local_rank);
  MPI_Comm_size(node, &mgpu__mpi.local_size);
  if ((rc = find_nodes(node)) != 0) goto done;
  rc = list_devices(conf, &devs);
  int worst = rc;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MIN, mgpu__mpi.world);
  if (rc != 0) goto done;
  if (worst != 0) {
    rc = mgpu__error(worst, "rank %d: another rank could not open its "
                     "devices", mgpu__mpi.rank);
    goto done;
  }
  if ((rc = choose_share(node, &devs, &lo, &hi, &mgpu__mpi.shared)) != 0)
    goto done;
  if ((rc = share_spec(&devs, lo, hi, spec, cap)) != 0) goto done;
  conf->devices = spec;
  *node_devices = devs.n;
  rc = mgpu_init(conf);
done:
  MPI_Comm_free(&node);
  return rc;
}

/* After mgpu_init: which open devices are host devices, and this rank's
 * place in the numbering of every rank's devices. */
static void number_devices(void) {
  mgpu__mpi.ndevices = mgpu_device_count();
  for (int d = 0; d < mgpu__mpi.ndevices && d < MGPU_MAX_DEVICES; d++) {
    mgpu_device_props p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    device_is_host[d] = mgpu_device_get_props(d, &p) == 0 &&
                        p.backend_kind == MGPU_BACKEND_HOST;
  }
  MPI_Exscan(&mgpu__mpi.ndevices, &mgpu__mpi.first_device, 1, MPI_INT,
             MPI_SUM, mgpu__mpi.world);
  if (mgpu__mpi.rank == 0) mgpu__mpi.first_device = 0;
  MPI_Allreduce(&mgpu__mpi.ndevices, &mgpu__mpi.total_devices, 1, MPI_INT,
                MPI_SUM, mgpu__mpi.world);
}

/* Chooses the path of device memory (MGPU_MPI_CUDA_AWARE, else what MPI
 * says) and logs it with the share (spec) of the node's devices. */
static void choose_path(const mpi_env *env, const char *spec,
                        int node_devices) {
  if (mgpu__mpi.shared)
    mgpu_module_log(MGPU_LOG_WARN, "rank %d: %d ranks on node %d share its %d "
                    "device(s); rank %d uses '%s' together with another rank",
                    mgpu__mpi.rank, mgpu__mpi.local_size, mgpu__mpi.node,
                    node_devices, mgpu__mpi.rank, spec);
  int queried = query_cuda_aware();
  mgpu__mpi.cuda_aware = env->cuda_aware >= 0 ? env->cuda_aware : queried;
  if (mgpu__mpi.rank == 0)
    mgpu_module_log(MGPU_LOG_INFO, "MPI device path: %s (MPI says %s; "
                    "MGPU_MPI_CUDA_AWARE=%s)",
                    mgpu__mpi.cuda_aware ? "device pointers straight to MPI"
                                         : "staged through pinned buffers",
                    queried ? "CUDA-aware" : "not CUDA-aware",
                    env->cuda_aware < 0 ? "auto"
                    : env->cuda_aware   ? "1"
                                        : "0");
  mgpu_module_log(MGPU_LOG_INFO, "rank %d: node %d/%d, local rank %d/%d, "
                  "devices '%s'", mgpu__mpi.rank, mgpu__mpi.node,
                  mgpu__mpi.nnodes, mgpu__mpi.local_rank,
                  mgpu__mpi.local_size, spec);
}

int mgpu_mpi_init(MPI_Comm comm, const mgpu_config *cfg) {
  if (mgpu__mpi.initialized)
    return mgpu__error(MGPU_EALREADY, "mgpu_mpi_init: already done");
  int flag = 0;
  MPI_Initialized(&flag);
  if (!flag)
    return mgpu__error(MGPU_ENOINIT, "mgpu_mpi_init: call MPI_Init first");
  memset(&mgpu__mpi, 0, sizeof mgpu__mpi);
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 4; o++) mgpu__mpi.half_ops[t][o] = MPI_OP_NULL;
  for (int t = 0; t < 2; t++)
    for (int o = 0; o < 2; o++) mgpu__mpi.narrow_ops[t][o] = MPI_OP_NULL;
  mgpu__mpi.world = MPI_COMM_NULL;
  mpi_env env;
  mgpu_config conf;
  int rc = read_env(&env);
  if (rc == 0) rc = take_config(cfg, &conf);
  if (rc != 0) return rc;
  if ((rc = MPI_Comm_dup(comm, &mgpu__mpi.world)) != MPI_SUCCESS)
    return mgpu__mpi_err(rc, "MPI_Comm_dup");
  MPI_Comm_rank(mgpu__mpi.world, &mgpu__mpi.rank);
  MPI_Comm_size(mgpu__mpi.world, &mgpu__mpi.nranks);
  char spec[512];
  int node_devices = 0;
  if ((rc = open_share(&env, &conf, spec, sizeof spec, &node_devices)) != 0)
    goto fail;
  number_devices();
  choose_path(&env, spec, node_devices);
  if ((rc = user_ops_create()) != 0) {
    mgpu_shutdown();
    goto fail;
  }
  mgpu__mpi.stats.size = sizeof mgpu__mpi.stats;
  mgpu__mpi.initialized = 1;
  return 0;

fail:
  user_ops_free();
  MPI_Comm_free(&mgpu__mpi.world);
  return rc;
}

int mgpu_mpi_finalize(void) {
  if (!mgpu__mpi.initialized) return 0;
  /* Requests never waited for hold buffers and MPI requests: completed
   * first (each ends by the timeout), or a later wait would run after
   * their buffers were freed by the shutdown. */
  char detail[512] = "";
  int req_rc = mgpu__mpi_requests_finish();
  if (req_rc != 0)
    snprintf(detail, sizeof detail, "%s", mgpu_error_detail());
  /* After a data step timed out MPI may still write the bounce buffers. */
  if (!mgpu__mpi.failed) mgpu__mpi_staging_free_all();
  user_ops_free();
  int rc = mgpu_shutdown();
  if (rc == 0 && req_rc != 0)
    rc = mgpu__error(req_rc, "mgpu_mpi_finalize: a request still open "
                     "failed: %s", detail);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&mgpu__mpi.world);
  memset(&mgpu__mpi, 0, sizeof mgpu__mpi);
  return rc;
}

int mgpu_mpi_get_info(mgpu_mpi_info *info) {
  int rc = mgpu__mpi_ready("mgpu_mpi_get_info");
  if (rc != 0) return rc;
  if (info == NULL || info->size < sizeof *info)
    return mgpu__error(MGPU_EINVAL, "mgpu_mpi_get_info: set info->size "
                       "to sizeof(mgpu_mpi_info)");
  info->rank = mgpu__mpi.rank;
  info->nranks = mgpu__mpi.nranks;
  info->local_rank = mgpu__mpi.local_rank;
  info->local_size = mgpu__mpi.local_size;
  info->node = mgpu__mpi.node;
  info->nnodes = mgpu__mpi.nnodes;
  info->ndevices = mgpu__mpi.ndevices;
  info->first_device = mgpu__mpi.first_device;
  info->total_devices = mgpu__mpi.total_devices;
  info->shared = mgpu__mpi.shared;
  info->cuda_aware = mgpu__mpi.cuda_aware;
  return 0;
}

int mgpu_mpi_get_stats(mgpu_mpi_stats *stats) {
  int rc = mgpu__mpi_ready("mgpu_mpi_get_stats");
  if (rc != 0) return rc;
  if (stats == NULL || stats->size < sizeof *stats)
    return mgpu__error(MGPU_EINVAL, "mgpu_mpi_get_stats: set "
                       "stats->size to sizeof(mgpu_mpi_stats)");
  *stats = mgpu__mpi.stats;
  return 0;
}

int mgpu_mpi_reset_stats(void) {
  int rc = mgpu__mpi_ready("mgpu_mpi_reset_stats");
  if (rc != 0) return rc;
  memset(&mgpu__mpi.stats, 0, sizeof mgpu__mpi.stats);
  mgpu__mpi.stats.size = sizeof mgpu__mpi.stats;
  return 0;
}
