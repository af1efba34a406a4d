/* Interop: buffers exported as DLPack managed tensors (mgpu/interop.h):
 * the view, its device, the reference it holds across mgpu_free and
 * mgpu_shutdown, and a deleter called from another thread. */
#include <pthread.h>

#include "task.h"

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType I64 = {kDLInt, 64, 1};

static uint64_t mem_in_use(int dev) {
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  return m.dev[dev].mem_in_use;
}

static int is_host(int dev) {
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(dev, &p));
  return p.backend_kind == MGPU_BACKEND_HOST;
}

/* The tests that import kDLCPU memory onto device 0 skip where device 0 is
 * not a host device: host memory goes on host devices only. */
#define SKIP_UNLESS_HOST_DEVICE_0()                                     \
  do {                                                                 \
    if (!is_host(0)) {                                                 \
      printf("skipped: device 0 is not a host device: kDLCPU memory "  \
             "cannot go on it\n");                                     \
      return TEST_SKIP;                                                \
    }                                                                  \
  } while (0)

/* A strided 2x3 float view at offset 16 sees the buffer's bytes, and writes
 * through it are seen by copies of the buffer. */
TEST_IMPL(export_view_shares_memory) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    mgpu_buffer *b;
    ASSERT_OK(mgpu_malloc(&b, d, 64 * sizeof(float)));
    float init[64];
    for (int i = 0; i < 64; i++) init[i] = (float)i;
    ASSERT_OK(mgpu_memcpy_htod(b, 0, init, sizeof init));
    int64_t shape[2] = {2, 3}, strides[2] = {8, 2};
    DLManagedTensorVersioned *t;
    ASSERT_OK(mgpu_buffer_dlpack(b, 16, F32, 2, shape, strides, &t));
    ASSERT_EQ(t->version.major, 1);
    ASSERT_EQ(t->version.minor, 1);
    ASSERT_EQ(t->flags, 0);
    ASSERT(t->dl_tensor.data == mgpu_buffer_ptr(b));
    ASSERT_EQ(t->dl_tensor.byte_offset, 16);
    ASSERT_EQ(t->dl_tensor.ndim, 2);
    ASSERT_EQ(t->dl_tensor.dtype.code, kDLFloat);
    ASSERT_EQ(t->dl_tensor.dtype.bits, 32);
    ASSERT_EQ(t->dl_tensor.shape[0], 2);
    ASSERT_EQ(t->dl_tensor.shape[1], 3);
    ASSERT_EQ(t->dl_tensor.strides[0], 8);
    ASSERT_EQ(t->dl_tensor.strides[1], 2);
    /* The caller's arrays were copied. */
    shape[0] = strides[0] = 99;
    ASSERT_EQ(t->dl_tensor.shape[0], 2);
    DLDevice where;
    ASSERT_OK(mgpu_buffer_dldevice(b, &where));
    ASSERT_EQ(where.device_type, t->dl_tensor.device.device_type);
    if (is_host(d)) {
      ASSERT_EQ(t->dl_tensor.device.device_type, kDLCPU);
      ASSERT_EQ(t->dl_tensor.device.device_id, 0);
      float *v = (float *)((char *)t->dl_tensor.data + t->dl_tensor.byte_offset);
      ASSERT(v[1 * 8 + 2 * 2] == 4.0f + 12.0f); /* element [1][2] */
      v[1 * 8 + 2 * 2] = -1.0f;
      float back[64];
      ASSERT_OK(mgpu_memcpy_dtoh(back, b, 0, sizeof back));
      ASSERT(back[16] == -1.0f);
      ASSERT(back[15] == 15.0f);
    } else {
      mgpu_device_props p = {.size = sizeof p};
      ASSERT_OK(mgpu_device_get_props(d, &p));
      ASSERT_EQ(t->dl_tensor.device.device_type, kDLCUDA);
      ASSERT_EQ(t->dl_tensor.device.device_id, p.ordinal);
    }
    t->deleter(t);
    /* Compact row-major strides when none are given, and 0-d views. */
    int64_t shape3[3] = {2, 3, 4};
    ASSERT_OK(mgpu_buffer_dlpack(b, 0, F32, 3, shape3, NULL, &t));
    ASSERT_EQ(t->dl_tensor.strides[0], 12);
    ASSERT_EQ(t->dl_tensor.strides[1], 4);
    ASSERT_EQ(t->dl_tensor.strides[2], 1);
    t->deleter(t);
    ASSERT_OK(mgpu_buffer_dlpack(b, 252, F32, 0, NULL, NULL, &t));
    ASSERT(t->dl_tensor.shape == NULL);
    t->deleter(t);
    ASSERT_OK(mgpu_free(b));
  }
  return 0;
}

