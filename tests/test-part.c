/* Distributions and scatter / gather.
 *
 * Property tests: for random n (0, smaller than the part count, and large),
 * part counts, block sizes and weights, every distribution covers [0, n)
 * exactly once, ranges are increasing and non-empty, counts agree with the
 * ranges, locate() agrees with the local order, and each kind has its own
 * shape (block sizes differ by at most one, cyclic puts i on i % P,
 * weighted follows the weights to within one element). Then scatter and
 * gather round trips, byte for byte, asynchronous and synchronous. */
#include "task.h"

static const mgpu_dist_kind kinds[] = {MGPU_DIST_BLOCK, MGPU_DIST_CYCLIC,
                                       MGPU_DIST_BLOCK_CYCLIC,
                                       MGPU_DIST_WEIGHTED};

/* Checks every property of d for n elements over P parts; weights may be
 * NULL. */
static void check_dist(const mgpu_dist *d, size_t n, int P, mgpu_dist_kind kind,
                       size_t block, const double *weights) {
  ASSERT_EQ(mgpu_dist_n(d), n);
  ASSERT_EQ(mgpu_dist_nparts(d), P);
  unsigned char *owner_seen = calloc(n ? n : 1, 1);
  ASSERT(owner_seen != NULL);
  size_t total = 0;
  for (int p = 0; p < P; p++) {
    size_t nr = mgpu_dist_nranges(d, p), local = 0, prev_end = 0;
    for (size_t r = 0; r < nr; r++) {
      mgpu_range g = mgpu_dist_range(d, p, r);
      ASSERT(g.begin < g.end);
      ASSERT(g.end <= n);
      ASSERT(r == 0 || g.begin >= prev_end);
      prev_end = g.end;
      for (size_t i = g.begin; i < g.end; i++) {
        ASSERT_EQ(owner_seen[i], 0);
        owner_seen[i] = 1;
        int lp = -1;
        size_t ll = 0;
        ASSERT_OK(mgpu_dist_locate(d, i, &lp, &ll));
        ASSERT_EQ(lp, p);
        ASSERT_EQ(ll, local + (i - g.begin));
        if (kind == MGPU_DIST_CYCLIC && P > 1) ASSERT_EQ(i % (size_t)P, p);
        if (kind == MGPU_DIST_BLOCK_CYCLIC && P > 1)
          ASSERT_EQ((i / block) % (size_t)P, p);
      }
      local += g.end - g.begin;
    }
    ASSERT_EQ(mgpu_dist_count(d, p), local);
    total += local;
    if (kind == MGPU_DIST_BLOCK) {
      size_t want = n / (size_t)P + ((size_t)p < n % (size_t)P);
      ASSERT_EQ(local, want);
    }
    if (kind == MGPU_DIST_WEIGHTED && weights != NULL) {
      double wsum = 0;
      for (int q = 0; q < P; q++) wsum += weights[q];
      double exact = (double)n * weights[p] / wsum;
      ASSERT((double)local > exact - 1.000001);
      ASSERT((double)local < exact + 1.000001);
      if (weights[p] == 0) ASSERT_EQ(local, 0);
    }
  }
  ASSERT_EQ(total, n);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(owner_seen[i], 1);
  if (n > 0) ASSERT_ERR(MGPU_ERANGE, mgpu_dist_locate(d, n, NULL, NULL));
  /* Out-of-range parts read as empty. */
  ASSERT_EQ(mgpu_dist_count(d, P), 0);
  ASSERT_EQ(mgpu_dist_nranges(d, -1), 0);
  ASSERT_EQ(mgpu_dist_device(d, P), -1);
  free(owner_seen);
}

