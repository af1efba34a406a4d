/* Pictures for the mgpu command: an RGB raster with rectangles, lines and
 * text in a built-in 5x7 font, written as PNG (libpng, when it was found at
 * configure time) or binary PPM, and PNG read back for the tests. */
#ifndef MGPU_TOOLS_IMAGE_H
#define MGPU_TOOLS_IMAGE_H

#include <stdint.h>

typedef struct image {
  int width, height;
  uint8_t *rgb; /* width * height * 3 bytes, rows top to bottom */
} image;

typedef uint32_t rgb_t; /* 0xRRGGBB */

/* Allocates a width x height image filled with bg; 0 or -1 (no memory). */
int image_init(image *img, int width, int height, rgb_t bg);
void image_free(image *img);

void image_rect(image *img, int x, int y, int w, int h, rgb_t c);
void image_line(image *img, int x0, int y0, int x1, int y1, rgb_t c);
/* Text with its top-left corner at (x, y); scale 1 is 6x8 pixels per
 * character cell, and the letters that go below the line (g, j, p, q, y)
 * one more row below it. Returns the width drawn. */
int image_text(image *img, int x, int y, const char *s, rgb_t c, int scale);
/* The width of s in pixels at scale. */
int text_width(const char *s, int scale);
rgb_t image_get(const image *img, int x, int y);

/* Nonzero when PNG can be written and read (libpng was found). */
int image_have_png(void);
/* Writes img; 0, or -1 with the reason in err. */
int image_write_png(const image *img, const char *path, char *err, int err_size);
int image_write_ppm(const image *img, const char *path, char *err, int err_size);
/* Reads an 8-bit RGB or RGBA PNG into img (alpha dropped). */
int image_read_png(image *img, const char *path, char *err, int err_size);

#endif /* MGPU_TOOLS_IMAGE_H */
