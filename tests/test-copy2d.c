/* Pitched (2-D) copies on every path: within a device, host to device and
 * back, pinned memory, between devices directly and host-staged; and the
 * bad input each is refused for. A tile of an image is the usual case. */
#include "task.h"

#define W 97   /* image width in bytes (odd: rows are not aligned) */
#define H 61
#define TW 13  /* tile */
#define TH 9

static unsigned char pixel(size_t x, size_t y) {
  return (unsigned char)(x * 7 + y * 13 + 1);
}

static void fill_image(unsigned char *img) {
  for (size_t y = 0; y < H; y++)
    for (size_t x = 0; x < W; x++) img[y * W + x] = pixel(x, y);
}

/* tile (tx, ty) of the image, packed with pitch tp, checked. */
static void check_tile(const unsigned char *t, size_t tp, size_t tx, size_t ty) {
  for (size_t y = 0; y < TH; y++)
    for (size_t x = 0; x < TW; x++)
      ASSERT_EQ(t[y * tp + x], pixel(tx + x, ty + y));
}

/* Copies tile (5, 7) of an image on device a into a tile buffer (pitch 16)
 * on device b, then back into a blank image on device a at (20, 30). */
static void tile_between(int a, int b) {
  unsigned char img[W * H], out[W * H];
  fill_image(img);
  mgpu_buffer *src, *tile, *back;
  ASSERT_OK(mgpu_malloc(&src, a, W * H));
  ASSERT_OK(mgpu_malloc(&tile, b, 16 * TH));
  ASSERT_OK(mgpu_malloc(&back, a, W * H));
  ASSERT_OK(mgpu_memcpy_htod(src, 0, img, W * H));
  memset(out, 0, sizeof out);
  ASSERT_OK(mgpu_memcpy_htod(back, 0, out, W * H));
  ASSERT_OK(mgpu_memcpy_2d(tile, 0, 16, src, 7 * W + 5, W, TW, TH));
  unsigned char t[16 * TH];
  ASSERT_OK(mgpu_memcpy_dtoh(t, tile, 0, sizeof t));
  check_tile(t, 16, 5, 7);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, b));
  ASSERT_OK(mgpu_memcpy_2d_async(back, 30 * W + 20, W, tile, 0, 16, TW, TH, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_memcpy_dtoh(out, back, 0, W * H));
  for (size_t y = 0; y < H; y++)
    for (size_t x = 0; x < W; x++) {
      int in_tile = x >= 20 && x < 20 + TW && y >= 30 && y < 30 + TH;
      ASSERT_EQ(out[y * W + x], in_tile ? pixel(x - 20 + 5, y - 30 + 7) : 0);
    }
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(tile));
  ASSERT_OK(mgpu_free(back));
}

TEST_IMPL(within_and_between_devices) {
  int n = test_init();
  tile_between(0, 0);
  if (n > 1) tile_between(0, n - 1);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(between_devices_staged) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.host_peer = 0; /* host devices refuse direct copies: staged path */
  cfg.devices = "host:2";
  if (getenv("MGPU_DEVICES") && strncmp(getenv("MGPU_DEVICES"), "host", 4))
    cfg.devices = NULL;
  ASSERT_OK(mgpu_init(&cfg));
  /* Only host devices are sure to stage (host_peer 0): two GPUs with peer
   * access, or two parts of one GPU, copy directly. */
  if (mgpu_device_count() < 2 || !test_device_is_host(0) ||
      !test_device_is_host(1)) {
    mgpu_shutdown();
    return TEST_SKIP;
  }
  mgpu_metrics m0 = {.size = sizeof m0}, m1 = {.size = sizeof m1};
  ASSERT_OK(mgpu_metrics_snapshot(&m0));
  tile_between(0, 1);
  ASSERT_OK(mgpu_metrics_snapshot(&m1));
  ASSERT(m1.dev[0].copies_peer_staged + m1.dev[1].copies_peer_staged >
         m0.dev[0].copies_peer_staged + m0.dev[1].copies_peer_staged);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(host_and_pinned_sides) {
  test_init();
  unsigned char img[W * H], t[TW * TH];
  fill_image(img);
  mgpu_buffer *d, *pinned;
  mgpu_stream *s;
  ASSERT_OK(mgpu_malloc(&d, 0, 32 * TH));
  ASSERT_OK(mgpu_malloc_host(&pinned, 0, W * H));
  ASSERT_OK(mgpu_stream_create(&s, 0));
  /* host image tile -> device (pitch 32) -> host packed */
  ASSERT_OK(mgpu_memcpy_2d_htod_async(d, 0, 32, img + 11 * W + 3, W, TW, TH, s));
  ASSERT_OK(mgpu_memcpy_2d_dtoh_async(t, TW, d, 0, 32, TW, TH, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  check_tile(t, TW, 3, 11);
  /* device -> pinned image at (40, 2), pinned read by the host */
  memset(mgpu_buffer_ptr(pinned), 0, W * H);
  ASSERT_OK(mgpu_memcpy_2d_async(pinned, 2 * W + 40, W, d, 0, 32, TW, TH, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  check_tile((unsigned char *)mgpu_buffer_ptr(pinned) + 2 * W + 40, W, 3, 11);
  /* contiguous rows are one plain copy */
  ASSERT_OK(mgpu_memcpy_2d(pinned, 0, TW, d, 0, TW, TW, 2));
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(d));
  ASSERT_OK(mgpu_free(pinned));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_IMPL(bad_input) {
  int n = test_init();
  mgpu_buffer *a, *b;
  ASSERT_OK(mgpu_malloc(&a, 0, 1000));
  ASSERT_OK(mgpu_malloc(&b, n - 1, 1000));
  ASSERT_ERR(MGPU_EINVAL, mgpu_memcpy_2d(a, 0, 8, b, 0, 16, 10, 4));
  ASSERT_DETAIL_HAS("pitch 8");
  /* the last row ends past the buffer: 9 * 120 + 10 > 1000 */
  ASSERT_ERR(MGPU_ERANGE, mgpu_memcpy_2d(a, 0, 120, b, 0, 16, 10, 10));
  ASSERT_ERR(MGPU_EOVERLAP, mgpu_memcpy_2d(a, 5, 100, a, 0, 100, 10, 3));
  mgpu_stream *s;
  if (n > 2) {
    ASSERT_OK(mgpu_stream_create(&s, 1));
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_memcpy_2d_async(a, 0, 16, b, 0, 16, 8, 4, s));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_ERR(MGPU_EINVAL, mgpu_memcpy_2d_htod_async(a, 0, 16, NULL, 16, 8, 4, s));
  ASSERT_OK(mgpu_memcpy_2d_async(a, 0, 16, a, 500, 16, 0, 4, s)); /* empty */
  ASSERT_OK(mgpu_stream_destroy(s));
  ASSERT_OK(mgpu_free(a));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(within_and_between_devices)
TEST_ENTRY(between_devices_staged)
TEST_ENTRY(host_and_pinned_sides)
TEST_ENTRY(bad_input)
TEST_LIST_END
