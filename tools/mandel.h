/* The Mandelbrot kernel's arguments, shared by its host variant
 * (tools/demo-mandelbrot.c) and its CUDA variant (tools/cuda/mandel.cu).
 * One launch computes one tile: blocks of MANDEL_BLOCK x MANDEL_BLOCK
 * pixels, each pixel the number of iterations before |z| > 2 (iters when
 * it never escapes). Both variants round every operation the same way (no
 * fused multiply-add), so their pictures agree pixel for pixel. */
#ifndef MGPU_TOOLS_MANDEL_H
#define MGPU_TOOLS_MANDEL_H

#include <stdint.h>

#define MANDEL_BLOCK 16

typedef struct mandel_args {
  uint16_t *out;    /* tile x tile counts, row-major, device memory */
  double x0, y0;    /* the complex number of pixel (0, 0) */
  double dx, dy;    /* step per pixel */
  int px0, py0;     /* the tile's first pixel */
  int tile;         /* tile edge in pixels */
  int width, height;
  int iters;
} mandel_args;

#endif /* MGPU_TOOLS_MANDEL_H */
