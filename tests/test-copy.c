/* Copies between devices: the direct and the host-staged path with odd sizes
 * and offsets, errors, many streams at once, stream order and events across
 * devices, peer access state and metrics. Every copy is checked byte for
 * byte, bytes around the destination range included.
 *
 * The staged path is reached two ways: host_peer = 0 in the config (host
 * devices refuse peer access) and mgpu_peer_disable (any backend). The chunk
 * is set small so that a few KiB already make many chunks. */
#include "task.h"
#include "util/fault.h"

#define CHUNK 4096

static int init_cfg(int host_peer, size_t chunk, int depth) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.host_peer = host_peer;
  cfg.staging_chunk = chunk;
  cfg.staging_depth = depth;
  ASSERT_OK(mgpu_init(&cfg));
  int n = mgpu_device_count();
  ASSERT(n > 0);
  return n;
}

/* Turns peer access of every pair on (where possible) or off. */
static void peer_all(int n, int on) {
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++) {
      if (on) {
        int yes = 0;
        ASSERT_OK(mgpu_peer_can_access(a, b, &yes));
        if (yes) ASSERT_OK(mgpu_peer_enable(a, b));
      } else {
        ASSERT_OK(mgpu_peer_disable(a, b));
      }
    }
}

static void fill_random(unsigned char *p, size_t n, uint64_t seed) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(test_rand(&st) >> 56);
}

/* One copy of size bytes from device a (at src_off) to device b (at
 * dst_off) on a stream of a or b, checked byte for byte: the range holds the
 * source bytes and everything around it is untouched. */
typedef struct pair_bufs {
  int a, b;
  size_t cap;
  mgpu_buffer *src, *dst;
  mgpu_stream *sa, *sb;
  unsigned char *host_src, *host_dst, *expect;
} pair_bufs;

static void pair_open(pair_bufs *p, int a, int b, size_t cap) {
  memset(p, 0, sizeof *p);
  p->a = a;
  p->b = b;
  p->cap = cap;
  ASSERT_OK(mgpu_malloc(&p->src, a, cap));
  ASSERT_OK(mgpu_malloc(&p->dst, b, cap));
  ASSERT_OK(mgpu_stream_create(&p->sa, a));
  ASSERT_OK(mgpu_stream_create(&p->sb, b));
  p->host_src = malloc(cap);
  p->host_dst = malloc(cap);
  p->expect = malloc(cap);
  ASSERT(p->host_src && p->host_dst && p->expect);
  fill_random(p->host_src, cap, (uint64_t)(a * 131 + b));
  ASSERT_OK(mgpu_memcpy_htod(p->src, 0, p->host_src, cap));
}

static void pair_close(pair_bufs *p) {
  ASSERT_OK(mgpu_stream_destroy(p->sa));
  ASSERT_OK(mgpu_stream_destroy(p->sb));
  ASSERT_OK(mgpu_free(p->src));
  ASSERT_OK(mgpu_free(p->dst));
  free(p->host_src);
  free(p->host_dst);
  free(p->expect);
}

static void pair_check(pair_bufs *p, size_t src_off, size_t dst_off,
                       size_t size, int on_dst) {
  memset(p->expect, 0xEE, p->cap);
  ASSERT_OK(mgpu_memcpy_htod(p->dst, 0, p->expect, p->cap));
  memcpy(p->expect + dst_off, p->host_src + src_off, size);
  mgpu_stream *s = on_dst ? p->sb : p->sa;
  ASSERT_OK(mgpu_memcpy_async(p->dst, dst_off, p->src, src_off, size, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_memcpy_dtoh(p->host_dst, p->dst, 0, p->cap));
  if (memcmp(p->host_dst, p->expect, p->cap) != 0) {
    size_t i = 0;
    while (p->host_dst[i] == p->expect[i]) i++;
    fprintf(stderr, "copy %d->%d of %zu bytes (src+%zu, dst+%zu, stream of "
            "%s): first wrong byte at %zu: %u, expected %u\n", p->a, p->b,
            size, src_off, dst_off, on_dst ? "dst" : "src", i,
            p->host_dst[i], p->expect[i]);
    ASSERT(0);
  }
}

/* Every ordered pair (at most 4 devices' worth), every odd size and offset,
 * issued on either side. */
static void odd_sizes_all_pairs(int n, size_t chunk) {
  const size_t sizes[] = {1, 3, 4095, 4096, chunk - 1, chunk, chunk + 1,
                          3 * chunk + 17, 7 * chunk + 5};
  const size_t offs[] = {0, 1, 13};
  size_t nsizes = sizeof sizes / sizeof sizes[0];
  size_t cap = sizes[nsizes - 1] + 64;
  if (n > 4) n = 4;
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      if (a == b) continue;
      pair_bufs p;
      pair_open(&p, a, b, cap);
      for (size_t i = 0; i < nsizes; i++)
        for (size_t j = 0; j < 3; j++)
          pair_check(&p, offs[j], offs[(j + 1) % 3], sizes[i], (int)(i + j) % 2);
      pair_close(&p);
    }
}