/* Pinned memory is host memory on every backend; unified memory is the
 * host's on host devices. */
TEST_IMPL(export_device_of_each_kind) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    mgpu_buffer *p, *u;
    ASSERT_OK(mgpu_malloc_host(&p, d, 256));
    ASSERT_OK(mgpu_malloc_unified(&u, d, 256));
    DLDevice dp, du;
    ASSERT_OK(mgpu_buffer_dldevice(p, &dp));
    ASSERT_OK(mgpu_buffer_dldevice(u, &du));
    ASSERT_EQ(dp.device_type, kDLCPU);
    ASSERT_EQ(du.device_type, is_host(d) ? kDLCPU : kDLCUDAManaged);
    ASSERT_OK(mgpu_free(p));
    ASSERT_OK(mgpu_free(u));
  }
  return 0;
}

TEST_IMPL(export_errors) {
  test_init();
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 0, 96));
  DLManagedTensorVersioned *t = (void *)&t;
  int64_t shape[2] = {3, 4}, strides[2] = {4, 1};
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, F32, 2, shape, NULL, NULL));
  ASSERT_DETAIL_HAS("device 0");
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, F32, 2, NULL, NULL, &t));
  ASSERT(t == NULL);
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, F32, -1, shape, NULL, &t));
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, F32, 65, shape, NULL, &t));
  DLDataType nibble = {kDLInt, 4, 1}, nolanes = {kDLInt, 8, 0};
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, nibble, 2, shape, NULL, &t));
  ASSERT_DETAIL_HAS("4 bits");
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, nolanes, 2, shape, NULL, &t));
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 2, F32, 2, shape, NULL, &t));
  ASSERT_DETAIL_HAS("offset 2");
  int64_t neg[2] = {3, -1};
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_dlpack(b, 0, F32, 2, neg, NULL, &t));
  ASSERT_DETAIL_HAS("dimension 1");
  /* 3x4 floats fill the 48... 96 bytes from offset 48 exactly; one more
   * element does not fit. */
  ASSERT_OK(mgpu_buffer_dlpack(b, 48, F32, 2, shape, strides, &t));
  t->deleter(t);
  ASSERT_ERR(MGPU_ERANGE, mgpu_buffer_dlpack(b, 52, F32, 2, shape, strides, &t));
  ASSERT_DETAIL_HAS("96-byte buffer of device 0");
  /* 12 int64 are 96 bytes: fits at 0, not at 8. */
  ASSERT_OK(mgpu_buffer_dlpack(b, 0, I64, 2, shape, NULL, &t));
  t->deleter(t);
  ASSERT_ERR(MGPU_ERANGE, mgpu_buffer_dlpack(b, 8, I64, 2, shape, NULL, &t));
  /* A negative stride may reach back only as far as the buffer's start. */
  int64_t back[1] = {-1}, three[1] = {3};
  ASSERT_OK(mgpu_buffer_dlpack(b, 8, F32, 1, three, back, &t));
  t->deleter(t);
  ASSERT_ERR(MGPU_ERANGE, mgpu_buffer_dlpack(b, 4, F32, 1, three, back, &t));
  int64_t huge[2] = {INT64_MAX / 2, 4};
  ASSERT_ERR(MGPU_ERANGE, mgpu_buffer_dlpack(b, 0, F32, 2, huge, NULL, &t));
  /* An empty view needs no bytes, but its offset must lie in the buffer. */
  int64_t empty[2] = {0, 4};
  ASSERT_OK(mgpu_buffer_dlpack(b, 96, F32, 2, empty, NULL, &t));
  t->deleter(t);
  ASSERT_ERR(MGPU_ERANGE, mgpu_buffer_dlpack(b, 100, F32, 2, empty, NULL, &t));
  ASSERT_OK(mgpu_free(b));
  ASSERT_ERR(MGPU_EFREED, mgpu_buffer_dlpack(b, 0, F32, 2, shape, NULL, &t));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_buffer_dlpack(NULL, 0, F32, 2, shape, NULL, &t));
  return 0;
}

/* mgpu_free on an exported buffer retires the handle at once; the memory
 * stays usable and counted until the last deleter. */
