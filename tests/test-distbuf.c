/* mgpu_scatter_buffer / mgpu_gather_buffer: a distribution's parts filled
 * from, and collected into, an array that lives in a device buffer. */
#include "task.h"

static void round_trip(mgpu_dist_kind kind, size_t block, size_t n, int src_dev,
                       int use_streams) {
  int ndev = mgpu_device_count();
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.kind = kind;
  o.block = block;
  mgpu_dist *d;
  ASSERT_OK(mgpu_dist_create(&d, n, &o));
  int64_t *host = malloc(n * sizeof *host), *back = malloc(n * sizeof *back);
  for (size_t i = 0; i < n; i++) host[i] = (int64_t)(i * 3 + 1);
  mgpu_buffer *arr, *out;
  ASSERT_OK(mgpu_malloc(&arr, src_dev, n * sizeof *host + 8));
  ASSERT_OK(mgpu_malloc(&out, (src_dev + 1) % ndev, n * sizeof *host + 8));
  ASSERT_OK(mgpu_memcpy_htod(arr, 8, host, n * sizeof *host));
  mgpu_buffer *bufs[MGPU_MAX_DEVICES];
  mgpu_stream *s[MGPU_MAX_DEVICES];
  ASSERT_OK(mgpu_dist_alloc_buffers(d, sizeof *host, bufs));
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_create(&s[p], p));
  ASSERT_OK(mgpu_scatter_buffer(d, arr, 8, sizeof *host, bufs,
                                use_streams ? s : NULL));
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_synchronize(s[p]));
  /* each part holds its ranges in local order */
  for (int p = 0; p < mgpu_dist_nparts(d); p++) {
    size_t count = mgpu_dist_count(d, p);
    if (count == 0) continue;
    int64_t *loc = malloc(count * sizeof *loc);
    ASSERT_OK(mgpu_memcpy_dtoh(loc, bufs[p], 0, count * sizeof *loc));
    size_t k = 0;
    for (size_t r = 0; r < mgpu_dist_nranges(d, p); r++) {
      mgpu_range rg = mgpu_dist_range(d, p, r);
      for (size_t i = rg.begin; i < rg.end; i++) ASSERT_EQ(loc[k++], host[i]);
    }
    ASSERT_EQ(k, count);
    free(loc);
  }
  ASSERT_OK(mgpu_gather_buffer(d, out, 8, sizeof *host, bufs,
                               use_streams ? s : NULL));
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_synchronize(s[p]));
  ASSERT_OK(mgpu_memcpy_dtoh(back, out, 8, n * sizeof *back));
  for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], host[i]);
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_destroy(s[p]));
  mgpu_dist_free_buffers(d, bufs);
  ASSERT_OK(mgpu_free(arr));
  ASSERT_OK(mgpu_free(out));
  mgpu_dist_destroy(d);
  free(host);
  free(back);
}

TEST_IMPL(every_kind_from_a_device_buffer) {
  int ndev = test_init();
  for (int streams = 0; streams < 2; streams++) {
    round_trip(MGPU_DIST_BLOCK, 1, 1001, 0, streams);
    round_trip(MGPU_DIST_CYCLIC, 1, 1001, ndev - 1, streams);
    round_trip(MGPU_DIST_BLOCK_CYCLIC, 7, 1001, 0, streams);
    round_trip(MGPU_DIST_BLOCK_CYCLIC, 5, 3, 0, streams); /* parts with nothing */
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(bad_input) {
  int ndev = test_init();
  mgpu_dist *d;
  ASSERT_OK(mgpu_dist_create(&d, 100, NULL));
  mgpu_buffer *small, *bufs[MGPU_MAX_DEVICES];
  ASSERT_OK(mgpu_malloc(&small, 0, 100));
  ASSERT_OK(mgpu_dist_alloc_buffers(d, 4, bufs));
  ASSERT_ERR(MGPU_ERANGE, mgpu_scatter_buffer(d, small, 0, 4, bufs, NULL));
  ASSERT_DETAIL_HAS("device 0");
  ASSERT_ERR(MGPU_EINVAL, mgpu_gather_buffer(d, small, 0, 0, bufs, NULL));
  if (ndev > 1) {
    mgpu_buffer *keep = bufs[1];
    bufs[1] = bufs[0];
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_scatter_buffer(d, small, 0, 1, bufs, NULL));
    bufs[1] = keep;
  }
  mgpu_dist_free_buffers(d, bufs);
  ASSERT_OK(mgpu_free(small));
  mgpu_dist_destroy(d);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(every_kind_from_a_device_buffer)
TEST_ENTRY(bad_input)
TEST_LIST_END
