/* Point to point between ranks on mgpu buffers.
 *
 * Every transfer starts with a handshake on the user's tag: the sender
 * posts a header (count, type), the receiver answers with an
 * acknowledgement that accepts it or says why not; data moves only after an
 * accepted header. Requests to the same peer, tag and communicator in the
 * same direction run one after the other, so a header can never be matched
 * by another transfer's data. Requests are state machines progressed by
 * mgpu_mpi_wait, all of them at once, so that two ranks sending to each
 * other both finish. Staged data moves in chunks through the device's send
 * or receive bounce slots: the copy to the host of chunk k+1 overlaps MPI's
 * transfer of chunk k (and MPI's receive of chunk k+1 the copy to the
 * device of chunk k). */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgpu/interop.h"
#include "mpi/mpi-internal.h"

enum { R_QUEUED, R_HANDSHAKE, R_WAIT_SLOTS, R_DATA, R_DONE };
enum { S_FREE, S_COPYING, S_MPI };

/* Header and acknowledgement. */
enum { H_COUNT, H_DTYPE, H_BYTES, H_LEN };
enum { A_STATUS, A_COUNT, A_DTYPE, A_CAPACITY, A_LEN };

#define HOST_PIECE ((size_t)1 << 30) /* one MPI message at most, host path */

struct mgpu_mpi_request {
  int is_send, peer, tag, dev, path, state, result;
  char detail[512];           /* the detail of result, written by finish */
  MPI_Comm comm;
  mgpu_buffer_view view;      /* the buffer, resolved once by post */
  size_t offset, count, bytes, capacity;
  mgpu_dtype dtype;
  long long hdr[H_LEN], ack[A_LEN];
  MPI_Request hdr_req, ack_req;
  double deadline;
  /* data phase */
  size_t piece, npieces, next_post, next_mpi, done_pieces;
  MPI_Request *data_reqs;     /* host path: one per piece */
  /* Host path: a reference on the buffer's memory (an export,
   * mgpu_buffer_dlpack) while MPI holds it, so that an mgpu_free before
   * the wait leaves it in place; dropped by the wait, kept when the module
   * failed (MPI may still write it). */
  DLManagedTensorVersioned *pin;
  mpi_staging *staging;       /* staged */
  int slot_state[MPI_STAGE_SLOTS];
  size_t slot_piece[MPI_STAGE_SLOTS];
  MPI_Request slot_req[MPI_STAGE_SLOTS];
  struct mgpu_mpi_request *next; /* outstanding requests, in posting order */
};

/* Outstanding requests of this rank (one thread at a time, mgpu/mpi.h). */
static mgpu_mpi_request *outstanding;

static int same_stream(const mgpu_mpi_request *a, const mgpu_mpi_request *b) {
  int cmp = MPI_UNEQUAL;
  if (a->is_send != b->is_send || a->peer != b->peer || a->tag != b->tag)
    return 0;
  MPI_Comm_compare(a->comm, b->comm, &cmp);
  return cmp == MPI_IDENT;
}

static const char *dir(const mgpu_mpi_request *r) {
  return r->is_send ? "send to" : "recv from";
}

static int post_handshake(mgpu_mpi_request *r) {
  int m;
  r->deadline = mgpu__mpi_deadline();
  if (r->is_send) {
    r->hdr[H_COUNT] = (long long)r->count;
    r->hdr[H_DTYPE] = r->dtype;
    r->hdr[H_BYTES] = (long long)r->bytes;
    m = MPI_Isend(r->hdr, H_LEN, MPI_LONG_LONG, r->peer, r->tag, r->comm,
                  &r->hdr_req);
    if (m == MPI_SUCCESS)
      m = MPI_Irecv(r->ack, A_LEN, MPI_LONG_LONG, r->peer, MPI_TAG_ACK,
                    r->comm, &r->ack_req);
  } else {
    m = MPI_Irecv(r->hdr, H_LEN, MPI_LONG_LONG, r->peer, r->tag, r->comm,
                  &r->hdr_req);
  }
  r->state = R_HANDSHAKE;
  return m == MPI_SUCCESS ? 0 : mgpu__mpi_err(m, "MPI_Isend/Irecv");
}

static void finish(mgpu_mpi_request *r, int rc) {
  if (r->result == 0 && rc != 0) {
    r->result = rc;
    snprintf(r->detail, sizeof r->detail, "%s", mgpu_error_detail());
  }
  if (r->staging != NULL) {
    if (r->is_send) r->staging->send_busy = 0;
    else r->staging->recv_busy = 0;
    r->staging = NULL;
  }
  r->state = R_DONE;
}