TEST_IMPL(free_while_exported_defers) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  ASSERT_OK(mgpu_init(&cfg));
  uint64_t before = mem_in_use(1);
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 1, 4096));
  int64_t shape[1] = {512};
  DLManagedTensorVersioned *t1, *t2;
  ASSERT_OK(mgpu_buffer_dlpack(b, 0, I64, 1, shape, NULL, &t1));
  ASSERT_OK(mgpu_buffer_dlpack(b, 0, I64, 1, shape, NULL, &t2));
  ASSERT_OK(mgpu_free(b));
  ASSERT_ERR(MGPU_EFREED, mgpu_free(b));
  ASSERT(mgpu_buffer_ptr(b) == NULL);
  int64_t *v = t1->dl_tensor.data;
  for (int i = 0; i < 512; i++) v[i] = i;
  ASSERT_EQ(((int64_t *)t2->dl_tensor.data)[511], 511);
  ASSERT_EQ(mem_in_use(1), before + 4096);
  t1->deleter(t1);
  ASSERT_EQ(mem_in_use(1), before + 4096);
  t2->deleter(t2);
  ASSERT_EQ(mem_in_use(1), before);
  /* A pooled buffer freed asynchronously while exported waits too. */
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 1));
  ASSERT_OK(mgpu_malloc_async(&b, 4096, s));
  ASSERT_OK(mgpu_buffer_dlpack(b, 0, I64, 1, shape, NULL, &t1));
  ASSERT_OK(mgpu_free_async(b, s));
  ((int64_t *)t1->dl_tensor.data)[0] = 42;
  t1->deleter(t1);
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Exported memory outlives mgpu_shutdown, whether its handle was freed or
 * not, and the deleter may run after it, also after a new mgpu_init. */
TEST_IMPL(deleter_after_shutdown) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_buffer *live, *freed;
  ASSERT_OK(mgpu_malloc(&live, 0, 1024));
  ASSERT_OK(mgpu_malloc(&freed, 1, 1024));
  int64_t shape[1] = {128};
  DLManagedTensorVersioned *tl, *tf, *tl2;
  ASSERT_OK(mgpu_buffer_dlpack(live, 0, I64, 1, shape, NULL, &tl));
  ASSERT_OK(mgpu_buffer_dlpack(live, 0, I64, 1, shape, NULL, &tl2));
  ASSERT_OK(mgpu_buffer_dlpack(freed, 0, I64, 1, shape, NULL, &tf));
  ((int64_t *)tl->dl_tensor.data)[127] = 7;
  ((int64_t *)tf->dl_tensor.data)[127] = 8;
  ASSERT_OK(mgpu_free(freed));
  tl2->deleter(tl2);
  ASSERT_OK(mgpu_shutdown());
  ASSERT_EQ(((int64_t *)tl->dl_tensor.data)[127], 7);
  ASSERT_EQ(((int64_t *)tf->dl_tensor.data)[127], 8);
  ((int64_t *)tl->dl_tensor.data)[0] = 1;
  ASSERT_ERR(MGPU_ENOINIT, mgpu_free(live));
  tf->deleter(tf);
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_ERR(MGPU_EFREED, mgpu_free(live));
  uint64_t before = mem_in_use(0);
  tl->deleter(tl);
  ASSERT_EQ(mem_in_use(0), before); /* the new device 0 never counted it */
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

typedef struct {
  DLManagedTensorVersioned **t;
  int n;
} drop_args;

static void *drop_all(void *arg) {
  drop_args *a = arg;
  for (int i = 0; i < a->n; i++) a->t[i]->deleter(a->t[i]);
  return NULL;
}

/* Deleters run on other threads while the owner exports and frees. */
TEST_IMPL(deleters_on_other_threads) {
  test_init();
  enum { T = 4, N = 200 };
  static DLManagedTensorVersioned *ts[T][N];
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 0, 4096));
  int64_t shape[1] = {512};
  for (int k = 0; k < T; k++)
    for (int i = 0; i < N; i++)
      ASSERT_OK(mgpu_buffer_dlpack(b, 0, I64, 1, shape, NULL, &ts[k][i]));
  pthread_t th[T];
  drop_args args[T];
  for (int k = 0; k < T; k++) {
    args[k] = (drop_args){ts[k], N};
    ASSERT(pthread_create(&th[k], NULL, drop_all, &args[k]) == 0);
  }
  ASSERT_OK(mgpu_free(b));
  for (int k = 0; k < T; k++) pthread_join(th[k], NULL);
  return 0;
}

/* A tensor over host memory of the test's own, counting its deleter. */
typedef struct {
  DLManagedTensorVersioned t;
  int64_t shape[2], strides[2];
  int deleted;
  float data[64];
} own_tensor;

