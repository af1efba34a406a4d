/* Fuzz target: the arithmetic of distributions (src/part/dist.c). The input
 * picks a kind, a number of parts, a length n (up to SIZE_MAX), a block size,
 * the devices and the weights. Whatever they are, a created distribution must
 * give every index exactly one owner: the counts add up to n, each part's
 * ranges are non-empty, increasing and inside [0, n), together they tile
 * [0, n), their lengths add up to the part's count, and mgpu_dist_locate of
 * each range's ends names that part and the right local position. */
#include <string.h>

#include "fuzz.h"
#include "mgpu.h"

#define DEVICES 4
#define RANGE_BUDGET 4096 /* ranges walked per input, so each run is fast */

/* The devices' threads must be gone before the process's own exit handlers
 * run (hwloc's libraries have some). */
static void shutdown_at_exit(void) { mgpu_shutdown(); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("MGPU_DEVICES", "host:4", 1);
  setenv("MGPU_HOST_WORKERS", "1", 1);
  if (mgpu_init(NULL) != 0) {
    fprintf(stderr, "fuzz-dist: mgpu_init: %s\n", mgpu_error_detail());
    abort();
  }
  atexit(shutdown_at_exit);
  return 0;
}

typedef struct reader {
  const uint8_t *p;
  size_t left;
} reader;

static uint64_t take(reader *r, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) {
    v = v << 8 | (r->left ? *r->p : 0);
    if (r->left) r->p++, r->left--;
  }
  return v;
}

/* Lengths that reach the edges: small, near powers of two, near SIZE_MAX. */
static size_t pick_size(reader *r) {
  uint64_t sel = take(r, 1), v = take(r, 8);
  switch (sel % 4) {
    case 0: return (size_t)(v % 1000);
    case 1: return (size_t)(v % 100000);
    case 2: return SIZE_MAX - (size_t)(v % 1000);
    default: return (size_t)v;
  }
}

static double pick_weight(uint8_t b) {
  switch (b % 8) {
    case 0: return 0;
    case 1: return 1e-310; /* subnormal */
    case 2: return 1e308;  /* sums overflow a double */
    case 3: return 1;
    default: return (double)b;
  }
}

typedef struct seen_range {
  size_t begin, end;
} seen_range;

static int by_begin(const void *a, const void *b) {
  size_t x = ((const seen_range *)a)->begin, y = ((const seen_range *)b)->begin;
  return x < y ? -1 : x > y;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER;
  o.kind = (mgpu_dist_kind)(take(&r, 1) % 5); /* 4: an unknown kind */
  int nparts = (int)(take(&r, 1) % 40);       /* 0: every device */
  size_t n = pick_size(&r);
  o.block = take(&r, 1) % 4 == 0 ? pick_size(&r) : (size_t)(take(&r, 2));
  int devices[40];
  double weights[40];
  for (int p = 0; p < 40; p++) {
    devices[p] = (int)(take(&r, 1) % DEVICES);
    weights[p] = pick_weight((uint8_t)take(&r, 1));
  }
  o.ndevices = nparts;
  o.devices = nparts ? devices : NULL;
  o.weights = weights; /* never NULL: measuring speeds is too slow here */

  mgpu_dist *d = NULL;
  int rc = mgpu_dist_create(&d, n, &o);
  if (rc != 0) {
    FUZZ_CHECK(rc == MGPU_EINVAL && mgpu_error_detail()[0] != '\0');
    return 0;
  }
  int P = mgpu_dist_nparts(d);
  FUZZ_CHECK(P == (nparts ? nparts : DEVICES));
  FUZZ_CHECK(mgpu_dist_n(d) == n);

  size_t total = 0;
  for (int p = 0; p < P; p++) {
    FUZZ_CHECK(mgpu_dist_device(d, p) == (nparts ? devices[p] : p));
    FUZZ_CHECK(!__builtin_add_overflow(total, mgpu_dist_count(d, p), &total));
  }
  FUZZ_CHECK(total == n);
  FUZZ_CHECK(mgpu_dist_count(d, P) == 0 && mgpu_dist_count(d, -1) == 0);

  static seen_range seen[RANGE_BUDGET];
  size_t nseen = 0, budget = RANGE_BUDGET;
  int complete = 1;
  for (int p = 0; p < P; p++) {
    size_t nr = mgpu_dist_nranges(d, p), local = 0;
    FUZZ_CHECK((nr == 0) == (mgpu_dist_count(d, p) == 0));
    size_t walk = nr < budget ? nr : budget;
    if (walk < nr) complete = 0;
    budget -= walk;
    size_t prev_end = 0;
    for (size_t k = 0; k < walk; k++) {
      mgpu_range g = mgpu_dist_range(d, p, k);
      FUZZ_CHECK(g.begin < g.end && g.end <= n);
      FUZZ_CHECK(k == 0 || g.begin >= prev_end);
      prev_end = g.end;
      int owner = -1;
      size_t at = 0;
      FUZZ_CHECK(mgpu_dist_locate(d, g.begin, &owner, &at) == 0);
      FUZZ_CHECK(owner == p && at == local);
      FUZZ_CHECK(mgpu_dist_locate(d, g.end - 1, &owner, &at) == 0);
      FUZZ_CHECK(owner == p && at == local + (g.end - 1 - g.begin));
      local += g.end - g.begin;
      seen[nseen++] = (seen_range){g.begin, g.end};
    }
    if (walk == nr) FUZZ_CHECK(local == mgpu_dist_count(d, p));
    mgpu_range past = mgpu_dist_range(d, p, nr);
    FUZZ_CHECK(past.begin == 0 && past.end == 0);
  }
  if (complete) { /* the ranges tile [0, n) */
    qsort(seen, nseen, sizeof *seen, by_begin);
    size_t next = 0;
    for (size_t k = 0; k < nseen; k++) {
      FUZZ_CHECK(seen[k].begin == next);
      next = seen[k].end;
    }
    FUZZ_CHECK(next == n);
  }
  int owner;
  FUZZ_CHECK(mgpu_dist_locate(d, n, &owner, NULL) == MGPU_ERANGE);
  mgpu_dist_destroy(d);
  return 0;
}