/* Gives up on what is still posted (a peer that never answered). */
static void abandon(mgpu_mpi_request *r) {
  MPI_Request *reqs[2] = {&r->hdr_req, &r->ack_req};
  for (int i = 0; i < 2; i++) {
    if (*reqs[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(reqs[i]);
    MPI_Request_free(reqs[i]);
  }
}

static int start_data(mgpu_mpi_request *r) {
  if (r->path == MPI_PATH_STAGED) {
    if ((r->is_send && r->staging->send_busy) ||
        (!r->is_send && r->staging->recv_busy)) {
      r->state = R_WAIT_SLOTS;
      return 0;
    }
    if (r->is_send) r->staging->send_busy = 1;
    else r->staging->recv_busy = 1;
    r->piece = mgpu__mpi.chunk;
  } else {
    r->piece = HOST_PIECE;
  }
  r->npieces = (r->bytes + r->piece - 1) / r->piece;
  r->state = R_DATA;
  r->deadline = mgpu__mpi_deadline();
  if (r->path == MPI_PATH_STAGED) return 0;
  DLDataType byte = {kDLUInt, 8, 1};
  int rc = mgpu_buffer_dlpack((mgpu_buffer *)r->view.handle, 0, byte, 0,
                              NULL, NULL, &r->pin);
  if (rc != 0) /* freed since the post: nothing moved */
    return mgpu__error(rc, "rank %d: %s rank %d tag %d: buffer %p of "
                       "device %d (%zu bytes at offset %zu) was freed before "
                       "its data moved (%s)", mgpu__mpi.rank, dir(r),
                       r->peer, r->tag, (const void *)r->view.handle, r->dev,
                       r->bytes, r->offset, mgpu_err_name(rc));
  r->data_reqs = mgpu_module_malloc((r->npieces ? r->npieces : 1) *
                                    sizeof *r->data_reqs);
  if (r->data_reqs == NULL)
    return mgpu__error(MGPU_ENOMEM, "rank %d: requests",
                       mgpu__mpi.rank);
  unsigned char *p = mgpu__mpi_addr(&r->view, r->offset);
  for (size_t k = 0; k < r->npieces; k++) {
    size_t len = r->bytes - k * r->piece < r->piece ? r->bytes - k * r->piece
                                                    : r->piece;
    int m = r->is_send
                ? MPI_Isend(p + k * r->piece, (int)len, MPI_BYTE, r->peer,
                            r->tag, r->comm, &r->data_reqs[k])
                : MPI_Irecv(p + k * r->piece, (int)len, MPI_BYTE, r->peer,
                            r->tag, r->comm, &r->data_reqs[k]);
    if (m != MPI_SUCCESS) {
      r->npieces = k;
      return mgpu__mpi_err(m, r->is_send ? "MPI_Isend" : "MPI_Irecv");
    }
  }
  return 0;
}

static size_t piece_len(const mgpu_mpi_request *r, size_t k) {
  size_t rest = r->bytes - k * r->piece;
  return rest < r->piece ? rest : r->piece;
}

/* One step of the staged data phase; returns 0 or an error. */
static int step_staged(mgpu_mpi_request *r) {
  mpi_bounce *slots = r->is_send ? r->staging->send : r->staging->recv;
  mgpu_stream *copy = r->is_send ? r->staging->d2h : r->staging->h2d;
  for (int s = 0; s < MPI_STAGE_SLOTS; s++) {
    mpi_bounce *b = &slots[s];
    size_t k = r->slot_piece[s];
    if (r->slot_state[s] == S_FREE && r->next_post < r->npieces) {
      k = r->slot_piece[s] = r->next_post++;
      int rc;
      if (r->is_send) {
        rc = mgpu_memcpy_dtoh_async(b->host, r->view.handle,
                                    r->offset + k * r->piece,
                                    piece_len(r, k), copy);
        if (rc == 0) rc = mgpu_event_record(b->done, copy);
        r->slot_state[s] = S_COPYING;
      } else {
        rc = MPI_Irecv(b->host, (int)piece_len(r, k), MPI_BYTE, r->peer,
                       r->tag, r->comm, &r->slot_req[s]);
        rc = rc == MPI_SUCCESS ? 0 : mgpu__mpi_err(rc, "MPI_Irecv");
        r->slot_state[s] = S_MPI;
      }
      if (rc != 0) return rc;
    } else if (r->slot_state[s] == S_COPYING) {
      int q = mgpu_event_query(b->done);
      if (q == MGPU_EAGAIN) continue;
      if (q != 0) return q;
      if (r->is_send) {
        /* Chunks leave in order: the receiver posts them in order. */
        if (k != r->next_mpi) continue;
        int m = MPI_Isend(b->host, (int)piece_len(r, k), MPI_BYTE, r->peer,
                          r->tag, r->comm, &r->slot_req[s]);
        if (m != MPI_SUCCESS) return mgpu__mpi_err(m, "MPI_Isend");
        r->next_mpi++;
        r->slot_state[s] = S_MPI;
      } else {
        r->slot_state[s] = S_FREE;
        r->done_pieces++;
        mgpu__mpi.stats.staged_chunks++;
      }
    } else if (r->slot_state[s] == S_MPI) {
      int got = 0;
      int m = MPI_Test(&r->slot_req[s], &got, MPI_STATUS_IGNORE);
      if (m != MPI_SUCCESS) return mgpu__mpi_err(m, "MPI_Test");
      if (!got) continue;
      if (r->is_send) {
        r->slot_state[s] = S_FREE;
        r->done_pieces++;
        mgpu__mpi.stats.staged_chunks++;
      } else {
        int rc = mgpu_memcpy_htod_async((mgpu_buffer *)r->view.handle,
                                        r->offset + k * r->piece, b->host,
                                        piece_len(r, k), copy);
        if (rc == 0) rc = mgpu_event_record(b->done, copy);
        if (rc != 0) return rc;
        r->slot_state[s] = S_COPYING;
      }
    }
  }
  return 0;
}

/* The peer moved no piece of the data within the timeout. What is posted
 * stays with MPI (a cancel may not take, and MPI may still write the
 * buffers it was given), so the module takes no further calls. */
static void data_timeout(mgpu_mpi_request *r) {
  int staged = r->path == MPI_PATH_STAGED;
  MPI_Request *reqs = staged ? r->slot_req : r->data_reqs;
  size_t n = staged ? MPI_STAGE_SLOTS : r->npieces;
  for (size_t i = 0; reqs != NULL && i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
  mgpu__mpi.failed = 1;
  snprintf(mgpu__mpi.failed_detail, sizeof mgpu__mpi.failed_detail,
           "%s rank %d tag %d: rank %d did not come for the data within %d "
           "ms (%zu of %zu pieces moved)", dir(r), r->peer, r->tag, r->peer,
           mgpu__mpi.timeout_ms, r->done_pieces, r->npieces);
  finish(r, mgpu__error(MGPU_ETIMEDOUT, "rank %d: %s; the program "
                        "should call MPI_Abort", mgpu__mpi.rank,
                        mgpu__mpi.failed_detail));
}

/* 1 when the handshake's request req completed; 0 while it is pending, or
 * when the test failed (r finished). */
static int handshake_arrived(mgpu_mpi_request *r, MPI_Request *req) {
  int got = 0;
  int m = MPI_Test(req, &got, MPI_STATUS_IGNORE);
  if (m != MPI_SUCCESS) {
    finish(r, mgpu__mpi_err(m, "MPI_Test"));
    return 0;
  }
  return got;
}

/* The sender's handshake: 1 when the receiver accepted the header, 0 while
 * its answer is awaited; r finished on a refusal or an error. */
static int handshake_send(mgpu_mpi_request *r) {
  if (!handshake_arrived(r, &r->ack_req)) return 0;
  /* The receiver had the header, so the header send completes. */
  MPI_Wait(&r->hdr_req, MPI_STATUS_IGNORE);
  if (r->ack[A_STATUS] == 0) return 1;
  finish(r, mgpu__error(
                MGPU_EMISMATCH, "rank %d: send to rank %d tag %d: %zu "
                "elements of %s, but the receiver posted %lld elements of %s "
                "in a buffer of %lld bytes; no data moved",
                mgpu__mpi.rank, r->peer, r->tag, r->count,
                mgpu__mpi_dtype_name(r->dtype), r->ack[A_COUNT],
                mgpu__mpi_dtype_name((mgpu_dtype)r->ack[A_DTYPE]),
                r->ack[A_CAPACITY]));
  return 0;
}

/* The receiver's handshake: 1 when the sender's header matches what was
 * posted (and the acknowledgement says so), 0 while it is awaited; r
 * finished on a mismatch or an error. */
static int handshake_recv(mgpu_mpi_request *r) {
  if (!handshake_arrived(r, &r->hdr_req)) return 0;
  int ok = r->hdr[H_COUNT] == (long long)r->count &&
           r->hdr[H_DTYPE] == r->dtype;
  r->ack[A_STATUS] = ok ? 0 : MGPU_EMISMATCH;
  r->ack[A_COUNT] = (long long)r->count;
  r->ack[A_DTYPE] = r->dtype;
  r->ack[A_CAPACITY] = (long long)r->capacity;
  int m = MPI_Send(r->ack, A_LEN, MPI_LONG_LONG, r->peer, MPI_TAG_ACK,
                   r->comm);
  if (m != MPI_SUCCESS) {
    finish(r, mgpu__mpi_err(m, "MPI_Send"));
    return 0;
  }
  if (ok) return 1;
  finish(r, mgpu__error(
                MGPU_EMISMATCH, "rank %d: recv from rank %d tag %d: posted "
                "%zu elements of %s, but the sender sends %lld elements of "
                "%s; no data moved", mgpu__mpi.rank, r->peer, r->tag,
                r->count, mgpu__mpi_dtype_name(r->dtype), r->hdr[H_COUNT],
                mgpu__mpi_dtype_name((mgpu_dtype)r->hdr[H_DTYPE])));
  return 0;
}

/* One step of the data phase; the deadline counts from the last piece
 * that moved. */
static void progress_data(mgpu_mpi_request *r) {
  size_t before = r->done_pieces;
  if (r->path == MPI_PATH_STAGED) {
    int rc = step_staged(r);
    if (rc != 0) {
      mgpu_stream_synchronize(r->is_send ? r->staging->d2h : r->staging->h2d);
      return finish(r, rc);
    }
    if (r->done_pieces == r->npieces) return finish(r, 0);
  } else {
    int all = 0;
    int m = mgpu__mpi_test_all((int)r->npieces, r->data_reqs, &all);
    if (m != MPI_SUCCESS) return finish(r, mgpu__mpi_err(m, "MPI_Testall"));
    if (all) return finish(r, 0);
    r->done_pieces = 0;
    for (size_t k = 0; k < r->npieces; k++)
      r->done_pieces += r->data_reqs[k] == MPI_REQUEST_NULL;
  }
  if (r->done_pieces != before) r->deadline = mgpu__mpi_deadline();
  else if (MPI_Wtime() > r->deadline) data_timeout(r);
}

/* Advances r as far as it can without blocking. */
static void progress(mgpu_mpi_request *r) {
  if (r->state == R_QUEUED) {
    for (mgpu_mpi_request *o = outstanding; o != r; o = o->next)
      if (o->state != R_DONE && same_stream(o, r)) return;
    int rc = post_handshake(r);
    if (rc != 0) finish(r, rc);
    return;
  }
  if (r->state == R_HANDSHAKE) {
    int accepted = r->is_send ? handshake_send(r) : handshake_recv(r);
    if (accepted) {
      int rc = start_data(r);
      if (rc != 0) finish(r, rc);
    } else if (r->state == R_HANDSHAKE && MPI_Wtime() > r->deadline) {
      abandon(r);
      finish(r, mgpu__error(MGPU_ETIMEDOUT, "rank %d: %s rank %d tag %d: "
                            "rank %d did not answer within %d ms",
                            mgpu__mpi.rank, dir(r), r->peer, r->tag, r->peer,
                            mgpu__mpi.timeout_ms));
    }
    return;
  }
  if (r->state == R_WAIT_SLOTS) {
    int rc = start_data(r);
    if (rc != 0) finish(r, rc);
    return;
  }
  if (r->state == R_DATA) progress_data(r);
}

/* The peer, tag and element count of a send or receive (what: "send" or
 * "recv"); *es becomes the element size. */
static int check_peer(const char *what, size_t count, mgpu_dtype dtype,
                      int peer, int tag, MPI_Comm comm, size_t *es) {
  int n = 0;
  if (MPI_Comm_size(comm, &n) != MPI_SUCCESS)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: invalid communicator",
                       mgpu__mpi.rank, what);
  if (peer < 0 || peer >= n)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: peer rank %d outside "
                       "0..%d (MPI_ANY_SOURCE is not supported)",
                       mgpu__mpi.rank, what, peer, n - 1);
  if (tag < 0 || tag >= MGPU_MPI_TAG_RESERVED)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: tag %d outside 0..%d",
                       mgpu__mpi.rank, what, tag, MGPU_MPI_TAG_RESERVED - 1);
  MPI_Datatype type;
  int rc = mgpu__mpi_type(dtype, &type);
  if (rc != 0) return rc;
  *es = mgpu__mpi_dtype_size(dtype);
  if (count > SIZE_MAX / *es)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: count %zu overflows",
                       mgpu__mpi.rank, what, count);
  return 0;
}

