/* mgpu demo mandelbrot: the Mandelbrot set in tiles over every device,
 * through the work-stealing pool.
 *
 * Each tile is one pool task, owned by the device of its block of tiles
 * (the middle of the picture costs far more than its edges, so owners
 * finish at different times and idle devices steal). A task launches the
 * kernel (host variant on host devices, CUDA variant on GPUs, opened from
 * libmgpu-demo-cuda.so, OpenCL C variant on OpenCL devices) into its
 * device's tile buffer and copies the tile
 * back, both on the pool's stream of that device.
 *
 * The run is recorded as a trace and drawn as a timeline; then the same
 * tiles are computed on device 0 alone, for the speedup and for a pixel by
 * pixel check of the picture. Writes into the output folder:
 *   mandelbrot.png          the picture (PPM when libpng is absent)
 *   mandelbrot-devices.png  each tile tinted by the device that computed it
 *   mandelbrot-trace.json   the trace (Perfetto, chrome://tracing)
 *   mandelbrot-timeline.png the timeline of the trace (SVG without libpng)
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "image.h"
#include "mandel.h"
#include "../examples/demo_cuda.h"

/* ---- the kernel ---- */

static void mandel_host(const mgpu_kernel_ctx *ctx, const void *argp) {
  const mandel_args *a = argp;
  for (int j = 0; j < MANDEL_BLOCK; j++) {
    int ty = (int)ctx->block_idx.y * MANDEL_BLOCK + j, py = a->py0 + ty;
    if (ty >= a->tile) break;
    for (int i = 0; i < MANDEL_BLOCK; i++) {
      int tx = (int)ctx->block_idx.x * MANDEL_BLOCK + i, px = a->px0 + tx;
      if (tx >= a->tile) break;
      if (px >= a->width || py >= a->height) {
        a->out[ty * a->tile + tx] = 0;
        continue;
      }
      /* The same operations, in the same order, as tools/cuda/mandel.cu
       * (this file is built with -ffp-contract=off). */
      double cr = a->x0 + (double)px * a->dx, ci = a->y0 + (double)py * a->dy;
      double zr = 0, zi = 0;
      int n = 0;
      while (n < a->iters) {
        double zr2 = zr * zr, zi2 = zi * zi;
        if (zr2 + zi2 > 4.0) break;
        double t = (zr2 - zi2) + cr;
        zi = (2.0 * zr) * zi + ci;
        zr = t;
        n++;
      }
      a->out[ty * a->tile + tx] = (uint16_t)n;
    }
  }
}

/* The OpenCL C variant: the same operations in the same order, with
 * contraction off (OpenCL C fuses a * b + c by default), so its pixels
 * match the host variant's. The struct is mandel_args (mandel.h) with the
 * pointer as a ulong; one work-item per pixel. */
static const char mandel_opencl_src[] =
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "typedef struct { ulong out; double x0, y0, dx, dy;\n"
    "  int px0, py0, tile, width, height, iters; } mandel_args;\n"
    "__kernel void mandel(mandel_args a) {\n"
    "  __global ushort *out = (__global ushort *)a.out;\n"
    "  int tx = get_global_id(0), ty = get_global_id(1);\n"
    "  int px = a.px0 + tx, py = a.py0 + ty;\n"
    "  if (tx >= a.tile || ty >= a.tile) return;\n"
    "  if (px >= a.width || py >= a.height) { out[ty * a.tile + tx] = 0; return; }\n"
    "  double cr = a.x0 + (double)px * a.dx, ci = a.y0 + (double)py * a.dy;\n"
    "  double zr = 0, zi = 0;\n"
    "  int n = 0;\n"
    "  while (n < a.iters) {\n"
    "    double zr2 = zr * zr, zi2 = zi * zi;\n"
    "    if (zr2 + zi2 > 4.0) break;\n"
    "    double t = (zr2 - zi2) + cr;\n"
    "    zi = (2.0 * zr) * zi + ci;\n"
    "    zr = t;\n"
    "    n++;\n"
    "  }\n"
    "  out[ty * a.tile + tx] = (ushort)n;\n"
    "}\n";


/* ---- the run ---- */

typedef struct options {
  int width, height, iters, tile;
  const char *out;
  int check; /* compare with a one-device run */
} options;

typedef struct demo demo;

