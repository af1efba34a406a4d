/* The timeline renderer (timeline.h).
 *
 * It reads the trace into lanes, spans, flows and counter samples, lays the
 * lanes out top to bottom (devices by number, then the host), and draws
 * them through one set of drawing calls (canvas.h) into a raster for PNG
 * and PPM, or as SVG elements. Each lane keeps the last pixel column a narrow
 * span was marked in, so thousands of short spans become a few marks. */
#include "timeline.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canvas.h"

/* ---- kinds and their colours ---- */

typedef struct kind {
  const char *prefix; /* span names starting with this */
  const char *label;  /* in the legend */
  rgb_t color;
} kind;

static const kind kinds[] = {
    {"kernel", "kernel", 0x4c72b0},
    {"copy.h2d", "copy h2d", 0x55a868},
    {"copy.d2h", "copy d2h", 0x9bd17a},
    {"copy.d2d", "copy in device", 0x2ca6a4},
    {"copy.peer", "copy peer direct", 0xdd8452},
    {"copy.staged", "copy host-staged", 0xe8b00c},
    {"copy", "copy (other)", 0x8ebf9f},
    {"memset", "memset", 0x7fb3d5},
    {"task", "pool task", 0x8172b3},
    {"coll", "collective", 0xc44e52},
    {"barrier", "collective", 0xc44e52},
    {"chan", "channel", 0x937860},
    {"wait", "wait", 0xa8a8a8},
    {"sync", "wait", 0xa8a8a8},
    {"callback", "host function", 0xda8bc3},
    {"run_on_device", "host function", 0xda8bc3},
    {"alloc", "alloc/free", 0xbcbd22},
    {"free", "alloc/free", 0xbcbd22},
    /* The 1 ns mark a steal arrow starts in (src/sched/task.c). */
    {"stolen", "task stolen", 0xd62728},
    /* A graph launch's part, and its nodes inside it (docs/graphs.md). */
    {"graph kernel", "kernel", 0x4c72b0},
    {"graph builtin", "kernel", 0x4c72b0},
    {"graph copy", "copy (other)", 0x8ebf9f},
    {"graph memset", "memset", 0x7fb3d5},
    {"graph callback", "host function", 0xda8bc3},
    {"graph", "graph launch", 0x17becf},
};
enum { NKINDS = sizeof kinds / sizeof kinds[0] };
static const rgb_t other_color = 0x64b5cd;
static const rgb_t counter_color = 0xb0a060;

static int kind_of(const char *name) {
  for (int i = 0; i < NKINDS; i++)
    if (strncmp(name, kinds[i].prefix, strlen(kinds[i].prefix)) == 0) return i;
  if (strstr(name, "wait") != NULL) return 12; /* kinds[12]: wait */
  return -1;
}

rgb_t timeline_kind_color(const char *span_name) {
  int k = kind_of(span_name);
  return k < 0 ? other_color : kinds[k].color;
}

static rgb_t flow_color(const char *name) {
  if (strstr(name, "steal") != NULL) return 0xd62728;
  if (strncmp(name, "chan", 4) == 0) return 0x6b4f2a;
  return 0x303030;
}

/* ---- the model ---- */

typedef struct lane {
  int pid;
  long long tid;        /* -1: a counter lane */
  char counter[48];     /* counter lanes: the counter's name */
  double max_value;
  int y, h;
} lane;

typedef struct span {
  int lane, kind;
  double ts, dur; /* µs */
} span;

typedef struct flow_end {
  char ph;
  double id;
  char name[48];
  int lane;
  double ts;
} flow_end;

typedef struct sample {
  int lane;
  double ts, value;
} sample;

typedef struct model {
  lane *lanes;
  int nlanes, lanes_cap;
  span *spans;
  size_t nspans, spans_cap;
  flow_end *flows;
  size_t nflows, flows_cap;
  sample *samples;
  size_t nsamples, samples_cap;
  const json *events;
  double t0, t1;
} model;

static void *grow(void *p, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return p;
  size_t c = *cap ? 2 * *cap : 256;
  void *q = realloc(p, c * size);
  if (q != NULL) *cap = c;
  return q;
}

