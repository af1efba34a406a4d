/* Memory: device, pinned and unified buffers, the budget, misuse of
 * handles, host<->device copies and the stream-ordered pool. */
#include "task.h"

static int init_budget(const char *devices, size_t budget) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = devices;
  cfg.host_mem = budget;
  ASSERT_OK(mgpu_init(&cfg));
  return mgpu_device_count();
}

TEST_IMPL(alloc_kinds_and_accessors) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    mgpu_buffer *b[3];
    ASSERT_OK(mgpu_malloc(&b[0], d, 1000));
    ASSERT_OK(mgpu_malloc_host(&b[1], d, 2000));
    ASSERT_OK(mgpu_malloc_unified(&b[2], d, 3000));
    for (int k = 0; k < 3; k++) {
      ASSERT(mgpu_buffer_ptr(b[k]) != NULL);
      ASSERT_EQ(mgpu_buffer_size(b[k]), 1000 * (k + 1));
      ASSERT_EQ(mgpu_buffer_device(b[k]), d);
      ASSERT_EQ(mgpu_buffer_kind(b[k]), k);
    }
    /* Pinned and unified memory is usable from the host directly. */
    memset(mgpu_buffer_ptr(b[1]), 7, 2000);
    memset(mgpu_buffer_ptr(b[2]), 9, 3000);
    for (int k = 0; k < 3; k++) ASSERT_OK(mgpu_free(b[k]));
  }
  return 0;
}

TEST_IMPL(alloc_errors) {
  int n = test_init();
  mgpu_buffer *b = NULL;
  ASSERT_ERR(MGPU_EINVAL, mgpu_malloc(&b, 0, 0));
  ASSERT_DETAIL_HAS("size 0");
  ASSERT_ERR(MGPU_EINVAL, mgpu_malloc(NULL, 0, 16));
  ASSERT_ERR(MGPU_ENODEV, mgpu_malloc(&b, n, 16));
  ASSERT_DETAIL_HAS("does not exist");
  ASSERT_ERR(MGPU_ENODEV, mgpu_malloc_host(&b, -3, 16));
  /* Pinned memory has no budget: a size near SIZE_MAX reaches the backend,
   * which must refuse it rather than round it up past zero. */
  ASSERT_ERR(MGPU_ENOMEM, mgpu_malloc_host(&b, 0, SIZE_MAX));
  ASSERT(b == NULL);
  ASSERT_ERR(MGPU_ENOMEM, mgpu_malloc_host(&b, 0, SIZE_MAX - 4096));
  ASSERT_DETAIL_HAS("device 0");
  return 0;
}

/* A host device's blocks start at multiples of 256 bytes, and consecutive
 * ones of 64 KiB or more at different offsets modulo 4 KiB (a kernel
 * reading one and writing the other would otherwise have its loads alias
 * its stores). */
TEST_IMPL(host_blocks_aligned_and_staggered) {
  test_init();
  if (!test_device_is_host(0)) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  enum { LARGE = 4, SMALL = 3 };
  const size_t big = (size_t)3 << 20; /* also offered huge pages */
  mgpu_buffer *b[LARGE + SMALL];
  uintptr_t at[LARGE + SMALL];
  for (int k = 0; k < LARGE + SMALL; k++) {
    size_t size = k < LARGE ? (k % 2 ? big : (size_t)100 << 10)
                            : (size_t)(1 + 100 * k);
    ASSERT_OK(mgpu_malloc(&b[k], 0, size));
    unsigned char *p = mgpu_buffer_ptr(b[k]);
    at[k] = (uintptr_t)p;
    ASSERT_EQ(at[k] % 256, 0);
    memset(p, k, size); /* the whole block is there */
    ASSERT_EQ(p[size - 1], k);
  }
  for (int i = 0; i < LARGE; i++)
    for (int j = i + 1; j < LARGE; j++)
      ASSERT(at[i] % 4096 != at[j] % 4096);
  for (int k = 0; k < LARGE + SMALL; k++) ASSERT_OK(mgpu_free(b[k]));
  return 0;
}