typedef struct tile_job {
  demo *d;
  int px0, py0;
  int device; /* the device that ran it */
  int owner;  /* the device it was submitted to */
  uint16_t *host; /* tile x tile counts */
} tile_job;

struct demo {
  options o;
  mgpu_kernel kernel;
  int ntiles, tiles_x;
  tile_job *jobs;
  uint16_t *tiles;                     /* ntiles * tile * tile */
  mgpu_buffer *buf[MGPU_MAX_DEVICES];  /* one tile per device */
  atomic_int done;
};

static int tile_task(int dev, mgpu_stream *stream, void *arg) {
  tile_job *j = arg;
  demo *d = j->d;
  int t = d->o.tile, blocks = (t + MANDEL_BLOCK - 1) / MANDEL_BLOCK;
  mandel_args a = {
      .out = mgpu_buffer_ptr(d->buf[dev]),
      .x0 = -2.2, .y0 = -1.2,
      .dx = 3.2 / d->o.width, .dy = 2.4 / d->o.height,
      .px0 = j->px0, .py0 = j->py0, .tile = t,
      .width = d->o.width, .height = d->o.height, .iters = d->o.iters};
  /* Keep the aspect ratio: the wider side spans its range. */
  double step = a.dx > a.dy ? a.dx : a.dy;
  a.dx = a.dy = step;
  a.x0 = -0.6 - step * d->o.width / 2;
  a.y0 = -step * d->o.height / 2;
  int rc = mgpu_launch(stream, &d->kernel, MGPU_DIM3(blocks, blocks, 1),
                       MGPU_DIM3(MANDEL_BLOCK, MANDEL_BLOCK, 1), &a, sizeof a);
  if (rc == 0)
    rc = mgpu_memcpy_dtoh_async(j->host, d->buf[dev], 0,
                                (size_t)t * t * sizeof(uint16_t), stream);
  j->device = dev;
  atomic_fetch_add(&d->done, 1);
  return rc;
}

