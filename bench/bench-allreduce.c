/* mgpu bench allreduce: float sums over 2 and 4 host devices (as many as
 * are open, at most 4), 8 B to 256 MiB per device in powers of 4 (as
 * nccl-tests -b 8 -e 256M -f 4 does, and 256 MiB itself; --quick: 8 B,
 * 4 KiB, 64 KiB, 1 MiB; --sizes 8,128K,...: those; --devices 2: those
 * device counts), next to MPI_Allreduce on as many local ranks over the
 * same sizes in the same run: Open MPI's and, where mpicc.mpich was found
 * at configure time, MPICH's (a row for each).
 *
 * Figures per size, as nccl-tests defines them: algbw = size / time and
 * busbw = algbw * 2 (n - 1) / n. The baseline of busbw is each MPI's busbw:
 * bench/peers/mpi_allreduce, run under mpirun (MPICH's build,
 * mpi_allreduce_mpich, under mpiexec.mpich; each under a timeout) by this
 * command when both are present, right after mgpu's sweep on the same
 * number of ranks; without them the row carries no baseline and a line says
 * why. On host devices memory is the limit, so each size from 64 KiB also
 * gets the traffic an all-reduce cannot avoid (every device's input read
 * once and output written once: 2 n size bytes) per second, next to memcpy
 * of pre-touched buffers by n threads (one per device) counted the same way
 * (bytes read + bytes written): their ratio says how close to the memory the
 * collective runs. At 64 MiB the ring is also timed, next to the algorithm
 * chosen by default.
 *
 * Each timed repetition issues a batch of back-to-back all-reduces (one
 * thread, a group per call; as many as fit in 64 MiB of data, at most 1000)
 * and synchronizes once; the figure is the median over repetitions after a
 * warm-up. The MPI peer times its batches the same way, between barriers,
 * and takes the slowest rank's time. Buffers are allocated and touched
 * once. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cmd.h"

#define NMPI 2 /* Open MPI, MPICH: mgpu_cmd_mpi */

#define MAXDEV 4
#define MAXSIZES 16

typedef struct setup {
  int n;
  mgpu_comm *comm;
  mgpu_stream *s[MAXDEV];
  mgpu_buffer *send[MAXDEV], *recv[MAXDEV];
} setup;

static int fail(const char *what, int rc) {
  fprintf(stderr, "bench allreduce: %s: %s (%s)\n", what, mgpu_err_name(rc),
          mgpu_error_detail());
  return 1;
}

static int open_comm(setup *st, int algo) {
  int devs[MAXDEV] = {0};
  for (int i = 0; i < st->n; i++) devs[i] = i;
  mgpu_comm_config cfg = MGPU_COMM_CONFIG_INITIALIZER;
  cfg.algo = algo;
  if (algo != MGPU_COLL_ALGO_AUTO) cfg.provider = MGPU_COLL_PROVIDER_MGPU;
  return mgpu_comm_create_config(devs, st->n, &cfg, &st->comm);
}

static int batch_iters(size_t bytes, int quick) {
  size_t iters = ((size_t)64 << 20) / bytes;
  size_t cap = quick ? 20 : 1000;
  if (iters < 1) iters = 1;
  return (int)(iters > cap ? cap : iters);
}

/* Seconds per all-reduce of count floats: median of reps batches. */
static int time_allreduce(setup *st, size_t count, int reps, int quick,
                          double *secs) {
  int iters = batch_iters(count * sizeof(float), quick);
  double *t = malloc((size_t)reps * sizeof *t);
  if (t == NULL) return MGPU_ENOMEM;
  int rc = 0;
  for (int rep = -1; rep < reps && rc == 0; rep++) { /* rep -1: warm-up */
    double t0 = bench_now();
    for (int it = 0; it < iters && rc == 0; it++) {
      rc = mgpu_group_begin();
      for (int r = 0; r < st->n && rc == 0; r++)
        rc = mgpu_allreduce(st->comm, r, st->send[r], st->recv[r], count,
                            MGPU_FLOAT32, MGPU_SUM, st->s[r]);
      int erc = mgpu_group_end();
      if (rc == 0) rc = erc;
    }
    for (int r = 0; r < st->n && rc == 0; r++)
      rc = mgpu_stream_synchronize(st->s[r]);
    if (rep >= 0) t[rep] = (bench_now() - t0) / iters;
  }
  if (rc == 0) *secs = bench_median(t, reps);
  free(t);
  return rc;
}