TEST_IMPL(budget_enforced_and_earlier_buffers_intact) {
  init_budget("host:2", 1u << 20);
  mgpu_buffer *a, *b, *c;
  ASSERT_OK(mgpu_malloc(&a, 0, 600u << 10));
  memset(mgpu_buffer_ptr(a), 0x5a, 600u << 10);
  ASSERT_ERR(MGPU_ENOMEM, mgpu_malloc(&b, 0, 600u << 10));
  ASSERT_DETAIL_HAS("device 0");
  ASSERT_DETAIL_HAS("614400");
  /* The other device has its own budget. */
  ASSERT_OK(mgpu_malloc(&b, 1, 600u << 10));
  /* Pinned memory is the host's, not the device's. */
  ASSERT_OK(mgpu_malloc_host(&c, 0, 2u << 20));
  unsigned char *p = mgpu_buffer_ptr(a);
  for (size_t i = 0; i < (600u << 10); i += 4096) ASSERT_EQ(p[i], 0x5a);
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_malloc(&a, 0, 1u << 20)); /* the whole budget, once freed */
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_free(c));
  /* A request larger than anything is refused, not attempted. */
  ASSERT_ERR(MGPU_ENOMEM, mgpu_malloc(&a, 0, SIZE_MAX));
  return 0;
}

TEST_IMPL(double_free_and_use_after_free) {
  test_init();
  mgpu_buffer *a;
  ASSERT_OK(mgpu_malloc(&a, 0, 64));
  ASSERT_OK(mgpu_free(a));
  ASSERT_ERR(MGPU_EFREED, mgpu_free(a));
  ASSERT_DETAIL_HAS("already freed");
  ASSERT(mgpu_buffer_ptr(a) == NULL);
  ASSERT_EQ(mgpu_buffer_size(a), 0);
  ASSERT_EQ(mgpu_buffer_device(a), -1);
  char host[64];
  ASSERT_ERR(MGPU_EFREED, mgpu_memcpy_htod(a, 0, host, 8));
  /* The slot is reused by a new buffer; the stale handle stays stale. */
  mgpu_buffer *b;
  ASSERT_OK(mgpu_malloc(&b, 0, 64));
  ASSERT(a != b);
  ASSERT_ERR(MGPU_EFREED, mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_free(NULL));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_free((mgpu_buffer *)(uintptr_t)0x1234));
  /* A stream handle is not a buffer. */
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_free((mgpu_buffer *)s));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

TEST_IMPL(freed_before_shutdown_stays_freed_after_reinit) {
  test_init();
  mgpu_buffer *a;
  ASSERT_OK(mgpu_malloc(&a, 0, 64));
  ASSERT_OK(mgpu_shutdown()); /* frees a */
  test_init();
  ASSERT_ERR(MGPU_EFREED, mgpu_free(a));
  return 0;
}

TEST_IMPL(htod_dtoh_roundtrip_odd_sizes) {
  int n = test_init();
  uint64_t seed = 42;
  const size_t sizes[] = {1, 3, 4095, 4097, 65536 + 7, (1u << 20) + 13};
  for (int d = 0; d < n; d++) {
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      size_t size = sizes[si], off = (size_t)(test_rand(&seed) % 17);
      mgpu_buffer *b;
      ASSERT_OK(mgpu_malloc(&b, d, size + off + 5));
      unsigned char *in = malloc(size), *out = malloc(size);
      for (size_t i = 0; i < size; i++) in[i] = (unsigned char)test_rand(&seed);
      memset(out, 0, size);
      ASSERT_OK(mgpu_memcpy_htod(b, off, in, size));
      ASSERT_OK(mgpu_memcpy_dtoh(out, b, off, size));
      ASSERT(memcmp(in, out, size) == 0);
      free(in);
      free(out);
      ASSERT_OK(mgpu_free(b));
    }
  }
  return 0;
}

TEST_IMPL(copy_bounds_checked) {
  test_init();
  mgpu_buffer *b;
  char host[256] = {0};
  ASSERT_OK(mgpu_malloc(&b, 0, 100));
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_htod(b, 90, host, 11));
  ASSERT_DETAIL_HAS("[90, 101)");
  ASSERT_DETAIL_HAS("100-byte");
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_dtoh(host, b, 101, 0));
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_dtoh(host, b, SIZE_MAX, 2));
  ASSERT_DETAIL_HAS("offset 18446744073709551615");
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_htod(b, 16, host, SIZE_MAX));
  ASSERT_DETAIL_HAS("18446744073709551615 bytes at offset 16");
  ASSERT_ERR(MGPU_EINVAL, mgpu_memcpy_htod(b, 0, NULL, 4));
  ASSERT_OK(mgpu_memcpy_htod(b, 100, host, 0)); /* empty copy at the end */
  ASSERT_OK(mgpu_memcpy_htod(b, 0, host, 100));
  ASSERT_OK(mgpu_free(b));
  return 0;
}