static void own_deleter(DLManagedTensorVersioned *self) {
  ((own_tensor *)self->manager_ctx)->deleted++;
}

static void own_init(own_tensor *o, int64_t rows, int64_t cols) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < 64; i++) o->data[i] = (float)i;
  o->shape[0] = rows;
  o->shape[1] = cols;
  o->strides[0] = cols;
  o->strides[1] = 1;
  o->t.version.major = 1;
  o->t.version.minor = 1;
  o->t.manager_ctx = o;
  o->t.deleter = own_deleter;
  o->t.dl_tensor.data = o->data;
  o->t.dl_tensor.device.device_type = kDLCPU;
  o->t.dl_tensor.ndim = 2;
  o->t.dl_tensor.dtype = F32;
  o->t.dl_tensor.shape = o->shape;
  o->t.dl_tensor.strides = o->strides;
}

/* Host memory another library owns becomes a buffer without a copy; the
 * owner's deleter runs exactly once, at mgpu_free. */
TEST_IMPL(import_host_tensor) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  ASSERT_OK(mgpu_init(&cfg));
  own_tensor o;
  own_init(&o, 4, 8);
  o.t.dl_tensor.byte_offset = 8 * sizeof(float); /* rows 1.. of 5 */
  uint64_t before = mem_in_use(1);
  mgpu_buffer *b;
  ASSERT_OK(mgpu_set_device(1));
  ASSERT_OK(mgpu_buffer_from_dlpack(&b, -1, &o.t));
  ASSERT_EQ(mgpu_buffer_device(b), 1);
  ASSERT(mgpu_buffer_ptr(b) == &o.data[8]);
  ASSERT_EQ(mgpu_buffer_size(b), 32 * sizeof(float));
  ASSERT_EQ(mem_in_use(1), before); /* not counted: not mgpu's */
  /* mgpu writes land in the owner's memory. */
  mgpu_buffer *src;
  ASSERT_OK(mgpu_malloc(&src, 0, 16));
  float v[4] = {-1, -2, -3, -4};
  ASSERT_OK(mgpu_memcpy_htod(src, 0, v, sizeof v));
  ASSERT_OK(mgpu_memcpy(b, 4, src, 0, sizeof v));
  ASSERT(o.data[9] == -1 && o.data[12] == -4 && o.data[13] == 13);
  ASSERT_OK(mgpu_free(src));
  ASSERT_EQ(o.deleted, 0);
  ASSERT_OK(mgpu_free(b));
  ASSERT_EQ(o.deleted, 1);
  /* Put on device 0 explicitly; released by shutdown when never freed. */
  own_init(&o, 2, 2);
  o.t.dl_tensor.strides = NULL;
  ASSERT_OK(mgpu_buffer_from_dlpack(&b, 0, &o.t));
  ASSERT_EQ(mgpu_buffer_device(b), 0);
  ASSERT_OK(mgpu_shutdown());
  ASSERT_EQ(o.deleted, 1);
  return 0;
}

/* A read-only tensor gives a read-only buffer. */
TEST_IMPL(import_read_only) {
  test_init();
  SKIP_UNLESS_HOST_DEVICE_0();
  own_tensor o;
  own_init(&o, 2, 4);
  o.t.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  mgpu_buffer *b, *dst;
  ASSERT_OK(mgpu_buffer_from_dlpack(&b, 0, &o.t));
  ASSERT_EQ(mgpu_buffer_is_readonly(b), 1);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memset_async(b, 0, 0, 8, s));
  ASSERT(o.data[1] == 1.0f);
  ASSERT_OK(mgpu_malloc(&dst, 0, 32));
  ASSERT_OK(mgpu_memcpy(dst, 0, b, 0, 32)); /* reading is fine */
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(b));
  ASSERT_EQ(o.deleted, 1);
  return 0;
}

