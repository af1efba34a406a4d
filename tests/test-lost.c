/* Lost devices: a host device lost by the test call (as a GPU's sticky error
 * would lose it) or by MGPU_FAULT=device:N@after:K fails its queued work and
 * refuses later work with MGPU_EDEVLOST naming it, mgpu_device_status says
 * so, the other devices go on, and the library shuts down and starts again
 * cleanly. */
#include <stdatomic.h>

#include "core/internal.h"
#include "task.h"

static void block_until(void *arg) {
  while (!atomic_load((atomic_int *)arg)) {
  }
}

TEST_IMPL(lost_device_fails_queued_and_later_work) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:3";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *s2, *s0;
  mgpu_buffer *b2, *b0;
  ASSERT_OK(mgpu_stream_create(&s2, 2));
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  ASSERT_OK(mgpu_malloc(&b2, 2, 4096));
  ASSERT_OK(mgpu_malloc(&b0, 0, 4096));
  unsigned char host[4096], back[4096];
  memset(host, 7, sizeof host);
  ASSERT_OK(mgpu_memset_async(b2, 0, 1, 4096, s2));
  ASSERT_OK(mgpu_stream_synchronize(s2));

  /* Work queued behind a blocked callback, then the device is lost. */
  atomic_int go = 0;
  ASSERT_OK(mgpu_stream_add_callback(s2, block_until, &go));
  ASSERT_OK(mgpu_memcpy_htod_async(b2, 0, host, sizeof host, s2));
  ASSERT_OK(mgpu_memset_async(b2, 0, 9, 16, s2));
  mgpu_device_state st = MGPU_DEVICE_LOST;
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu__device_lose(2, "lost by the test"));
  atomic_store(&go, 1);
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s2));
  ASSERT_DETAIL_HAS("device 2");
  ASSERT_DETAIL_HAS("lost by the test");
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);

  /* Nothing queued ran: the buffer still holds what it held. */
  memcpy(back, mgpu_buffer_ptr(b2), sizeof back);
  for (size_t i = 0; i < sizeof back; i++) ASSERT_EQ(back[i], 1);

  /* Later work is refused at once, naming the device. */
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_memcpy_htod_async(b2, 0, host, 64, s2));
  ASSERT_DETAIL_HAS("device 2 was lost");
  mgpu_buffer *more;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_malloc(&more, 2, 64));
  mgpu_stream *s2b;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_create(&s2b, 2));
  float one = 1;
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_fill(s2, b2, 0, 16, MGPU_FLOAT32, &one));

  /* The other devices go on. */
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu_memcpy_htod_async(b0, 0, host, sizeof host, s0));
  ASSERT_OK(mgpu_memcpy_dtoh_async(back, b0, 0, sizeof back, s0));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT(memcmp(back, host, sizeof back) == 0);

  /* What belongs to the lost device is still released. */
  ASSERT_OK(mgpu_free(b2));
  ASSERT_OK(mgpu_stream_destroy(s2));
  ASSERT_OK(mgpu_free(b0));
  ASSERT_OK(mgpu_stream_destroy(s0));
  mgpu_shutdown();
  /* A new init opens a working device 2. */
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_device_status(2, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_OK(mgpu_malloc(&b2, 2, 64));
  ASSERT_OK(mgpu_free(b2));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* MGPU_FAULT=device:1@after:3: device 1 runs three operations, then is
 * lost; the fourth and later fail. */
TEST_IMPL(lost_device_by_fault_rule) {
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = "host:2";
  cfg.fault = "device:1@after:3";
  ASSERT_OK(mgpu_init(&cfg));
  mgpu_stream *s;
  mgpu_buffer *b;
  ASSERT_OK(mgpu_stream_create(&s, 1));
  ASSERT_OK(mgpu_malloc(&b, 1, 8));
  memset(mgpu_buffer_ptr(b), 0, 8);
  for (int i = 0; i < 6; i++) ASSERT_OK(mgpu_memset_async(b, (size_t)i, 5, 1, s));
  ASSERT_ERR(MGPU_EDEVLOST, mgpu_stream_synchronize(s));
  ASSERT_DETAIL_HAS("device 1");
  ASSERT_DETAIL_HAS("device:1@after");
  const unsigned char *p = mgpu_buffer_ptr(b);
  for (int i = 0; i < 6; i++) ASSERT_EQ(p[i], i < 3 ? 5 : 0);
  mgpu_device_state st;
  ASSERT_OK(mgpu_device_status(1, &st));
  ASSERT_EQ(st, MGPU_DEVICE_LOST);
  ASSERT_OK(mgpu_device_status(0, &st));
  ASSERT_EQ(st, MGPU_DEVICE_OK);
  ASSERT_ERR(MGPU_EINVAL, mgpu_device_status(0, NULL));
  ASSERT_ERR(MGPU_ENODEV, mgpu_device_status(2, &st));
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  mgpu_shutdown();
  cfg.fault = "";
  ASSERT_OK(mgpu_init(&cfg));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(lost_device_fails_queued_and_later_work)
TEST_ENTRY(lost_device_by_fault_rule)
TEST_LIST_END
