/* Traces: the recorder's file read back with the JSON reader (Chrome
 * trace-event shape, names, flows, counters, relative timestamps, the cap),
 * its errors, and the timeline picture read back pixel by pixel. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "core/internal.h"
#include "image.h"
#include "json.h"
#include "obs/trace.h"
#include "task.h"
#include "timeline.h"

/* A fresh path under the build folder's temporary directory. */
static void temp_path(char *out, size_t size, const char *name) {
  const char *dir = getenv("TMPDIR");
  snprintf(out, size, "%s/mgpu-test-trace-%d-%s", dir ? dir : "/tmp",
           (int)getpid(), name);
}

static json *read_trace(const char *path) {
  char err[256];
  json *j = json_parse_file(path, err, sizeof err);
  if (j == NULL) fprintf(stderr, "parse %s: %s\n", path, err);
  ASSERT(j != NULL);
  return j;
}

/* The first event with this ph and name (and pid, unless pid < 0). */
static const json *find_event(const json *trace, const char *ph,
                              const char *name, int pid) {
  const json *ev = json_get(trace, "traceEvents");
  ASSERT(ev != NULL && ev->type == JSON_ARRAY);
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *p = json_get_string(e, "ph"), *n = json_get_string(e, "name");
    if (p && n && strcmp(p, ph) == 0 && strcmp(n, name) == 0 &&
        (pid < 0 || (int)json_get_number(e, "pid", -1) == pid))
      return e;
  }
  return NULL;
}

static size_t count_events(const json *trace, const char *ph) {
  const json *ev = json_get(trace, "traceEvents");
  size_t n = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const char *p = json_get_string(&ev->items[i], "ph");
    if (p && strcmp(p, ph) == 0) n++;
  }
  return n;
}

TEST_IMPL(json_reader) {
  char err[128];
  const char *text = "{\"a\": [1, -2.5e3, true, false, null],"
                     " \"s\": \"q\\\"\\\\\\n\\u00e9\\ud83d\\ude00\", \"o\": {}}";
  json *j = json_parse(text, strlen(text), err, sizeof err);
  ASSERT(j != NULL);
  const json *a = json_get(j, "a");
  ASSERT(a != NULL && a->type == JSON_ARRAY && a->n == 5);
  ASSERT(a->items[1].number == -2500.0);
  ASSERT(a->items[2].type == JSON_BOOL && a->items[2].number == 1);
  ASSERT(a->items[4].type == JSON_NULL);
  ASSERT(strcmp(json_get_string(j, "s"), "q\"\\\n\xc3\xa9\xf0\x9f\x98\x80") == 0);
  ASSERT(json_get(j, "o")->type == JSON_OBJECT && json_get(j, "o")->n == 0);
  ASSERT(json_get(j, "missing") == NULL);
  json_free(j);
  const char *bad[] = {"{\"a\":}", "[1,]", "\"open", "{\"a\" 1}", "[1] x",
                       "", "tru"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    ASSERT(json_parse(bad[i], strlen(bad[i]), err, sizeof err) == NULL);
    ASSERT(strstr(err, "at byte") != NULL);
  }
  char deep[200];
  memset(deep, '[', sizeof deep);
  ASSERT(json_parse(deep, sizeof deep, err, sizeof err) == NULL);
  ASSERT(strstr(err, "deep") != NULL);
  return 0;
}

