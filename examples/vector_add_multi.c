/* vector_add_multi: c = a + b split over every device, with the pieces
 * moved between devices peer to peer.
 *
 * Device d owns block d of a. The blocks of b arrive one device off: block d
 * of b is uploaded to device d-1 (as if an earlier step had left it there),
 * so each device first fetches its block of b from its neighbour with a copy
 * between devices. Each device then adds its blocks with the built-in
 * element-wise kernel, and sends its block of c to device 0, which holds the
 * whole result. The host checks every element. Every step is queued on
 * streams and ordered with events; the host waits once at the end.
 */
#include <stdio.h>
#include <stdlib.h>

#include <mgpu.h>
#include "check.h"

#define N ((size_t)1000003) /* not a multiple of anything */

int main(void) {
  CHECK(mgpu_init(NULL));
  int n = mgpu_device_count();
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  float *c = malloc(N * sizeof *c);
  size_t *first = calloc((size_t)n + 1, sizeof *first);
  mgpu_buffer **ab = calloc((size_t)n, sizeof *ab), **bb = calloc((size_t)n, sizeof *bb);
  mgpu_buffer **b_away = calloc((size_t)n, sizeof *b_away);
  mgpu_stream **s = calloc((size_t)n, sizeof *s);
  mgpu_event **sent = calloc((size_t)n, sizeof *sent);
  if (!a || !b || !c || !first || !ab || !bb || !b_away || !s || !sent) return 1;
  for (size_t i = 0; i < N; i++) {
    a[i] = (float)(i % 1000);
    b[i] = (float)(i % 777) * 2.0f;
  }
  for (int d = 0; d <= n; d++) first[d] = N * (size_t)d / (size_t)n;

  mgpu_buffer *result; /* the whole of c, on device 0 */
  CHECK(mgpu_malloc(&result, 0, N * sizeof(float)));
  for (int d = 0; d < n; d++) {
    size_t count = first[d + 1] - first[d];
    int left = (d + n - 1) % n; /* where block d of b was left */
    CHECK(mgpu_stream_create(&s[d], d));
    CHECK(mgpu_event_create(&sent[d], d));
    CHECK(mgpu_malloc(&ab[d], d, count * sizeof(float)));
    CHECK(mgpu_malloc(&bb[d], d, count * sizeof(float)));
    CHECK(mgpu_malloc(&b_away[d], left, count * sizeof(float)));
    CHECK(mgpu_memcpy_htod(ab[d], 0, a + first[d], count * sizeof(float)));
    CHECK(mgpu_memcpy_htod(b_away[d], 0, b + first[d], count * sizeof(float)));
  }
  for (int d = 0; d < n; d++) {
    size_t count = first[d + 1] - first[d];
    /* Fetch block d of b from the neighbour, add, send c's block to 0. */
    CHECK(mgpu_memcpy_async(bb[d], 0, b_away[d], 0, count * sizeof(float), s[d]));
    CHECK(mgpu_elementwise(s[d], bb[d], 0, ab[d], 0, bb[d], 0, count,
                           MGPU_FLOAT32, MGPU_SUM));
    CHECK(mgpu_memcpy_async(result, first[d] * sizeof(float), bb[d], 0,
                            count * sizeof(float), s[d]));
    CHECK(mgpu_event_record(sent[d], s[d]));
  }
  /* Device 0 reads the result once every block has arrived. */
  for (int d = 1; d < n; d++) CHECK(mgpu_stream_wait_event(s[0], sent[d]));
  CHECK(mgpu_memcpy_dtoh_async(c, result, 0, N * sizeof(float), s[0]));
  CHECK(mgpu_stream_synchronize(s[0]));

  size_t bad = 0;
  for (size_t i = 0; i < N; i++)
    if (c[i] != a[i] + b[i] && bad++ < 5)
      fprintf(stderr, "c[%zu] = %g, expected %g\n", i, c[i], a[i] + b[i]);

  mgpu_metrics m = {.size = sizeof m};
  CHECK(mgpu_metrics_snapshot(&m));
  for (int d = 0; d < n; d++) {
    mgpu_copy_path path = MGPU_PATH_DEVICE;
    int left = (d + n - 1) % n;
    CHECK(mgpu_copy_path_get(left, d, &path));
    printf("device %d: %zu elements; b fetched from device %d (%s); sent "
           "%llu bytes direct, %llu staged\n", d, first[d + 1] - first[d],
           left, mgpu_copy_path_name(path),
           (unsigned long long)m.dev[d].bytes_peer_direct,
           (unsigned long long)m.dev[d].bytes_peer_staged);
  }
  for (int d = 0; d < n; d++) {
    CHECK(mgpu_event_destroy(sent[d]));
    CHECK(mgpu_stream_destroy(s[d]));
    CHECK(mgpu_free(ab[d]));
    CHECK(mgpu_free(bb[d]));
    CHECK(mgpu_free(b_away[d]));
  }
  CHECK(mgpu_free(result));
  CHECK(mgpu_shutdown());
  free(a); free(b); free(c); free(first); free(ab); free(bb); free(b_away);
  free(s); free(sent);
  if (bad) {
    fprintf(stderr, "%zu wrong elements\n", bad);
    return 1;
  }
  printf("c = a + b verified on all %zu elements over %d devices\n", N, n);
  return 0;
}
