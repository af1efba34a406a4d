/* One set of drawing calls for two outputs: a raster (image.h, for PNG and
 * PPM) and SVG elements written to a file, so that a picture is laid out
 * once whatever it is saved as. */
#ifndef MGPU_TOOLS_CANVAS_H
#define MGPU_TOOLS_CANVAS_H

#include <stdio.h>

#include "image.h"

typedef struct canvas {
  image *img; /* raster, or NULL */
  FILE *svg;  /* SVG, or NULL */
} canvas;

void canvas_rect(canvas *cv, int x, int y, int w, int h, rgb_t c);
void canvas_line(canvas *cv, int x0, int y0, int x1, int y1, rgb_t c);
/* Text with its top-left corner at (x, y), 6x8 pixels per character at
 * scale 1 (SVG: a 10-pixel monospace font per scale). */
void canvas_text(canvas *cv, int x, int y, const char *s, rgb_t c, int scale);
/* A two-pixel line with an arrowhead at (x1, y1). */
void canvas_arrow(canvas *cv, int x0, int y0, int x1, int y1, rgb_t c);

#endif /* MGPU_TOOLS_CANVAS_H */
