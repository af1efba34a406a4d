/* p2p_bandwidth: copy bandwidth between every ordered pair of devices.
 *
 * For each pair (src, dst) the program copies a buffer from src to dst a few
 * times on a stream of src, times the copies with events, checks that the
 * bytes arrived, and prints the matrix of GB/s with the path each pair took
 * (direct peer copy, or staged through pinned host memory).
 *
 *   MGPU_DEVICES=host:4 ./p2p_bandwidth
 *   MGPU_DEVICES=host:4 MGPU_HOST_PEER=none ./p2p_bandwidth   (all staged)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mgpu.h>
#include "check.h"

#define SIZE ((size_t)4 << 20)
#define REPS 3

/* Copies src -> dst REPS times on s; returns GB/s from the events. */
static double time_copies(mgpu_buffer *dst, mgpu_buffer *src, mgpu_stream *s,
                          mgpu_event *start, mgpu_event *end) {
  CHECK(mgpu_memcpy_async(dst, 0, src, 0, SIZE, s)); /* warm-up */
  CHECK(mgpu_event_record(start, s));
  for (int r = 0; r < REPS; r++) CHECK(mgpu_memcpy_async(dst, 0, src, 0, SIZE, s));
  CHECK(mgpu_event_record(end, s));
  CHECK(mgpu_event_synchronize(end));
  float ms = 0;
  CHECK(mgpu_event_elapsed_ms(start, end, &ms));
  return ms > 0 ? (double)SIZE * REPS / (ms * 1e-3) / 1e9 : 0;
}

int main(void) {
  CHECK(mgpu_init(NULL));
  int n = mgpu_device_count();
  mgpu_buffer **bufs = calloc((size_t)n, sizeof *bufs);
  unsigned char *pattern = malloc(SIZE), *back = malloc(SIZE);
  double *gbps = calloc((size_t)n * (size_t)n, sizeof *gbps);
  if (bufs == NULL || pattern == NULL || back == NULL || gbps == NULL) return 1;
  for (int d = 0; d < n; d++) CHECK(mgpu_malloc(&bufs[d], d, SIZE));

  int wrong = 0;
  for (int a = 0; a < n; a++) {
    mgpu_stream *s;
    mgpu_event *start, *end;
    CHECK(mgpu_stream_create(&s, a));
    CHECK(mgpu_event_create(&start, a));
    CHECK(mgpu_event_create(&end, a));
    for (int b = 0; b < n; b++) {
      if (a == b) continue;
      /* Fresh bytes on the source, so that each pair proves its own copy. */
      for (size_t i = 0; i < SIZE; i++) pattern[i] = (unsigned char)(i * 7 + a * 31 + b);
      CHECK(mgpu_memcpy_htod(bufs[a], 0, pattern, SIZE));
      gbps[a * n + b] = time_copies(bufs[b], bufs[a], s, start, end);
      CHECK(mgpu_memcpy_dtoh(back, bufs[b], 0, SIZE));
      if (memcmp(back, pattern, SIZE) != 0) {
        fprintf(stderr, "copy %d -> %d delivered wrong bytes\n", a, b);
        wrong = 1;
      }
    }
    CHECK(mgpu_event_destroy(start));
    CHECK(mgpu_event_destroy(end));
    CHECK(mgpu_stream_destroy(s));
  }

  printf("copy bandwidth, GB/s, %zu MiB copies (row: from, column: to)\n",
         SIZE >> 20);
  printf("%4s", "");
  for (int b = 0; b < n; b++) printf(" %14d", b);
  printf("\n");
  for (int a = 0; a < n; a++) {
    printf("%4d", a);
    for (int b = 0; b < n; b++) {
      mgpu_copy_path path;
      CHECK(mgpu_copy_path_get(a, b, &path));
      if (a == b)
        printf(" %14s", "-");
      else
        printf(" %7.2f %-6s", gbps[a * n + b], mgpu_copy_path_name(path));
    }
    printf("\n");
  }
  for (int d = 0; d < n; d++) CHECK(mgpu_free(bufs[d]));
  free(bufs);
  free(pattern);
  free(back);
  free(gbps);
  CHECK(mgpu_shutdown());
  if (!wrong) printf("all copies verified\n");
  return wrong;
}
