/* run_on_device: each device's own host thread runs a function with that
 * device current; the caller's current device is left alone.
 *
 * Every device fills a buffer of its own with its id on its own host thread,
 * all devices at once (mgpu_run_on_device_async), and the main thread checks
 * the results. Exits 0 when every value is right. */
#include <mgpu.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT 100000

typedef struct job {
  mgpu_buffer *buf;
  int32_t *result; /* host copy of the buffer */
} job;

static int fill_with_id(int dev, void *arg) {
  job *j = arg;
  int current = -1;
  mgpu_get_device(&current); /* inside fn, the device is current */
  if (current != dev) return -1000;
  mgpu_stream *s;
  int rc = mgpu_stream_create(&s, dev);
  if (rc != 0) return rc;
  int32_t id = dev;
  rc = mgpu_fill(s, j->buf, 0, COUNT, MGPU_INT32, &id);
  if (rc == 0)
    rc = mgpu_memcpy_dtoh_async(j->result, j->buf, 0, COUNT * sizeof(int32_t), s);
  if (rc == 0) rc = mgpu_stream_synchronize(s);
  mgpu_stream_destroy(s);
  return rc;
}

int main(void) {
  int rc = mgpu_init(NULL);
  if (rc != 0) {
    fprintf(stderr, "mgpu_init: %s: %s\n", mgpu_strerror(rc), mgpu_error_detail());
    return 1;
  }
  int ndev = mgpu_device_count(), bad = 0;
  job jobs[MGPU_MAX_DEVICES];
  mgpu_work *work[MGPU_MAX_DEVICES];
  for (int d = 0; d < ndev; d++) {
    jobs[d].result = malloc(COUNT * sizeof(int32_t));
    if (jobs[d].result == NULL || mgpu_malloc(&jobs[d].buf, d, COUNT * sizeof(int32_t)) != 0 ||
        mgpu_run_on_device_async(d, fill_with_id, &jobs[d], &work[d]) != 0) {
      fprintf(stderr, "device %d: %s\n", d, mgpu_error_detail());
      return 1;
    }
  }
  for (int d = 0; d < ndev; d++) {
    rc = mgpu_work_wait(work[d]);
    if (rc != 0) {
      fprintf(stderr, "device %d: %s: %s\n", d, mgpu_strerror(rc), mgpu_error_detail());
      bad++;
      continue;
    }
    for (int i = 0; i < COUNT; i++) bad += jobs[d].result[i] != d;
    printf("device %d filled %d values with its id\n", d, COUNT);
  }
  int current = -1;
  mgpu_get_device(&current);
  printf("main thread is still on device %d\n", current);
  for (int d = 0; d < ndev; d++) {
    mgpu_free(jobs[d].buf);
    free(jobs[d].result);
  }
  mgpu_shutdown();
  return bad == 0 && current == 0 ? 0 : 1;
}
