/* mgpu demo NAME: small complete programs on every open device.
 *
 * vecadd: c = a + b over float vectors of n elements, cut in one block per
 * device. Each device copies its blocks in, adds them with the built-in
 * element-wise kernel and copies the result out, all queued on its own
 * stream so that the devices work at once; the host then checks every
 * element and prints each device's time and bytes moved. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

typedef struct part {
  size_t first, count;
  mgpu_stream *stream;
  mgpu_event *start, *stop;
  mgpu_buffer *a, *b, *c;
} part;

static int vecadd_part(part *p, const float *a, const float *b, float *c) {
  size_t bytes = p->count * sizeof(float);
  int rc = mgpu_event_record(p->start, p->stream);
  if (rc == 0) rc = mgpu_memcpy_htod_async(p->a, 0, a + p->first, bytes, p->stream);
  if (rc == 0) rc = mgpu_memcpy_htod_async(p->b, 0, b + p->first, bytes, p->stream);
  if (rc == 0)
    rc = mgpu_elementwise(p->stream, p->c, 0, p->a, 0, p->b, 0, p->count,
                          MGPU_FLOAT32, MGPU_SUM);
  if (rc == 0) rc = mgpu_memcpy_dtoh_async(c + p->first, p->c, 0, bytes, p->stream);
  if (rc == 0) rc = mgpu_event_record(p->stop, p->stream);
  return rc;
}

static int demo_vecadd(size_t n) {
  int ndev = mgpu_device_count(), rc = 0;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  float *c = malloc(n * sizeof *c);
  part *parts = calloc((size_t)ndev, sizeof *parts);
  if (a == NULL || b == NULL || c == NULL || parts == NULL) {
    fprintf(stderr, "mgpu demo vecadd: out of host memory\n");
    rc = 1;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    a[i] = (float)(i % 1000);
    b[i] = 0.5f * (float)(i % 7);
    c[i] = -1.0f;
  }
  for (int d = 0; d < ndev; d++) {
    part *p = &parts[d];
    p->first = n * (size_t)d / (size_t)ndev;
    p->count = n * (size_t)(d + 1) / (size_t)ndev - p->first;
    size_t bytes = (p->count ? p->count : 1) * sizeof(float);
    if ((rc = mgpu_stream_create(&p->stream, d)) != 0 ||
        (rc = mgpu_event_create(&p->start, d)) != 0 ||
        (rc = mgpu_event_create(&p->stop, d)) != 0 ||
        (rc = mgpu_malloc(&p->a, d, bytes)) != 0 ||
        (rc = mgpu_malloc(&p->b, d, bytes)) != 0 ||
        (rc = mgpu_malloc(&p->c, d, bytes)) != 0) {
      rc = mgpu_cmd_fail("setting up a device", rc);
      goto out;
    }
  }
  mgpu_metrics_reset();
  for (int d = 0; d < ndev; d++) {
    if ((rc = vecadd_part(&parts[d], a, b, c)) != 0) {
      rc = mgpu_cmd_fail("queueing the vector add", rc);
      goto out;
    }
  }
  for (int d = 0; d < ndev; d++) {
    if ((rc = mgpu_stream_synchronize(parts[d].stream)) != 0) {
      rc = mgpu_cmd_fail("running the vector add", rc);
      goto out;
    }
  }
  mgpu_metrics m = {.size = sizeof m};
  mgpu_metrics_snapshot(&m);
  printf("vecadd: %zu floats over %d devices\n", n, ndev);
  printf("%-6s %-28s %12s %10s %12s %12s\n", "device", "name", "elements",
         "time ms", "bytes in", "bytes out");
  for (int d = 0; d < ndev; d++) {
    mgpu_device_props pr = {.size = sizeof pr};
    mgpu_device_get_props(d, &pr);
    float ms = 0;
    mgpu_event_elapsed_ms(parts[d].start, parts[d].stop, &ms);
    printf("%-6d %-28.28s %12zu %10.3f %12llu %12llu\n", d, pr.name,
           parts[d].count, ms, (unsigned long long)m.dev[d].bytes_h2d,
           (unsigned long long)m.dev[d].bytes_d2h);
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (c[i] != a[i] + b[i]) bad++;
  if (bad != 0) {
    fprintf(stderr, "vecadd: %zu of %zu elements are wrong\n", bad, n);
    rc = 1;
  } else {
    printf("vecadd: all %zu elements correct\n", n);
  }
out:
  for (int d = 0; parts != NULL && d < ndev; d++) {
    part *p = &parts[d];
    if (p->stream) mgpu_stream_destroy(p->stream);
    if (p->start) mgpu_event_destroy(p->start);
    if (p->stop) mgpu_event_destroy(p->stop);
    if (p->a) mgpu_free(p->a);
    if (p->b) mgpu_free(p->b);
    if (p->c) mgpu_free(p->c);
  }
  free(parts);
  free(a);
  free(b);
  free(c);
  return rc;
}

int mgpu_cmd_demo(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "mandelbrot") == 0)
    return mgpu_demo_mandelbrot(argc, argv);
  size_t n = (size_t)1 << 24;
  if (argc >= 3) {
    char *end;
    n = strtoull(argv[2], &end, 10);
    /* The byte counts and the per-device split (n * (d + 1)) must not
     * wrap. */
    if (*end != '\0' || n == 0 ||
        n > SIZE_MAX / MGPU_MAX_DEVICES / sizeof(float))
      argc = 0; /* falls to usage */
  }
  if (argc < 2 || argc > 3 || strcmp(argv[1], "vecadd") != 0) {
    fprintf(stderr, "usage: mgpu demo vecadd [ELEMENTS]\n"
                    "       mgpu demo mandelbrot [--size WxH] [--iters N] "
                    "[--tile N] [--out DIR]\n");
    return 2;
  }
  int rc = mgpu_cmd_init();
  if (rc != 0) return rc;
  return demo_vecadd(n);
}