static void size_name(size_t bytes, char *out, size_t len) {
  if (bytes >= (1u << 20))
    snprintf(out, len, "%zuMiB", bytes >> 20);
  else if (bytes >= (1u << 10))
    snprintf(out, len, "%zuKiB", bytes >> 10);
  else
    snprintf(out, len, "%zuB", bytes);
}

/* Runs MPI mpi's MPI_Allreduce on n local ranks over the sizes; secs[i]
 * gets the median seconds of size i (0 where none came back). Returns 0, or
 * -1 with why filled in. */
static int run_mpi(mgpu_cmd_mpi mpi, int n, const size_t *sizes, int nsizes,
                   int reps, int quick, double *secs, char *why,
                   size_t wlen) {
  char peer[PATH_MAX];
  for (int i = 0; i < nsizes; i++) secs[i] = 0;
  if (!mgpu_cmd_mpi_peer(mpi, "mpi_allreduce", n, peer, sizeof peer, why, wlen))
    return -1;
  char args[512];
  int len = snprintf(args, sizeof args, "--raw --reps %d%s --sizes ", reps,
                     quick ? " --quick" : "");
  for (int i = 0; i < nsizes && len < (int)sizeof args - 24; i++)
    len += snprintf(args + len, sizeof args - (size_t)len, "%s%zu",
                    i ? "," : "", sizes[i]);
  FILE *f = mgpu_cmd_mpirun(mpi, n, quick ? 60 : 900, peer, args);
  if (f == NULL) {
    snprintf(why, wlen, "cannot start its launcher");
    return -1;
  }
  size_t b;
  double t;
  int got = 0;
  while (fscanf(f, "%zu %lf", &b, &t) == 2)
    for (int i = 0; i < nsizes; i++)
      if (sizes[i] == b) {
        secs[i] = t;
        got = 1;
      }
  if (mgpu_cmd_mpi_close(f, got, why, wlen) == 0) return 0;
  /* A peer that failed (timed out, say) gives no figure, not some. */
  for (int i = 0; i < nsizes; i++) secs[i] = 0;
  return -1;
}

/* The busbw and time rows of one size (t seconds, bytes per device) next
 * to each MPI that ran it (mpi[m] seconds, 0 where it did not); with no
 * MPI, rows without a baseline. */
static void report_size(bench_report *rep, const char *name, size_t bytes,
                        double t, double factor, const double mpi[NMPI]) {
  double busbw = (double)bytes / t / 1e9 * factor;
  int any = 0;
  for (int m = 0; m < NMPI; m++) {
    if (mpi[m] <= 0) continue;
    char base[64];
    const char *who = mgpu_cmd_mpi_name((mgpu_cmd_mpi)m);
    snprintf(base, sizeof base, "%s busbw", who);
    bench_report_add(rep, name, "busbw", busbw, "GB/s", base,
                     (double)bytes / mpi[m] / 1e9 * factor);
    snprintf(base, sizeof base, "%s time", who);
    bench_report_add(rep, name, "time", t * 1e6, "us", base, mpi[m] * 1e6);
    any = 1;
  }
  if (!any) {
    bench_report_add(rep, name, "busbw", busbw, "GB/s", NULL, 0);
    bench_report_add(rep, name, "time", t * 1e6, "us", NULL, 0);
  }
}

