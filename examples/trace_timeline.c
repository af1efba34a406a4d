/* trace_timeline: record a trace of part of a program, then read the
 * metrics.
 *
 * Every device scales its block of a vector (copy in, scale, copy out, on
 * its own stream) while a trace is recorded into trace_timeline.json; the
 * program marks its own phases with mgpu_trace_span. Then it prints the
 * metrics (utilization, copy time and bandwidth per path) and says how to
 * look at the trace:
 *     mgpu trace view trace_timeline.json -o timeline.png
 * or open it in https://ui.perfetto.dev. Exits 0 when the result is right
 * and the trace holds events. */
#include <stdio.h>

#include "check.h"

#define N (1 << 20)

static float x[N];

int main(void) {
  CHECK(mgpu_init(NULL));
  int ndev = mgpu_device_count();
  for (int i = 0; i < N; i++) x[i] = (float)i;
  mgpu_stream *stream[MGPU_MAX_DEVICES];
  mgpu_buffer *buf[MGPU_MAX_DEVICES];
  size_t first[MGPU_MAX_DEVICES + 1];
  for (int d = 0; d <= ndev; d++) first[d] = (size_t)N * d / ndev;
  for (int d = 0; d < ndev; d++) {
    CHECK(mgpu_stream_create(&stream[d], d));
    CHECK(mgpu_malloc(&buf[d], d, (first[d + 1] - first[d]) * sizeof(float)));
  }

  const char *path = "trace_timeline.json";
  CHECK(mgpu_trace_start(path));
  uint64_t t0 = mgpu_trace_now_ns();
  for (int d = 0; d < ndev; d++) {
    size_t count = first[d + 1] - first[d];
    CHECK(mgpu_memcpy_htod_async(buf[d], 0, x + first[d], count * sizeof(float),
                                 stream[d]));
    CHECK(mgpu_scale(stream[d], buf[d], 0, count, MGPU_FLOAT32, 2.0));
    CHECK(mgpu_memcpy_dtoh_async(x + first[d], buf[d], 0, count * sizeof(float),
                                 stream[d]));
  }
  mgpu_trace_span("queue the work", t0, mgpu_trace_now_ns());
  uint64_t t1 = mgpu_trace_now_ns();
  for (int d = 0; d < ndev; d++) CHECK(mgpu_stream_synchronize(stream[d]));
  mgpu_trace_span("wait for every device", t1, mgpu_trace_now_ns());
  CHECK(mgpu_trace_stop());

  mgpu_trace_stats st = {.size = sizeof st};
  CHECK(mgpu_trace_stats_get(&st));
  printf("trace: %s, %llu events from %llu threads (%llu dropped)\n", path,
         (unsigned long long)st.events, (unsigned long long)st.threads,
         (unsigned long long)st.dropped);
  printf("look at it: mgpu trace view %s -o timeline.png, or open it in "
         "https://ui.perfetto.dev\n\n", path);
  CHECK(mgpu_metrics_print(stdout, MGPU_METRICS_TABLE));

  int bad = 0;
  for (int i = 0; i < N; i++) bad += x[i] != 2.0f * (float)i;
  for (int d = 0; d < ndev; d++) {
    CHECK(mgpu_free(buf[d]));
    CHECK(mgpu_stream_destroy(stream[d]));
  }
  CHECK(mgpu_shutdown());
  /* Per device: two copies and a kernel, and the program's two spans. */
  if (bad != 0 || st.events < (uint64_t)(3 * ndev + 2)) {
    fprintf(stderr, "trace_timeline: %d wrong values, %llu events\n", bad,
            (unsigned long long)st.events);
    return 1;
  }
  return 0;
}