TEST_IMPL(recorder_writes_chrome_json) {
  char path[512], tmp[600];
  temp_path(path, sizeof path, "basic.json");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  mgpu__trace_name_device(0, "device 0: host device 0");
  mgpu__trace_name_device(1, "device 1: host device 1");
  uint32_t s0 = mgpu__trace_stream_track_new(0, "stream 7");
  uint32_t s1 = mgpu__trace_stream_track_new(1, NULL);
  ASSERT(s0 != s1);

  /* Off: nothing is kept. */
  mgpu__trace_span(0, s0, "kernel early", 1, 2, NULL, 0);
  ASSERT_EQ(mgpu_trace_active(), 0);
  ASSERT_OK(mgpu_trace_start(path));
  ASSERT_EQ(mgpu_trace_active(), 1);
  ASSERT(access(tmp, F_OK) == 0); /* written to the temporary name first */
  uint64_t t = mgpu__now_ns();
  mgpu__trace_arg args[] = {MGPU__TARG_I("bytes", 4096),
                            MGPU__TARG_S("path", "peer direct")};
  mgpu__trace_span(0, s0, "kernel mandel", t + 1000, t + 2500, args, 0);
  /* A tag set for the next operation, taken by the backend, recorded when
   * the operation ran. */
  ASSERT(mgpu__trace_tag_take() == NULL);
  mgpu__trace_tag_set("copy.peer", args, 2);
  mgpu__trace_tag *tag = mgpu__trace_tag_take();
  ASSERT(tag != NULL && mgpu__trace_tag_take() == NULL);
  mgpu__trace_span_tag(1, s1, tag, t + 3001, t + 4002);
  free(tag);
  mgpu__trace_flow("event wait", (mgpu__trace_point){0, s0, t + 2400},
                   (mgpu__trace_point){1, s1, t + 3001});
  mgpu__trace_counter(1, "memory in use", t + 500, 1 << 20);
  mgpu__trace_name_thread(MGPU__TRACE_HOST, "main thread");
  mgpu_trace_span("setup", t, t + 10);
  mgpu_trace_stats st = {.size = sizeof st};
  ASSERT_OK(mgpu_trace_stats_get(&st));
  ASSERT_EQ(st.events, 6);
  ASSERT_OK(mgpu_trace_stop());
  ASSERT_EQ(mgpu_trace_active(), 0);
  ASSERT(access(tmp, F_OK) != 0); /* renamed */

  json *j = read_trace(path);
  const json *other = json_get(j, "otherData");
  ASSERT(other != NULL);
  double base = json_get_number(other, "base_ns", -1);
  ASSERT(base > 0 && base <= (double)t);
  ASSERT_EQ(json_get_number(other, "dropped_events", -1), 0);
  ASSERT_EQ(count_events(j, "X"), 3);

  const json *k = find_event(j, "X", "kernel mandel", 0);
  ASSERT(k != NULL);
  /* Relative to the base, nanoseconds kept: 1.5 us long exactly. */
  ASSERT(json_get_number(k, "dur", 0) == 1.5);
  double ts = json_get_number(k, "ts", -1);
  ASSERT(fabs(ts - ((double)(t + 1000) - base) / 1000) < 1e-6);
  ASSERT_EQ(json_get_number(k, "tid", 0), s0);
  ASSERT(json_get(k, "args") == NULL);

  const json *c = find_event(j, "X", "copy.peer", 1);
  ASSERT(c != NULL);
  ASSERT_EQ(json_get_number(json_get(c, "args"), "bytes", 0), 4096);
  ASSERT(strcmp(json_get_string(json_get(c, "args"), "path"), "peer direct") == 0);
  ASSERT(json_get_number(c, "dur", 0) == 1.001);

  const json *fs = find_event(j, "s", "event wait", 0);
  const json *ff = find_event(j, "f", "event wait", 1);
  ASSERT(fs != NULL && ff != NULL);
  ASSERT(json_get_number(fs, "id", -1) == json_get_number(ff, "id", -2));
  ASSERT(strcmp(json_get_string(ff, "bp"), "e") == 0);
  ASSERT(strcmp(json_get_string(fs, "cat"), json_get_string(ff, "cat")) == 0);

  const json *ctr = find_event(j, "C", "memory in use", 1);
  ASSERT(ctr != NULL);
  ASSERT_EQ(json_get_number(json_get(ctr, "args"), "value", 0), 1 << 20);

  /* Processes and tracks are named. */
  int named0 = 0, named1 = 0, stream7 = 0, host_thread = 0;
  const json *ev = json_get(j, "traceEvents");
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *n = json_get_string(e, "name");
    const char *v = json_get_string(json_get(e, "args"), "name");
    if (n == NULL || v == NULL) continue;
    if (strcmp(n, "process_name") == 0 && strcmp(v, "device 0: host device 0") == 0)
      named0 = 1;
    if (strcmp(n, "process_name") == 0 && strcmp(v, "device 1: host device 1") == 0)
      named1 = 1;
    if (strcmp(n, "thread_name") == 0 && strcmp(v, "stream 7") == 0 &&
        json_get_number(e, "tid", 0) == s0)
      stream7 = 1;
    if (strcmp(n, "thread_name") == 0 && strcmp(v, "main thread") == 0 &&
        json_get_number(e, "pid", 0) == MGPU__TRACE_HOST)
      host_thread = 1;
  }
  ASSERT(named0 && named1 && stream7 && host_thread);
  json_free(j);
  remove(path);
  mgpu__trace_forget_names();
  return 0;
}

