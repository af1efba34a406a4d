/* Traces: the recorder's file read back with the JSON reader (Chrome
 * trace-event shape, names, flows, counters, relative timestamps, the cap),
 * its errors, and the timeline picture read back pixel by pixel. */
#include <math.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "util/thread.h"
#include "image.h"
#include "mgpu/module.h"
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
  uint32_t s0 = mgpu__trace_track_new(0, "stream 7");
  uint32_t s1 = mgpu__trace_track_new(1, NULL);
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
  /* A tag pushed around the backend calls, copied by the backend, recorded when
   * the operation ran. */
  ASSERT(mgpu__trace_tag_copy() == NULL);
  int pushed = mgpu__trace_tag_push("copy.peer", args, 2);
  ASSERT(pushed);
  ASSERT(!mgpu__trace_tag_push("copy.d2d", NULL, 0)); /* the outer one wins */
  mgpu__trace_tag *tag = mgpu__trace_tag_copy();
  mgpu__trace_tag_pop(pushed);
  ASSERT(tag != NULL && mgpu__trace_tag_copy() == NULL);
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
  /* A graph launch has a colour of its own; its nodes take their kind's. */
  ASSERT(timeline_kind_color("graph launch") != timeline_kind_color("other"));
  ASSERT(timeline_kind_color("graph launch") != timeline_kind_color("kernel"));
  ASSERT_EQ(timeline_kind_color("graph kernel"), timeline_kind_color("kernel"));
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


/* ---- a traced run over every layer ---- */

static int sleepy_task(int dev, mgpu_stream *s, void *arg) {
  (void)dev;
  (void)s;
  (void)arg;
  struct timespec ts = {0, 2 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return 0;
}

static void tiny_kernel(const mgpu_kernel_ctx *ctx, const void *args) {
  (void)ctx;
  (void)args;
}

static void noop_callback(void *arg) { (void)arg; }

static int noop_on_device(int dev, void *arg) {
  (void)dev;
  (void)arg;
  return 0;
}

/* How many events of ph whose name starts with prefix, on process pid
 * (any when pid < 0). */
static size_t count_named(const json *trace, const char *ph, const char *prefix,
                          int pid) {
  const json *ev = json_get(trace, "traceEvents");
  size_t n = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *p = json_get_string(e, "ph"), *nm = json_get_string(e, "name");
    if (p && nm && strcmp(p, ph) == 0 && strncmp(nm, prefix, strlen(prefix)) == 0 &&
        (pid < 0 || (int)json_get_number(e, "pid", -1) == pid))
      n++;
  }
  return n;
}

/* Every flow start has one end with its id, name and category. */
static void assert_flows_paired(const json *trace, const char *name) {
  const json *ev = json_get(trace, "traceEvents");
  size_t starts = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const json *s = &ev->items[i];
    const char *p = json_get_string(s, "ph"), *nm = json_get_string(s, "name");
    if (!p || !nm || strcmp(p, "s") != 0 || strcmp(nm, name) != 0) continue;
    starts++;
    int ends = 0;
    for (size_t k = 0; k < ev->n; k++) {
      const json *f = &ev->items[k];
      const char *q = json_get_string(f, "ph"), *fn = json_get_string(f, "name");
      if (q && fn && strcmp(q, "f") == 0 && strcmp(fn, name) == 0 &&
          json_get_number(f, "id", -1) == json_get_number(s, "id", -2))
        ends++;
    }
    ASSERT_EQ(ends, 1);
  }
  ASSERT(starts > 0);
}

/* Every end of every flow named name lies inside a span of its track, where
 * Perfetto binds it (within 1 ns: timestamps are written in whole ns). */
