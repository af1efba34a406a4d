/* Tests of the channels: messages arrive whole and in order, sends are
 * ordered on the sender's stream (a buffer reused right after a send does
 * not change the message), a full channel blocks the sender, close ends the
 * stream of messages, many threads on many channels (TSan), the errors. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "task.h"
#include "util/fault.h"


/* The next device of dev's backend after dev (dev itself if alone). */
static int peer_of(int dev) {
  int all[64];
  int m = test_same_backend(all, 64);
  for (int i = 0; i < m; i++)
    if (all[i] == dev) return all[(i + 1) % m];
  return dev;
}

typedef struct end_arg {
  mgpu_channel *ch;
  int dev;
  int count;
  size_t msg_size;
  int id;              /* sender id written into each message */
  int nsenders;
  int *seen;           /* receivers: [sender * count + seq] */
  pthread_mutex_t *seen_lock;
} end_arg;

/* Message seq of sender id: size 1 + (seq % msg_size) bytes; the first 8
 * bytes (when they fit) say who and which, the rest a pattern. */
static size_t msg_len(size_t msg_size, int seq) {
  size_t len = 1 + (size_t)seq * 7 % msg_size;
  return len < 8 && msg_size >= 8 ? 8 : len;
}

static void fill_msg(unsigned char *p, size_t len, int id, int seq) {
  for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(seq * 13 + id * 7 + (int)i);
  if (len >= 8) {
    int32_t w[2] = {id, seq};
    memcpy(p, w, 8);
  }
}

static void *sender(void *p) {
  end_arg *a = p;
  mgpu_stream *s;
  mgpu_buffer *src;
  ASSERT_OK(mgpu_stream_create(&s, a->dev));
  ASSERT_OK(mgpu_malloc(&src, a->dev, a->msg_size));
  unsigned char *h = malloc(a->msg_size);
  for (int seq = 0; seq < a->count; seq++) {
    size_t len = msg_len(a->msg_size, seq);
    fill_msg(h, len, a->id, seq);
    /* Stream-ordered: the copy in waits for the message to be taken, so h
     * may be rewritten at once after synchronizing only this copy. */
    ASSERT_OK(mgpu_memcpy_htod_async(src, 0, h, len, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_channel_send(a->ch, src, 0, len, s));
  }
  ASSERT_OK(mgpu_stream_synchronize(s));
  free(h);
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_stream_destroy(s));
  return NULL;
}

static void *receiver(void *p) {
  end_arg *a = p;
  mgpu_stream *s;
  mgpu_buffer *dst;
  ASSERT_OK(mgpu_stream_create(&s, a->dev));
  ASSERT_OK(mgpu_malloc(&dst, a->dev, a->msg_size + 3));
  unsigned char *h = malloc(a->msg_size);
  unsigned char *want = malloc(a->msg_size);
  int last[64];
  for (int i = 0; i < 64; i++) last[i] = -1;
  for (;;) {
    size_t len = 0;
    int rc = mgpu_channel_recv(a->ch, dst, 3, &len, s);
    if (rc == MGPU_ECLOSED) break;
    ASSERT_OK(rc);
    ASSERT_OK(mgpu_memcpy_dtoh_async(h, dst, 3, len, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT(len >= 8);
    int32_t w[2];
    memcpy(w, h, 8);
    ASSERT(w[0] >= 0 && w[0] < a->nsenders && w[1] >= 0 && w[1] < a->count);
    ASSERT_EQ(len, msg_len(a->msg_size, w[1]));
    fill_msg(want, len, w[0], w[1]);
    ASSERT(memcmp(h, want, len) == 0);
    /* With one receiver, each sender's messages arrive in order. */
    if (a->nsenders >= 1 && a->seen_lock == NULL) {
      ASSERT(w[1] > last[w[0]]);
      last[w[0]] = w[1];
    }
    if (a->seen_lock) pthread_mutex_lock(a->seen_lock);
    a->seen[w[0] * a->count + w[1]]++;
    if (a->seen_lock) pthread_mutex_unlock(a->seen_lock);
  }
  free(h);
  free(want);
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_destroy(s));
  return NULL;
}

/* senders x receivers threads on one channel; every message exactly once. */
static void run_channel(int from, int to, size_t msg_size, int capacity,
                        int nsend, int nrecv, int count) {
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(from, to, msg_size, capacity, &ch));
  int *seen = calloc((size_t)(nsend * count), sizeof *seen);
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_t st[8], rt[8];
  end_arg sa[8], ra[8];
  for (int i = 0; i < nrecv; i++) {
    ra[i] = (end_arg){ch, to, count, msg_size, 0, nsend, seen,
                      nrecv > 1 ? &lock : NULL};
    ASSERT(pthread_create(&rt[i], NULL, receiver, &ra[i]) == 0);
  }
  for (int i = 0; i < nsend; i++) {
    sa[i] = (end_arg){ch, from, count, msg_size, i, nsend, NULL, NULL};
    ASSERT(pthread_create(&st[i], NULL, sender, &sa[i]) == 0);
  }
  for (int i = 0; i < nsend; i++) pthread_join(st[i], NULL);
  ASSERT_OK(mgpu_channel_close(ch));
  for (int i = 0; i < nrecv; i++) pthread_join(rt[i], NULL);
  for (int i = 0; i < nsend * count; i++) ASSERT_EQ(seen[i], 1);
  free(seen);
  ASSERT_OK(mgpu_channel_destroy(ch));
}