static uint64_t metric_sum(int staged) {
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  uint64_t sum = 0;
  for (int i = 0; i < m.ndevices; i++)
    sum += staged ? m.dev[i].bytes_peer_staged : m.dev[i].bytes_peer_direct;
  return sum;
}

TEST_IMPL(peer_access) {
  int n = init_cfg(-1, 0, 0);
  int yes = -1;
  ASSERT_OK(mgpu_peer_can_access(0, 0, &yes));
  ASSERT_EQ(yes, 1);
  ASSERT_OK(mgpu_peer_enable(0, 0));
  ASSERT_OK(mgpu_peer_disable(0, 0));
  ASSERT_ERR(MGPU_ENODEV, mgpu_peer_can_access(0, n, &yes));
  ASSERT_ERR(MGPU_ENODEV, mgpu_peer_enable(-1, 0));
  ASSERT_ERR(MGPU_ENODEV, mgpu_peer_disable(0, n + 3));
  ASSERT_ERR(MGPU_EINVAL, mgpu_peer_can_access(0, 0, NULL));
  mgpu_copy_path path;
  ASSERT_OK(mgpu_copy_path_get(0, 0, &path));
  ASSERT_EQ(path, MGPU_PATH_DEVICE);
  ASSERT_ERR(MGPU_EINVAL, mgpu_copy_path_get(0, 0, NULL));
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  ASSERT_OK(mgpu_peer_can_access(0, 1, &yes));
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (p.backend_kind == MGPU_BACKEND_HOST) ASSERT_EQ(yes, 1);
  if (yes) {
    /* On by default, twice harmless, off twice harmless, on again. */
    ASSERT_OK(mgpu_copy_path_get(0, 1, &path));
    ASSERT(path == MGPU_PATH_DIRECT || path == MGPU_PATH_DEVICE);
    ASSERT_OK(mgpu_peer_enable(0, 1));
    ASSERT_OK(mgpu_peer_enable(1, 0));
    ASSERT_OK(mgpu_peer_disable(0, 1));
    ASSERT_OK(mgpu_peer_disable(1, 0));
    ASSERT_OK(mgpu_copy_path_get(1, 0, &path));
    if (path != MGPU_PATH_DEVICE) ASSERT_EQ(path, MGPU_PATH_STAGED);
    ASSERT_OK(mgpu_peer_enable(1, 0));
    ASSERT_OK(mgpu_copy_path_get(0, 1, &path));
    ASSERT(path == MGPU_PATH_DIRECT || path == MGPU_PATH_DEVICE);
  } else {
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_peer_enable(0, 1));
    ASSERT_OK(mgpu_peer_disable(0, 1));
    ASSERT_OK(mgpu_copy_path_get(0, 1, &path));
    ASSERT_EQ(path, MGPU_PATH_STAGED);
  }
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(host_peer_none) {
  int n = init_cfg(0, 0, 0);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  if (n < 2 || p.backend_kind != MGPU_BACKEND_HOST) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  int yes = -1;
  ASSERT_OK(mgpu_peer_can_access(0, 1, &yes));
  ASSERT_EQ(yes, 0);
  ASSERT_ERR(MGPU_ENOTSUP, mgpu_peer_enable(0, 1));
  ASSERT_DETAIL_HAS("devices 0 and 1");
  mgpu_copy_path path;
  ASSERT_OK(mgpu_copy_path_get(1, 0, &path));
  ASSERT_EQ(path, MGPU_PATH_STAGED);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(direct_odd_sizes) {
  int n = init_cfg(1, CHUNK, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  int yes = 0;
  ASSERT_OK(mgpu_peer_can_access(0, 1, &yes));
  if (!yes) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 1);
  uint64_t staged0 = metric_sum(1), direct0 = metric_sum(0);
  odd_sizes_all_pairs(n, CHUNK);
  mgpu_copy_path path;
  ASSERT_OK(mgpu_copy_path_get(0, 1, &path));
  if (path == MGPU_PATH_DIRECT) /* else one GPU: counted as device copies */
    ASSERT(metric_sum(0) > direct0);
  ASSERT_EQ(metric_sum(1), staged0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Staged through the config (host devices) or peer_disable (others). */
TEST_IMPL(staged_odd_sizes) {
  int n = init_cfg(0, CHUNK, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 0);
  uint64_t direct0 = metric_sum(0), staged0 = metric_sum(1);
  odd_sizes_all_pairs(n, CHUNK);
  ASSERT(metric_sum(1) > staged0);
  ASSERT_EQ(metric_sum(0), direct0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* host_peer on, but the pairs turned off: staged as well. */
TEST_IMPL(staged_by_disable) {
  int n = init_cfg(1, 3 * CHUNK, 2);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 0);
  odd_sizes_all_pairs(n, 3 * CHUNK);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Copies of four chunks or more ramp up and down (an eighth, a quarter and a
 * half chunk at each end): sizes around that edge and around the ramp's
 * pieces, with every depth from 2 to 5. */
TEST_IMPL(staged_ramp) {
  const size_t chunk = 32768;
  int n = init_cfg(0, chunk, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 0);
  const size_t sizes[] = {4 * chunk - 1, 4 * chunk, 4 * chunk + 1,
                          4 * chunk + chunk / 8 + 1, 4 * chunk + chunk / 4,
                          5 * chunk - 3, 6 * chunk + chunk / 2,
                          7 * chunk + 7 * chunk / 8, 10 * chunk + 7777};
  pair_bufs p;
  pair_open(&p, 1, 0, 11 * chunk);
  for (int depth = 2; depth <= 5; depth++) {
    ASSERT_OK(mgpu_staging_set(0, depth));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
      pair_check(&p, i % 3, (i + depth) % 5, sizes[i], (int)(i + depth) % 2);
  }
  pair_close(&p);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Backend calls made by one staged copy of size bytes from p's source to
 * its destination, on the destination's stream. */
static uint64_t staged_copy_calls(pair_bufs *p, size_t size) {
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0)); /* counting on, no rule */
  uint64_t before = mgpu__fault_calls(MGPU__FAULT_BACKEND);
  ASSERT_OK(mgpu_memcpy_async(p->dst, 0, p->src, 0, size, p->sb));
  uint64_t calls = mgpu__fault_calls(MGPU__FAULT_BACKEND) - before;
  ASSERT_OK(mgpu_stream_synchronize(p->sb));
  return calls;
}

/* The chunk adapts to the copy: the smallest setting (a 9 MiB copy would be
 * 2,305 pieces; it takes 149, 64 KiB at most) and the largest (64 MiB: a copy
 * smaller than that is cut into 2 x depth pieces, its bounce buffers no
 * larger than the copy) still copy every byte, at the edges of pieces and
 * of the bounce buffers' power-of-two sizes too. */
TEST_IMPL(staged_chunk_adapts) {
  int n = init_cfg(0, MGPU_STAGING_CHUNK_MIN, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 0);
  const size_t sizes[] = {1, 4095, 4097, 65536 + 3, 100000, 393216,
                          ((size_t)1 << 20) + 5, ((size_t)3 << 20) + 13,
                          ((size_t)9 << 20) + 1};
  const size_t chunks[] = {MGPU_STAGING_CHUNK_MIN, MGPU_STAGING_CHUNK_MAX,
                           (size_t)1 << 20};
  uint64_t staged0 = metric_sum(1);
  pair_bufs p;
  pair_open(&p, 0, 1, ((size_t)9 << 20) + 16);
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    ASSERT_OK(mgpu_staging_set(chunks[c], c == 2 ? 2 : 3));
    size_t got = 0;
    ASSERT_OK(mgpu_staging_get(&got, NULL));
    ASSERT_EQ(got, chunks[c]); /* the setting; each copy adapts it */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
      pair_check(&p, i % 3, (i + c) % 5, sizes[i], (int)(i + c) % 2);
  }
  /* How many pieces: each costs two backend copies (and events), counted
   * by the fault seam's site counter. 2 MiB with a 64 MiB setting: 11
   * pieces, not 1; 9 MiB with a 4 KiB one: 149, not 2,305. */
  const size_t cases[][3] = {{(size_t)2 << 20, MGPU_STAGING_CHUNK_MAX, 11},
                             {(size_t)9 << 20, MGPU_STAGING_CHUNK_MIN, 149}};
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(mgpu_staging_set(cases[k][1], 3));
    staged_copy_calls(&p, cases[k][0]); /* warm: pools filled */
    uint64_t calls = staged_copy_calls(&p, cases[k][0]);
    ASSERT(calls >= 2 * cases[k][2] && calls <= 8 * cases[k][2]);
  }
  pair_close(&p);
  ASSERT(metric_sum(1) > staged0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* mgpu_free waits for work queued on its device, and that includes the half
 * of a staged copy that runs on a helper stream of the device: freeing the
 * source right after a copy issued on the destination's stream (and the
 * destination right after one issued on the source's) must neither lose
 * data nor touch freed memory (ASan watches the second). */
TEST_IMPL(free_after_copy) {
  int n = init_cfg(0, 65536, 2);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  peer_all(n, 0);
  const size_t size = (size_t)3 << 20;
  unsigned char *host = malloc(size), *back = malloc(size);
  ASSERT(host && back);
  fill_random(host, size, 5);
  mgpu_stream *s0, *s1;
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  for (int round = 0; round < 3; round++) {
    mgpu_buffer *src, *dst;
    ASSERT_OK(mgpu_malloc(&src, 0, size));
    ASSERT_OK(mgpu_malloc(&dst, 1, size));
    ASSERT_OK(mgpu_memcpy_htod(src, 0, host, size));
    ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, size, s1)); /* helper on 0 */
    ASSERT_OK(mgpu_free(src));
    ASSERT_OK(mgpu_memcpy_dtoh_async(back, dst, 0, size, s1));
    ASSERT_OK(mgpu_stream_synchronize(s1));
    ASSERT(memcmp(host, back, size) == 0);
    ASSERT_OK(mgpu_malloc(&src, 0, size));
    ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, size, s0)); /* helper on 1 */
    ASSERT_OK(mgpu_free(dst));
    ASSERT_OK(mgpu_stream_synchronize(s0));
    ASSERT_OK(mgpu_free(src));
  }
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_stream_destroy(s1));
  free(host);
  free(back);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(staging_params) {
  int n = init_cfg(0, 0, 0);
  size_t chunk = 0;
  int depth = 0;
  ASSERT_OK(mgpu_staging_get(&chunk, &depth));
  ASSERT_EQ(chunk, 0); /* chosen per pair of devices */
  ASSERT_EQ(depth, 3);
  ASSERT_ERR(MGPU_EINVAL, mgpu_staging_set(0, 1));
  ASSERT_ERR(MGPU_EINVAL, mgpu_staging_set(100, 0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_staging_set(0, 65));
  ASSERT_ERR(MGPU_EINVAL, mgpu_staging_set(MGPU_STAGING_CHUNK_MAX + 1, 0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_staging_set((size_t)2 << 30, 0));
  ASSERT_OK(mgpu_staging_set(MGPU_STAGING_CHUNK_MAX, 0));
  ASSERT_OK(mgpu_staging_set(8192, 0));
  ASSERT_OK(mgpu_staging_get(&chunk, &depth));
  ASSERT_EQ(chunk, 8192);
  ASSERT_EQ(depth, 3);
  /* Change the chunk and the depth between copies: the pool follows. */
  if (n >= 2) {
    peer_all(n, 0);
    const int depths[] = {2, 5, 64};
    const size_t chunks[] = {4096, 12288, 65536};
    for (int i = 0; i < 3; i++) {
      ASSERT_OK(mgpu_staging_set(chunks[i], depths[i]));
      pair_bufs p;
      pair_open(&p, 0, 1, 200000);
      pair_check(&p, 5, 3, 199990, i % 2);
      pair_check(&p, 0, 0, 1, 1 - i % 2);
      pair_close(&p);
    }
  }
  ASSERT_OK(mgpu_shutdown());
  ASSERT_ERR(MGPU_ENOINIT, mgpu_staging_set(8192, 2));
  /* A new init starts from the config again. */
  init_cfg(0, 16384, 4);
  ASSERT_OK(mgpu_staging_get(&chunk, &depth));
  ASSERT_EQ(chunk, 16384);
  ASSERT_EQ(depth, 4);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(errors) {
  int n = init_cfg(0, CHUNK, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_buffer *a, *b, *c;
  mgpu_stream *sa, *sb;
  ASSERT_OK(mgpu_malloc(&a, 0, 10000));
  ASSERT_OK(mgpu_malloc(&b, 1, 10000));
  ASSERT_OK(mgpu_stream_create(&sa, 0));
  ASSERT_OK(mgpu_stream_create(&sb, 1));
  /* Overlap within one buffer. */
  ASSERT_ERR(MGPU_EOVERLAP, mgpu_memcpy_async(a, 100, a, 50, 100, sa));
  ASSERT_OK(mgpu_memcpy(a, 0, a, 9999, 1)); /* one buffer, apart: fine */
  ASSERT_ERR(MGPU_EOVERLAP, mgpu_memcpy(a, 10, a, 0, 11));
  /* Past the end on either side, across devices. */
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_async(b, 9000, a, 0, 1001, sa));
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_async(b, 0, a, 9999, 2, sb));
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy(b, 0, a, (size_t)-1, 2));
  /* A stream of neither device. */
  if (n >= 3) {
    mgpu_stream *sc;
    ASSERT_OK(mgpu_stream_create(&sc, 2));
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_memcpy_async(b, 0, a, 0, 10, sc));
    ASSERT_OK(mgpu_stream_destroy(sc));
  }
  /* Freed buffers. */
  ASSERT_OK(mgpu_malloc(&c, 1, 100));
  ASSERT_OK(mgpu_free(c));
  ASSERT_ERR(MGPU_EFREED, mgpu_memcpy_async(c, 0, a, 0, 10, sa));
  ASSERT_ERR(MGPU_EFREED, mgpu_memcpy_async(a, 0, c, 0, 10, sa));
  /* Size 0 is a no-op. */
  ASSERT_OK(mgpu_memcpy_async(b, 0, a, 0, 0, sa));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Many copies in flight at once on many streams: each device sends to the
 * next one on each of its streams, half of them issued on the destination's
 * streams, then everything is checked. */
static void many_streams(int host_peer, int direct) {
  int n = init_cfg(host_peer, 2 * CHUNK, 3);
  if (n > 4) n = 4;
  enum { NS = 6 };
  const size_t size = 10 * CHUNK + 123;
  if (!direct) peer_all(mgpu_device_count(), 0);
  mgpu_buffer *src[4], *dst[4][NS];
  mgpu_stream *st[4][NS];
  unsigned char *host = malloc(size), *back = malloc(size);
  ASSERT(host && back);
  for (int d = 0; d < n; d++) {
    fill_random(host, size, (uint64_t)d + 7);
    ASSERT_OK(mgpu_malloc(&src[d], d, size));
    ASSERT_OK(mgpu_memcpy_htod(src[d], 0, host, size));
    for (int k = 0; k < NS; k++) {
      ASSERT_OK(mgpu_malloc(&dst[d][k], d, size));
      ASSERT_OK(mgpu_stream_create(&st[d][k], d));
    }
  }
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < NS; k++)
      for (int d = 0; d < n; d++) {
        int to = (d + 1 + k % 2) % n;
        mgpu_stream *s = k % 3 == 0 ? st[to][k] : st[d][k];
        ASSERT_OK(mgpu_memcpy_async(dst[to][k], 0, src[d], 0, size, s));
      }
  for (int d = 0; d < n; d++)
    ASSERT_OK(mgpu_device_synchronize(d));
  for (int d = 0; d < n; d++)
    for (int k = 0; k < NS; k++) {
      int from = ((d - 1 - k % 2) % n + n) % n;
      fill_random(host, size, (uint64_t)from + 7);
      ASSERT_OK(mgpu_memcpy_dtoh(back, dst[d][k], 0, size));
      ASSERT(memcmp(host, back, size) == 0);
    }
  for (int d = 0; d < n; d++) {
    ASSERT_OK(mgpu_free(src[d]));
    for (int k = 0; k < NS; k++) {
      ASSERT_OK(mgpu_stream_destroy(st[d][k]));
      ASSERT_OK(mgpu_free(dst[d][k]));
    }
  }
  free(host);
  free(back);
  ASSERT_OK(mgpu_shutdown());
}