static void assert_flows_bound(const json *trace, const char *name) {
  const json *ev = json_get(trace, "traceEvents");
  for (size_t i = 0; i < ev->n; i++) {
    const json *f = &ev->items[i];
    const char *p = json_get_string(f, "ph"), *nm = json_get_string(f, "name");
    if (!p || !nm || (strcmp(p, "s") != 0 && strcmp(p, "f") != 0) ||
        strcmp(nm, name) != 0)
      continue;
    double ts = json_get_number(f, "ts", -1);
    int inside = 0;
    for (size_t k = 0; k < ev->n && !inside; k++) {
      const json *x = &ev->items[k];
      const char *q = json_get_string(x, "ph");
      if (q == NULL || strcmp(q, "X") != 0 ||
          json_get_number(x, "pid", -1) != json_get_number(f, "pid", -2) ||
          json_get_number(x, "tid", -1) != json_get_number(f, "tid", -2))
        continue;
      double a = json_get_number(x, "ts", 0), d = json_get_number(x, "dur", 0);
      inside = ts >= a - 0.001 && ts <= a + d + 0.001;
    }
    if (!inside) fprintf(stderr, "%s %s at %.3f us is in no span\n", name, p, ts);
    ASSERT(inside);
  }
}

TEST_IMPL(trace_of_every_layer) {
  char path[512], metrics[512];
  temp_path(path, sizeof path, "run.json");
  temp_path(metrics, sizeof metrics, "metrics.json");
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.trace = path;     /* as MGPU_TRACE would */
  cfg.metrics = metrics; /* as MGPU_METRICS would */
  ASSERT_OK(mgpu_init(&cfg));
  int n = mgpu_device_count();
  if (n < 2) return TEST_SKIP;
  mgpu_device_props p0 = {.size = sizeof p0};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  ASSERT_EQ(mgpu_trace_active(), 1);
  enum { N = 1 << 16 };
  static float host[N];
  mgpu_stream *s[2];
  mgpu_buffer *a[2];
  for (int d = 0; d < 2; d++) {
    ASSERT_OK(mgpu_stream_create(&s[d], d));
    ASSERT_OK(mgpu_malloc(&a[d], d, N * sizeof(float)));
  }
  /* Kernels, copies of every path, memset, callback. On CUDA devices the
   * kernel is the test library's empty one (one int argument), named tiny
   * here as on host devices. */
  mgpu_kernel k = {"tiny", tiny_kernel, NULL, NULL};
  mgpu_device_props p1 = {.size = sizeof p1};
  ASSERT_OK(mgpu_device_get_props(1, &p1));
  if (p0.backend_kind == MGPU_BACKEND_CUDA ||
      p1.backend_kind == MGPU_BACKEND_CUDA) {
    const mgpu_kernel *e = test_testkern_sym("tk_empty_kernel");
    ASSERT(e != NULL);
    k.cuda_fn = e->cuda_fn;
  }
  int unused = 0;
  ASSERT_OK(mgpu_memcpy_htod_async(a[0], 0, host, sizeof host, s[0]));
  ASSERT_OK(mgpu_launch(s[0], &k, MGPU_DIM3(2, 1, 1), MGPU_DIM3(32, 1, 1),
                        &unused, sizeof unused));
  ASSERT_OK(mgpu_memset_async(a[0], 0, 0, sizeof host, s[0]));
  ASSERT_OK(mgpu_scale(s[0], a[0], 0, N, MGPU_FLOAT32, 2.0));
  ASSERT_OK(mgpu_stream_add_callback(s[0], noop_callback, NULL));
  ASSERT_OK(mgpu_memcpy_async(a[1], 0, a[0], 0, sizeof host, s[0])); /* peer */
  ASSERT_OK(mgpu_peer_disable(0, 1));
  ASSERT_OK(mgpu_memcpy_async(a[1], 0, a[0], 0, sizeof host, s[0])); /* staged */
  ASSERT_OK(mgpu_peer_enable(0, 1));
  ASSERT_OK(mgpu_memcpy_dtoh_async(host, a[0], 0, sizeof host, s[0]));
  /* An event recorded on device 0 that device 1's stream waits for. */
  mgpu_event *ev;
  ASSERT_OK(mgpu_event_create(&ev, 0));
  ASSERT_OK(mgpu_launch(s[0], &k, MGPU_DIM3(64, 1, 1), MGPU_DIM3(1, 1, 1),
                        &unused, sizeof unused));
  ASSERT_OK(mgpu_event_record(ev, s[0]));
  ASSERT_OK(mgpu_stream_wait_event(s[1], ev));
  ASSERT_OK(mgpu_launch(s[1], &k, MGPU_DIM3(1, 1, 1), MGPU_DIM3(1, 1, 1),
                        &unused, sizeof unused));
  for (int d = 0; d < 2; d++) ASSERT_OK(mgpu_stream_synchronize(s[d]));
  ASSERT_OK(mgpu_event_destroy(ev));
  ASSERT_OK(mgpu_run_on_device(1, noop_on_device, NULL));
  /* The stream-ordered pool keeps a freed block. */
  mgpu_buffer *pooled;
  ASSERT_OK(mgpu_malloc_async(&pooled, 1 << 20, s[1]));
  ASSERT_OK(mgpu_free_async(pooled, s[1]));
  ASSERT_OK(mgpu_stream_synchronize(s[1]));

  /* A collective, a barrier, a channel. */
  int devs[2] = {0, 1};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  ASSERT_OK(mgpu_group_begin());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(mgpu_allreduce(comm, r, a[r], a[r], 1024, MGPU_FLOAT32, MGPU_SUM, s[r]));
  ASSERT_OK(mgpu_group_end());
  for (int d = 0; d < 2; d++) ASSERT_OK(mgpu_stream_synchronize(s[d]));
  ASSERT_OK(mgpu_comm_destroy(comm));
  mgpu_barrier *bar;
  ASSERT_OK(mgpu_barrier_create(devs, 1, &bar));
  ASSERT_OK(mgpu_barrier_wait(bar, 0, 1000));
  ASSERT_OK(mgpu_barrier_destroy(bar));
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(0, 1, 4096, 2, &ch));
  ASSERT_OK(mgpu_channel_send(ch, a[0], 0, 4096, s[0]));
  size_t got = 0;
  ASSERT_OK(mgpu_channel_recv(ch, a[1], 0, &got, s[1]));
  ASSERT_EQ(got, 4096);
  for (int d = 0; d < 2; d++) ASSERT_OK(mgpu_stream_synchronize(s[d]));
  ASSERT_OK(mgpu_channel_destroy(ch));

  /* Pool tasks that all prefer device 0: the others steal. */
  mgpu_pool_opts po = MGPU_POOL_OPTS_INITIALIZER;
  mgpu_pool *pool;
  ASSERT_OK(mgpu_pool_create(&pool, &po));
  for (int i = 0; i < 40; i++) {
    mgpu_task_desc td = MGPU_TASK_DESC_INITIALIZER;
    td.fn = sleepy_task;
    td.device = 0;
    ASSERT_OK(mgpu_pool_submit(pool, &td, NULL));
  }
  ASSERT_OK(mgpu_pool_wait_all(pool));
  mgpu_pool_stats ps = {.size = sizeof ps};
  ASSERT_OK(mgpu_pool_stats_get(pool, &ps));
  uint64_t stolen = 0;
  for (int i = 0; i < ps.ndevices; i++) stolen += ps.dev[i].tasks_stolen;
  ASSERT_OK(mgpu_pool_destroy(pool));

  /* Metrics with time, before the buffers go. */
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT(m.wall_ns > 0);
  ASSERT(m.dev[0].utilization > 0);
  ASSERT(m.dev[0].copy_ns[MGPU_METRIC_PATH_H2D] > 0);
  ASSERT_EQ(m.dev[0].copy_bytes[MGPU_METRIC_PATH_H2D], sizeof host);
  ASSERT(m.dev[0].copy_gbps[MGPU_METRIC_PATH_H2D] > 0);
  /* The direct copy: a device copy where devices 0 and 1 are parts of one
   * GPU (cuda:0/4), a peer copy elsewhere. */
  mgpu_copy_path direct;
  ASSERT_OK(mgpu_copy_path_get(0, 1, &direct));
  ASSERT(m.dev[0].copy_bytes[direct == MGPU_PATH_DEVICE
                                 ? MGPU_METRIC_PATH_D2D
                                 : MGPU_METRIC_PATH_PEER_DIRECT] >= sizeof host);
  /* The staged copy's halves: device to host on 0, host to device on 1. */
  ASSERT(m.dev[0].copy_bytes[MGPU_METRIC_PATH_PEER_STAGED] >= sizeof host);
  ASSERT(m.dev[1].copy_bytes[MGPU_METRIC_PATH_PEER_STAGED] >= sizeof host);
  ASSERT_EQ(m.dev[1].mem_pool_cached, 1 << 20);
  ASSERT(m.dev[1].mem_in_use >= m.dev[1].mem_pool_cached + N * sizeof(float));
  ASSERT_ERR(MGPU_EINVAL, mgpu_metrics_print(NULL, MGPU_METRICS_TABLE));
  ASSERT_ERR(MGPU_EINVAL, mgpu_metrics_print(stdout, (mgpu_metrics_format)7));
  for (int d = 0; d < 2; d++) {
    ASSERT_OK(mgpu_free(a[d]));
    ASSERT_OK(mgpu_stream_destroy(s[d]));
  }
  ASSERT_OK(mgpu_shutdown()); /* writes the trace and the metrics */
  ASSERT_EQ(mgpu_trace_active(), 0);

  json *j = read_trace(path);
  ASSERT_EQ(json_get_number(json_get(j, "otherData"), "dropped_events", -1), 0);
  /* One process per device, named with its properties. */
  char want[160];
  snprintf(want, sizeof want, "device 0: %s", p0.name);
  const json *evs = json_get(j, "traceEvents");
  int named = 0;
  for (size_t i = 0; i < evs->n; i++) {
    const char *v = json_get_string(json_get(&evs->items[i], "args"), "name");
    if (v != NULL && strcmp(v, want) == 0) named = 1;
  }
  ASSERT(named);
  ASSERT(count_named(j, "X", "kernel tiny", 0) >= 2);
  ASSERT(count_named(j, "X", "kernel tiny", 1) == 1);
  ASSERT(count_named(j, "X", "kernel scale", 0) == 1);
  ASSERT(count_named(j, "X", "copy.h2d", 0) == 1);
  ASSERT(count_named(j, "X", "copy.d2h", 0) == 1);
  ASSERT(count_named(j, "X", "copy.peer", -1) >= 1);
  ASSERT(count_named(j, "X", "copy.staged", 0) >= 1); /* its d2h halves */
  ASSERT(count_named(j, "X", "copy.staged", 1) >= 1); /* its h2d halves */
  ASSERT(count_named(j, "X", "memset", 0) == 1);
  ASSERT(count_named(j, "X", "callback", 0) == 1);
  /* Ours, and the one mgpu_shutdown queues to drain each device. */
  ASSERT_EQ(count_named(j, "X", "run_on_device", 1), 2);
  /* A small all-reduce on host devices is one kernel on one rank's
   * stream, which the others wait for. */
  ASSERT(count_named(j, "X", "coll.allreduce", -1) >= 1);
  ASSERT(count_named(j, "X", "barrier", -1) == 1);
  ASSERT(count_named(j, "X", "chan.send", 0) >= 1);
  ASSERT(count_named(j, "X", "chan.recv", 1) >= 1);
  ASSERT(count_named(j, "X", "wait stream", -1) >= 2);
  ASSERT(count_named(j, "X", "alloc", -1) >= 2);
  ASSERT(count_named(j, "X", "free", -1) >= 2);
  ASSERT_EQ(count_named(j, "X", "task", -1), 40);
  ASSERT(count_named(j, "C", "memory in use", 0) >= 2);
  ASSERT(count_named(j, "C", "memory in use", 1) >= 2);
  ASSERT(count_named(j, "C", "memory cached by the pool", 1) >= 1);
  assert_flows_paired(j, "event");
  assert_flows_paired(j, "chan");
  assert_flows_bound(j, "event");
  assert_flows_bound(j, "chan");
  ASSERT_EQ(count_named(j, "s", "steal", -1), stolen);
  if (stolen > 0) assert_flows_paired(j, "steal");
  assert_flows_bound(j, "steal");
  /* The event's arrow goes from device 0 to device 1. */
  int across = 0;
  for (size_t i = 0; i < evs->n; i++) {
    const json *e = &evs->items[i];
    const char *p = json_get_string(e, "ph"), *nm = json_get_string(e, "name");
    if (p && nm && strcmp(p, "f") == 0 && strcmp(nm, "event") == 0 &&
        json_get_number(e, "pid", -1) == 1)
      across = 1;
  }
  ASSERT(across);
  json_free(j);
  remove(path);

  /* MGPU_METRICS wrote JSON at shutdown. */
  json *mj = read_trace(metrics);
  const json *devices = json_get(mj, "devices");
  ASSERT(devices != NULL && devices->type == JSON_ARRAY && (int)devices->n == n);
  const json *d0 = &devices->items[0];
  ASSERT(json_get_number(d0, "utilization", -1) > 0);
  ASSERT(json_get_number(json_get(json_get(d0, "copies"), "h2d"), "bytes", 0) ==
         sizeof host);
  ASSERT(json_get_number(d0, "tasks_run", -1) >= 0);
  json_free(mj);
  remove(metrics);
  return 0;
}

