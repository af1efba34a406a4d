/* The flight recorder (see flight.h): per device, a ring of
 * MGPU__FLIGHT_SLOTS slots and a count of the records ever made; record k
 * goes to slot k % MGPU__FLIGHT_SLOTS and carries sequence number k + 1. */
#include <stdatomic.h>
#include <stdio.h>

#include "mgpu/core.h"
#include "mgpu/error.h"
#include "mgpu/trace.h"
#include "obs/flight.h"
#include "util/log.h"
#include "util/thread.h"

typedef struct flight_slot {
  _Atomic uint64_t seq; /* k + 1 of the record in it; 0: never written */
  _Atomic(const char *) op;
  _Atomic uint64_t bytes;
  _Atomic uintptr_t stream;
  _Atomic uint64_t t_ns;
} flight_slot;

typedef struct flight_ring {
  _Atomic uint64_t count; /* records made */
  flight_slot slots[MGPU__FLIGHT_SLOTS];
} flight_ring;

static flight_ring rings[MGPU_MAX_DEVICES];

void mgpu__flight_record(int dev, const char *op, uint64_t bytes,
                         uintptr_t stream) {
  if (dev < 0 || dev >= MGPU_MAX_DEVICES) return;
  flight_ring *r = &rings[dev];
  uint64_t k = atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed);
  flight_slot *s = &r->slots[k % MGPU__FLIGHT_SLOTS];
  /* 0 first: a reader that sees the fields change under it also sees the
   * sequence number move and skips the slot. */
  atomic_store_explicit(&s->seq, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&s->op, op, memory_order_relaxed);
  atomic_store_explicit(&s->bytes, bytes, memory_order_relaxed);
  atomic_store_explicit(&s->stream, stream, memory_order_relaxed);
  atomic_store_explicit(&s->t_ns, mgpu__now_coarse_ns(), memory_order_relaxed);
  atomic_store_explicit(&s->seq, k + 1, memory_order_release);
}

/* Reads record k of ring r into the out fields; 0 when it is there whole. */
static int read_slot(flight_ring *r, uint64_t k, const char **op,
                     uint64_t *bytes, uintptr_t *stream, uint64_t *t_ns) {
  flight_slot *s = &r->slots[k % MGPU__FLIGHT_SLOTS];
  if (atomic_load_explicit(&s->seq, memory_order_acquire) != k + 1) return -1;
  *op = atomic_load_explicit(&s->op, memory_order_relaxed);
  *bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
  *stream = atomic_load_explicit(&s->stream, memory_order_relaxed);
  *t_ns = atomic_load_explicit(&s->t_ns, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&s->seq, memory_order_relaxed) == k + 1 ? 0
                                                                      : -1;
}

char *mgpu__flight_format(int dev, int n, char *out, size_t size) {
  size_t len = 0;
  out[0] = '\0';
  if (dev < 0 || dev >= MGPU_MAX_DEVICES || size == 0) return out;
  flight_ring *r = &rings[dev];
  uint64_t count = atomic_load_explicit(&r->count, memory_order_acquire);
  uint64_t now = mgpu__now_coarse_ns();
  int shown = 0;
  for (uint64_t k = count; k > 0 && shown < n &&
                           count - k < MGPU__FLIGHT_SLOTS && len + 1 < size;
       k--) {
    const char *op;
    uint64_t bytes, t_ns;
    uintptr_t stream;
    if (read_slot(r, k - 1, &op, &bytes, &stream, &t_ns) != 0) continue;
    double ago_ms = now > t_ns ? (double)(now - t_ns) / 1e6 : 0.0;
    char where[48] = "";
    if (stream != 0)
      snprintf(where, sizeof where, " stream %p", (void *)stream);
    int w = snprintf(out + len, size - len, "%s%s %llu B%s %.1f ms ago",
                     shown ? "; " : "", op, (unsigned long long)bytes, where,
                     ago_ms);
    if (w < 0) break;
    len += (size_t)w < size - len ? (size_t)w : size - len - 1;
    shown++;
  }
  if (shown == 0) snprintf(out, size, "no operation recorded");
  return out;
}

char *mgpu__flight_list(const int *devs, int n, char *out, size_t size) {
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n && len + 1 < size; i++) {
    char ops[256];
    mgpu__flight_format(devs[i], MGPU__FLIGHT_DETAIL, ops, sizeof ops);
    int w = snprintf(out + len, size - len, "%sdevice %d (last: %s)",
                     i ? ", " : "", devs[i], ops);
    if (w < 0) break;
    len += (size_t)w < size - len ? (size_t)w : size - len - 1;
  }
  return out;
}

void mgpu__flight_reset(void) {
  for (int d = 0; d < MGPU_MAX_DEVICES; d++) {
    atomic_store_explicit(&rings[d].count, 0, memory_order_relaxed);
    for (int i = 0; i < MGPU__FLIGHT_SLOTS; i++)
      atomic_store_explicit(&rings[d].slots[i].seq, 0, memory_order_relaxed);
  }
}

/* One device's ring, oldest first, one operation a line. */
static void dump_device(FILE *f, int dev, uint64_t now) {
  flight_ring *r = &rings[dev];
  uint64_t count = atomic_load_explicit(&r->count, memory_order_acquire);
  uint64_t first = count > MGPU__FLIGHT_SLOTS ? count - MGPU__FLIGHT_SLOTS : 0;
  fprintf(f, "device %d: %llu operation(s) recorded, the last %llu:\n", dev,
          (unsigned long long)count, (unsigned long long)(count - first));
  for (uint64_t k = first; k < count; k++) {
    const char *op;
    uint64_t bytes, t_ns;
    uintptr_t stream;
    if (read_slot(r, k, &op, &bytes, &stream, &t_ns) != 0) continue;
    double ago_ms = now > t_ns ? (double)(now - t_ns) / 1e6 : 0.0;
    fprintf(f, "  #%-8llu %-24s %12llu B  stream %-18p %10.3f ms ago\n",
            (unsigned long long)k, op, (unsigned long long)bytes,
            (void *)stream, ago_ms);
  }
}

int mgpu_flight_recorder_dump(FILE *f, int dev) {
  if (f == NULL)
    return mgpu__error(MGPU_EINVAL, "flight recorder: NULL file");
  if (dev < -1 || dev >= MGPU_MAX_DEVICES)
    return mgpu__error(MGPU_EINVAL, "flight recorder: device %d (expected -1 "
                       "for all, or 0 to %d)", dev, MGPU_MAX_DEVICES - 1);
  uint64_t now = mgpu__now_coarse_ns();
  for (int d = dev < 0 ? 0 : dev; d <= (dev < 0 ? MGPU_MAX_DEVICES - 1 : dev);
       d++)
    if (dev >= 0 || atomic_load_explicit(&rings[d].count,
                                         memory_order_relaxed) > 0)
      dump_device(f, d, now);
  if (ferror(f)) return mgpu__error(MGPU_EIO, "flight recorder: write failed");
  return 0;
}
