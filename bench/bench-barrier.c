/* mgpu bench barrier: a host barrier (mgpu_barrier_wait) of 2 and 4
 * parties (as many devices as are open, at most 4), one thread per rank,
 * next to what the same threads or processes would otherwise use, measured
 * in the same run:
 *  - pthread_barrier_wait among as many threads;
 *  - MPI_Barrier among as many local ranks (bench/peers/mpi_barrier
 *    --raw, run by this command under a timeout right after mgpu's figure,
 *    as bench allreduce runs its peer): Open MPI's under mpirun and, where
 *    mpicc.mpich was found at configure time, MPICH's (mpi_barrier_mpich)
 *    under mpiexec.mpich; without them the row has no such baseline and a
 *    line on stderr says why).
 * Each repetition times a batch of back-to-back barriers on every thread;
 * the figure is rank 0's time per barrier, median of --reps repetitions
 * after a warm-up, in microseconds. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "cmd.h"


#define MAXRANKS 4

/* The threads of one timed barrier: mgpu's (barrier) or pthread's. */
typedef struct party {
  mgpu_barrier *barrier;  /* NULL: pthread's */
  pthread_barrier_t pbar;
  long rounds;            /* barriers per thread, warm-up included */
  int rc;                 /* the first failure of a thread other than 0 */
} party;

typedef struct rank_arg {
  party *p;
  int rank;
} rank_arg;

static int one_wait(party *p, int rank) {
  if (p->barrier != NULL) return mgpu_barrier_wait(p->barrier, rank, 10000);
  int rc = pthread_barrier_wait(&p->pbar);
  return rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD ? 0 : MGPU_EINVAL;
}

static void *rank_thread(void *a) {
  rank_arg *ra = a;
  for (long i = 0; i < ra->p->rounds; i++) {
    int rc = one_wait(ra->p, ra->rank);
    if (rc != 0) {
      ra->p->rc = rc;
      break;
    }
  }
  return NULL;
}

/* Median microseconds per barrier of n threads (mgpu's with mgpu != 0,
 * else pthread's): reps batches of iters after a warm-up batch. */
static int barrier_us(int n, int mgpu, int iters, int reps, double *out) {
  party p = {NULL, .rounds = (long)iters * (reps + 1), .rc = 0};
  int devs[MAXRANKS] = {0, 1, 2, 3};
  int rc = mgpu ? mgpu_barrier_create(devs, n, &p.barrier)
                : pthread_barrier_init(&p.pbar, NULL, (unsigned)n) == 0
                      ? 0 : MGPU_ENOMEM;
  if (rc != 0) return rc;
  double *v = malloc((size_t)reps * sizeof *v);
  pthread_t t[MAXRANKS];
  rank_arg args[MAXRANKS];
  int started = 1;
  for (int r = 1; r < n; r++) {
    args[r] = (rank_arg){&p, r};
    if (pthread_create(&t[r], NULL, rank_thread, &args[r]) != 0) {
      fprintf(stderr, "bench barrier: cannot start thread %d\n", r);
      exit(1); /* the started ones wait at the barrier for ever */
    }
    started = r + 1;
  }
  for (int rep = -1; rc == 0 && rep < reps; rep++) { /* -1: warm-up */
    double t0 = bench_now();
    for (int i = 0; rc == 0 && i < iters; i++) rc = one_wait(&p, 0);
    if (rep >= 0 && v != NULL) v[rep] = (bench_now() - t0) / iters * 1e6;
  }
  /* A failure on rank 0 leaves the others waiting: destroying ends them. */
  if (rc != 0 && p.barrier != NULL) mgpu_barrier_destroy(p.barrier);
  for (int r = 1; r < started; r++) pthread_join(t[r], NULL);
  if (rc == 0 && p.rc != 0) rc = p.rc;
  if (rc == 0 && v != NULL) *out = bench_median(v, reps);
  if (rc == 0 && p.barrier != NULL) mgpu_barrier_destroy(p.barrier);
  if (!mgpu) pthread_barrier_destroy(&p.pbar);
  free(v);
  return v == NULL && rc == 0 ? MGPU_ENOMEM : rc;
}

/* MPI_Barrier on n local ranks (the peer of MPI mpi under its launcher):
 * seconds per barrier in *secs. 0, or -1 with why filled in. */
static int run_mpi(mgpu_cmd_mpi mpi, int n, int iters, int reps,
                   double *secs, char *why, size_t wlen) {
  char peer[PATH_MAX];
  *secs = 0;
  if (!mgpu_cmd_mpi_peer(mpi, "mpi_barrier", n, peer, sizeof peer, why, wlen))
    return -1;
  char args[128];
  snprintf(args, sizeof args, "--raw --reps %d --iters %d", reps, iters);
  FILE *f = mgpu_cmd_mpirun(mpi, n, 120, peer, args);
  if (f == NULL) {
    snprintf(why, wlen, "cannot start its launcher");
    return -1;
  }
  int ranks;
  double t;
  while (fscanf(f, "%d %lf", &ranks, &t) == 2)
    if (ranks == n) *secs = t;
  if (mgpu_cmd_mpi_close(f, *secs > 0, why, wlen) == 0) return 0;
  *secs = 0;
  return -1;
}

/* The rows of each MPI's MPI_Barrier on n ranks next to mgpu's figure
 * (mine); a line on stderr for an MPI whose peer did not run. */
static void report_mpi(bench_report *r, const char *name, int n, int iters,
                       int reps, double mine) {
  for (int m = MGPU_CMD_OPEN_MPI; m <= MGPU_CMD_MPICH; m++) {
    char why[PATH_MAX + 128] = "", base[64];
    double mpi = 0;
    if (run_mpi((mgpu_cmd_mpi)m, n, iters, reps, &mpi, why, sizeof why) != 0) {
      fprintf(stderr, "bench barrier: no %s baseline on %d ranks: %s\n",
              mgpu_cmd_mpi_name((mgpu_cmd_mpi)m), n, why);
      continue;
    }
    snprintf(base, sizeof base, "%s MPI_Barrier",
             mgpu_cmd_mpi_name((mgpu_cmd_mpi)m));
    bench_report_add(r, name, "latency", mine, "us", base, mpi * 1e6);
  }
}

int mgpu_bench_barrier(int argc, char **argv) {
  static const char usage[] = "mgpu bench barrier [--json] [--quick] "
                              "[--reps N]";
  bench_opts o;
  int nrest = 0;
  int rc = bench_parse(argc, argv, usage, &o, NULL, 0, &nrest);
  if (rc != 0) return rc;
  int iters = o.quick ? 2000 : 20000;
  int ndev = mgpu_device_count();
  bench_report *r = bench_report_new("barrier");
  for (int n = 2; n <= MAXRANKS && n <= ndev; n *= 2) {
    double mine = 0, pth = 0;
    rc = barrier_us(n, 1, iters, o.reps, &mine);
    if (rc == 0) rc = barrier_us(n, 0, iters, o.reps, &pth);
    if (rc != 0) {
      fprintf(stderr, "bench barrier: %s: %s\n", mgpu_err_name(rc),
              mgpu_error_detail());
      bench_report_finish(r, o.json);
      return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "host barrier, %d parties", n);
    bench_report_add(r, name, "latency", mine, "us", "pthread_barrier_wait",
                     pth);
    report_mpi(r, name, n, iters, o.reps, mine);
  }
  if (ndev < 2)
    fprintf(stderr, "bench barrier: one device open: a barrier of one party "
            "is not measured\n");
  bench_report_finish(r, o.json);
  return 0;
}
