/* Collectives over the ranks of an MPI communicator, on mgpu buffers.
 *
 * Each call first checks its own arguments, then every rank's arguments are
 * compared (check_all: each rank sends its call's description to every
 * other, non-blocking, under the deadline), and only then does data move:
 * a bad buffer on one rank, a mismatch, or a rank that never comes fails the
 * call on every rank that is there, never hangs it. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/mpi-internal.h"

enum { C_BCAST = 1, C_REDUCE, C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER,
       C_SCATTER, C_GATHER };
static const char *kind_name[] = {"collective", "bcast", "reduce", "allreduce",
                                  "reduce_scatter", "allgather", "scatter",
                                  "gather"};

/* What every rank must agree on, and this rank's own verdict. V_CHUNK is
 * MGPU_MPI_CHUNK: it shapes the staged pipeline (every rank must cut the
 * data into the same MPI calls of the same sizes), so ranks started with
 * different values fail every call rather than overrun a bounce buffer. */
enum { V_KIND, V_COUNT, V_DTYPE, V_OP, V_ROOT, V_STATUS, V_PATH, V_CHUNK,
       V_DEV, V_LEN };
/* V_DEV: with a V_STATUS of MGPU_EDEVLOST, the rank's device that was lost
 * (-1 otherwise). */

/* exchange's deadline passed: the requests left are cancelled and freed
 * (MPI may still use their buffers), the module fails, and the ranks not
 * heard from are named. */
static int exchange_timed_out(int n, int me, const long long *mine,
                              MPI_Request *reqs) {
  char missing[256];
  size_t len = 0;
  missing[0] = '\0';
  for (int r = 0; r < n; r++) {
    if (r == me || reqs[r] == MPI_REQUEST_NULL) continue;
    int got = 0;
    MPI_Test(&reqs[r], &got, MPI_STATUS_IGNORE);
    if (got) continue;
    if (len < sizeof missing)
      len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                              len ? ", " : "", r);
    MPI_Cancel(&reqs[r]);
    MPI_Request_free(&reqs[r]);
  }
  for (int r = n; r < 2 * n; r++)
    if (reqs[r] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[r]);
  mgpu__mpi.failed = 1;
  snprintf(mgpu__mpi.failed_detail, sizeof mgpu__mpi.failed_detail,
           "the argument check of %s did not complete within %d ms; "
           "rank(s) that did not come: %s", kind_name[mine[V_KIND]],
           mgpu__mpi.timeout_ms, missing);
  return mgpu__error(MGPU_ETIMEDOUT, "rank %d: %s: rank(s) %s did not "
                     "arrive within %d ms; the module takes no further "
                     "calls (the program should call MPI_Abort)",
                     mgpu__mpi.rank, kind_name[mine[V_KIND]], missing,
                     mgpu__mpi.timeout_ms);
}

/* Sends mine to every other rank of comm and receives theirs into all,
 * waiting no longer than the deadline; a rank that never comes is named.
 * At the deadline the requests left are cancelled and freed, but MPI may
 * still read mine and write all (a send is delivered, a cancel may fail):
 * *kept becomes 1 and the caller must not free them; and the module takes
 * no further calls, since the ranks that were late would pair this call
 * with the next ones of the others (wrong results returned as success). */
static int exchange(MPI_Comm comm, int n, int me, const long long *mine,
                    long long *all, MPI_Request *reqs, int *kept) {
  int rc = 0;
  for (int r = 0; r < n && rc == 0; r++) {
    if (r == me) continue;
    int m = MPI_Irecv(all + (size_t)r * V_LEN, V_LEN, MPI_LONG_LONG, r,
                      MPI_TAG_CHECK, comm, &reqs[r]);
    if (m == MPI_SUCCESS)
      m = MPI_Isend(mine, V_LEN, MPI_LONG_LONG, r, MPI_TAG_CHECK, comm,
                    &reqs[n + r]);
    if (m != MPI_SUCCESS) rc = mgpu__mpi_err(m, "MPI_Isend");
  }
  if (rc != 0) { /* nothing may write into all once the caller frees it */
    for (int r = 0; r < 2 * n; r++) {
      if (reqs[r] == MPI_REQUEST_NULL) continue;
      if (r < n) MPI_Cancel(&reqs[r]);
      MPI_Request_free(&reqs[r]);
    }
    return rc;
  }
  double deadline = mgpu__mpi_deadline();
  int pending = 1;
  while (rc == 0 && pending) {
    int done = 0;
    int m = mgpu__mpi_test_all(2 * n, reqs, &done);
    if (m != MPI_SUCCESS) {
      rc = mgpu__mpi_err(m, "MPI_Testall");
      break;
    }
    if (done) {
      pending = 0;
      break;
    }
    if (MPI_Wtime() > deadline) break;
    sched_yield();
  }
  if (rc == 0 && pending) {
    *kept = 1;
    rc = exchange_timed_out(n, me, mine, reqs);
  }
  return rc;
}

