/* A two-stage pipeline across devices: a producer on one device makes
 * blocks of numbers, a channel carries them to a consumer on another device,
 * which adds them up. Each side runs in its own thread and queues its work
 * on its own stream; the channel holds a few blocks, so the producer runs
 * ahead of the consumer by at most that many.
 *
 * Block i holds 2 * (i + 1) in every element; after N blocks the consumer's
 * sum holds N * (N + 1) in every element, which main checks. */
#include <mgpu.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

#define BLOCK 4096 /* floats per message */
#define BLOCKS 64
#define CAPACITY 4

typedef struct stage {
  mgpu_channel *chan;
  int dev;
} stage;

static void *producer(void *arg) {
  stage *st = arg;
  mgpu_stream *s;
  mgpu_buffer *block;
  CHECK(mgpu_stream_create(&s, st->dev));
  CHECK(mgpu_malloc(&block, st->dev, BLOCK * sizeof(float)));
  for (int i = 0; i < BLOCKS; i++) {
    /* "Compute" the block, then send it; the next iteration may overwrite
     * the buffer at once: the send was queued before it on the stream. */
    float v = (float)(i + 1);
    CHECK(mgpu_fill(s, block, 0, BLOCK, MGPU_FLOAT32, &v));
    CHECK(mgpu_scale(s, block, 0, BLOCK, MGPU_FLOAT32, 2.0));
    CHECK(mgpu_channel_send(st->chan, block, 0, BLOCK * sizeof(float), s));
  }
  CHECK(mgpu_channel_close(st->chan));
  CHECK(mgpu_stream_synchronize(s));
  CHECK(mgpu_free(block));
  CHECK(mgpu_stream_destroy(s));
  return NULL;
}

int main(void) {
  CHECK(mgpu_init(NULL));
  /* Device 0 to device 1 when there is one of the same kind (a channel
   * joins devices of one backend), else within device 0. */
  int from = 0, to = 0;
  mgpu_device_props p0 = {.size = sizeof p0}, p1 = {.size = sizeof p1};
  CHECK(mgpu_device_get_props(0, &p0));
  if (mgpu_device_count() > 1 && mgpu_device_get_props(1, &p1) == 0 &&
      p1.backend_kind == p0.backend_kind)
    to = 1;
  mgpu_channel *chan;
  CHECK(mgpu_channel_create(from, to, BLOCK * sizeof(float), CAPACITY, &chan));

  stage prod = {chan, from};
  pthread_t t;
  if (pthread_create(&t, NULL, producer, &prod) != 0) return 1;

  /* The consumer: receive each block and add it to the running sum. */
  mgpu_stream *s;
  mgpu_buffer *in, *sum;
  CHECK(mgpu_stream_create(&s, to));
  CHECK(mgpu_malloc(&in, to, BLOCK * sizeof(float)));
  CHECK(mgpu_malloc(&sum, to, BLOCK * sizeof(float)));
  CHECK(mgpu_memset_async(sum, 0, 0, BLOCK * sizeof(float), s));
  int received = 0;
  for (;;) {
    size_t size;
    int rc = mgpu_channel_recv(chan, in, 0, &size, s);
    if (rc == MGPU_ECLOSED) break; /* the producer is done */
    CHECK(rc);
    CHECK(mgpu_axpy(s, sum, 0, in, 0, BLOCK, MGPU_FLOAT32, 1.0));
    received++;
  }
  pthread_join(t, NULL);

  float *h = malloc(BLOCK * sizeof *h);
  CHECK(mgpu_stream_synchronize(s));
  CHECK(mgpu_memcpy_dtoh(h, sum, 0, BLOCK * sizeof *h));
  float want = (float)BLOCKS * (BLOCKS + 1);
  int bad = received != BLOCKS;
  for (int i = 0; i < BLOCK; i++) bad |= h[i] != want;
  printf("pipeline: %d blocks from device %d to device %d, sum %g (want %g): "
         "%s\n", received, from, to, h[0], want, bad ? "WRONG" : "ok");
  free(h);
  CHECK(mgpu_channel_destroy(chan));
  CHECK(mgpu_free(in));
  CHECK(mgpu_free(sum));
  CHECK(mgpu_stream_destroy(s));
  CHECK(mgpu_shutdown());
  return bad ? 1 : 0;
}