static int sweep(int n, const size_t *sizes, int nsizes, const bench_opts *o,
                 bench_report *rep) {
  setup st;
  memset(&st, 0, sizeof st);
  st.n = n;
  size_t max = sizes[nsizes - 1];
  int rc = open_comm(&st, MGPU_COLL_ALGO_AUTO);
  if (rc != 0) return fail("comm", rc);
  for (int r = 0; r < n && rc == 0; r++) {
    rc = mgpu_stream_create(&st.s[r], r);
    if (rc == 0) rc = mgpu_malloc(&st.send[r], r, max);
    if (rc == 0) rc = mgpu_malloc(&st.recv[r], r, max);
    /* Touch every page once, outside the timing. */
    if (rc == 0) rc = mgpu_memset_async(st.send[r], 0, 0, max, st.s[r]);
    if (rc == 0) rc = mgpu_memset_async(st.recv[r], 0, 0, max, st.s[r]);
  }
  for (int r = 0; r < n && rc == 0; r++) rc = mgpu_stream_synchronize(st.s[r]);
  if (rc != 0) return fail("buffers of the largest size", rc);

  double t[MAXSIZES], tring = 0;
  for (int i = 0; i < nsizes && rc == 0; i++) {
    rc = time_allreduce(&st, sizes[i] / sizeof(float), o->reps, o->quick,
                        &t[i]);
    if (rc == 0 && sizes[i] == (64u << 20) && n > 1) {
      setup ring = st;
      if (open_comm(&ring, MGPU_COLL_ALGO_RING) == 0) {
        rc = time_allreduce(&ring, sizes[i] / sizeof(float), o->reps,
                            o->quick, &tring);
        mgpu_comm_destroy(ring.comm);
      }
    }
  }
  for (int r = 0; r < n; r++) {
    mgpu_free(st.send[r]);
    mgpu_free(st.recv[r]);
    mgpu_stream_destroy(st.s[r]);
  }
  mgpu_comm_destroy(st.comm);
  if (rc != 0) return fail("allreduce", rc);

  /* Each MPI on as many ranks, the same sizes, now. */
  double mpi[NMPI][MAXSIZES];
  for (int m = 0; m < NMPI; m++) {
    char why[PATH_MAX + 128] = "";
    if (run_mpi((mgpu_cmd_mpi)m, n, sizes, nsizes, o->reps, o->quick, mpi[m],
                why, sizeof why) != 0)
      fprintf(stderr, "bench allreduce: no %s baseline on %d ranks: %s\n",
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), n, why);
  }

  double dn = n, factor = n > 1 ? 2.0 * (dn - 1) / dn : 1.0;
  for (int i = 0; i < nsizes; i++) {
    size_t bytes = sizes[i];
    char name[96], sz[32];
    size_name(bytes, sz, sizeof sz);
    double algbw = (double)bytes / t[i] / 1e9;
    snprintf(name, sizeof name, "allreduce %s, %d dev", sz, n);
    report_size(rep, name, bytes, t[i], factor,
                (const double[NMPI]){mpi[0][i], mpi[1][i]});
    if (bytes >= (64u << 10)) {
      int iters = batch_iters(bytes, o->quick);
      double memcpy_rw =
          2.0 * bench_memcpy_gbps(bytes, n, iters < 50 ? iters : 50, o->reps);
      snprintf(name, sizeof name, "allreduce %s, %d dev, traffic", sz, n);
      bench_report_add(rep, name, "bandwidth", 2.0 * dn * (double)bytes / t[i] / 1e9,
                       "GB/s", "memcpy read+write", memcpy_rw);
    }
    if (bytes == (64u << 20) && tring > 0) {
      snprintf(name, sizeof name, "allreduce %s, %d dev, ring", sz, n);
      bench_report_add(rep, name, "busbw", (double)bytes / tring / 1e9 * factor,
                       "GB/s", "default algorithm", algbw * factor);
    }
  }
  return 0;
}

/* Parses a comma-separated list of sizes ("8,128K,4M") or device counts
 * ("2,4") into out; returns how many, or -1 on a bad item. */
