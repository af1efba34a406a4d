/* A sum over every device, two ways.
 *
 * 1. The numbers 1 .. M are spread over the devices in blocks;
 *    mgpu_reduce_to_host adds up every element of every device's block and
 *    returns one number: M (M + 1) / 2.
 * 2. Every device holds a vector filled with its rank + 1; an all-reduce
 *    (one thread issuing for every device in a group) leaves the sum
 *    n (n + 1) / 2 in every element on every device. */
#include <mgpu.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

#define M 1000000
#define VEC 100000

int main(void) {
  CHECK(mgpu_init(NULL));
  /* Every device of device 0's kind (a communicator spans one backend). */
  int count = mgpu_device_count(), n = 0;
  int *devs = malloc((size_t)count * sizeof *devs);
  mgpu_device_props p0 = {.size = sizeof p0}, p = {.size = sizeof p};
  CHECK(mgpu_device_get_props(0, &p0));
  for (int d = 0; d < count; d++) {
    CHECK(mgpu_device_get_props(d, &p));
    if (p.backend_kind == p0.backend_kind) devs[n++] = d;
  }
  mgpu_comm *comm;
  CHECK(mgpu_comm_create(devs, n, &comm));
  printf("reduce_multi: %d devices, collectives by %s\n", n,
         mgpu_coll_provider_name(mgpu_comm_provider(comm)));

  /* 1. Blocks of 1 .. M, one per device. */
  mgpu_buffer **blocks = malloc((size_t)n * sizeof *blocks);
  size_t *counts = malloc((size_t)n * sizeof *counts);
  int64_t *h = malloc((size_t)M * sizeof *h);
  for (int i = 0; i < M; i++) h[i] = i + 1;
  for (int d = 0; d < n; d++) {
    size_t lo = (size_t)M * (size_t)d / (size_t)n;
    size_t hi = (size_t)M * (size_t)(d + 1) / (size_t)n;
    counts[d] = hi - lo;
    CHECK(mgpu_malloc(&blocks[d], devs[d], (hi - lo + 1) * sizeof *h));
    if (hi > lo)
      CHECK(mgpu_memcpy_htod(blocks[d], 0, h + lo, (hi - lo) * sizeof *h));
  }
  int64_t total = 0;
  CHECK(mgpu_reduce_to_host(comm, blocks, counts, MGPU_INT64, MGPU_SUM,
                            &total));
  int64_t want_total = (int64_t)M * (M + 1) / 2;
  int bad = total != want_total;
  printf("  sum of 1..%d over the devices: %lld (want %lld)\n", M,
         (long long)total, (long long)want_total);

  /* 2. An all-reduce of one vector per device. */
  mgpu_stream **streams = malloc((size_t)n * sizeof *streams);
  mgpu_buffer **vecs = malloc((size_t)n * sizeof *vecs);
  for (int d = 0; d < n; d++) {
    float v = (float)(d + 1);
    CHECK(mgpu_stream_create(&streams[d], devs[d]));
    CHECK(mgpu_malloc(&vecs[d], devs[d], VEC * sizeof(float)));
    CHECK(mgpu_fill(streams[d], vecs[d], 0, VEC, MGPU_FLOAT32, &v));
  }
  CHECK(mgpu_group_begin());
  for (int d = 0; d < n; d++)
    CHECK(mgpu_allreduce(comm, d, vecs[d], vecs[d], VEC, MGPU_FLOAT32,
                         MGPU_SUM, streams[d]));
  CHECK(mgpu_group_end());
  float *out = malloc(VEC * sizeof *out);
  float want = (float)n * (float)(n + 1) / 2;
  for (int d = 0; d < n; d++) {
    CHECK(mgpu_stream_synchronize(streams[d]));
    CHECK(mgpu_memcpy_dtoh(out, vecs[d], 0, VEC * sizeof *out));
    for (int i = 0; i < VEC; i++) bad |= out[i] != want;
  }
  printf("  all-reduce of %d floats: every element %g on every device "
         "(want %g): %s\n", VEC, out[0], want, bad ? "WRONG" : "ok");

  for (int d = 0; d < n; d++) {
    CHECK(mgpu_free(blocks[d]));
    CHECK(mgpu_free(vecs[d]));
    CHECK(mgpu_stream_destroy(streams[d]));
  }
  CHECK(mgpu_comm_destroy(comm));
  free(out), free(streams), free(vecs), free(blocks), free(counts), free(h);
  free(devs);
  CHECK(mgpu_shutdown());
  return bad ? 1 : 0;
}