static int post(int is_send, const mgpu_buffer *buf, size_t offset,
                size_t count, mgpu_dtype dtype, int peer, int tag,
                MPI_Comm comm, mgpu_stream *stream, mgpu_mpi_request **out) {
  const char *what = is_send ? "send" : "recv";
  int rc = mgpu__mpi_usable(is_send ? "mgpu_mpi_send" : "mgpu_mpi_recv");
  if (rc != 0) return rc;
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: request is NULL",
                       mgpu__mpi.rank, what);
  *out = NULL;
  size_t es = 1;
  int path;
  mgpu_buffer_view view;
  if ((rc = check_peer(what, count, dtype, peer, tag, comm, &es)) != 0 ||
      (rc = mgpu__mpi_check_buffer(what, buf, offset, count * es, stream,
                                   &view, &path)) != 0)
    return rc;
  mgpu_mpi_request *r = mgpu_module_calloc(1, sizeof *r);
  if (r == NULL)
    return mgpu__error(MGPU_ENOMEM, "rank %d: %s request",
                       mgpu__mpi.rank, what);
  r->is_send = is_send;
  r->peer = peer;
  r->tag = tag;
  r->comm = comm;
  r->view = view;
  r->offset = offset;
  r->count = count;
  r->dtype = dtype;
  r->bytes = count * es;
  r->capacity = view.size - offset;
  r->dev = view.device;
  r->path = path;
  r->hdr_req = r->ack_req = MPI_REQUEST_NULL;
  /* Not 0 (calloc): a cancel at the deadline looks at every slot, also
   * those never used (MPI_Cancel of a request 0 aborts the job). */
  for (int s = 0; s < MPI_STAGE_SLOTS; s++) r->slot_req[s] = MPI_REQUEST_NULL;
  if (path == MPI_PATH_STAGED &&
      (rc = mgpu__mpi_staging(r->dev, &r->staging)) != 0) {
    mgpu_module_free(r);
    return rc;
  }
  /* The data is read (or overwritten) after the work queued before. */
  if ((rc = mgpu__mpi_sync_before(&view, stream)) != 0) {
    mgpu_module_free(r);
    return rc;
  }
  mgpu__mpi_count(r->dev, path, r->bytes);
  r->state = R_QUEUED;
  mgpu_mpi_request **tail = &outstanding;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = r;
  progress(r);
  *out = r;
  return 0;
}