/* The exchange of a rank without memory for exchange's arrays (an
 * allocation failed): it still takes part, one peer at a time, sending mine
 * (its failure in V_STATUS) and dropping what each peer sends, so that the
 * others learn of its failure instead of waiting for it. */
static void exchange_one_by_one(MPI_Comm comm, int n, int me,
                                const long long *mine) {
  /* The send buffer outlives a send left with MPI at the deadline. */
  static long long note[V_LEN];
  memcpy(note, mine, sizeof note);
  double deadline = mgpu__mpi_deadline();
  for (int r = 0; r < n; r++) {
    if (r == me) continue;
    long long theirs[V_LEN];
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int m = MPI_Irecv(theirs, V_LEN, MPI_LONG_LONG, r, MPI_TAG_CHECK, comm,
                      &reqs[0]);
    if (m == MPI_SUCCESS)
      m = MPI_Isend(note, V_LEN, MPI_LONG_LONG, r, MPI_TAG_CHECK, comm,
                    &reqs[1]);
    int done = 0;
    while (m == MPI_SUCCESS &&
           (m = mgpu__mpi_test_all(2, reqs, &done)) == MPI_SUCCESS && !done &&
           MPI_Wtime() <= deadline)
      sched_yield();
    if (done) continue;
    /* Nothing may write into theirs once this returns. */
    if (reqs[0] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[0]);
    for (int i = 0; i < 2; i++)
      if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
    return;
  }
}

/* The first rank whose verdict, call description or MGPU_MPI_CHUNK
 * differs from mine, as an error naming it; 0 when every rank agrees. */
static int compare(int n, const long long *mine, const long long *all) {
  int rc = 0;
  for (int r = 0; rc == 0 && r < n; r++) {
    const long long *v = all + (size_t)r * V_LEN;
    if (v[V_STATUS] == MGPU_EDEVLOST && v[V_DEV] >= 0)
      rc = mgpu__error(MGPU_EDEVLOST, "rank %d: %s: rank %d lost its "
                       "device %lld (MGPU_EDEVLOST); no data moved",
                       mgpu__mpi.rank, kind_name[mine[V_KIND]], r,
                       v[V_DEV]);
    else if (v[V_STATUS] != 0)
      rc = mgpu__error((int)v[V_STATUS], "rank %d: %s: rank %d refused "
                       "its arguments or could not start (%s); no data "
                       "moved",
                       mgpu__mpi.rank, kind_name[mine[V_KIND]], r,
                       mgpu_err_name((int)v[V_STATUS]));
  }
  for (int r = 0; rc == 0 && r < n; r++) {
    const long long *v = all + (size_t)r * V_LEN;
    if (memcmp(v, mine, V_STATUS * sizeof *v) == 0) continue;
    if (v[V_KIND] != mine[V_KIND])
      rc = mgpu__error(MGPU_EMISMATCH, "rank %d: called %s while rank "
                       "%d called %s", mgpu__mpi.rank,
                       kind_name[mine[V_KIND]], r,
                       v[V_KIND] > 0 && v[V_KIND] <= C_GATHER
                                 ? kind_name[v[V_KIND]] : "?");
    else if (mine[V_OP] >= 0) /* a reduction */
      rc = mgpu__error(
          MGPU_EMISMATCH, "rank %d: %s: count %lld, dtype %s, op %s, root "
          "%lld here but count %lld, dtype %s, op %s, root %lld on rank %d",
          mgpu__mpi.rank, kind_name[mine[V_KIND]], mine[V_COUNT],
          mgpu__mpi_dtype_name((mgpu_dtype)mine[V_DTYPE]),
          mgpu_op_name((mgpu_op)mine[V_OP]), mine[V_ROOT], v[V_COUNT],
          mgpu__mpi_dtype_name((mgpu_dtype)v[V_DTYPE]),
          mgpu_op_name((mgpu_op)v[V_OP]), v[V_ROOT], r);
    else
      rc = mgpu__error(
          MGPU_EMISMATCH, "rank %d: %s: count %lld, dtype %s, root %lld here "
          "but count %lld, dtype %s, root %lld on rank %d", mgpu__mpi.rank,
          kind_name[mine[V_KIND]], mine[V_COUNT],
          mgpu__mpi_dtype_name((mgpu_dtype)mine[V_DTYPE]), mine[V_ROOT],
          v[V_COUNT], mgpu__mpi_dtype_name((mgpu_dtype)v[V_DTYPE]),
          v[V_ROOT], r);
  }
  for (int r = 0; rc == 0 && r < n; r++) {
    const long long *v = all + (size_t)r * V_LEN;
    if (v[V_CHUNK] != mine[V_CHUNK])
      rc = mgpu__error(
          MGPU_EMISMATCH, "rank %d: %s: MGPU_MPI_CHUNK=%lld here but %lld on "
          "rank %d: every rank must be started with the same value; no data "
          "moved", mgpu__mpi.rank, kind_name[mine[V_KIND]], mine[V_CHUNK],
          v[V_CHUNK], r);
  }
  return rc;
}