TEST_IMPL(many_streams_staged) {
  many_streams(0, 0);
  return 0;
}

TEST_IMPL(many_streams_direct) {
  many_streams(1, 1);
  return 0;
}

/* A copy issued on device A's stream runs after earlier work on it, and
 * before later work on it; work on B that waits on an event recorded after
 * the copy sees the data. Then the same with the copy issued on B's stream. */
static void stream_order(int host_peer) {
  int n = init_cfg(host_peer, CHUNK, 2);
  if (n < 2) return;
  const size_t size = 40 * CHUNK + 1;
  mgpu_buffer *src, *dst;
  mgpu_stream *sa, *sb;
  mgpu_event *ea, *eb;
  unsigned char *back = malloc(size);
  ASSERT(back);
  int a = n - 1, b = 0;
  ASSERT_OK(mgpu_malloc(&src, a, size));
  ASSERT_OK(mgpu_malloc(&dst, b, size));
  ASSERT_OK(mgpu_stream_create(&sa, a));
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_event_create(&ea, a));
  ASSERT_OK(mgpu_event_create(&eb, b));
  for (int round = 0; round < 4; round++) {
    /* Issued on A: fill, copy, overwrite; B waits for an event after the
     * copy and reads. */
    ASSERT_OK(mgpu_memset_async(src, 0, 0x10 + round, size, sa));
    ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, size, sa));
    ASSERT_OK(mgpu_event_record(ea, sa));
    ASSERT_OK(mgpu_memset_async(src, 0, 0x77, size, sa));
    ASSERT_OK(mgpu_stream_wait_event(sb, ea));
    ASSERT_OK(mgpu_memcpy_dtoh_async(back, dst, 0, size, sb));
    ASSERT_OK(mgpu_stream_synchronize(sb));
    for (size_t i = 0; i < size; i++) ASSERT_EQ(back[i], 0x10 + round);
    ASSERT_OK(mgpu_stream_synchronize(sa));

    /* Issued on B: earlier work on B (a memset of dst) comes first, the
     * source is ready through an event, later work on B sees the data. */
    ASSERT_OK(mgpu_memset_async(src, 0, 0x20 + round, size, sa));
    ASSERT_OK(mgpu_event_record(ea, sa));
    ASSERT_OK(mgpu_memset_async(dst, 0, 0x55, size, sb));
    ASSERT_OK(mgpu_stream_wait_event(sb, ea));
    ASSERT_OK(mgpu_memcpy_async(dst, 0, src, 0, size, sb));
    ASSERT_OK(mgpu_event_record(eb, sb));
    ASSERT_OK(mgpu_memcpy_dtoh_async(back, dst, 0, size, sb));
    /* A waits for the copy before it overwrites the source. */
    ASSERT_OK(mgpu_stream_wait_event(sa, eb));
    ASSERT_OK(mgpu_memset_async(src, 0, 0x66, size, sa));
    ASSERT_OK(mgpu_stream_synchronize(sb));
    for (size_t i = 0; i < size; i++) ASSERT_EQ(back[i], 0x20 + round);
    ASSERT_OK(mgpu_event_synchronize(eb));
    ASSERT_OK(mgpu_stream_synchronize(sa));
  }
  ASSERT_OK(mgpu_event_destroy(ea));
  ASSERT_OK(mgpu_event_destroy(eb));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  free(back);
}

