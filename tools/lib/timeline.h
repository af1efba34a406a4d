/* The timeline picture of a Chrome trace-event file (what `mgpu trace view`
 * draws): one lane per trace process (device) with a sub-lane per track
 * (stream or host thread) and one per counter, spans coloured by kind, flow
 * arrows between lanes, a time axis with units, the names and a legend.
 * Spans narrower than a pixel are merged into one-pixel marks, and the
 * picture says how many. */
#ifndef MGPU_TOOLS_TIMELINE_H
#define MGPU_TOOLS_TIMELINE_H

#include <stddef.h>

#include "image.h"
#include "json.h"

#define TIMELINE_MAX_LANES 256

typedef struct timeline_lane {
  int pid;
  long long tid;   /* counter lanes: -1 */
  int y0, y1;      /* pixel rows of the lane's bar */
} timeline_lane;

/* Where things were drawn, for the caller's message and for the tests. */
typedef struct timeline_info {
  int width, height;
  int plot_x0, plot_x1; /* pixel columns of the first and last time */
  double t0_us, t1_us;  /* the time range drawn */
  int nlanes;
  timeline_lane lanes[TIMELINE_MAX_LANES];
  size_t spans, merged, merged_marks, flows, counters;
  int devices;
} timeline_info;

/* The colour a span of this name is drawn in (kernel, copy by path, task,
 * collective, channel, wait, host function, memory, other). */
rgb_t timeline_kind_color(const char *span_name);
/* The picture's background. */
#define TIMELINE_BG 0xffffffu

/* Draws trace (a parsed trace-event file) width pixels wide into path:
 * PNG for ".png", SVG for ".svg", PPM for ".ppm". 0, or -1 with the reason
 * in err. info may be NULL. */
int timeline_render(const json *trace, const char *title, int width,
                    const char *path, timeline_info *info, char *err,
                    int err_size);

#endif /* MGPU_TOOLS_TIMELINE_H */