TEST_IMPL(import_errors) {
  test_init();
  own_tensor o;
  own_init(&o, 4, 8);
  mgpu_buffer *b = (void *)&b;
  o.strides[0] = 16; /* every other row: not contiguous */
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  ASSERT_DETAIL_HAS("not contiguous");
  ASSERT(b == NULL);
  o.strides[0] = 8;
  o.shape[0] = 1;
  o.strides[0] = 12345; /* an extent of 1 may have any stride */
  if (is_host(0)) {
    ASSERT_OK(mgpu_buffer_from_dlpack(&b, -1, &o.t));
    ASSERT_OK(mgpu_free(b));
    ASSERT_EQ(o.deleted, 1);
  } else { /* kDLCPU memory goes on host devices only */
    ASSERT_ERR(MGPU_ENODEV, mgpu_buffer_from_dlpack(&b, -1, &o.t));
    ASSERT_DETAIL_HAS("kDLCPU");
    ASSERT_EQ(o.deleted, 0);
  }
  own_init(&o, 4, 8);
  o.t.dl_tensor.device.device_type = kDLCUDA;
  o.t.dl_tensor.device.device_id = 7;
  ASSERT_ERR(MGPU_ENODEV, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  ASSERT_DETAIL_HAS("kDLCUDA");
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_buffer_from_dlpack(&b, 0, &o.t));
  o.t.dl_tensor.device.device_type = kDLOpenCL; /* no OpenCL device 7 */
  ASSERT_ERR(MGPU_ENODEV, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  ASSERT_DETAIL_HAS("kDLOpenCL");
  o.t.dl_tensor.device.device_type = kDLVulkan;
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  own_init(&o, 0, 8);
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  ASSERT_DETAIL_HAS("empty");
  own_init(&o, -1, 8);
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  own_init(&o, 4, 8);
  o.t.version.major = 2;
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(&b, -1, &o.t));
  o.t.version.major = 1;
  ASSERT_ERR(MGPU_ENODEV, mgpu_buffer_from_dlpack(&b, 99, &o.t));
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(NULL, -1, &o.t));
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_from_dlpack(&b, -1, NULL));
  ASSERT_EQ(o.deleted, 0); /* a failed import leaves the tensor alone */
  return 0;
}

/* An export imported again, and an import exported again: each memory is
 * released once, by the last holder. */
TEST_IMPL(import_export_chain) {
  int other = test_init() > 1 ? 1 : 0;
  SKIP_UNLESS_HOST_DEVICE_0();
  own_tensor o;
  own_init(&o, 4, 4);
  mgpu_buffer *imp, *own, *back;
  ASSERT_OK(mgpu_buffer_from_dlpack(&imp, 0, &o.t));
  int64_t shape[1] = {16};
  DLManagedTensorVersioned *t;
  ASSERT_OK(mgpu_buffer_dlpack(imp, 0, F32, 1, shape, NULL, &t));
  ASSERT_OK(mgpu_free(imp));
  ASSERT_EQ(o.deleted, 0); /* the export still holds the memory */
  ((float *)t->dl_tensor.data)[0] = 42;
  t->deleter(t);
  ASSERT_EQ(o.deleted, 1);
  ASSERT(o.data[0] == 42);
  /* mgpu's own buffer, exported and imported on another device (where
   * there is one). */
  ASSERT_OK(mgpu_malloc(&own, 0, 64));
  ASSERT_OK(mgpu_buffer_dlpack(own, 0, F32, 1, shape, NULL, &t));
  ASSERT_OK(mgpu_buffer_from_dlpack(&back, other, t));
  ASSERT(mgpu_buffer_ptr(back) == mgpu_buffer_ptr(own));
  ASSERT_OK(mgpu_free(own));
  ASSERT_OK(mgpu_memcpy(back, 0, back, 32, 16)); /* still valid memory */
  ASSERT_OK(mgpu_free(back)); /* calls the export's deleter: all freed */
  return 0;
}

/* mgpu_stream_order_native: host devices have no foreign streams to order
 * (the caller waits on the host), and the stream handle is checked. */
TEST_IMPL(order_native_stream) {
  test_init();
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  if (is_host(0)) {
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_stream_order_native(s, (void *)1));
    ASSERT_DETAIL_HAS("device 0");
  } else {
    ASSERT_OK(mgpu_stream_order_native(s, (void *)1));
    ASSERT_ERR(MGPU_EINVAL, mgpu_stream_order_native(s, NULL));
  }
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_ERR(MGPU_EFREED, mgpu_stream_order_native(s, (void *)1));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_stream_order_native(NULL, (void *)1));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(order_native_stream)
TEST_ENTRY(export_view_shares_memory)
TEST_ENTRY(export_device_of_each_kind)
TEST_ENTRY(export_errors)
TEST_ENTRY(free_while_exported_defers)
TEST_ENTRY(deleter_after_shutdown)
TEST_ENTRY(deleters_on_other_threads)
TEST_ENTRY(import_host_tensor)
TEST_ENTRY(import_read_only)
TEST_ENTRY(import_errors)
TEST_ENTRY(import_export_chain)
TEST_LIST_END