static void progress(demo *d, const char *what) {
  int n = atomic_load(&d->done), w = 40, fill = n * w / d->ntiles;
  fprintf(stderr, "\r%-12s [", what);
  for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
  fprintf(stderr, "] %d/%d tiles", n, d->ntiles);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Computes every tile on the given devices; fills stats and the time. */
static int run(demo *d, int ndev, const int *devs, mgpu_pool_stats *stats,
               double *seconds, const char *what) {
  mgpu_pool_opts po = MGPU_POOL_OPTS_INITIALIZER;
  po.policy = MGPU_SCHED_WS;
  po.ndevices = ndev;
  po.devices = devs;
  mgpu_pool *pool;
  int rc = mgpu_pool_create(&pool, &po);
  if (rc != 0) return mgpu_cmd_fail("creating the pool", rc);
  atomic_store(&d->done, 0);
  int bar = isatty(STDERR_FILENO);
  double t0 = now_s();
  for (int k = 0; k < d->ntiles && rc == 0; k++) {
    tile_job *j = &d->jobs[k];
    mgpu_task_desc td = MGPU_TASK_DESC_INITIALIZER;
    td.fn = tile_task;
    td.arg = j;
    /* Blocks of consecutive tiles per device: uneven work, so stealing. */
    j->owner = devs[(int)((long long)k * ndev / d->ntiles)];
    td.device = j->owner;
    rc = mgpu_pool_submit(pool, &td, NULL);
  }
  while (rc == 0 && bar && atomic_load(&d->done) < d->ntiles) {
    progress(d, what);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  }
  int wrc = mgpu_pool_wait_all(pool);
  *seconds = now_s() - t0;
  if (bar) {
    progress(d, what);
    fprintf(stderr, "\n");
  }
  if (rc == 0) rc = wrc;
  if (rc != 0) mgpu_cmd_fail("computing the tiles", rc);
  stats->size = sizeof *stats;
  mgpu_pool_stats_get(pool, stats);
  mgpu_pool_destroy(pool);
  return rc != 0;
}

/* ---- pictures ---- */

static uint16_t count_at(const demo *d, const uint16_t *tiles, int x, int y) {
  int t = d->o.tile, k = (y / t) * d->tiles_x + x / t;
  return tiles[(size_t)k * t * t + (size_t)(y % t) * t + (x % t)];
}

/* Iterations to colour: black inside the set; outside, a gradient (deep
 * blue, sky, white, orange, dark) over the logarithm of the count, twice
 * round, so that the bands near the set stay apart. */
static rgb_t palette(int n, int iters) {
  static const double stop[][4] = {{0.0, 0, 7, 100},      {0.16, 32, 107, 203},
                                   {0.42, 237, 255, 255}, {0.6425, 255, 170, 0},
                                   {0.8575, 0, 2, 0},     {1.0, 0, 7, 100}};
  if (n >= iters) return 0x000000;
  double t = 2 * log(1.0 + n) / log(1.0 + iters);
  t -= floor(t);
  int i = 0;
  while (i < 4 && t > stop[i + 1][0]) i++;
  double f = (t - stop[i][0]) / (stop[i + 1][0] - stop[i][0]);
  rgb_t c = 0;
  for (int k = 1; k <= 3; k++)
    c = c << 8 | (rgb_t)lround(stop[i][k] + f * (stop[i + 1][k] - stop[i][k]));
  return c;
}

static const rgb_t device_tint[] = {0x4c72b0, 0xdd8452, 0x55a868, 0xc44e52,
                                    0x8172b3, 0x937860, 0xda8bc3, 0xccb974};

static int save(const image *img, const char *dir, const char *name,
                char *written, size_t size) {
  char err[512];
  int png = image_have_png();
  snprintf(written, size, "%s/%s.%s", dir, name, png ? "png" : "ppm");
  int rc = png ? image_write_png(img, written, err, sizeof err)
               : image_write_ppm(img, written, err, sizeof err);
  if (rc != 0) fprintf(stderr, "mgpu demo mandelbrot: %s\n", err);
  return rc != 0;
}

static int pictures(demo *d, const char *dir, char *pic, char *devpic,
                    size_t size) {
  image img, dimg;
  int w = d->o.width, h = d->o.height;
  /* The devices' picture has its key in a band below the picture (it
   * covered most of a small one in a corner), at least the key's width. */
  int ndev = mgpu_device_count();
  int rows = ndev < 32 ? ndev : 32, key_w = 260, key_h = 24 * rows + 36;
  int dw = w > key_w ? w : key_w;
  if (image_init(&img, w, h, 0) != 0 ||
      image_init(&dimg, dw, h + key_h, 0) != 0) {
    fprintf(stderr, "mgpu demo mandelbrot: out of memory for the pictures\n");
    return 1;
  }
  int t = d->o.tile;
  for (int y = 0; y < h; y++) {
    for (int x = 0; x < w; x++) {
      rgb_t c = palette(count_at(d, d->tiles, x, y), d->o.iters);
      image_rect(&img, x, y, 1, 1, c);
      const tile_job *j = &d->jobs[(y / t) * d->tiles_x + x / t];
      rgb_t tint = device_tint[j->device % 8];
      /* The picture's brightness in the device's colour; a tile a device
       * stole gets a dashed edge. */
      int lum = (int)(((c >> 16) & 255) + ((c >> 8) & 255) + (c & 255)) / 3;
      int k = 96 + lum * 159 / 255;
      rgb_t dc = (((tint >> 16) & 255) * k / 255) << 16 |
                 (((tint >> 8) & 255) * k / 255) << 8 | ((tint & 255) * k / 255);
      int edge = x % t == 0 || y % t == 0;
      if (edge) dc = j->device != j->owner && ((x + y) / 3) % 2 ? 0xffffff : 0x202020;
      image_rect(&dimg, x, y, 1, 1, dc);
    }
  }
  /* The key: one swatch per device. */
  image_rect(&dimg, 0, h, dw, key_h, 0x000000);
  if (dw > w) image_rect(&dimg, w, 0, dw - w, h, 0x000000);
  for (int i = 0; i < rows; i++) {
    char label[32];
    snprintf(label, sizeof label, "device %d", i);
    image_rect(&dimg, 12, h + 8 + 24 * i, 16, 16, device_tint[i % 8]);
    image_text(&dimg, 36, h + 9 + 24 * i, label, 0xffffff, 2);
  }
  image_text(&dimg, 12, h + 10 + 24 * rows, "dashed edge: stolen", 0xffffff,
             2);
  int rc = save(&img, dir, "mandelbrot", pic, size) ||
           save(&dimg, dir, "mandelbrot-devices", devpic, size);
  image_free(&img);
  image_free(&dimg);
  return rc;
}

/* ---- the command ---- */

static int usage(void) {
  fprintf(stderr,
          "usage: mgpu demo mandelbrot [--size WxH] [--iters N] [--tile N]\n"
          "                            [--out DIR] [--no-check]\n"
          "  defaults: --size 1600x1200 --iters 1000 --tile 64 --out .\n");
  return 2;
}

/* Says what is wrong with the command line, for usage() to follow. */
static int bad(const char *what) {
  fprintf(stderr, "mgpu demo mandelbrot: %s\n", what);
  return -1;
}

static int parse(int argc, char **argv, options *o) {
  *o = (options){1600, 1200, 1000, 64, ".", 1};
  for (int i = 2; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--size") == 0 && v != NULL) {
      if (sscanf(v, "%dx%d", &o->width, &o->height) != 2)
        return bad("--size takes WIDTHxHEIGHT, as 1600x1200");
      i++;
    } else if (strcmp(argv[i], "--iters") == 0 && v != NULL) {
      o->iters = atoi(v);
      i++;
    } else if (strcmp(argv[i], "--tile") == 0 && v != NULL) {
      o->tile = atoi(v);
      i++;
    } else if (strcmp(argv[i], "--out") == 0 && v != NULL) {
      o->out = v;
      i++;
    } else if (strcmp(argv[i], "--no-check") == 0) {
      o->check = 0;
    } else {
      char what[160];
      snprintf(what, sizeof what, "unknown option or missing value: %s",
               argv[i]);
      return bad(what);
    }
  }
  if (o->width < 16 || o->height < 16 || o->width > 16384 || o->height > 16384)
    return bad("--size: width and height from 16 to 16384");
  if (o->iters < 1 || o->iters > 65535)
    return bad("--iters: from 1 to 65535");
  if (o->tile < 16 || o->tile > 1024) return bad("--tile: from 16 to 1024");
  /* A tile larger than the picture is the picture. */
  int side = o->width > o->height ? o->width : o->height;
  if (o->tile > side) o->tile = side;
  return 0;
}