/* Compares the V_LEN values of every rank of comm; *path becomes the
 * widest path any rank needs (ranks must cut the data into the same MPI
 * calls: if one stages, all do). */
static int check_all(MPI_Comm comm, const long long *mine, int local_rc,
                     int *path) {
  int n, me;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  *path = (int)mine[V_PATH];
  if (n == 1) return local_rc;
  mgpu__mpi.exchanges++;
  /* The local detail is kept: a refused rank reports its own reason. */
  char local_detail[512];
  snprintf(local_detail, sizeof local_detail, "%s", mgpu_error_detail());
  /* all holds every rank's values, then (at V_LEN * n) mine as sent: both
   * outlive the call when MPI keeps them (exchange's kept). */
  long long *all = mgpu_module_calloc((size_t)(n + 1) * V_LEN, sizeof *all);
  MPI_Request *reqs = mgpu_module_calloc((size_t)n * 2, sizeof *reqs);
  if (all == NULL || reqs == NULL) {
    mgpu_module_free(all);
    mgpu_module_free(reqs);
    long long v[V_LEN];
    memcpy(v, mine, sizeof v);
    if (local_rc == 0) v[V_STATUS] = MGPU_ENOMEM;
    exchange_one_by_one(comm, n, me, v);
    if (local_rc != 0) return mgpu__error(local_rc, "%s", local_detail);
    return mgpu__error(MGPU_ENOMEM, "rank %d: %s: no memory for the "
                       "argument check", mgpu__mpi.rank,
                       kind_name[mine[V_KIND]]);
  }
  for (int r = 0; r < 2 * n; r++) reqs[r] = MPI_REQUEST_NULL;
  memcpy(all + (size_t)me * V_LEN, mine, V_LEN * sizeof *all);
  long long *sent = all + (size_t)n * V_LEN;
  memcpy(sent, mine, V_LEN * sizeof *all);
  int kept = 0;
  int rc = exchange(comm, n, me, sent, all, reqs, &kept);
  if (rc == 0 && local_rc != 0) {
    rc = local_rc;
    mgpu__error(local_rc, "%s", local_detail);
  }
  if (rc == 0) rc = compare(n, mine, all);
  for (int r = 0; rc == 0 && r < n; r++)
    if (all[(size_t)r * V_LEN + V_PATH] > *path)
      *path = (int)all[(size_t)r * V_LEN + V_PATH];
  if (!kept) mgpu_module_free(all);
  else mgpu__mpi_keep(all); /* MPI may still use it */
  mgpu_module_free(reqs);
  return rc;
}