int mgpu_mpi_isend(const mgpu_buffer *buf, size_t offset, size_t count,
                   mgpu_dtype dtype, int dest, int tag, MPI_Comm comm,
                   mgpu_stream *stream, mgpu_mpi_request **req) {
  return post(1, buf, offset, count, dtype, dest, tag, comm, stream, req);
}

int mgpu_mpi_irecv(mgpu_buffer *buf, size_t offset, size_t count,
                   mgpu_dtype dtype, int source, int tag, MPI_Comm comm,
                   mgpu_stream *stream, mgpu_mpi_request **req) {
  return post(0, buf, offset, count, dtype, source, tag, comm, stream, req);
}

int mgpu_mpi_wait(mgpu_mpi_request *req) {
  mgpu_mpi_request **link = &outstanding;
  while (*link != NULL && *link != req) link = &(*link)->next;
  if (req == NULL || *link == NULL)
    return mgpu__error(MGPU_EBADHANDLE, "rank %d: mgpu_mpi_wait: not "
                       "an outstanding request", mgpu__mpi.rank);
  while (req->state != R_DONE) {
    for (mgpu_mpi_request *o = outstanding; o != NULL; o = o->next)
      if (o->state != R_DONE) progress(o);
    if (req->state != R_DONE) sched_yield();
  }
  *link = req->next;
  int rc = req->result;
  if (rc != 0) {
    /* Progress of another request may have written the thread's detail
     * since: report this request's own. */
    mgpu__error(rc, "%s", req->detail);
  } else if (!req->is_send && req->path == MPI_PATH_STAGED) {
    rc = mgpu_stream_synchronize(mgpu__mpi.staging[req->dev].h2d);
  }
  if (req->pin != NULL && !mgpu__mpi.failed) req->pin->deleter(req->pin);
  else if (req->pin != NULL) mgpu__mpi_keep(req->pin); /* MPI may use it */
  mgpu_module_free(req->data_reqs);
  mgpu_module_free(req);
  return rc;
}