TEST_IMPL(basic) {
  test_init();
  run_channel(0, peer_of(0), 256, 4, 1, 1, 300);
  run_channel(0, 0, 64, 1, 1, 1, 50); /* same device, one slot */
  return 0;
}

/* A buffer rewritten on the sender's stream right after each send: every
 * message must carry the value it had at its send. */
TEST_IMPL(stream_order) {
  test_init();
  int a = 0, b = peer_of(0);
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(a, b, 64 * sizeof(int32_t), 3, &ch));
  mgpu_stream *sa, *sb;
  mgpu_buffer *src, *dst;
  ASSERT_OK(mgpu_stream_create(&sa, a));
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_malloc(&src, a, 64 * sizeof(int32_t)));
  ASSERT_OK(mgpu_malloc(&dst, b, 100 * 64 * sizeof(int32_t)));
  /* Receives first (in a thread), so the sender never blocks for long. */
  for (int round = 0; round < 100; round += 3) {
    int m = round + 3 <= 100 ? 3 : 100 - round;
    for (int i = 0; i < m; i++) {
      int32_t v = round + i;
      ASSERT_OK(mgpu_fill(sa, src, 0, 64, MGPU_INT32, &v));
      ASSERT_OK(mgpu_channel_send(ch, src, 0, 64 * sizeof(int32_t), sa));
    }
    for (int i = 0; i < m; i++) {
      size_t len;
      ASSERT_OK(mgpu_channel_recv(ch, dst, (size_t)(round + i) * 64 * sizeof(int32_t), &len, sb));
      ASSERT_EQ(len, 64 * sizeof(int32_t));
    }
  }
  ASSERT_OK(mgpu_stream_synchronize(sb));
  int32_t *h = malloc(100 * 64 * sizeof *h);
  ASSERT_OK(mgpu_memcpy_dtoh(h, dst, 0, 100 * 64 * sizeof *h));
  for (int i = 0; i < 100 * 64; i++) ASSERT_EQ(h[i], i / 64);
  free(h);
  ASSERT_OK(mgpu_channel_close(ch));
  ASSERT_OK(mgpu_stream_synchronize(sa));
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

/* The small path (device buffers, idle streams: copied by the calling
 * thread, no event recorded) and the queued one (pinned host buffers:
 * copies and events on the streams) taken in turn on both ends, in
 * patterns that do not line up: a receive by hand after a queued send
 * waits for that send's copy in, a send by hand into a slot whose last
 * message was taken by a queued receive waits for it to be out. Every
 * message arrives whole and in order. */
#define MIXED_MSGS 600
#define MIXED_LEN 256

typedef struct mixed_end {
  mgpu_channel *ch;
  int dev;
} mixed_end;