int mgpu__mpi_refuse(MPI_Comm comm, int code, int dev) {
  long long v[V_LEN] = {0, 0, 0, -1, 0, code, 0, (long long)mgpu__mpi.chunk,
                        code == MGPU_EDEVLOST ? dev : -1};
  int path;
  return check_all(comm, v, code, &path);
}

/* ---- the MPI step of each collective ---- */

typedef struct coll_ctx {
  int kind, root, me, n;
  MPI_Comm comm;
  MPI_Datatype type;
  MPI_Op op;
  size_t esize;
} coll_ctx;

/* One MPI call of the data phase, non-blocking and waited for against the
 * deadline, so that a rank that dies or leaves mid-call cannot hold the
 * others forever. */
static int mpi_step(void *arg, void *in, void *out, size_t c, int in_place) {
  coll_ctx *x = arg;
  if (c > INT_MAX)
    return mgpu__error(MGPU_ENOTSUP, "rank %d: %zu elements in one MPI "
                       "call", x->me, c);
  int n = (int)c, m = MPI_SUCCESS;
  MPI_Request req = MPI_REQUEST_NULL;
  const char *call = "";
  switch (x->kind) {
    case C_BCAST:
      call = "MPI_Ibcast";
      m = MPI_Ibcast(x->me == x->root ? in : out, n, x->type, x->root,
                     x->comm, &req);
      break;
    case C_REDUCE:
      call = "MPI_Ireduce";
      m = MPI_Ireduce(in_place && x->me == x->root ? MPI_IN_PLACE : in, out,
                      n, x->type, x->op, x->root, x->comm, &req);
      break;
    case C_ALLREDUCE:
      call = "MPI_Iallreduce";
      m = MPI_Iallreduce(in_place ? MPI_IN_PLACE : in, out, n, x->type, x->op,
                         x->comm, &req);
      break;
    case C_REDUCE_SCATTER:
      call = "MPI_Ireduce_scatter_block";
      m = MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : in, out, n,
                                    x->type, x->op, x->comm, &req);
      break;
    case C_ALLGATHER:
      call = "MPI_Iallgather";
      m = MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, x->type, out, n,
                         x->type, x->comm, &req);
      break;
    case C_SCATTER:
      call = "MPI_Iscatter";
      m = MPI_Iscatter(in, n, x->type,
                       in_place && x->me == x->root ? MPI_IN_PLACE : out, n,
                       x->type, x->root, x->comm, &req);
      break;
    case C_GATHER:
      call = "MPI_Igather";
      m = MPI_Igather(in_place && x->me == x->root ? MPI_IN_PLACE : in, n,
                      x->type, out, n, x->type, x->root, x->comm, &req);
      break;
  }
  if (m != MPI_SUCCESS) return mgpu__mpi_err(m, call);
  char what[96];
  snprintf(what, sizeof what, "%s: %s of %d elements", kind_name[x->kind],
           call, n);
  int rc = mgpu__mpi_wait_coll(&req, x->comm, what);
  /* In place, MPI leaves the result at the start; mgpu's convention is
   * element r * count. */
  if (rc == 0 && x->kind == C_REDUCE_SCATTER && in_place && x->me != 0)
    memmove((unsigned char *)out + (size_t)x->me * c * x->esize, out,
            c * x->esize);
  return rc;
}

/* One collective: local checks, the collective check, the plan. */
typedef struct coll_args {
  int kind;
  const mgpu_buffer *send;
  size_t send_off;
  mgpu_buffer *recv;
  size_t recv_off;
  size_t count;
  mgpu_dtype dtype;
  mgpu_op op;
  int has_op, root;
  MPI_Comm comm;
  mgpu_stream *stream;
} coll_args;

/* Staged, "in place" only says where the input sits and where the output
 * goes: the bounce buffers are never one. */
static void staged_in_place(const coll_args *a, int me, mpi_plan *pl) {
  if (!pl->in_place) return;
  size_t one = a->count * pl->esize;
  if (a->kind == C_ALLGATHER || a->kind == C_GATHER) {
    pl->n_in = 1;
    pl->in_off = a->recv_off + (size_t)me * one;
  }
  if (a->kind == C_REDUCE_SCATTER)
    pl->out_off = a->recv_off + (size_t)me * one;
  if (a->kind == C_SCATTER) pl->n_out = 0; /* root's piece stays */
  pl->in_place = 0;
}