int mgpu__mpi_requests_finish(void) {
  int first = 0;
  while (outstanding != NULL) {
    int rc = mgpu_mpi_wait(outstanding);
    if (first == 0) first = rc;
  }
  return first;
}

int mgpu_mpi_send(const mgpu_buffer *buf, size_t offset, size_t count,
                  mgpu_dtype dtype, int dest, int tag, MPI_Comm comm,
                  mgpu_stream *stream) {
  mgpu_mpi_request *r;
  int rc = mgpu_mpi_isend(buf, offset, count, dtype, dest, tag, comm, stream,
                          &r);
  return rc != 0 ? rc : mgpu_mpi_wait(r);
}

int mgpu_mpi_recv(mgpu_buffer *buf, size_t offset, size_t count,
                  mgpu_dtype dtype, int source, int tag, MPI_Comm comm,
                  mgpu_stream *stream) {
  mgpu_mpi_request *r;
  int rc = mgpu_mpi_irecv(buf, offset, count, dtype, source, tag, comm,
                          stream, &r);
  return rc != 0 ? rc : mgpu_mpi_wait(r);
}

/* ---- pitched transfers: packed on the device, moved as one ---- */

static int pitched(const char *what, const mgpu_buffer *buf, size_t offset,
                   size_t pitch, size_t width, size_t height, mgpu_dtype dtype,
                   mgpu_stream *stream, mpi_staging **staging, size_t *wbytes) {
  int rc = mgpu__mpi_usable(what);
  if (rc != 0) return rc;
  size_t es = mgpu__mpi_dtype_size(dtype);
  if (es == 0)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: unknown dtype %d",
                       mgpu__mpi.rank, what, (int)dtype);
  if (width > SIZE_MAX / es / (height ? height : 1))
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: %zu x %zu overflows",
                       mgpu__mpi.rank, what, width, height);
  *wbytes = width * es;
  if (pitch < *wbytes)
    return mgpu__error(MGPU_EINVAL, "rank %d: %s: pitch %zu is less "
                       "than the row of %zu bytes", mgpu__mpi.rank,
                       what, pitch, *wbytes);
  int path;
  mgpu_buffer_view view;
  size_t span = height ? (height - 1) * pitch + *wbytes : 0;
  if ((rc = mgpu__mpi_check_buffer(what, buf, offset, span, stream, &view,
                                   &path)))
    return rc;
  if ((rc = mgpu__mpi_pack(view.device, *wbytes * height, staging)) != 0)
    return rc;
  return mgpu__mpi_sync_before(&view, stream);
}