static int lane_of(model *m, int pid, long long tid, const char *counter) {
  for (int i = 0; i < m->nlanes; i++)
    if (m->lanes[i].pid == pid && m->lanes[i].tid == tid &&
        (counter == NULL || strcmp(m->lanes[i].counter, counter) == 0))
      return i;
  if (m->nlanes == TIMELINE_MAX_LANES) return -1;
  size_t cap = (size_t)m->lanes_cap;
  lane *l = grow(m->lanes, &cap, (size_t)m->nlanes, sizeof *l);
  if (l == NULL) return -1;
  m->lanes = l;
  m->lanes_cap = (int)cap;
  lane *n = &m->lanes[m->nlanes];
  memset(n, 0, sizeof *n);
  n->pid = pid;
  n->tid = tid;
  if (counter != NULL) snprintf(n->counter, sizeof n->counter, "%s", counter);
  return m->nlanes++;
}

static void extend(model *m, double t) {
  if (t < m->t0) m->t0 = t;
  if (t > m->t1) m->t1 = t;
}

/* The first number among an event's arguments (a counter's value). */
static double first_arg(const json *e) {
  const json *args = json_get(e, "args");
  if (args == NULL || args->type != JSON_OBJECT) return 0;
  for (size_t i = 0; i < args->n; i++)
    if (args->items[i].type == JSON_NUMBER) return args->items[i].number;
  return 0;
}

static int build(model *m, const json *trace, char *err, int err_size) {
  const json *ev = trace->type == JSON_ARRAY ? trace : json_get(trace, "traceEvents");
  if (ev == NULL || ev->type != JSON_ARRAY) {
    snprintf(err, (size_t)err_size, "no traceEvents array: not a trace-event file");
    return -1;
  }
  m->events = ev;
  m->t0 = INFINITY;
  m->t1 = -INFINITY;
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *ph = json_get_string(e, "ph"), *name = json_get_string(e, "name");
    if (ph == NULL || name == NULL) continue;
    int pid = (int)json_get_number(e, "pid", 0);
    long long tid = (long long)json_get_number(e, "tid", 0);
    double ts = json_get_number(e, "ts", 0);
    if (ph[0] == 'X') {
      int l = lane_of(m, pid, tid, NULL);
      span *s = grow(m->spans, &m->spans_cap, m->nspans, sizeof *s);
      if (l < 0 || s == NULL) goto nomem;
      m->spans = s;
      double dur = json_get_number(e, "dur", 0);
      m->spans[m->nspans++] = (span){l, kind_of(name), ts, dur};
      extend(m, ts);
      extend(m, ts + dur);
    } else if (ph[0] == 's' || ph[0] == 'f') {
      int l = lane_of(m, pid, tid, NULL);
      flow_end *f = grow(m->flows, &m->flows_cap, m->nflows, sizeof *f);
      if (l < 0 || f == NULL) goto nomem;
      m->flows = f;
      flow_end *n = &m->flows[m->nflows++];
      n->ph = ph[0];
      n->id = json_get_number(e, "id", 0);
      snprintf(n->name, sizeof n->name, "%s", name);
      n->lane = l;
      n->ts = ts;
      extend(m, ts);
    } else if (ph[0] == 'C') {
      int l = lane_of(m, pid, -1, name);
      sample *s = grow(m->samples, &m->samples_cap, m->nsamples, sizeof *s);
      if (l < 0 || s == NULL) goto nomem;
      m->samples = s;
      double v = first_arg(e);
      m->samples[m->nsamples++] = (sample){l, ts, v};
      if (v > m->lanes[l].max_value) m->lanes[l].max_value = v;
      extend(m, ts);
    }
  }
  if (m->nspans == 0 && m->nsamples == 0) {
    snprintf(err, (size_t)err_size, "the trace holds no spans or counters");
    return -1;
  }
  if (!(m->t1 > m->t0)) m->t1 = m->t0 + 1;
  return 0;
nomem:
  snprintf(err, (size_t)err_size, "out of memory (or more than %d lanes)",
           TIMELINE_MAX_LANES);
  return -1;
}

/* Names from the metadata events; NULL when there is none. */
static const char *meta_name(const model *m, const char *what, int pid,
                             long long tid) {
  const json *ev = m->events;
  for (size_t i = 0; i < ev->n; i++) {
    const json *e = &ev->items[i];
    const char *ph = json_get_string(e, "ph"), *name = json_get_string(e, "name");
    if (ph == NULL || ph[0] != 'M' || name == NULL || strcmp(name, what) != 0)
      continue;
    if ((int)json_get_number(e, "pid", -1) != pid) continue;
    if (tid >= 0 && (long long)json_get_number(e, "tid", -1) != tid) continue;
    const char *n = json_get_string(json_get(e, "args"), "name");
    if (n != NULL) return n;
  }
  return NULL;
}