/* What a collective asks of this rank's two buffers: the bytes each side
 * needs, whether it uses it at all, and whether send and recv are one. */
typedef struct coll_sides {
  size_t one, all; /* bytes of one rank's piece, and of every rank's */
  size_t send_need, recv_need;
  int use_send, use_recv, in_place;
} coll_sides;

static void sides_of(const coll_args *a, int is_root, int n, size_t es,
                     coll_sides *sd) {
  sd->one = a->count * es;
  sd->all = sd->one * (size_t)n;
  sd->send_need = sd->recv_need = sd->one;
  sd->use_send = sd->use_recv = 1;
  switch (a->kind) {
    case C_BCAST: sd->use_send = 0; break; /* one buffer, given as recv */
    case C_REDUCE: sd->use_recv = is_root; break;
    case C_ALLREDUCE: break;
    case C_REDUCE_SCATTER: sd->send_need = sd->all; break;
    case C_ALLGATHER: sd->recv_need = sd->all; break;
    case C_SCATTER: sd->send_need = sd->all; sd->use_send = is_root; break;
    case C_GATHER: sd->recv_need = sd->all; sd->use_recv = is_root; break;
  }
  sd->in_place = sd->use_send && sd->use_recv && a->send == a->recv &&
                 a->send_off == a->recv_off;
  /* In place, the one buffer must hold the larger of the two. */
  if (sd->in_place && sd->send_need < sd->recv_need)
    sd->send_need = sd->recv_need;
}

/* Checks the buffers the call uses, resolving each once into sv and rv,
 * and chooses the path of the data. */
static int check_sides(const coll_args *a, int me, const coll_sides *sd,
                       mgpu_buffer_view *sv, mgpu_buffer_view *rv,
                       int *path) {
  int spath = MPI_PATH_HOST, rpath = MPI_PATH_HOST, rc;
  memset(sv, 0, sizeof *sv);
  memset(rv, 0, sizeof *rv);
  if (sd->use_send &&
      (rc = mgpu__mpi_check_buffer("send", a->send, a->send_off,
                                   sd->send_need, a->stream, sv, &spath)))
    return rc;
  if (sd->use_recv && (rc = mgpu__mpi_check_buffer(
                           a->kind == C_BCAST ? "broadcast" : "recv", a->recv,
                           a->recv_off, sd->recv_need, a->stream, rv, &rpath)))
    return rc;
  if (sd->use_send && sd->use_recv && sv->device != rv->device)
    return mgpu__error(MGPU_EWRONGDEV, "rank %d: %s: send buffer on "
                       "device %d, recv buffer on device %d: both must be "
                       "on one device", me, kind_name[a->kind], sv->device,
                       rv->device);
  *path = spath > rpath ? spath : rpath;
  /* The module's own operators (half precision; narrow integers' sums and
   * products under Open MPI, init.c) run on the host: not on device
   * memory. */
  if (*path == MPI_PATH_DIRECT && a->has_op &&
      mgpu__mpi_op_on_host(a->dtype, a->op))
    *path = MPI_PATH_STAGED;
  return 0;
}

/* The plan of the data movement from the checked sides. */
static void plan_of(const coll_args *a, int me, int n, size_t es,
                    const coll_sides *sd, const mgpu_buffer_view *sv,
                    const mgpu_buffer_view *rv, int path, mpi_plan *pl) {
  memset(pl, 0, sizeof *pl);
  pl->path = path;
  pl->esize = es;
  pl->count = a->count;
  pl->in_place = sd->in_place;
  pl->dev = sd->use_send ? sv->device : rv->device;
  if (sd->use_send) {
    pl->in = *sv;
    pl->in_off = a->send_off;
    pl->in_stride = sd->one;
    pl->n_in = sd->send_need == sd->all && n > 1 ? n : 1;
  }
  if (sd->use_recv) {
    pl->out = *rv;
    pl->out_off = a->recv_off;
    pl->out_stride = sd->one;
    pl->n_out = sd->recv_need == sd->all && n > 1 ? n : 1;
  }
  pl->nranks = n;
  pl->splittable = a->kind == C_ALLREDUCE || a->kind == C_REDUCE ||
                   a->kind == C_BCAST;
  if (a->kind == C_BCAST) {
    /* The broadcast buffer is read on the root and written elsewhere. */
    if (me == a->root) {
      pl->in = *rv;
      pl->in_off = a->recv_off;
      pl->n_in = 1;
      pl->n_out = 0;
      pl->in_stride = sd->one;
    } else {
      pl->n_in = 0;
    }
  }
  if (path == MPI_PATH_STAGED) staged_in_place(a, me, pl);
}