TEST_IMPL(distributions_cover_exactly_once) {
  int ndev = test_init();
  uint64_t rng = 0x1234567ull;
  int checked = 0;
  for (int iter = 0; iter < 400; iter++) {
    int P = 1 + (int)(test_rand(&rng) % 9);
    size_t n;
    switch (iter % 5) {
      case 0: n = 0; break;
      case 1: n = test_rand(&rng) % (size_t)P; break; /* fewer than parts */
      case 2: n = test_rand(&rng) % 50; break;
      default: n = test_rand(&rng) % 5000; break;
    }
    int devs[9];
    for (int p = 0; p < P; p++) devs[p] = (int)(test_rand(&rng) % (uint64_t)ndev);
    double w[9];
    for (int p = 0; p < P; p++)
      w[p] = test_rand(&rng) % 4 == 0 ? 0.0
                                      : (double)(test_rand(&rng) % 1000) / 7.0;
    w[test_rand(&rng) % (uint64_t)P] += 1.0; /* not all zero */
    mgpu_dist_kind kind = kinds[iter % 4];
    mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
    o.kind = kind;
    o.ndevices = P;
    o.devices = devs;
    o.block = 1 + test_rand(&rng) % 17;
    o.weights = w;
    mgpu_dist *d;
    ASSERT_OK(mgpu_dist_create(&d, n, &o));
    for (int p = 0; p < P; p++) ASSERT_EQ(mgpu_dist_device(d, p), devs[p]);
    check_dist(d, n, P, kind, o.block, w);
    mgpu_dist_destroy(d);
    checked++;
  }
  ASSERT_EQ(checked, 400);
  return 0;
}

TEST_IMPL(distribution_defaults_and_measured_weights) {
  int ndev = test_init();
  mgpu_dist *d;
  /* NULL options: block over every device. */
  ASSERT_OK(mgpu_dist_create(&d, 1001, NULL));
  check_dist(d, 1001, ndev, MGPU_DIST_BLOCK, 1, NULL);
  mgpu_dist_destroy(d);
  /* Weighted without weights: each device's measured speed. */
  double speed[MGPU_MAX_DEVICES];
  ASSERT_OK(mgpu_device_speed(ndev, NULL, speed));
  for (int i = 0; i < ndev; i++) ASSERT(speed[i] > 0);
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.kind = MGPU_DIST_WEIGHTED;
  ASSERT_OK(mgpu_dist_create(&d, 100000, &o));
  check_dist(d, 100000, ndev, MGPU_DIST_WEIGHTED, 1, NULL);
  for (int p = 0; p < ndev; p++) ASSERT(mgpu_dist_count(d, p) > 0);
  mgpu_dist_destroy(d);
  /* A huge cyclic distribution costs nothing to describe. */
  o.kind = MGPU_DIST_CYCLIC;
  ASSERT_OK(mgpu_dist_create(&d, (size_t)1 << 40, &o));
  /* One range per element of part 0 (one range in all over one part). */
  if (ndev > 1) ASSERT_EQ(mgpu_dist_nranges(d, 0),
                          ((size_t)1 << 40) / (size_t)ndev +
                              (((size_t)1 << 40) % (size_t)ndev > 0));
  else ASSERT_EQ(mgpu_dist_nranges(d, 0), 1);
  int p;
  size_t local;
  ASSERT_OK(mgpu_dist_locate(d, ((size_t)1 << 40) - 1, &p, &local));
  ASSERT_EQ(p, (int)((((size_t)1 << 40) - 1) % (size_t)ndev));
  mgpu_dist_destroy(d);
  return 0;
}

TEST_IMPL(distribution_errors) {
  int ndev = test_init();
  mgpu_dist *d;
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.kind = (mgpu_dist_kind)17;
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(&d, 10, &o));
  o.kind = MGPU_DIST_BLOCK_CYCLIC;
  o.block = 0;
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(&d, 10, &o));
  ASSERT_DETAIL_HAS("block size");
  o = (mgpu_dist_opts)MGPU_DIST_OPTS_INITIALIZER;
  o.kind = MGPU_DIST_WEIGHTED;
  double w[MGPU_MAX_DEVICES] = {0};
  o.weights = w;
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(&d, 10, &o));
  ASSERT_DETAIL_HAS("sum to");
  w[0] = -2;
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(&d, 10, &o));
  ASSERT_DETAIL_HAS("weight of part 0");
  o = (mgpu_dist_opts)MGPU_DIST_OPTS_INITIALIZER;
  int devs[1] = {ndev};
  o.ndevices = 1;
  o.devices = devs;
  ASSERT_ERR(MGPU_ENODEV, mgpu_dist_create(&d, 10, &o));
  o.size = 3;
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(&d, 10, &o));
  ASSERT_ERR(MGPU_EINVAL, mgpu_dist_create(NULL, 10, NULL));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_dist_locate(NULL, 0, NULL, NULL));
  mgpu_dist_destroy(NULL);
  return 0;
}

/* ---- scatter / gather ---- */

static void fill_random(unsigned char *p, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)test_rand(rng);
}

/* Scatters host, checks each part's buffer holds its elements in local
 * order, gathers into a fresh array and compares. */