static int by_lane(const void *a, const void *b) {
  const lane *x = a, *y = b;
  /* Devices by number, then the other processes; in a process the
   * tracks by number, then its counters. */
  if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
  if ((x->tid < 0) != (y->tid < 0)) return x->tid < 0 ? 1 : -1;
  if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
  return strcmp(x->counter, y->counter);
}

static int by_start(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->lane != y->lane) return x->lane - y->lane;
  return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* Flow ends by name and id, each start before its end. */
static int by_flow(const void *a, const void *b) {
  const flow_end *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c != 0) return c;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->ph == 'f') - (y->ph == 'f');
}

/* ---- layout ---- */

enum {
  LABEL_W = 250,  /* the names' column */
  RIGHT = 24,
  TOP = 84,       /* below the title and the time axis */
  HEADER_H = 18,  /* a device's name band */
  TRACK_H = 16,   /* a stream or thread */
  BAR_H = 12,
  COUNTER_H = 30,
  GAP = 8
};

static void format_time(char *out, size_t size, double us, double step_us) {
  if (step_us < 1) snprintf(out, size, "%.0f ns", us * 1000);
  else if (step_us < 1000) snprintf(out, size, "%g us", round(us * 1000) / 1000);
  else if (step_us < 1e6) snprintf(out, size, "%g ms", round(us) / 1000);
  else snprintf(out, size, "%g s", round(us / 1000) / 1000);
}

static void format_value(char *out, size_t size, const char *name, double v) {
  if (strstr(name, "memory") != NULL || strstr(name, "bytes") != NULL) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
      v /= 1024;
      u++;
    }
    snprintf(out, size, "%.1f %s", v, unit[u]);
  } else {
    snprintf(out, size, "%g", v);
  }
}

static void draw_axis(canvas *cv, const model *m, int x0, int x1, int width) {
  double range = m->t1 - m->t0, raw = range / 10, mag = pow(10, floor(log10(raw)));
  double step = mag;
  if (raw / mag >= 5) step = 5 * mag;
  else if (raw / mag >= 2) step = 2 * mag;
  int y = TOP - 12;
  canvas_line(cv, x0, y, x1, y, 0x404040);
  char label[48];
  for (double t = 0; t <= range * 1.0001; t += step) {
    int x = x0 + (int)lround(t / range * (x1 - x0));
    canvas_line(cv, x, y - 4, x, y, 0x404040);
    format_time(label, sizeof label, t, step);
    int w = text_width(label, 1), lx = x - w / 2;
    if (lx + w > width - 2) lx = width - 2 - w;
    canvas_text(cv, lx, y - 14, label, 0x202020, 1);
  }
  canvas_text(cv, 8, y - 14, "time since start", 0x606060, 1);
}

/* The legend names the kinds present (present[NKINDS]: other; [NKINDS+1]:
 * counters; [NKINDS+2]: steal arrows; [NKINDS+3]: other arrows). */
static void draw_legend(canvas *cv, int y, int width, const int *present) {
  int x = 8;
  canvas_text(cv, x, y + 2, "legend:", 0x202020, 1);
  x += 60;
  for (int i = 0; i < NKINDS + 4; i++) {
    const char *label;
    rgb_t c;
    int flow = 0;
    if (i < NKINDS) {
      int shown = present[i];
      for (int j = 0; j < NKINDS; j++)
        if (strcmp(kinds[j].label, kinds[i].label) == 0 && present[j]) {
          shown = j == i; /* the first present kind of this label */
          break;
        }
      if (!shown) continue;
      label = kinds[i].label;
      c = kinds[i].color;
    } else if (!present[i]) {
      continue;
    } else if (i == NKINDS) {
      label = "other";
      c = other_color;
    } else if (i == NKINDS + 1) {
      label = "memory in use";
      c = counter_color;
    } else if (i == NKINDS + 2) {
      label = "steal";
      c = flow_color("steal");
      flow = 1;
    } else {
      label = "wait / send->recv";
      c = flow_color("wait");
      flow = 1;
    }
    int w = 16 + 6 + text_width(label, 1) + 14;
    if (x + w > width - 8) {
      x = 68;
      y += 16;
    }
    if (flow)
      canvas_arrow(cv, x, y + 4, x + 16, y + 4, c);
    else
      canvas_rect(cv, x, y, 16, 10, c);
    canvas_text(cv, x + 22, y + 2, label, 0x202020, 1);
    x += w;
  }
}