static void *mixed_receiver(void *p) {
  mixed_end *e = p;
  mgpu_stream *s;
  mgpu_buffer *dev_buf, *host_buf;
  ASSERT_OK(mgpu_stream_create(&s, e->dev));
  ASSERT_OK(mgpu_malloc(&dev_buf, e->dev, MIXED_LEN));
  ASSERT_OK(mgpu_malloc_host(&host_buf, e->dev, MIXED_LEN));
  unsigned char got[MIXED_LEN], want[MIXED_LEN];
  for (int seq = 0; seq < MIXED_MSGS; seq++) {
    mgpu_buffer *dst = seq % 3 == 1 ? host_buf : dev_buf;
    size_t len = 0;
    ASSERT_OK(mgpu_channel_recv(e->ch, dst, 0, &len, s));
    ASSERT_OK(mgpu_memcpy_dtoh_async(got, dst, 0, len, s));
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_EQ(len, msg_len(MIXED_LEN, seq));
    fill_msg(want, len, 0, seq);
    ASSERT(memcmp(got, want, len) == 0);
  }
  ASSERT_OK(mgpu_free(dev_buf));
  ASSERT_OK(mgpu_free(host_buf));
  ASSERT_OK(mgpu_stream_destroy(s));
  return NULL;
}

TEST_IMPL(mixed_paths) {
  test_init();
  int a = 0, b = peer_of(0);
  for (int capacity = 1; capacity <= 3; capacity += 2) {
    mixed_end e;
    e.dev = b;
    ASSERT_OK(mgpu_channel_create(a, b, MIXED_LEN, capacity, &e.ch));
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, mixed_receiver, &e) == 0);
    mgpu_stream *s;
    mgpu_buffer *dev_buf, *host_buf;
    ASSERT_OK(mgpu_stream_create(&s, a));
    ASSERT_OK(mgpu_malloc(&dev_buf, a, MIXED_LEN));
    ASSERT_OK(mgpu_malloc_host(&host_buf, a, MIXED_LEN));
    unsigned char h[MIXED_LEN];
    for (int seq = 0; seq < MIXED_MSGS; seq++) {
      mgpu_buffer *src = seq % 2 ? host_buf : dev_buf;
      size_t len = msg_len(MIXED_LEN, seq);
      fill_msg(h, len, 0, seq);
      ASSERT_OK(mgpu_memcpy_htod_async(src, 0, h, len, s));
      ASSERT_OK(mgpu_stream_synchronize(s));
      ASSERT_OK(mgpu_channel_send(e.ch, src, 0, len, s));
      /* The next fill of this buffer is ordered after the send on s. */
    }
    pthread_join(t, NULL);
    ASSERT_OK(mgpu_stream_synchronize(s));
    ASSERT_OK(mgpu_channel_destroy(e.ch));
    ASSERT_OK(mgpu_free(dev_buf));
    ASSERT_OK(mgpu_free(host_buf));
    ASSERT_OK(mgpu_stream_destroy(s));
  }
  return 0;
}

/* A send or receive made on a thread of its own: the call's channel,
 * buffer (its source or destination) and stream; a receive's offset and
 * the size it got; done once it returned, with rc. */
typedef struct blocked_call {
  mgpu_channel *ch;
  mgpu_buffer *buf;
  mgpu_stream *s;
  atomic_int done;
  int rc;
  size_t offset, len;
} blocked_call;

static void *send_one(void *p) {
  blocked_call *b = p;
  b->rc = mgpu_channel_send(b->ch, b->buf, 0, 8, b->s);
  atomic_store(&b->done, 1);
  return NULL;
}