TEST_IMPL(same_device_copies_and_overlap) {
  int n = test_init();
  for (int d = 0; d < n; d++) {
    mgpu_buffer *a, *b, *h;
    ASSERT_OK(mgpu_malloc(&a, d, 4096));
    ASSERT_OK(mgpu_malloc(&b, d, 4096));
    ASSERT_OK(mgpu_malloc_host(&h, d, 4096));
    unsigned char *hp = mgpu_buffer_ptr(h);
    for (int i = 0; i < 4096; i++) hp[i] = (unsigned char)(i * 7);
    ASSERT_OK(mgpu_memcpy(a, 0, h, 0, 4096));       /* pinned -> device */
    ASSERT_OK(mgpu_memcpy(b, 1, a, 3, 4000));       /* device -> device */
    ASSERT_OK(mgpu_memcpy(a, 0, a, 2048, 2048));    /* disjoint halves */
    ASSERT_ERR(MGPU_EOVERLAP, mgpu_memcpy(a, 10, a, 0, 100));
    ASSERT_DETAIL_HAS("overlap");
    memset(hp, 0, 4096);
    ASSERT_OK(mgpu_memcpy(h, 0, b, 1, 4000));       /* device -> pinned */
    for (int i = 0; i < 4000; i++) ASSERT_EQ(hp[i], (unsigned char)((i + 3) * 7));
    ASSERT_OK(mgpu_free(a));
    ASSERT_OK(mgpu_free(b));
    ASSERT_OK(mgpu_free(h));
  }
  return 0;
}

TEST_IMPL(wrong_device_stream) {
  int n = test_init();
  if (n < 2) return TEST_SKIP;
  mgpu_buffer *b;
  mgpu_stream *s1;
  char host[16];
  ASSERT_OK(mgpu_malloc(&b, 0, 16));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_memcpy_htod_async(b, 0, host, 16, s1));
  ASSERT_DETAIL_HAS("device 0");
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_memcpy_dtoh_async(host, b, 0, 16, s1));
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_memset_async(b, 0, 0, 16, s1));
  float one = 1;
  ASSERT_ERR(MGPU_EWRONGDEV, mgpu_fill(s1, b, 0, 4, MGPU_FLOAT32, &one));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_free(b));
  return 0;
}

TEST_IMPL(memset_async) {
  test_init();
  mgpu_buffer *b;
  mgpu_stream *s;
  unsigned char out[300];
  ASSERT_OK(mgpu_malloc(&b, 0, 300));
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_memset_async(b, 0, 0x11, 300, s));
  ASSERT_OK(mgpu_memset_async(b, 100, 0xee, 101, s));
  ASSERT_OK(mgpu_memcpy_dtoh_async(out, b, 0, 300, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  for (int i = 0; i < 300; i++)
    ASSERT_EQ(out[i], i >= 100 && i < 201 ? 0xee : 0x11);
  ASSERT_ERR(MGPU_ERANGE, mgpu_memset_async(b, 250, 0, 51, s));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(b));
  return 0;
}