/* Lays out the lanes; returns the height of the picture. */
static int layout(model *m) {
  qsort(m->lanes, (size_t)m->nlanes, sizeof *m->lanes, by_lane);
  int y = TOP;
  for (int i = 0; i < m->nlanes; i++) {
    if (i == 0 || m->lanes[i].pid != m->lanes[i - 1].pid) y += HEADER_H;
    m->lanes[i].y = y;
    m->lanes[i].h = m->lanes[i].tid < 0 ? COUNTER_H : TRACK_H;
    y += m->lanes[i].h;
    if (i + 1 == m->nlanes || m->lanes[i + 1].pid != m->lanes[i].pid) y += GAP;
  }
  return y + 60;
}

/* The lanes were sorted after spans pointed into them: renumber. */
static void remap(model *m, const lane *before, int n) {
  int *map = malloc((size_t)n * sizeof *map);
  if (map == NULL) return;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m->nlanes; j++)
      if (before[i].pid == m->lanes[j].pid && before[i].tid == m->lanes[j].tid &&
          strcmp(before[i].counter, m->lanes[j].counter) == 0)
        map[i] = j;
  for (size_t i = 0; i < m->nspans; i++) m->spans[i].lane = map[m->spans[i].lane];
  for (size_t i = 0; i < m->nflows; i++) m->flows[i].lane = map[m->flows[i].lane];
  for (size_t i = 0; i < m->nsamples; i++)
    m->samples[i].lane = map[m->samples[i].lane];
  free(map);
}

/* What every drawing step needs: the canvas, the model, the plot's
 * columns and the time scale. */
typedef struct frame {
  canvas *cv;
  model *m;
  int x0, x1, width;
  double scale; /* pixels per us */
} frame;

static double xof(const frame *fr, double t) {
  return fr->x0 + (t - fr->m->t0) * fr->scale;
}

/* Device names on dark bands, lane backgrounds and lane names; returns the
 * number of processes (the trace format's groups: mgpu writes one per
 * device and one named "host" for the threads of none), *hosts those named
 * "host". */
static int draw_names(const frame *fr, int *hosts) {
  const model *m = fr->m;
  char line[256];
  int processes = 0;
  *hosts = 0;
  for (int i = 0; i < m->nlanes; i++) {
    const lane *l = &m->lanes[i];
    if (i == 0 || l->pid != m->lanes[i - 1].pid) {
      const char *pname = meta_name(m, "process_name", l->pid, -1);
      if (pname == NULL) snprintf(line, sizeof line, "process %d", l->pid);
      else snprintf(line, sizeof line, "%s", pname);
      if (pname != NULL && strcmp(pname, "host") == 0) ++*hosts;
      canvas_rect(fr->cv, 0, l->y - HEADER_H, fr->width, HEADER_H - 2, 0x3b4252);
      canvas_text(fr->cv, 6, l->y - HEADER_H + 4, line, 0xffffff, 1);
      processes++;
    }
    canvas_rect(fr->cv, fr->x0, l->y + 1, fr->x1 - fr->x0, l->h - 2,
              i % 2 ? 0xf4f4f4 : 0xfafafa);
    if (l->tid >= 0) {
      const char *tname = meta_name(m, "thread_name", l->pid, l->tid);
      if (tname == NULL) snprintf(line, sizeof line, "  track %lld", l->tid);
      else snprintf(line, sizeof line, "  %s", tname);
    } else {
      char v[32];
      format_value(v, sizeof v, l->counter, l->max_value);
      snprintf(line, sizeof line, "  %s (max %s)", l->counter, v);
    }
    if ((int)strlen(line) > (LABEL_W - 8) / 6) line[(LABEL_W - 8) / 6] = '\0';
    canvas_text(fr->cv, 4, l->y + (l->h - 8) / 2, line, 0x303030, 1);
  }
  return processes;
}

/* Spans in their kind's colour. In each lane, spans narrower than a pixel
 * become one-pixel marks, one per column: *merged counts those spans,
 * *marks the marks drawn. */