TEST_IMPL(full_and_close) {
  test_init();
  int a = 0, b = peer_of(0);
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(a, b, 8, 2, &ch));
  mgpu_stream *sa, *sb;
  mgpu_buffer *src, *dst;
  ASSERT_OK(mgpu_stream_create(&sa, a));
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_malloc(&src, a, 8));
  ASSERT_OK(mgpu_malloc(&dst, b, 8));
  ASSERT_OK(mgpu_memset_async(src, 0, 7, 8, sa));
  ASSERT_OK(mgpu_channel_send(ch, src, 0, 8, sa));
  ASSERT_OK(mgpu_channel_send(ch, src, 0, 8, sa));
  /* Full: the third send blocks until a receive makes room. */
  blocked_call bs = {ch, src, sa, 0, -1, 0, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, send_one, &bs) == 0);
  usleep(20000);
  ASSERT_EQ(atomic_load(&bs.done), 0);
  size_t len;
  ASSERT_OK(mgpu_channel_recv(ch, dst, 0, &len, sb));
  pthread_join(t, NULL);
  ASSERT_OK(bs.rc);
  /* Close: the two messages still inside are delivered, then the end. */
  ASSERT_OK(mgpu_channel_close(ch));
  ASSERT_ERR(MGPU_ECLOSED, mgpu_channel_send(ch, src, 0, 8, sa));
  ASSERT_OK(mgpu_channel_recv(ch, dst, 0, &len, sb));
  ASSERT_OK(mgpu_channel_recv(ch, dst, 0, &len, sb));
  ASSERT_ERR(MGPU_ECLOSED, mgpu_channel_recv(ch, dst, 0, &len, sb));
  ASSERT_ERR(MGPU_ECLOSED, mgpu_channel_recv(ch, dst, 0, &len, sb));
  unsigned char h[8];
  ASSERT_OK(mgpu_stream_synchronize(sb));
  ASSERT_OK(mgpu_memcpy_dtoh(h, dst, 0, 8));
  for (int i = 0; i < 8; i++) ASSERT_EQ(h[i], 7);
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_ERR(MGPU_EFREED, mgpu_channel_close(ch));
  ASSERT_ERR(MGPU_EFREED, mgpu_channel_send(ch, src, 0, 8, sa));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

/* A receiver blocked on an empty channel is woken by close. */
static void *recv_one(void *p) {
  blocked_call *b = p;
  b->rc = mgpu_channel_recv(b->ch, b->buf, b->offset, &b->len, b->s);
  atomic_store(&b->done, 1);
  return NULL;
}

TEST_IMPL(close_wakes_receiver) {
  test_init();
  int b = peer_of(0);
  mgpu_channel *ch;
  ASSERT_OK(mgpu_channel_create(0, b, 16, 4, &ch));
  mgpu_stream *sb;
  mgpu_buffer *dst;
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_malloc(&dst, b, 16));
  blocked_call br = {ch, dst, sb, 0, -1, 0, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, recv_one, &br) == 0);
  usleep(10000);
  ASSERT_OK(mgpu_channel_close(ch));
  pthread_join(t, NULL);
  ASSERT_EQ(br.rc, MGPU_ECLOSED);
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

TEST_IMPL(errors) {
  int ndev = test_init();
  int b = peer_of(0);
  mgpu_channel *ch;
  ASSERT_ERR(MGPU_EINVAL, mgpu_channel_create(0, b, 0, 4, &ch));
  ASSERT_ERR(MGPU_EINVAL, mgpu_channel_create(0, b, 16, 0, &ch));
  ASSERT_ERR(MGPU_ENODEV, mgpu_channel_create(0, ndev, 16, 4, &ch));
  /* Devices of two backends: refused when the channel is made. */
  mgpu_device_props p0 = {.size = sizeof p0}, pd = {.size = sizeof pd};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  for (int d = 1; d < ndev; d++) {
    ASSERT_OK(mgpu_device_get_props(d, &pd));
    if (pd.backend_kind == p0.backend_kind) continue;
    ASSERT_ERR(MGPU_ENOTSUP, mgpu_channel_create(0, d, 16, 4, &ch));
    ASSERT_DETAIL_HAS("different backends");
    break;
  }
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_channel_close(NULL));
  ASSERT_OK(mgpu_channel_create(0, b, 16, 4, &ch));
  mgpu_stream *sa, *sb;
  mgpu_buffer *src, *dst, *small;
  ASSERT_OK(mgpu_stream_create(&sa, 0));
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_malloc(&src, 0, 64));
  ASSERT_OK(mgpu_malloc(&dst, b, 64));
  ASSERT_OK(mgpu_malloc(&small, b, 8));
  ASSERT_ERR(MGPU_ERANGE, mgpu_channel_send(ch, src, 0, 17, sa));
  ASSERT_ERR(MGPU_ERANGE, mgpu_channel_send(ch, src, 0, 0, sa));
  ASSERT_ERR(MGPU_ERANGE, mgpu_channel_send(ch, src, 60, 16, sa));
  /* The destination's range is checked once a message is there (an empty
   * open channel would block), and a bad one leaves the message in place. */
  ASSERT_OK(mgpu_channel_send(ch, src, 0, 16, sa));
  ASSERT_ERR(MGPU_ERANGE, mgpu_channel_recv(ch, small, 0, NULL, sb));
  size_t got = 0;
  ASSERT_OK(mgpu_channel_recv(ch, dst, 48, &got, sb));
  ASSERT_EQ(got, 16);
  ASSERT_OK(mgpu_stream_synchronize(sb));
  if (b != 0) {
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_channel_send(ch, dst, 0, 16, sb));
    ASSERT_DETAIL_HAS("device");
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_channel_send(ch, src, 0, 16, sb));
    ASSERT_ERR(MGPU_EWRONGDEV, mgpu_channel_recv(ch, src, 0, NULL, sa));
  }
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_ERR(MGPU_EFREED, mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_free(small));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