static void round_trip(const mgpu_dist *d, size_t elem, int async,
                       uint64_t *rng) {
  size_t n = mgpu_dist_n(d);
  int P = mgpu_dist_nparts(d);
  size_t bytes = n * elem;
  unsigned char *src = malloc(bytes + 1), *back = malloc(bytes + 1);
  ASSERT(src && back);
  fill_random(src, bytes, rng);
  memset(back, 0xEE, bytes + 1);
  mgpu_buffer **bufs = calloc((size_t)P, sizeof *bufs);
  mgpu_stream **streams = calloc((size_t)P, sizeof *streams);
  ASSERT_OK(mgpu_dist_alloc_buffers(d, elem, bufs));
  for (int p = 0; p < P; p++)
    ASSERT_OK(mgpu_stream_create(&streams[p], mgpu_dist_device(d, p)));
  ASSERT_OK(mgpu_scatter(d, src, elem, bufs, async ? streams : NULL));
  if (async)
    for (int p = 0; p < P; p++) ASSERT_OK(mgpu_stream_synchronize(streams[p]));
  for (int p = 0; p < P; p++) {
    size_t count = mgpu_dist_count(d, p);
    if (count == 0) {
      ASSERT(bufs[p] == NULL);
      continue;
    }
    unsigned char *part = malloc(count * elem);
    ASSERT_OK(mgpu_memcpy_dtoh(part, bufs[p], 0, count * elem));
    size_t local = 0;
    for (size_t r = 0; r < mgpu_dist_nranges(d, p); r++) {
      mgpu_range g = mgpu_dist_range(d, p, r);
      ASSERT(memcmp(part + local * elem, src + g.begin * elem,
                    (g.end - g.begin) * elem) == 0);
      local += g.end - g.begin;
    }
    free(part);
  }
  ASSERT_OK(mgpu_gather(d, back, elem, bufs, async ? streams : NULL));
  if (async)
    for (int p = 0; p < P; p++) ASSERT_OK(mgpu_stream_synchronize(streams[p]));
  ASSERT(memcmp(src, back, bytes) == 0);
  ASSERT_EQ(back[bytes], 0xEE); /* nothing written past the end */
  for (int p = 0; p < P; p++) ASSERT_OK(mgpu_stream_destroy(streams[p]));
  mgpu_dist_free_buffers(d, bufs);
  free(streams);
  free(bufs);
  free(src);
  free(back);
}

TEST_IMPL(scatter_gather_round_trip) {
  int ndev = test_init();
  uint64_t rng = 42;
  const size_t sizes[] = {0, 1, 3, 1000, 70000};
  const size_t elems[] = {1, 4, 12};
  for (int k = 0; k < 4; k++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
      for (size_t e = 0; e < 3; e++) {
        int P = 1 + (int)(test_rand(&rng) % (uint64_t)(2 * ndev));
        int devs[2 * MGPU_MAX_DEVICES];
        for (int p = 0; p < P; p++) devs[p] = p % ndev;
        double w[2 * MGPU_MAX_DEVICES];
        for (int p = 0; p < P; p++) w[p] = 1.0 + (double)(p % 3);
        mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
        o.kind = kinds[k];
        o.ndevices = P;
        o.devices = devs;
        o.weights = w;
        /* Large blocks go direct, small ones are packed: both paths. */
        o.block = (s + e) % 2 ? 7 : 20000;
        mgpu_dist *d;
        ASSERT_OK(mgpu_dist_create(&d, sizes[s], &o));
        round_trip(d, elems[e], (int)((s + k) % 2), &rng);
        mgpu_dist_destroy(d);
      }
  return 0;
}

TEST_IMPL(cyclic_gather_restores_every_element) {
  int ndev = test_init();
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.kind = MGPU_DIST_CYCLIC;
  mgpu_dist *d;
  size_t n = 100003;
  ASSERT_OK(mgpu_dist_create(&d, n, &o));
  double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  for (size_t i = 0; i < n; i++) x[i] = (double)i * 0.5;
  mgpu_buffer *bufs[MGPU_MAX_DEVICES];
  mgpu_stream *streams[MGPU_MAX_DEVICES];
  ASSERT_OK(mgpu_dist_alloc_buffers(d, sizeof(double), bufs));
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_create(&streams[p], p));
  ASSERT_OK(mgpu_scatter(d, x, sizeof(double), bufs, streams));
  /* Part p holds x[p], x[p+P], ...: element j of part p is (p + j*P)/2. */
  for (int p = 0; p < ndev; p++) {
    ASSERT_OK(mgpu_stream_synchronize(streams[p]));
    double first[2];
    if (mgpu_dist_count(d, p) < 2) continue;
    ASSERT_OK(mgpu_memcpy_dtoh(first, bufs[p], 0, sizeof first));
    ASSERT(first[0] == (double)p * 0.5);
    ASSERT(first[1] == (double)(p + ndev) * 0.5);
  }
  memset(y, 0, n * sizeof *y);
  ASSERT_OK(mgpu_gather(d, y, sizeof(double), bufs, streams));
  for (int p = 0; p < ndev; p++) ASSERT_OK(mgpu_stream_destroy(streams[p]));
  for (size_t i = 0; i < n; i++) ASSERT(y[i] == x[i]);
  mgpu_dist_free_buffers(d, bufs);
  mgpu_dist_destroy(d);
  free(x);
  free(y);
  return 0;
}