static void draw_spans(const frame *fr, size_t *merged, size_t *marks) {
  const model *m = fr->m;
  int last_lane = -1, last_col = -1;
  *merged = *marks = 0;
  for (size_t i = 0; i < m->nspans; i++) {
    const span *s = &m->spans[i];
    const lane *l = &m->lanes[s->lane];
    double a = xof(fr, s->ts), b = xof(fr, s->ts + s->dur);
    rgb_t c = s->kind < 0 ? other_color : kinds[s->kind].color;
    int y = l->y + (l->h - BAR_H) / 2;
    if (s->lane != last_lane) last_col = -1;
    last_lane = s->lane;
    if (b - a < 1) {
      (*merged)++;
      int col = (int)floor(a);
      if (col == last_col) continue;
      last_col = col;
      (*marks)++;
      canvas_rect(fr->cv, col, y, 1, BAR_H, c);
      continue;
    }
    int xa = (int)floor(a), xb = (int)ceil(b);
    canvas_rect(fr->cv, xa, y, xb - xa, BAR_H, c);
    /* A dark left edge separates back-to-back spans (the next span's
     * edge covers this one's last column). */
    if (xb - xa >= 4) canvas_rect(fr->cv, xa, y, 1, BAR_H, 0x202020);
  }
}

/* Counters as steps, each up to the lane's maximum. */
static void draw_counters(const frame *fr) {
  const model *m = fr->m;
  for (size_t i = 0; i < m->nsamples; i++) {
    const sample *s = &m->samples[i];
    const lane *l = &m->lanes[s->lane];
    double end = m->t1;
    for (size_t j = i + 1; j < m->nsamples; j++)
      if (m->samples[j].lane == s->lane) {
        end = m->samples[j].ts;
        break;
      }
    if (l->max_value <= 0) continue;
    int h = (int)lround(s->value / l->max_value * (l->h - 4));
    int xa = (int)floor(xof(fr, s->ts)), xb = (int)ceil(xof(fr, end));
    canvas_rect(fr->cv, xa, l->y + l->h - 2 - h, xb - xa > 0 ? xb - xa : 1, h,
              counter_color);
  }
}

/* Arrows between lanes (a flow within one lane says nothing more than the
 * order of its spans); returns how many were drawn. */
static size_t draw_flows(const frame *fr) {
  model *m = fr->m;
  size_t flows = 0;
  qsort(m->flows, m->nflows, sizeof *m->flows, by_flow);
  for (size_t i = 0; i + 1 < m->nflows; i++) {
    const flow_end *s = &m->flows[i], *f = &m->flows[i + 1];
    if (s->ph != 's' || f->ph != 'f' || f->id != s->id ||
        strcmp(f->name, s->name) != 0 || f->lane == s->lane)
      continue;
    const lane *la = &m->lanes[s->lane], *lb = &m->lanes[f->lane];
    canvas_arrow(fr->cv, (int)lround(xof(fr, s->ts)), la->y + la->h / 2,
               (int)lround(xof(fr, f->ts)), lb->y + lb->h / 2,
               flow_color(s->name));
    flows++;
  }
  return flows;
}

/* The title, its summary line, the axis, the merge note and the legend of
 * the kinds present. */
static void draw_frame_text(const frame *fr, const char *title, int height,
                            int processes, int hosts, size_t flows,
                            size_t merged, size_t marks) {
  const model *m = fr->m;
  char line[256], span_time[48];
  canvas_text(fr->cv, 8, 8, title, 0x101010, 2);
  format_time(span_time, sizeof span_time, m->t1 - m->t0, m->t1 - m->t0);
  int devices = processes - hosts;
  snprintf(line, sizeof line, "%zu spans over %s on %d device%s%s, %zu arrows",
           m->nspans, span_time, devices, devices == 1 ? "" : "s",
           hosts > 0 ? " and the host" : "", flows);
  canvas_text(fr->cv, 8, 30, line, 0x404040, 1);
  draw_axis(fr->cv, m, fr->x0, fr->x1, fr->width);
  int ly = height - 52;
  if (merged > 0)
    snprintf(line, sizeof line, "%zu spans narrower than a pixel drawn as %zu "
             "one-pixel marks", merged, marks);
  else
    snprintf(line, sizeof line, "every span drawn to scale");
  canvas_text(fr->cv, 8, ly, line, 0x404040, 1);
  int present[NKINDS + 4] = {0};
  for (size_t i = 0; i < m->nspans; i++)
    present[m->spans[i].kind < 0 ? NKINDS : m->spans[i].kind] = 1;
  present[NKINDS + 1] = m->nsamples > 0;
  for (size_t i = 0; i < m->nflows; i++)
    present[strstr(m->flows[i].name, "steal") ? NKINDS + 2 : NKINDS + 3] = 1;
  draw_legend(fr->cv, ly + 16, fr->width, present);
}