TEST_IMPL(stream_order_staged) {
  stream_order(0);
  int n = mgpu_device_count();
  ASSERT_OK(mgpu_shutdown());
  return n < 2 ? TEST_SKIP : 0;
}

TEST_IMPL(stream_order_direct) {
  stream_order(1);
  int n = mgpu_device_count();
  ASSERT_OK(mgpu_shutdown());
  return n < 2 ? TEST_SKIP : 0;
}

/* The synchronous copy, pinned and unified buffers on other devices, and a
 * shutdown with pooled staging state followed by a new init. */
TEST_IMPL(sync_kinds_reinit) {
  for (int host_peer = 0; host_peer <= 1; host_peer++) {
    int n = init_cfg(host_peer, CHUNK, 0);
    if (n < 2) {
      ASSERT_OK(mgpu_shutdown());
      return TEST_SKIP;
    }
    const size_t size = 5 * CHUNK + 77;
    unsigned char *host = malloc(size), *back = malloc(size);
    ASSERT(host && back);
    fill_random(host, size, 99 + (uint64_t)host_peer);
    mgpu_buffer *dev0, *dev1, *pinned0, *unified1;
    ASSERT_OK(mgpu_malloc(&dev0, 0, size));
    ASSERT_OK(mgpu_malloc(&dev1, 1, size));
    ASSERT_OK(mgpu_malloc_host(&pinned0, 0, size));
    ASSERT_OK(mgpu_malloc_unified(&unified1, 1, size));
    ASSERT_OK(mgpu_memcpy_htod(dev0, 0, host, size));
    ASSERT_OK(mgpu_memcpy(dev1, 0, dev0, 0, size));     /* device -> device */
    ASSERT_OK(mgpu_memcpy(pinned0, 0, dev1, 0, size));  /* device -> pinned */
    ASSERT_OK(mgpu_memcpy(unified1, 0, pinned0, 0, size));
    memset(back, 0, size);
    ASSERT_OK(mgpu_memcpy_dtoh(back, unified1, 0, size));
    ASSERT(memcmp(host, back, size) == 0);
    ASSERT_OK(mgpu_memcpy(dev0, 0, dev1, 1, size - 1)); /* and back, shifted */
    ASSERT_OK(mgpu_memcpy_dtoh(back, dev0, 0, size - 1));
    ASSERT(memcmp(host + 1, back, size - 1) == 0);
    ASSERT_OK(mgpu_free(dev0));
    ASSERT_OK(mgpu_free(dev1));
    ASSERT_OK(mgpu_free(pinned0));
    ASSERT_OK(mgpu_free(unified1));
    free(host);
    free(back);
    ASSERT_OK(mgpu_shutdown());
  }
  return 0;
}