static int local_check(const coll_args *a, int me, int n, mpi_plan *pl,
                       coll_ctx *x) {
  const char *name = kind_name[a->kind];
  int rc = mgpu__mpi_type(a->dtype, &x->type);
  if (rc != 0) return rc;
  if (a->has_op && (rc = mgpu__mpi_op(a->dtype, a->op, &x->op)) != 0)
    return rc;
  size_t es = mgpu__mpi_dtype_size(a->dtype);
  if (a->count > (SIZE_MAX / es) / (size_t)n)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: count %zu overflows", me,
                       name, a->count);
  if (a->kind != C_ALLREDUCE && a->kind != C_REDUCE_SCATTER &&
      a->kind != C_ALLGATHER && (a->root < 0 || a->root >= n))
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: root %d outside 0..%d", me,
                       name, a->root, n - 1);
  coll_sides sd;
  mgpu_buffer_view sv, rv;
  int path = MPI_PATH_HOST;
  sides_of(a, me == a->root, n, es, &sd);
  if ((rc = check_sides(a, me, &sd, &sv, &rv, &path)) != 0) return rc;
  plan_of(a, me, n, es, &sd, &sv, &rv, path, pl);
  x->kind = a->kind;
  x->root = a->root;
  x->me = me;
  x->n = n;
  x->comm = a->comm;
  x->esize = es;
  pl->fn = mpi_step;
  pl->ctx = x;
  return 0;
}

/* After a staged call: every rank learns whether a copy through the
 * bounce buffers failed on some rank (its data went out as whatever the
 * bounce buffer held), so that no rank returns success with a result that
 * is not one. */
static int agree_after(const coll_args *a, int me, int local) {
  int mine[2] = {local, me}, worst[2] = {0, 0};
  MPI_Request req = MPI_REQUEST_NULL;
  int m = MPI_Iallreduce(mine, worst, 1, MPI_2INT, MPI_MINLOC, a->comm, &req);
  if (m != MPI_SUCCESS) return local != 0 ? local : mgpu__mpi_err(m, "MPI_Iallreduce");
  char what[64];
  snprintf(what, sizeof what, "%s: the closing status exchange",
           kind_name[a->kind]);
  int rc = mgpu__mpi_wait_coll(&req, a->comm, what);
  if (local != 0) return local; /* the rank's own code and detail */
  if (rc != 0) return rc;
  if (worst[0] == 0) return 0;
  return mgpu__error(worst[0], "rank %d: %s: rank %d failed while the "
                     "data moved (%s): the outputs are undefined",
                     mgpu__mpi.rank, kind_name[a->kind], worst[1],
                     mgpu_err_name(worst[0]));
}