TEST_IMPL(recorder_errors) {
  test_init();
  mgpu__obs_set_reporters(mgpu__error, mgpu__log);
  char path[512];
  temp_path(path, sizeof path, "errors.json");
  ASSERT_ERR(MGPU_EINVAL, mgpu_trace_start(NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_trace_start(""));
  ASSERT_ERR(MGPU_EINVAL, mgpu_trace_stop());
  ASSERT_ERR(MGPU_EIO, mgpu_trace_start("/nonexistent-dir/x/trace.json"));
  ASSERT_DETAIL_HAS("/nonexistent-dir/x/trace.json.tmp");
  ASSERT_OK(mgpu_trace_start(path));
  ASSERT_ERR(MGPU_EALREADY, mgpu_trace_start(path));
  ASSERT_DETAIL_HAS(path);
  mgpu_trace_stats st = {.size = 0};
  ASSERT_ERR(MGPU_EINVAL, mgpu_trace_stats_get(&st));
  ASSERT_ERR(MGPU_EINVAL, mgpu_trace_stats_get(NULL));
  ASSERT_OK(mgpu_trace_stop());
  json *j = read_trace(path);
  json_free(j);
  remove(path);
  return 0;
}

enum { THREADS = 4, PER_THREAD = 5000 };

static void *record_many(void *arg) {
  int dev = (int)(intptr_t)arg;
  mgpu__trace_name_thread(dev, "recorder");
  uint32_t track = mgpu__trace_thread_track();
  for (int i = 0; i < PER_THREAD; i++) {
    uint64_t t = mgpu__now_ns();
    mgpu__trace_span(dev, track, "task", t, t + 10, NULL, 0);
  }
  return NULL;
}

TEST_IMPL(recorder_threads_and_cap) {
  char path[512];
  temp_path(path, sizeof path, "threads.json");
  ASSERT_OK(mgpu_trace_start(path));
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    ASSERT(pthread_create(&th[i], NULL, record_many, (void *)(intptr_t)i) == 0);
  /* This thread goes past its cap meanwhile. */
  uint32_t track = mgpu__trace_thread_track();
  for (int i = 0; i < MGPU__TRACE_CAP + 25; i++)
    mgpu__trace_span(MGPU__TRACE_HOST, track, "span", 1, 2, NULL, 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  ASSERT_OK(mgpu_trace_stop());
  mgpu_trace_stats st = {.size = sizeof st};
  ASSERT_OK(mgpu_trace_stats_get(&st));
  ASSERT_EQ(st.events, MGPU__TRACE_CAP + THREADS * PER_THREAD);
  ASSERT_EQ(st.dropped, 25);
  ASSERT_EQ(st.threads, THREADS + 1);
  json *j = read_trace(path);
  ASSERT_EQ(json_get_number(json_get(j, "otherData"), "dropped_events", -1), 25);
  /* Every thread has its own track in its device's process. */
  for (int d = 0; d < THREADS; d++) {
    const json *e = find_event(j, "X", "task", d);
    ASSERT(e != NULL);
  }
  json_free(j);
  remove(path);

  /* A second recording starts empty: the old buffers are emptied, the
   * threads that exited are gone. */
  ASSERT_OK(mgpu_trace_start(path));
  mgpu__trace_span(0, 1, "kernel k", 10, 20, NULL, 0);
  ASSERT_OK(mgpu_trace_stop());
  ASSERT_OK(mgpu_trace_stats_get(&st));
  ASSERT_EQ(st.events, 1);
  ASSERT_EQ(st.dropped, 0);
  remove(path);
  return 0;
}

/* A small known trace: device 0 with two streams, device 1 with one stream
 * and a memory counter, one steal arrow; 1000 us long. */
static const char *known_trace =
    "{\"traceEvents\":["
    "{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"device 0: test\"}},"
    "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"device 1: test\"}},"
    "{\"ph\":\"M\",\"pid\":0,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"stream 1\"}},"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":400,\"name\":\"kernel mandel\"},"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":500,\"dur\":500,\"name\":\"copy.peer\"},"
    "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":100,\"dur\":300,\"name\":\"task 7\"},"
    "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":600,\"dur\":0.001,\"name\":\"kernel tiny\"},"
    "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":600.002,\"dur\":0.001,\"name\":\"kernel tiny\"},"
    "{\"ph\":\"s\",\"pid\":0,\"tid\":1,\"ts\":50,\"name\":\"steal\",\"cat\":\"steal\",\"id\":1},"
    "{\"ph\":\"f\",\"pid\":1,\"tid\":1,\"ts\":100,\"name\":\"steal\",\"cat\":\"steal\",\"id\":1,\"bp\":\"e\"},"
    "{\"ph\":\"C\",\"pid\":1,\"ts\":0,\"name\":\"memory in use\",\"args\":{\"value\":1048576}}"
    "]}";

static const timeline_lane *find_lane(const timeline_info *info, int pid,
                                      long long tid) {
  for (int i = 0; i < info->nlanes; i++)
    if (info->lanes[i].pid == pid && info->lanes[i].tid == tid)
      return &info->lanes[i];
  return NULL;
}

/* The pixel column of time t (us) in the picture. */
static int column(const timeline_info *info, double t) {
  return info->plot_x0 + (int)((t - info->t0_us) / (info->t1_us - info->t0_us) *
                               (info->plot_x1 - info->plot_x0));
}

TEST_IMPL(timeline_png) {
  if (!image_have_png()) return TEST_SKIP;
  char err[256], path[512];
  temp_path(path, sizeof path, "timeline.png");
  json *j = json_parse(known_trace, strlen(known_trace), err, sizeof err);
  ASSERT(j != NULL);
  timeline_info info;
  ASSERT(timeline_render(j, "known", 1000, path, &info, err, sizeof err) == 0);
  json_free(j);
  ASSERT_EQ(info.devices, 2);
  ASSERT_EQ(info.nlanes, 4); /* 0/1, 0/2, 1/1, 1/memory */
  ASSERT_EQ(info.spans, 5);
  ASSERT_EQ(info.merged, 2);
  ASSERT_EQ(info.merged_marks, 1);
  ASSERT_EQ(info.flows, 1);

  image img;
  ASSERT(image_read_png(&img, path, err, sizeof err) == 0);
  ASSERT_EQ(img.width, 1000);
  ASSERT_EQ(img.height, info.height);
  const timeline_lane *k = find_lane(&info, 0, 1), *c = find_lane(&info, 0, 2);
  const timeline_lane *t = find_lane(&info, 1, 1), *m = find_lane(&info, 1, -1);
  ASSERT(k && c && t && m);
  /* Lanes top to bottom: device 0's streams, then device 1's. */
  ASSERT(k->y1 <= c->y0 && c->y1 <= t->y0 && t->y1 <= m->y0);
  int ym = (k->y0 + k->y1) / 2;
  ASSERT_EQ(image_get(&img, column(&info, 200), ym), timeline_kind_color("kernel mandel"));
  ASSERT(image_get(&img, column(&info, 300), (c->y0 + c->y1) / 2) !=
         timeline_kind_color("copy.peer"));
  ASSERT_EQ(image_get(&img, column(&info, 750), (c->y0 + c->y1) / 2),
            timeline_kind_color("copy.peer"));
  ASSERT_EQ(image_get(&img, column(&info, 250), (t->y0 + t->y1) / 2),
            timeline_kind_color("task 7"));
  ASSERT_EQ(image_get(&img, column(&info, 600), (t->y0 + t->y1) / 2),
            timeline_kind_color("kernel"));
  /* Different kinds, different colours. */
  ASSERT(timeline_kind_color("kernel") != timeline_kind_color("copy.peer"));
  ASSERT(timeline_kind_color("copy.peer") != timeline_kind_color("copy.staged"));
  ASSERT(timeline_kind_color("task") != timeline_kind_color("coll.allreduce"));
  /* Outside the spans: no span colour. */
  rgb_t gap = image_get(&img, column(&info, 450), ym);
  ASSERT(gap != timeline_kind_color("kernel") && gap != timeline_kind_color("copy.peer"));
  /* Device names in white on the dark bands above the lanes. */
  int white = 0;
  for (int x = 0; x < 200; x++)
    for (int y = k->y0 - 18; y < k->y0; y++)
      if (image_get(&img, x, y) == 0xffffff) white++;
  ASSERT(white > 50);
  image_free(&img);
  if (getenv("MGPU_TEST_KEEP") == NULL) remove(path);
  return 0;
}

TEST_IMPL(timeline_svg_and_errors) {
  char err[256], path[512];
  temp_path(path, sizeof path, "timeline.svg");
  json *j = json_parse(known_trace, strlen(known_trace), err, sizeof err);
  ASSERT(j != NULL);
  timeline_info info;
  ASSERT(timeline_render(j, "known", 900, path, &info, err, sizeof err) == 0);
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  ASSERT(strncmp(text, "<svg", 4) == 0);
  ASSERT(strstr(text, "device 1: test") != NULL);
  ASSERT(strstr(text, "memory in use") != NULL);
  char fill[32];
  snprintf(fill, sizeof fill, "#%06x", timeline_kind_color("copy.peer"));
  ASSERT(strstr(text, fill) != NULL);
  remove(path);
  ASSERT(timeline_render(j, "x", 900, "out.jpg", &info, err, sizeof err) != 0);
  ASSERT(strstr(err, ".svg") != NULL);
  json_free(j);
  const char *empty = "{\"traceEvents\":[]}";
  j = json_parse(empty, strlen(empty), err, sizeof err);
  ASSERT(timeline_render(j, "x", 900, path, &info, err, sizeof err) != 0);
  ASSERT(strstr(err, "no spans") != NULL);
  json_free(j);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(json_reader)
TEST_ENTRY(recorder_writes_chrome_json)
TEST_ENTRY(recorder_errors)
TEST_ENTRY(recorder_threads_and_cap)
TEST_ENTRY(timeline_png)
TEST_ENTRY(timeline_svg_and_errors)
TEST_LIST_END