/* Metrics: each copy counts its bytes and one copy on the source device, on
 * the path it took. */
TEST_IMPL(metrics) {
  int n = init_cfg(-1, CHUNK, 0);
  if (n < 2) {
    ASSERT_OK(mgpu_shutdown());
    return TEST_SKIP;
  }
  mgpu_buffer *a, *b;
  mgpu_stream *s;
  ASSERT_OK(mgpu_malloc(&a, 1, 3 * CHUNK));
  ASSERT_OK(mgpu_malloc(&b, 0, 3 * CHUNK));
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_metrics_reset());
  ASSERT_OK(mgpu_peer_disable(0, 1));
  ASSERT_OK(mgpu_memcpy_async(b, 0, a, 0, 3 * CHUNK, s));
  ASSERT_OK(mgpu_memcpy_async(b, 1, a, 2, 5, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[1].bytes_peer_staged, 3 * CHUNK + 5);
  ASSERT_EQ(m.dev[1].copies_peer_staged, 2);
  ASSERT_EQ(m.dev[0].bytes_peer_staged, 0);
  ASSERT_EQ(m.dev[1].bytes_peer_direct, 0);
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(0, &p));
  int same_gpu = p.split_count > 1; /* on: a device copy, not a peer copy */
  int yes = 0;
  ASSERT_OK(mgpu_peer_can_access(0, 1, &yes));
  if (yes && !same_gpu) {
    ASSERT_OK(mgpu_peer_enable(0, 1));
    ASSERT_OK(mgpu_memcpy_async(b, 0, a, 0, 1000, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_metrics_snapshot(&m));
    ASSERT_EQ(m.dev[1].bytes_peer_direct, 1000);
    ASSERT_EQ(m.dev[1].copies_peer_direct, 1);
  }
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(peer_access)
TEST_ENTRY(host_peer_none)
TEST_ENTRY(direct_odd_sizes)
TEST_ENTRY(staged_odd_sizes)
TEST_ENTRY(staged_by_disable)
TEST_ENTRY(staged_ramp)
TEST_ENTRY(staged_chunk_adapts)
TEST_ENTRY(free_after_copy)
TEST_ENTRY(staging_params)
TEST_ENTRY(errors)
TEST_ENTRY(many_streams_staged)
TEST_ENTRY(many_streams_direct)
TEST_ENTRY(stream_order_staged)
TEST_ENTRY(stream_order_direct)
TEST_ENTRY(sync_kinds_reinit)
TEST_ENTRY(metrics)
TEST_LIST_END
