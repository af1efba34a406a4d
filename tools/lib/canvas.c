/* The drawing surface of the pictures (canvas.h): every call draws into the
 * raster, the SVG file, or both. */
#include "canvas.h"

#include <math.h>

static void svg_color(FILE *f, rgb_t c) { fprintf(f, "#%06x", c & 0xffffffu); }

void canvas_rect(canvas *cv, int x, int y, int w, int h, rgb_t c) {
  if (w <= 0 || h <= 0) return;
  if (cv->img != NULL) image_rect(cv->img, x, y, w, h, c);
  if (cv->svg != NULL) {
    fprintf(cv->svg, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"",
            x, y, w, h);
    svg_color(cv->svg, c);
    fprintf(cv->svg, "\"/>\n");
  }
}

void canvas_line(canvas *cv, int x0, int y0, int x1, int y1, rgb_t c) {
  if (cv->img != NULL) image_line(cv->img, x0, y0, x1, y1, c);
  if (cv->svg != NULL) {
    fprintf(cv->svg, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"",
            x0, y0, x1, y1);
    svg_color(cv->svg, c);
    fprintf(cv->svg, "\"/>\n");
  }
}

void canvas_text(canvas *cv, int x, int y, const char *s, rgb_t c,
                      int scale) {
  if (cv->img != NULL) image_text(cv->img, x, y, s, c, scale);
  if (cv->svg != NULL) {
    fprintf(cv->svg, "<text x=\"%d\" y=\"%d\" font-family=\"monospace\" "
            "font-size=\"%d\" fill=\"", x, y + 7 * scale, 10 * scale);
    svg_color(cv->svg, c);
    fprintf(cv->svg, "\">");
    for (; *s != '\0'; s++) {
      if (*s == '<') fputs("&lt;", cv->svg);
      else if (*s == '>') fputs("&gt;", cv->svg);
      else if (*s == '&') fputs("&amp;", cv->svg);
      else fputc(*s, cv->svg);
    }
    fprintf(cv->svg, "</text>\n");
  }
}

void canvas_arrow(canvas *cv, int x0, int y0, int x1, int y1, rgb_t c) {
  canvas_line(cv, x0, y0, x1, y1, c);
  canvas_line(cv, x0 + 1, y0, x1 + 1, y1, c); /* two pixels wide */
  double dx = x1 - x0, dy = y1 - y0, len = sqrt(dx * dx + dy * dy);
  if (len < 1) return;
  dx /= len;
  dy /= len;
  for (int side = -1; side <= 1; side += 2) {
    double a = 0.45 * side, ca = cos(a), sa = sin(a);
    int hx = x1 - (int)lround(7 * (dx * ca - dy * sa));
    int hy = y1 - (int)lround(7 * (dx * sa + dy * ca));
    canvas_line(cv, x1, y1, hx, hy, c);
    canvas_line(cv, x1 + 1, y1, hx + 1, hy, c);
  }
}