static void draw(canvas *cv, model *m, const char *title, int width,
                 int height, timeline_info *info) {
  frame fr = {cv, m, LABEL_W, width - RIGHT, width, 0};
  fr.scale = (fr.x1 - fr.x0) / (m->t1 - m->t0);
  size_t merged, marks;
  int hosts;
  int processes = draw_names(&fr, &hosts);
  draw_spans(&fr, &merged, &marks);
  draw_counters(&fr);
  size_t flows = draw_flows(&fr);
  draw_frame_text(&fr, title, height, processes, hosts, flows, merged, marks);
  if (info == NULL) return;
  memset(info, 0, sizeof *info);
  info->width = width;
  info->height = height;
  info->plot_x0 = fr.x0;
  info->plot_x1 = fr.x1;
  info->t0_us = m->t0;
  info->t1_us = m->t1;
  info->nlanes = m->nlanes;
  for (int i = 0; i < m->nlanes; i++)
    info->lanes[i] = (timeline_lane){m->lanes[i].pid, m->lanes[i].tid,
                                     m->lanes[i].y + (m->lanes[i].h - BAR_H) / 2,
                                     m->lanes[i].y + (m->lanes[i].h + BAR_H) / 2};
  info->spans = m->nspans;
  info->merged = merged;
  info->merged_marks = marks;
  info->flows = flows;
  info->counters = m->nsamples;
  info->devices = processes;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Which picture path names: 1 SVG, 2 PPM, 0 PNG, -1 (err filled) none this
 * build can write. */
static int picture_kind(const char *path, char *err, int err_size) {
  if (ends_with(path, ".svg")) return 1;
  if (ends_with(path, ".ppm")) return 2;
  if (!ends_with(path, ".png")) {
    snprintf(err, (size_t)err_size, "%s: the picture's name must end in .png, "
             ".svg or .ppm", path);
    return -1;
  }
  if (!image_have_png()) {
    snprintf(err, (size_t)err_size, "%s: PNG needs libpng, which was not found "
             "when mgpu was configured; write .svg instead", path);
    return -1;
  }
  return 0;
}

/* The model of trace, its lanes laid out and its spans sorted; the
 * picture's height in *height. 0, or -1 with err filled (m's arrays are
 * the caller's to free either way). */
static int model_laid_out(model *m, const json *trace, int *height, char *err,
                          int err_size) {
  if (build(m, trace, err, err_size) != 0) return -1;
  lane *before = malloc((size_t)m->nlanes * sizeof *before);
  if (before == NULL) {
    snprintf(err, (size_t)err_size, "out of memory");
    return -1;
  }
  memcpy(before, m->lanes, (size_t)m->nlanes * sizeof *before);
  *height = layout(m);
  remap(m, before, m->nlanes);
  free(before);
  qsort(m->spans, m->nspans, sizeof *m->spans, by_start);
  return 0;
}

int timeline_render(const json *trace, const char *title, int width,
                    const char *path, timeline_info *info, char *err,
                    int err_size) {
  int kind = picture_kind(path, err, err_size);
  if (kind < 0) return -1;
  int svg = kind == 1, ppm = kind == 2;
  if (width < 400) width = 400;
  if (width > 16384) width = 16384;
  model m;
  memset(&m, 0, sizeof m);
  int height = 0;
  int rc = model_laid_out(&m, trace, &height, err, err_size);
  if (rc != 0) goto out;
  canvas cv = {NULL, NULL};
  image img = {0, 0, NULL};
  if (svg) {
    cv.svg = fopen(path, "w");
    if (cv.svg == NULL) {
      snprintf(err, (size_t)err_size, "%s: cannot create", path);
      rc = -1;
      goto out;
    }
    fprintf(cv.svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\">\n", width, height, width, height);
    canvas_rect(&cv, 0, 0, width, height, TIMELINE_BG);
  } else if (image_init(&img, width, height, TIMELINE_BG) != 0) {
    snprintf(err, (size_t)err_size, "out of memory for a %dx%d picture", width,
             height);
    rc = -1;
    goto out;
  } else {
    cv.img = &img;
  }
  draw(&cv, &m, title, width, height, info);
  if (svg) {
    fprintf(cv.svg, "</svg>\n");
    if (fclose(cv.svg) != 0) {
      snprintf(err, (size_t)err_size, "%s: write failed", path);
      rc = -1;
    }
  } else {
    rc = ppm ? image_write_ppm(&img, path, err, err_size)
             : image_write_png(&img, path, err, err_size);
    image_free(&img);
  }
out:
  free(m.lanes);
  free(m.spans);
  free(m.flows);
  free(m.samples);
  return rc;
}