TEST_IMPL(metrics_table_and_reset) {
  test_init();
  mgpu_buffer *b;
  mgpu_stream *s;
  static char host[1 << 20];
  ASSERT_OK(mgpu_stream_create(&s, 0));
  ASSERT_OK(mgpu_malloc(&b, 0, sizeof host));
  ASSERT_OK(mgpu_memcpy_htod_async(b, 0, host, sizeof host, s));
  ASSERT_OK(mgpu_stream_synchronize(s));
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT(f != NULL);
  ASSERT_OK(mgpu_metrics_print(f, MGPU_METRICS_TABLE));
  fclose(f);
  ASSERT(strstr(text, "util") != NULL);
  ASSERT(strstr(text, "h2d") != NULL);
  ASSERT(strstr(text, "load imbalance") != NULL);
  free(text);
  ASSERT_OK(mgpu_metrics_reset());
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].copy_ns[MGPU_METRIC_PATH_H2D], 0);
  ASSERT_EQ(m.dev[0].copy_bytes[MGPU_METRIC_PATH_H2D], 0);
  ASSERT(m.dev[0].copy_gbps[MGPU_METRIC_PATH_H2D] == 0);
  ASSERT(m.wall_ns < 1000000000ull);
  ASSERT(strcmp(mgpu_metric_path_name(MGPU_METRIC_PATH_PEER_STAGED), "peer_staged") == 0);
  ASSERT(strcmp(mgpu_metric_path_name(99), "?") == 0);
  ASSERT_OK(mgpu_free(b));
  ASSERT_OK(mgpu_stream_destroy(s));
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  ASSERT_OK(mgpu_shutdown());
  ASSERT_ERR(MGPU_ENOINIT, mgpu_metrics_print(stderr, MGPU_METRICS_TABLE));
  /* MGPU_TRACE records from init to shutdown. */
  char path[512];
  temp_path(path, sizeof path, "env.json");
  setenv("MGPU_TRACE", path, 1);
  ASSERT_OK(mgpu_init(NULL));
  unsetenv("MGPU_TRACE");
  ASSERT_EQ(mgpu_trace_active(), 1);
  ASSERT_OK(mgpu_run_on_device(0, noop_on_device, NULL));
  ASSERT_OK(mgpu_shutdown());
  ASSERT_EQ(mgpu_trace_active(), 0);
  json *j = read_trace(path);
  ASSERT(count_named(j, "X", "run_on_device", 0) >= 1);
  json_free(j);
  remove(path);
  /* A trace path that cannot be created fails mgpu_init, with the name. */
  cfg.trace = "/nonexistent-dir/t.json";
  ASSERT_ERR(MGPU_EIO, mgpu_init(&cfg));
  ASSERT_DETAIL_HAS("/nonexistent-dir/t.json");
  ASSERT_EQ(mgpu_is_initialized(), 0);
  ASSERT_EQ(mgpu_trace_active(), 0);
  return 0;
}