/* Every device sends to the next over its own channel, with two senders
 * and two receivers per channel, all at once; and the metrics count them. */
typedef struct pair_arg {
  int from;
} pair_arg;

static void *pair_thread(void *p) {
  pair_arg *a = p;
  run_channel(a->from, peer_of(a->from), 96, 3, 2, 2, 150);
  return NULL;
}

TEST_IMPL(stress) {
  int ndev = test_init();
  int devs[4];
  int n = test_same_backend(devs, 4);
  ASSERT_OK(mgpu_metrics_reset());
  pthread_t t[4];
  pair_arg args[4];
  for (int i = 0; i < n; i++) {
    args[i].from = devs[i];
    ASSERT(pthread_create(&t[i], NULL, pair_thread, &args[i]) == 0);
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  uint64_t sent = 0, received = 0;
  for (int d = 0; d < ndev; d++) {
    sent += m.dev[d].chan_msgs_sent;
    received += m.dev[d].chan_msgs_received;
  }
  ASSERT_EQ(sent, (uint64_t)n * 300);
  ASSERT_EQ(received, (uint64_t)n * 300);
  return 0;
}

/* A receiver that advances its offset per message through a buffer of
 * exactly the messages sent ends with MGPU_ECLOSED, not MGPU_ERANGE, on the
 * call past the end; a receive into a bad range while a message is there is
 * MGPU_ERANGE and leaves the message for the next call. */
TEST_IMPL(recv_loop_ends_closed) {
  test_init();
  int dst = peer_of(0);
  enum { MSG = 64, COUNT = 3 };
  mgpu_channel *ch;
  mgpu_stream *ss, *ds;
  mgpu_buffer *src, *out;
  ASSERT_OK(mgpu_channel_create(0, dst, MSG, COUNT, &ch));
  ASSERT_OK(mgpu_stream_create(&ss, 0));
  ASSERT_OK(mgpu_stream_create(&ds, dst));
  ASSERT_OK(mgpu_malloc(&src, 0, MSG));
  ASSERT_OK(mgpu_malloc(&out, dst, (size_t)MSG * COUNT));
  unsigned char h[MSG];
  for (int m = 0; m < COUNT; m++) {
    memset(h, 'a' + m, MSG);
    ASSERT_OK(mgpu_memcpy_htod_async(src, 0, h, MSG, ss));
    ASSERT_OK(mgpu_channel_send(ch, src, 0, MSG, ss));
    ASSERT_OK(mgpu_stream_synchronize(ss));
  }
  ASSERT_OK(mgpu_channel_close(ch));
  size_t got = 0;
  ASSERT_ERR(MGPU_ERANGE, mgpu_channel_recv(ch, out, (size_t)MSG * COUNT - 1, &got, ds));
  ASSERT_EQ(got, 0);
  size_t offset = 0;
  int received = 0, rc;
  while ((rc = mgpu_channel_recv(ch, out, offset, &got, ds)) == 0) {
    ASSERT_EQ(got, MSG);
    offset += got;
    received++;
  }
  ASSERT_EQ(rc, MGPU_ECLOSED);
  ASSERT_DETAIL_HAS("closed");
  ASSERT_EQ(received, COUNT);
  ASSERT_EQ(offset, (size_t)MSG * COUNT);
  unsigned char back[MSG * COUNT];
  ASSERT_OK(mgpu_memcpy_dtoh_async(back, out, 0, sizeof back, ds));
  ASSERT_OK(mgpu_stream_synchronize(ds));
  for (int i = 0; i < MSG * COUNT; i++) ASSERT_EQ(back[i], 'a' + i / MSG);
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(out));
  ASSERT_OK(mgpu_stream_destroy(ss));
  ASSERT_OK(mgpu_stream_destroy(ds));
  ASSERT_OK(mgpu_channel_destroy(ch));
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* Channels copy through the copy layer: a pair whose peer access the user
 * turned off sends host-staged, and direct again once it is back on. The
 * messages arrive whole either way (the receiver checks each one). */
TEST_IMPL(peer_disabled) {
  test_init();
  int a = 0, b = peer_of(0);
  if (b == a) return TEST_SKIP;
  ASSERT_OK(mgpu_peer_disable(a, b));
  ASSERT_OK(mgpu_metrics_reset());
  run_channel(a, b, 256, 4, 1, 1, 20);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[a].copies_peer_staged, 20);
  ASSERT_EQ(m.dev[a].copies_peer_direct, 0);
  ASSERT_EQ(m.dev[a].chan_msgs_sent, 20);

  mgpu_copy_path path;
  ASSERT_OK(mgpu_peer_enable(a, b));
  ASSERT_OK(mgpu_copy_path_get(a, b, &path));
  ASSERT_OK(mgpu_metrics_reset());
  run_channel(a, b, 256, 4, 1, 1, 20);
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[a].copies_peer_staged, path == MGPU_PATH_STAGED ? 20 : 0);
  ASSERT_EQ(m.dev[a].copies_peer_direct, path == MGPU_PATH_DIRECT ? 20 : 0);
  return 0;
}