int mgpu_mpi_send_2d(const mgpu_buffer *buf, size_t offset, size_t pitch,
                     size_t width, size_t height, mgpu_dtype dtype, int dest,
                     int tag, MPI_Comm comm, mgpu_stream *stream) {
  mpi_staging *staging;
  size_t wbytes;
  int rc = pitched("mgpu_mpi_send_2d", buf, offset, pitch, width, height,
                   dtype, stream, &staging, &wbytes);
  if (rc != 0) return rc;
  if (height > 0 && wbytes > 0)
    rc = mgpu_memcpy_2d(staging->pack, 0, wbytes, buf, offset, pitch, wbytes,
                        height);
  if (rc != 0) return rc;
  return mgpu_mpi_send(staging->pack, 0, width * height, dtype, dest, tag, comm,
                       NULL);
}

int mgpu_mpi_recv_2d(mgpu_buffer *buf, size_t offset, size_t pitch,
                     size_t width, size_t height, mgpu_dtype dtype, int source,
                     int tag, MPI_Comm comm, mgpu_stream *stream) {
  mpi_staging *staging;
  size_t wbytes;
  int rc = pitched("mgpu_mpi_recv_2d", buf, offset, pitch, width, height,
                   dtype, stream, &staging, &wbytes);
  if (rc != 0) return rc;
  rc = mgpu_mpi_recv(staging->pack, 0, width * height, dtype, source, tag, comm,
                     NULL);
  if (rc != 0 || height == 0 || wbytes == 0) return rc;
  return mgpu_memcpy_2d(buf, offset, pitch, staging->pack, 0, wbytes, wbytes,
                        height);
}