/* Counters are kept per thread and summed: what threads added is counted
 * while they run and after they ended, a reset starts every thread's
 * count again at 0, and so does a new mgpu_init. */
typedef struct adder {
  int n;
  pthread_barrier_t *added, *leave; /* NULL: no waits */
} adder;

static void *add_coll_ops(void *p) {
  adder *a = p;
  for (int i = 0; i < a->n; i++)
    ASSERT_OK(mgpu_module_metric_add(0, "coll_ops", 1));
  if (a->added != NULL) {
    pthread_barrier_wait(a->added);
    pthread_barrier_wait(a->leave);
    ASSERT_OK(mgpu_module_metric_add(0, "coll_ops", 1));
  }
  return NULL;
}

/* A destructor of a key made after mgpu_init runs after the metrics' own
 * at thread exit; what it counts is still counted. */
static pthread_key_t late_key;

static void late_destructor(void *p) {
  (void)p;
  ASSERT_OK(mgpu_module_metric_add(0, "coll_ops", 100));
}

static void *add_then_exit(void *p) {
  (void)p;
  ASSERT_OK(mgpu_module_metric_add(0, "coll_ops", 1));
  pthread_setspecific(late_key, &late_key);
  return NULL;
}

static uint64_t coll_ops_now(void) {
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  return m.dev[0].coll_ops;
}