/* A send that took its turn before a close publishes its message after
 * it: the receive gets that message, not MGPU_ECLOSED (which stranded a
 * message whose send returned 0), and only the next one is MGPU_ECLOSED.
 * The stall point chan_send_inside holds the sender inside for 200 ms. */
TEST_IMPL(close_while_sending) {
  test_init();
  int a = 0, b = peer_of(0);
  blocked_call arg = {NULL, NULL, NULL, 0, -1, 0, 0};
  mgpu_stream *sb;
  mgpu_buffer *dst;
  ASSERT_OK(mgpu_channel_create(a, b, sizeof(int64_t), 1, &arg.ch));
  ASSERT_OK(mgpu_stream_create(&arg.s, a));
  ASSERT_OK(mgpu_stream_create(&sb, b));
  ASSERT_OK(mgpu_malloc(&arg.buf, a, sizeof(int64_t)));
  ASSERT_OK(mgpu_malloc(&dst, b, sizeof(int64_t)));
  int64_t v = 42, got = 0;
  ASSERT_OK(mgpu_memcpy_htod(arg.buf, 0, &v, sizeof v));
  ASSERT_OK(mgpu__fault_set("stall:chan_send_inside@us:200000", NULL, 0));
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, send_one, &arg) == 0);
  /* Bounded: a send that failed before it went inside never stalls. */
  for (int i = 0; i < 10000 && mgpu__fault_stalls() == 0; i++) usleep(1000);
  if (mgpu__fault_stalls() == 0) {
    pthread_join(t, NULL);
    fprintf(stderr, "the send never went inside the channel: it returned "
            "%s\n", mgpu_err_name(arg.rc));
    abort();
  }
  ASSERT_OK(mgpu_channel_close(arg.ch));
  size_t len = 0;
  ASSERT_OK(mgpu_channel_recv(arg.ch, dst, 0, &len, sb));
  ASSERT_EQ(len, sizeof v);
  pthread_join(t, NULL);
  ASSERT_OK(arg.rc);
  ASSERT_OK(mgpu_stream_synchronize(arg.s));
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(mgpu_stream_synchronize(sb));
  ASSERT_OK(mgpu_memcpy_dtoh(&got, dst, 0, sizeof got));
  ASSERT_EQ(got, 42);
  ASSERT_ERR(MGPU_ECLOSED, mgpu_channel_recv(arg.ch, dst, 0, &len, sb));
  ASSERT_OK(mgpu_channel_destroy(arg.ch));
  ASSERT_OK(mgpu_free(arg.buf));
  ASSERT_OK(mgpu_free(dst));
  ASSERT_OK(mgpu_stream_destroy(arg.s));
  ASSERT_OK(mgpu_stream_destroy(sb));
  return 0;
}