static int parse_list(const char *s, int sizes, size_t *out, int max) {
  int k = 0;
  char item[32];
  while (*s != '\0') {
    size_t len = strcspn(s, ",");
    if (len == 0 || len >= sizeof item || k == max) return -1;
    memcpy(item, s, len);
    item[len] = '\0';
    size_t v = bench_parse_size(item);
    if (v == 0 || (sizes && v % sizeof(float) != 0) ||
        (!sizes && (v > MAXDEV || item[len - 1] < '0' || item[len - 1] > '9')))
      return -1;
    out[k++] = v;
    s += len + (s[len] == ',');
  }
  return k;
}

int mgpu_bench_allreduce(int argc, char **argv) {
  static const char usage[] =
      "mgpu bench allreduce [--json] [--quick] [--reps N] [--sizes B,B,...] "
      "[--devices N,N]\n"
      "  --sizes    bytes per device, multiples of 4 (K, M, G suffixes); "
      "default 8 B to 256 MiB\n"
      "             in powers of 4 and 256 MiB (--quick: 8, 4K, 64K, 1M)\n"
      "  --devices  device counts to sweep; default 2,4 (those open)";
  bench_opts o;
  char *args[16];
  int nrest, nargs = 0;
  size_t sizes[MAXSIZES], given_devs[2];
  int nsizes = 0, ngiven_devs = 0;
  for (int i = 0; i < argc; i++) {
    int sz = strcmp(argv[i], "--sizes") == 0;
    if ((sz || strcmp(argv[i], "--devices") == 0) && i + 1 < argc) {
      int k = sz ? parse_list(argv[++i], 1, sizes, MAXSIZES)
                 : parse_list(argv[++i], 0, given_devs, 2);
      if (k <= 0) {
        fprintf(stderr, "bad list '%s'\nusage: %s\n", argv[i], usage);
        return 2;
      }
      if (sz) nsizes = k;
      else ngiven_devs = k;
    } else if (nargs < 16) {
      args[nargs++] = argv[i];
    } else {
      fprintf(stderr, "unexpected argument %s\nusage: %s\n", argv[i], usage);
      return 2;
    }
  }
  if (bench_parse(nargs, args, usage, &o, NULL, 0, &nrest) != 0) return 2;
  int ndev = mgpu_device_count();
  if (ndev < 1) return fail("devices", ndev < 0 ? ndev : MGPU_ENODEV);
  if (nsizes > 0) {
    /* Ascending: the buffers are sized for the last. */
    for (int i = 1; i < nsizes; i++)
      for (int j = i; j > 0 && sizes[j - 1] > sizes[j]; j--) {
        size_t t = sizes[j];
        sizes[j] = sizes[j - 1];
        sizes[j - 1] = t;
      }
  } else if (o.quick) {
    static const size_t quick[] = {8, 4u << 10, 64u << 10, 1u << 20};
    for (int i = 0; i < 4; i++) sizes[nsizes++] = quick[i];
  } else {
    for (size_t b = 8; b <= (256u << 20); b *= 4) sizes[nsizes++] = b;
    sizes[nsizes++] = 256u << 20;
  }
  bench_report *rep = bench_report_new("allreduce");
  int counts[2] = {2, 4}, ncounts = 0;
  if (ngiven_devs > 0) {
    for (int k = 0; k < ngiven_devs; k++)
      if ((int)given_devs[k] <= ndev) counts[ncounts++] = (int)given_devs[k];
  } else {
    for (int k = 0; k < 2; k++)
      if (counts[k] <= ndev) counts[ncounts++] = counts[k];
  }
  if (ncounts == 0) counts[ncounts++] = ndev; /* one device: itself */
  for (int k = 0; k < ncounts; k++)
    if (sweep(counts[k], sizes, nsizes, &o, rep) != 0) {
      bench_report_finish(rep, o.json);
      return 1;
    }
  bench_report_finish(rep, o.json);
  return 0;
}