TEST_IMPL(pool_reuses_blocks) {
  init_budget("host:1", 64u << 20);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  mgpu_buffer *a, *b;
  ASSERT_OK(mgpu_malloc_async(&a, 1000, s));
  void *first = mgpu_buffer_ptr(a);
  ASSERT_EQ(mgpu_buffer_size(a), 1000);
  ASSERT_OK(mgpu_memset_async(a, 0, 3, 1000, s));
  ASSERT_OK(mgpu_free_async(a, s));
  ASSERT_ERR(MGPU_EFREED, mgpu_free_async(a, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_malloc_async(&b, 900, s)); /* same size class */
  ASSERT(mgpu_buffer_ptr(b) == first);
  ASSERT_OK(mgpu_free_async(b, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  /* Many rounds in one budget: blocks come back, the budget is not eaten. */
  for (int i = 0; i < 200; i++) {
    ASSERT_OK(mgpu_malloc_async(&a, 1u << 20, s));
    ASSERT_OK(mgpu_memset_async(a, 0, i, 1u << 20, s));
    ASSERT_OK(mgpu_free_async(a, s));
  }
  ASSERT_OK(mgpu_stream_synchronize(s));
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT(m.dev[0].mem_peak <= (4u << 20));
  ASSERT_OK(mgpu_mempool_trim(0));
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].mem_in_use, 0);
  ASSERT_ERR(MGPU_EINVAL, mgpu_malloc_async(&a, 0, s));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_malloc_async(&a, 16, NULL));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

/* Caches one freed 1 MiB block on device 0; returns the bytes it holds. */
static uint64_t cache_one_block(mgpu_stream *s) {
  mgpu_buffer *a;
  if (mgpu_malloc_async(&a, 1u << 20, s) != 0 || mgpu_free_async(a, s) != 0 ||
      mgpu_stream_synchronize(s) != 0)
    return 0;
  mgpu_metrics m = {.size = sizeof m};
  return mgpu_metrics_snapshot(&m) == 0 ? m.dev[0].mem_pool_cached : 0;
}

/* mgpu_mempool_trim empties the mempool's cache; mgpu_pool_trim, its former
 * name, still does the same; a device that does not exist is refused by
 * both, named in the detail. */
TEST_IMPL(mempool_trim_and_its_former_name) {
  init_budget("host:2", 64u << 20);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  mgpu_metrics m = {.size = sizeof m};
  ASSERT(cache_one_block(s) >= (1u << 20));
  ASSERT_OK(mgpu_mempool_trim(0));
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].mem_pool_cached, 0);
  ASSERT_EQ(m.dev[0].mem_in_use, 0);
  ASSERT(cache_one_block(s) >= (1u << 20));
  ASSERT_OK(mgpu_pool_trim(0));
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].mem_pool_cached, 0);
  ASSERT_ERR(MGPU_ENODEV, mgpu_mempool_trim(2));
  ASSERT_DETAIL_HAS("device 2");
  ASSERT_ERR(MGPU_ENODEV, mgpu_pool_trim(-1));
  ASSERT_DETAIL_HAS("device -1");
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

TEST_IMPL(pool_trims_cache_when_budget_is_short) {
  init_budget("host:1", 4u << 20);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  mgpu_buffer *a;
  ASSERT_OK(mgpu_malloc_async(&a, 3u << 20, s)); /* 4 MiB class */
  ASSERT_OK(mgpu_free_async(a, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  /* The cached 4 MiB block must give way to a plain allocation. */
  ASSERT_OK(mgpu_malloc(&a, 0, 3u << 20));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_stream_destroy(s));
  return 0;
}

TEST_IMPL(metrics_count_copies_and_memory) {
  test_init();
  ASSERT_OK(mgpu_metrics_reset());
  mgpu_buffer *b;
  char host[1000];
  memset(host, 1, sizeof host);
  ASSERT_OK(mgpu_malloc(&b, 0, 1000));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, host, 1000));
  ASSERT_OK(mgpu_memcpy_htod(b, 0, host, 500));
  ASSERT_OK(mgpu_memcpy_dtoh(host, b, 0, 300));
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].bytes_h2d, 1500);
  ASSERT_EQ(m.dev[0].copies_h2d, 2);
  ASSERT_EQ(m.dev[0].bytes_d2h, 300);
  ASSERT_EQ(m.dev[0].copies_d2h, 1);
  ASSERT(m.dev[0].mem_in_use >= 1000);
  ASSERT(m.dev[0].mem_peak >= m.dev[0].mem_in_use);
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].mem_in_use, 0);
  ASSERT(m.dev[0].mem_peak >= 1000); /* the peak stays until reset */
  ASSERT_OK(mgpu_metrics_reset());
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].bytes_h2d, 0);
  ASSERT_EQ(m.dev[0].mem_peak, 0);
  mgpu_metrics bad = {.size = 4};
  ASSERT_ERR(MGPU_EINVAL, mgpu_metrics_snapshot(&bad));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(alloc_kinds_and_accessors)
TEST_ENTRY(alloc_errors)
TEST_ENTRY(host_blocks_aligned_and_staggered)
TEST_ENTRY(budget_enforced_and_earlier_buffers_intact)
TEST_ENTRY(double_free_and_use_after_free)
TEST_ENTRY(freed_before_shutdown_stays_freed_after_reinit)
TEST_ENTRY(htod_dtoh_roundtrip_odd_sizes)
TEST_ENTRY(copy_bounds_checked)
TEST_ENTRY(same_device_copies_and_overlap)
TEST_ENTRY(wrong_device_stream)
TEST_ENTRY(memset_async)
TEST_ENTRY(pool_reuses_blocks)
TEST_ENTRY(mempool_trim_and_its_former_name)
TEST_ENTRY(pool_trims_cache_when_budget_is_short)
TEST_ENTRY(metrics_count_copies_and_memory)
TEST_LIST_END
