/* mgpu trace view TRACE.json -o PICTURE.png|.svg [--width N] [--title T]:
 * draws the timeline of a trace file (tools/lib/timeline.c) and says what
 * it drew. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "json.h"
#include "timeline.h"

static int usage(void) {
  fprintf(stderr,
          "usage: mgpu trace view TRACE.json -o PICTURE.png|.svg "
          "[--width PIXELS] [--title TEXT]\n"
          "  Draws one lane per device, a sub-lane per stream and thread, spans\n"
          "  coloured by kind and arrows for waits across devices and steals.\n"
          "  Record a trace with MGPU_TRACE=trace.json or mgpu_trace_start().\n");
  return 2;
}

int mgpu_trace_view(const char *in, const char *out, const char *title,
                    int width, int quiet) {
  char err[512];
  json *trace = json_parse_file(in, err, sizeof err);
  if (trace == NULL) {
    fprintf(stderr, "mgpu trace view: %s\n", err);
    return 1;
  }
  timeline_info info;
  int rc = timeline_render(trace, title != NULL ? title : in, width, out, &info,
                           err, sizeof err);
  json_free(trace);
  if (rc != 0) {
    fprintf(stderr, "mgpu trace view: %s\n", err);
    return 1;
  }
  if (!quiet)
    printf("%s: %dx%d, %d processes, %d lanes, %zu spans (%zu narrower than a "
           "pixel, merged into %zu marks), %zu arrows, %zu counter samples\n",
           out, info.width, info.height, info.devices, info.nlanes, info.spans,
           info.merged, info.merged_marks, info.flows, info.counters);
  return 0;
}

int mgpu_cmd_trace(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "view") != 0) return usage();
  const char *in = NULL, *out = NULL, *title = NULL;
  int width = 1600;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else if (strcmp(argv[i], "--width") == 0 && i + 1 < argc) {
      width = atoi(argv[++i]);
      if (width < 400 || width > 16384) {
        fprintf(stderr, "mgpu trace view: --width must be 400 to 16384\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--title") == 0 && i + 1 < argc) {
      title = argv[++i];
    } else if (argv[i][0] != '-' && in == NULL) {
      in = argv[i];
    } else {
      return usage();
    }
  }
  if (in == NULL || out == NULL) return usage();
  return mgpu_trace_view(in, out, title, width, 0);
}