/* The tiles, their jobs and a tile buffer on each of ndev devices; 0 or
 * the command's exit code (what is made is freed by demo_free). */
static int demo_alloc(demo *d, int ndev) {
  int t = d->o.tile;
  d->tiles_x = (d->o.width + t - 1) / t;
  d->ntiles = d->tiles_x * ((d->o.height + t - 1) / t);
  d->jobs = calloc((size_t)d->ntiles, sizeof *d->jobs);
  d->tiles = malloc((size_t)d->ntiles * t * t * sizeof *d->tiles);
  if (d->jobs == NULL || d->tiles == NULL) {
    fprintf(stderr, "mgpu demo mandelbrot: out of host memory\n");
    return 1;
  }
  for (int dev = 0; dev < ndev; dev++) {
    int rc = mgpu_malloc(&d->buf[dev], dev, (size_t)t * t * sizeof(uint16_t));
    if (rc != 0) return mgpu_cmd_fail("allocating a tile buffer", rc);
  }
  for (int k = 0; k < d->ntiles; k++)
    d->jobs[k] = (tile_job){d, (k % d->tiles_x) * t, (k / d->tiles_x) * t,
                            -1, -1, d->tiles + (size_t)k * t * t};
  return 0;
}

static void demo_free(demo *d, int ndev) {
  for (int dev = 0; dev < ndev; dev++)
    if (d->buf[dev] != NULL) mgpu_free(d->buf[dev]);
  free(d->jobs);
  free(d->tiles);
}

/* The run on every device: its time, and each device's share. */
static void print_run(const demo *d, int ndev, const mgpu_pool_stats *all,
                      double t_all) {
  int t = d->o.tile;
  printf("mandelbrot %dx%d, %d iterations, %d tiles of %dx%d on %d devices: "
         "%.3f s\n", d->o.width, d->o.height, d->o.iters, d->ntiles, t, t,
         ndev, t_all);
  printf("%-6s %-28s %8s %8s %10s %8s\n", "device", "name", "tiles", "stolen",
         "busy ms", "util");
  for (int i = 0; i < all->ndevices; i++) {
    mgpu_device_props pr = {.size = sizeof pr};
    if (mgpu_device_get_props(all->dev[i].device, &pr) != 0)
      snprintf(pr.name, sizeof pr.name, "?");
    printf("%-6d %-28.28s %8llu %8llu %10.1f %7.1f%%\n", all->dev[i].device,
           pr.name, (unsigned long long)all->dev[i].tasks_run,
           (unsigned long long)all->dev[i].tasks_stolen,
           all->dev[i].busy_ns / 1e6,
           100.0 * all->dev[i].busy_ns / 1e9 / t_all);
  }
  printf("load imbalance %.3f (max busy / mean busy - 1)\n",
         all->load_imbalance);
}