TEST_IMPL(scatter_errors) {
  int ndev = test_init();
  mgpu_dist *d;
  ASSERT_OK(mgpu_dist_create(&d, 1000, NULL));
  mgpu_buffer *bufs[MGPU_MAX_DEVICES] = {0};
  char host[1000];
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_scatter(d, host, 1, bufs, NULL));
  ASSERT_DETAIL_HAS("part 0");
  ASSERT_OK(mgpu_dist_alloc_buffers(d, 1, bufs));
  ASSERT_ERR(MGPU_EINVAL, mgpu_scatter(d, host, 0, bufs, NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_gather(d, NULL, 1, bufs, NULL));
  ASSERT_ERR(MGPU_ERANGE, mgpu_scatter(d, host, 2, bufs, NULL));
  ASSERT_DETAIL_HAS("needs");
  if (ndev > 1) {
    mgpu_buffer *t = bufs[0];
    bufs[0] = bufs[1];
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_scatter(d, host, 1, bufs, NULL));
    ASSERT_DETAIL_HAS("device 1");
    bufs[0] = t;
  }
  memset(host, 7, sizeof host);
  ASSERT_OK(mgpu_scatter(d, host, 1, bufs, NULL));
  mgpu_dist_free_buffers(d, bufs);
  mgpu_dist_destroy(d);
  return 0;
}

/* count * elem_size that does not fit in a size_t is refused, not wrapped
 * into a buffer smaller than the part. */
TEST_IMPL(alloc_buffers_size_overflow) {
  test_init();
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.ndevices = 1;
  mgpu_dist *d;
  ASSERT_OK(mgpu_dist_create(&d, SIZE_MAX / 4 + 2, &o));
  mgpu_buffer *bufs[1] = {NULL};
  ASSERT_ERR(MGPU_ERANGE, mgpu_dist_alloc_buffers(d, 4, bufs));
  ASSERT_DETAIL_HAS("part 0");
  ASSERT(bufs[0] == NULL);
  mgpu_dist_destroy(d);
  return 0;
}

/* A freed buffer is reported with the part and the device it stood for. */
TEST_IMPL(scatter_freed_buffer_detail) {
  test_init();
  mgpu_dist *d;
  ASSERT_OK(mgpu_dist_create(&d, 100, NULL));
  mgpu_buffer *bufs[MGPU_MAX_DEVICES] = {0};
  ASSERT_OK(mgpu_dist_alloc_buffers(d, 1, bufs));
  int last = mgpu_dist_nparts(d) - 1;
  ASSERT_OK(mgpu_free(bufs[last]));
  char host[100] = {0};
  ASSERT_ERR(MGPU_EFREED, mgpu_scatter(d, host, 1, bufs, NULL));
  char want[64];
  snprintf(want, sizeof want, "part %d (device %d,", last,
           mgpu_dist_device(d, last));
  ASSERT_DETAIL_HAS(want);
  bufs[last] = NULL;
  mgpu_dist_free_buffers(d, bufs);
  mgpu_dist_destroy(d);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(distributions_cover_exactly_once)
TEST_ENTRY(distribution_defaults_and_measured_weights)
TEST_ENTRY(distribution_errors)
TEST_ENTRY(scatter_gather_round_trip)
TEST_ENTRY(cyclic_gather_restores_every_element)
TEST_ENTRY(scatter_errors)
TEST_ENTRY(alloc_buffers_size_overflow)
TEST_ENTRY(scatter_freed_buffer_detail)
TEST_LIST_END