TEST_IMPL(metrics_sum_threads) {
  test_init();
  ASSERT_OK(mgpu_metrics_reset());
  ASSERT_EQ(coll_ops_now(), 0);
  pthread_t t[4];
  adder ended = {1000, NULL, NULL};
  for (int i = 0; i < 4; i++)
    ASSERT(pthread_create(&t[i], NULL, add_coll_ops, &ended) == 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  ASSERT_OK(mgpu_module_metric_add(0, "coll_ops", 7));
  ASSERT_EQ(coll_ops_now(), 4007);
  /* A thread that still runs: its count is read, reset, and counted again
   * after the reset. */
  pthread_barrier_t added, leave;
  pthread_barrier_init(&added, NULL, 2);
  pthread_barrier_init(&leave, NULL, 2);
  adder live = {5, &added, &leave};
  pthread_t l;
  ASSERT(pthread_create(&l, NULL, add_coll_ops, &live) == 0);
  pthread_barrier_wait(&added);
  ASSERT_EQ(coll_ops_now(), 4012);
  ASSERT_OK(mgpu_metrics_reset());
  ASSERT_EQ(coll_ops_now(), 0);
  pthread_barrier_wait(&leave);
  pthread_join(l, NULL);
  ASSERT_EQ(coll_ops_now(), 1);
  pthread_barrier_destroy(&added);
  pthread_barrier_destroy(&leave);
  ASSERT(pthread_key_create(&late_key, late_destructor) == 0);
  ASSERT(pthread_create(&l, NULL, add_then_exit, NULL) == 0);
  pthread_join(l, NULL);
  ASSERT_EQ(coll_ops_now(), 102);
  pthread_key_delete(late_key);
  ASSERT_OK(mgpu_shutdown());
  test_init();
  ASSERT_EQ(coll_ops_now(), 0);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(json_reader)
TEST_ENTRY(recorder_writes_chrome_json)
TEST_ENTRY(recorder_errors)
TEST_ENTRY(recorder_threads_and_cap)
TEST_ENTRY(timeline_png)
TEST_ENTRY(timeline_svg_and_errors)
TEST_ENTRY(trace_of_every_layer)
TEST_ENTRY(metrics_table_and_reset)
TEST_ENTRY(metrics_sum_threads)
TEST_LIST_END