static int coll_run(const coll_args *a) {
  int rc = mgpu__mpi_usable(kind_name[a->kind]);
  if (rc != 0) return rc;
  int me, n;
  if (MPI_Comm_rank(a->comm, &me) != MPI_SUCCESS ||
      MPI_Comm_size(a->comm, &n) != MPI_SUCCESS)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: invalid communicator",
                       mgpu__mpi.rank, kind_name[a->kind]);
  mpi_plan pl;
  coll_ctx x;
  int local = local_check(a, me, n, &pl, &x);
  const mgpu_buffer_view *dep = NULL;
  if (local == 0) dep = pl.in.handle != NULL ? &pl.in : &pl.out;
  /* What can fail on this rank before data moves fails here, before the
   * exchange, so that every rank learns of it and none waits for this one:
   * the wait for the work the data depends on, and the staging buffers. */
  mpi_staging *staging = NULL;
  if (local == 0) local = mgpu__mpi_sync_before(dep, a->stream);
  if (local == 0 && pl.path == MPI_PATH_STAGED)
    local = mgpu__mpi_staging(pl.dev, &staging);
  long long v[V_LEN] = {a->kind, (long long)a->count, a->dtype,
                        a->has_op ? (long long)a->op : -1LL, a->root, local,
                        local == 0 ? pl.path : 0, (long long)mgpu__mpi.chunk,
                        local == MGPU_EDEVLOST && dep != NULL
                            ? pl.dev : -1};
  int path = 0;
  rc = check_all(a->comm, v, local, &path);
  if (rc != 0) return rc;
  if (path == MPI_PATH_STAGED && pl.path != MPI_PATH_STAGED) {
    /* Another rank stages: cut the data the same way, through this rank's
     * bounce buffers too. Staging buffers that cannot be made now leave
     * this rank out of the data phase: the others time out naming it. */
    pl.path = MPI_PATH_STAGED;
    staged_in_place(a, me, &pl);
    if ((rc = mgpu__mpi_staging(pl.dev, &staging)) != 0) return rc;
  }
  (void)staging; /* run_plan finds it again */
  rc = mgpu__mpi_run_plan(&pl);
  size_t bytes = a->count * pl.esize *
                 (size_t)(pl.n_in > pl.n_out ? pl.n_in : pl.n_out);
  mgpu__mpi_count(pl.dev, pl.path, bytes);
  if (pl.path == MPI_PATH_STAGED && n > 1 && !mgpu__mpi.failed)
    rc = agree_after(a, me, rc);
  return rc;
}

int mgpu_mpi_bcast(mgpu_buffer *buf, size_t offset, size_t count,
                   mgpu_dtype dtype, int root, MPI_Comm comm,
                   mgpu_stream *stream) {
  coll_args a = {C_BCAST, NULL, 0, buf, offset, count, dtype, MGPU_SUM, 0,
                 root, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_reduce(const mgpu_buffer *send, size_t send_offset,
                    mgpu_buffer *recv, size_t recv_offset, size_t count,
                    mgpu_dtype dtype, mgpu_op op, int root, MPI_Comm comm,
                    mgpu_stream *stream) {
  coll_args a = {C_REDUCE, send, send_offset, recv, recv_offset, count, dtype,
                 op, 1, root, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_allreduce(const mgpu_buffer *send, size_t send_offset,
                       mgpu_buffer *recv, size_t recv_offset, size_t count,
                       mgpu_dtype dtype, mgpu_op op, MPI_Comm comm,
                       mgpu_stream *stream) {
  coll_args a = {C_ALLREDUCE, send, send_offset, recv, recv_offset, count,
                 dtype, op, 1, 0, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_reduce_scatter(const mgpu_buffer *send, size_t send_offset,
                            mgpu_buffer *recv, size_t recv_offset,
                            size_t count, mgpu_dtype dtype, mgpu_op op,
                            MPI_Comm comm, mgpu_stream *stream) {
  coll_args a = {C_REDUCE_SCATTER, send, send_offset, recv, recv_offset,
                 count, dtype, op, 1, 0, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_allgather(const mgpu_buffer *send, size_t send_offset,
                       mgpu_buffer *recv, size_t recv_offset, size_t count,
                       mgpu_dtype dtype, MPI_Comm comm, mgpu_stream *stream) {
  coll_args a = {C_ALLGATHER, send, send_offset, recv, recv_offset, count,
                 dtype, MGPU_SUM, 0, 0, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_scatter(const mgpu_buffer *send, size_t send_offset,
                     mgpu_buffer *recv, size_t recv_offset, size_t count,
                     mgpu_dtype dtype, int root, MPI_Comm comm,
                     mgpu_stream *stream) {
  coll_args a = {C_SCATTER, send, send_offset, recv, recv_offset, count,
                 dtype, MGPU_SUM, 0, root, comm, stream};
  return coll_run(&a);
}

int mgpu_mpi_gather(const mgpu_buffer *send, size_t send_offset,
                    mgpu_buffer *recv, size_t recv_offset, size_t count,
                    mgpu_dtype dtype, int root, MPI_Comm comm,
                    mgpu_stream *stream) {
  coll_args a = {C_GATHER, send, send_offset, recv, recv_offset, count, dtype,
                 MGPU_SUM, 0, root, comm, stream};
  return coll_run(&a);
}