/* The same tiles on device 0 alone: the speedup, and every pixel compared
 * with the run on every device (0, or the command's exit code). */
static int check_against_one(demo *d, int ndev, double t_all) {
  size_t bytes = (size_t)d->ntiles * d->o.tile * d->o.tile * sizeof *d->tiles;
  uint16_t *first = malloc(bytes);
  if (first == NULL) {
    fprintf(stderr, "mgpu demo mandelbrot: out of host memory\n");
    return 1;
  }
  memcpy(first, d->tiles, bytes);
  memset(d->tiles, 0xff, bytes);
  int dev0 = 0;
  mgpu_pool_stats one;
  double t_one = 0;
  int rc = run(d, 1, &dev0, &one, &t_one, "one device");
  size_t differ = 0;
  for (int y = 0; rc == 0 && y < d->o.height; y++)
    for (int x = 0; x < d->o.width; x++)
      differ += count_at(d, first, x, y) != count_at(d, d->tiles, x, y);
  free(first);
  if (rc != 0) return rc;
  printf("one device (device 0): %.3f s; speedup on %d devices: %.2fx\n",
         t_one, ndev, t_one / t_all);
  if (differ != 0) {
    fprintf(stderr, "mgpu demo mandelbrot: %zu of %d pixels differ from the "
            "one-device run\n", differ, d->o.width * d->o.height);
    return 1;
  }
  printf("check: every one of %d pixels equals the one-device run\n",
         d->o.width * d->o.height);
  return 0;
}

int mgpu_demo_mandelbrot(int argc, char **argv) {
  demo d;
  memset(&d, 0, sizeof d);
  if (parse(argc, argv, &d.o) != 0) return usage();
  if (mkdir(d.o.out, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "mgpu demo mandelbrot: cannot create %s: %s\n", d.o.out,
            strerror(errno));
    return 1;
  }
  int rc = mgpu_cmd_init();
  if (rc != 0) return rc;
  d.kernel = (mgpu_kernel){.name = "mandel",
                           .host_fn = mandel_host,
                           .cuda_fn = demo_cuda_fn("mgpu_demo_mandel_cuda_fn"),
                           .opencl_src = mandel_opencl_src};
  int ndev = mgpu_device_count();
  if ((rc = demo_alloc(&d, ndev)) != 0) goto out;

  /* The run on every device, recorded unless a trace is already running
   * (MGPU_TRACE): then it is part of that one. */
  char trace[PATH_MAX], timeline[PATH_MAX];
  snprintf(trace, sizeof trace, "%s/mandelbrot-trace.json", d.o.out);
  int own_trace = !mgpu_trace_active() && mgpu_trace_start(trace) == 0;
  int devs[MGPU_MAX_DEVICES];
  for (int i = 0; i < ndev; i++) devs[i] = i;
  mgpu_pool_stats all;
  double t_all;
  rc = run(&d, ndev, devs, &all, &t_all, "all devices");
  if (own_trace && (mgpu_trace_stop() != 0 || rc != 0)) own_trace = 0;
  if (rc != 0) goto out;
  print_run(&d, ndev, &all, t_all);

  char pic[PATH_MAX + 32], devpic[PATH_MAX + 32];
  if ((rc = pictures(&d, d.o.out, pic, devpic, sizeof pic)) != 0) goto out;
  if (d.o.check && (rc = check_against_one(&d, ndev, t_all)) != 0) goto out;
  printf("picture:  %s\ndevices:  %s\n", pic, devpic);
  if (own_trace) {
    snprintf(timeline, sizeof timeline, "%s/mandelbrot-timeline.%s", d.o.out,
             image_have_png() ? "png" : "svg");
    char title[160];
    snprintf(title, sizeof title, "mgpu demo mandelbrot on %d devices", ndev);
    if ((rc = mgpu_trace_view(trace, timeline, title, 1600, 1)) != 0) goto out;
    printf("trace:    %s (open in ui.perfetto.dev or chrome://tracing)\n"
           "timeline: %s\n", trace, timeline);
  }
out:
  demo_free(&d, ndev);
  return rc;
}