/* Starts the receive o on thread *t and waits until it stands at its
 * offer, held there stall_us by the stall point chan_offered. */
static void recv_at_offer(blocked_call *o, int stall_us, pthread_t *t) {
  char spec[64];
  snprintf(spec, sizeof spec, "stall:chan_offered@us:%d", stall_us);
  ASSERT_OK(mgpu__fault_set(spec, NULL, 0));
  ASSERT(pthread_create(t, NULL, recv_one, o) == 0);
  for (int i = 0; i < 10000 && mgpu__fault_stalls() == 0; i++) usleep(1000);
  ASSERT(mgpu__fault_stalls() == 1);
}

/* A receive that waits offers its buffer, and the send writes the message
 * there: once, counted as the sender's copy only, into the offered range
 * alone, and in the order of the receiver's stream (a copy queued there
 * by another thread while the receive waits sees the message). The stall
 * point chan_offered holds the receiver with its offer standing. */
TEST_IMPL(offered_buffer) {
  test_init();
  int a = 0, b = peer_of(0);
  if (!test_device_is_host(a) || !test_device_is_host(b)) {
    fprintf(stderr, "skipped: the offer is the host devices' small path\n");
    return 0;
  }
  enum { MSG = 4096, LEN = 1000 };
  blocked_call o = {NULL, NULL, NULL, 0, -1, 8, 0};
  mgpu_stream *sa;
  mgpu_buffer *src;
  ASSERT_OK(mgpu_channel_create(a, b, MSG, 1, &o.ch));
  ASSERT_OK(mgpu_stream_create(&sa, a));
  ASSERT_OK(mgpu_stream_create(&o.s, b));
  ASSERT_OK(mgpu_malloc(&src, a, MSG));
  ASSERT_OK(mgpu_malloc(&o.buf, b, MSG + 16));
  unsigned char *msg = malloc(MSG), *got = malloc(MSG + 16);
  unsigned char *seen = malloc(LEN);
  for (int i = 0; i < MSG; i++) msg[i] = (unsigned char)(i * 7 + 3);
  ASSERT_OK(mgpu_memcpy_htod(src, 0, msg, MSG));
  ASSERT_OK(mgpu_memset_async(o.buf, 0, 0xee, MSG + 16, o.s));
  ASSERT_OK(mgpu_stream_synchronize(o.s));
  ASSERT_OK(mgpu_metrics_reset());
  pthread_t t;
  recv_at_offer(&o, 200000, &t);
  /* Queued after the receive began: runs after the message landed. */
  memset(seen, 0, LEN);
  ASSERT_OK(mgpu_memcpy_dtoh_async(seen, o.buf, 8, LEN, o.s));
  usleep(20000); /* time for the copy to run, were the stream free */
  ASSERT_OK(mgpu_channel_send(o.ch, src, 0, LEN, sa));
  pthread_join(t, NULL);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(o.rc);
  ASSERT_EQ(o.len, (size_t)LEN);
  ASSERT_OK(mgpu_stream_synchronize(o.s));
  ASSERT(memcmp(seen, msg, LEN) == 0);
  ASSERT_OK(mgpu_memcpy_dtoh(got, o.buf, 0, MSG + 16));
  ASSERT(memcmp(got + 8, msg, LEN) == 0);
  for (int i = 0; i < MSG + 16; i++)
    if (i < 8 || i >= 8 + LEN) ASSERT_EQ(got[i], 0xee);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  /* One copy, the sender's; the receive copied nothing. */
  ASSERT_EQ(m.dev[a].copies_peer_direct + m.dev[a].copies_d2d, 1);
  if (a != b) ASSERT_EQ(m.dev[b].copies_d2d, 0);
  ASSERT_EQ(m.dev[a].chan_msgs_sent, 1);
  ASSERT_EQ(m.dev[b].chan_msgs_received, 1);
  /* The next message, with no offer standing (the receive comes after
   * the send), goes through the slot as before. */
  ASSERT_OK(mgpu_channel_send(o.ch, src, 100, LEN, sa));
  ASSERT_OK(mgpu_stream_synchronize(sa));
  ASSERT_OK(mgpu_channel_recv(o.ch, o.buf, 8, &o.len, o.s));
  ASSERT_OK(mgpu_memcpy_dtoh(got, o.buf, 0, MSG + 16));
  ASSERT(memcmp(got + 8, msg + 100, LEN) == 0);
  free(msg);
  free(got);
  free(seen);
  ASSERT_OK(mgpu_channel_destroy(o.ch));
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_free(o.buf));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(o.s));
  return 0;
}

/* A channel from a device to itself may send bytes of a buffer into an
 * offered range of the same buffer: the message arrives as it was sent,
 * though the two ranges overlap. */
TEST_IMPL(offered_overlap) {
  test_init();
  if (!test_device_is_host(0)) {
    fprintf(stderr, "skipped: the offer is the host devices' small path\n");
    return 0;
  }
  enum { MSG = 1024, LEN = 1000, SIZE = 2048 };
  blocked_call o = {NULL, NULL, NULL, 0, -1, 8, 0};
  mgpu_stream *sa;
  ASSERT_OK(mgpu_channel_create(0, 0, MSG, 1, &o.ch));
  ASSERT_OK(mgpu_stream_create(&sa, 0));
  ASSERT_OK(mgpu_stream_create(&o.s, 0));
  ASSERT_OK(mgpu_malloc(&o.buf, 0, SIZE));
  unsigned char *was = malloc(SIZE), *got = malloc(SIZE);
  for (int i = 0; i < SIZE; i++) was[i] = (unsigned char)(i * 13 + 5);
  ASSERT_OK(mgpu_memcpy_htod(o.buf, 0, was, SIZE));
  /* The receive lands at offset 8 (o.offset), above the bytes that
   * the send reads, [0, LEN): a forward copy would read bytes it wrote. */
  ASSERT_OK(mgpu_metrics_reset());
  pthread_t t;
  recv_at_offer(&o, 100000, &t);
  ASSERT_OK(mgpu_channel_send(o.ch, o.buf, 0, LEN, sa));
  pthread_join(t, NULL);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(o.rc);
  ASSERT_EQ(o.len, (size_t)LEN);
  ASSERT_OK(mgpu_memcpy_dtoh(got, o.buf, 0, SIZE));
  ASSERT(memcmp(got + 8, was, LEN) == 0);
  mgpu_metrics m = {.size = sizeof m};
  ASSERT_OK(mgpu_metrics_snapshot(&m));
  ASSERT_EQ(m.dev[0].copies_d2d, 1); /* the send's, into the offer */
  ASSERT(memcmp(got, was, 8) == 0);
  ASSERT(memcmp(got + 8 + LEN, was + 8 + LEN, SIZE - 8 - LEN) == 0);
  free(was);
  free(got);
  ASSERT_OK(mgpu_channel_destroy(o.ch));
  ASSERT_OK(mgpu_free(o.buf));
  ASSERT_OK(mgpu_stream_destroy(sa));
  ASSERT_OK(mgpu_stream_destroy(o.s));
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(basic)
TEST_ENTRY(peer_disabled)
TEST_ENTRY(stream_order)
TEST_ENTRY(mixed_paths)
TEST_ENTRY(full_and_close)
TEST_ENTRY(close_wakes_receiver)
TEST_ENTRY(errors)
TEST_ENTRY(stress)
TEST_ENTRY(recv_loop_ends_closed)
TEST_ENTRY(close_while_sending)
TEST_ENTRY(offered_buffer)
TEST_ENTRY(offered_overlap)
TEST_LIST_END
