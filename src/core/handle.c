/* The handle table: every public handle (the kinds of MGPU__HANDLE_TYPES,
 * core/core-internal.h) is a slot number plus a generation; one lookup for all.
 *
 * A handle is ((generation << 40) | (type << 32) | (slot + 1)). Each slot
 * has one atomic state word: its generation, a LIVE bit, a CLOSING bit and
 * the count of users, the calls that looked the handle up and have not put
 * it back yet. A lookup is a load, a check (type, generation, live, not
 * closing) and a compare-and-swap that adds a user: no lock, so the task
 * pool's submit goes through it too. Putting the handle back subtracts the
 * user.
 *
 * Destroying is two steps. Closing sets CLOSING, so every later lookup is
 * MGPU_EFREED while the calls already inside go on; a second close is
 * MGPU_EFREED too. Retiring then waits until the last user has put the handle
 * back (close_cond; only a put that leaves a closing slot empty takes
 * close_lock), bumps the generation and frees the slot. In between, the
 * destroy call wakes what its calls may be waiting on (a barrier, a channel),
 * so the users leave. A destroy therefore never frees under a caller.
 *
 * Pins are the cheap form of a use for a thread that looks up several
 * handles at once and gives them all back together (a collective's
 * communicator, stream and buffers; a channel call's channel, buffer and
 * stream; a barrier wait's barrier, whose slot word both parties would
 * otherwise write). The thread writes the handles into its
 * own pin record (plain stores to its own cache lines), publishes them with
 * one exchange of the record's count, then checks each slot's state: no
 * compare-and-swap on the slots' shared words, one exchange per batch
 * instead of two atomic operations per handle. A closer sets CLOSING first
 * and then looks for the handle in every record; the two sides' sequentially
 * consistent operations (the publish and the check, the CLOSING and the
 * scan) make sure that either the pinning thread sees CLOSING and fails, or
 * the closer sees the pin and retire waits for it, as for a use. A thread
 * gives its pins back with another exchange, then, if a retire is looking
 * for pins at all (pin_closers), wakes it for any slot it pinned that is
 * closing.
 *
 * A slot whose generation would wrap is retired for good instead of being
 * reused, so a handle freed 2^24 reuses ago never matches a live one.
 *
 * Slots live in fixed chunks that are never moved or freed, so the table
 * itself outlives mgpu_shutdown and a handle kept across a re-init is still
 * recognized as stale.
 *
 * table_lock guards the free list, next_free and the growth of the table
 * (chunks, nslots are written under it, read without it: atomics). A slot's
 * obj and type are written before the state word publishes LIVE (release),
 * and read after a lookup's CAS (acquire). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-internal.h"
#include "util/fault.h"

#define CHUNK_SLOTS 4096u
#define MAX_CHUNKS 1024u
#define GEN_MASK 0xffffffu

/* The state word of a slot. */
#define ST_USERS 0x3fffffffu     /* calls inside */
#define ST_CLOSING (1ull << 30)  /* closed: lookups fail, users leave */
#define ST_LIVE (1ull << 31)     /* holds an object */
#define ST_GEN(st) ((uint32_t)((st) >> 32) & GEN_MASK)

/* A slot is a cache line of its own: every use writes its state word (a
 * compare-and-swap, and a subtraction to put it back), and two handles
 * used by two threads (each its own stream, say) sharing a line would
 * move it between their cores at every call. */
typedef struct slot {
  _Alignas(64) _Atomic uint64_t state;
  void *obj;
  _Atomic uint8_t type; /* mgpu__htype of the live object */
  uint32_t next_free; /* table_lock */
} slot;

/* One thread's pins. count and the entries are written by the owning thread
 * only, read by closers scanning for a handle. */
#define PIN_RECORDS 256
#define PIN_ENTRIES 62
typedef struct pin_record {
  _Alignas(64) _Atomic int count;  /* entries [0, count) are pinned */
  _Atomic int taken;               /* a thread owns the record */
  _Atomic uintptr_t entry[PIN_ENTRIES];
} pin_record;

static pin_record pin_records[PIN_RECORDS];
static _Atomic int pin_nrecords; /* records ever taken: the scan's bound */
/* Retires looking for pins now: an unpin wakes closers only then. */
static _Atomic int pin_closers;

static mgpu__mutex table_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_HANDLE_TABLE);
static mgpu__mutex close_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_HANDLE_CLOSE);
static mgpu__cond close_cond = PTHREAD_COND_INITIALIZER;
static _Atomic(slot *) chunks[MAX_CHUNKS];
static _Atomic uint32_t nslots;  /* slots handed out at least once */
static uint32_t free_head = ~0u; /* index of the first free slot */

static slot *slot_at(uint32_t i) {
  slot *c = atomic_load_explicit(&chunks[i / CHUNK_SLOTS], memory_order_acquire);
  return &c[i % CHUNK_SLOTS];
}

static uint32_t slot_index(uintptr_t h) {
  return (uint32_t)(h & 0xffffffffu);
}

uintptr_t mgpu__handle_new(mgpu__htype type, void *obj) {
  uintptr_t h = 0;
  mgpu__mutex_lock(&table_lock);
  uint32_t i;
  uint32_t n = atomic_load_explicit(&nslots, memory_order_relaxed);
  if (free_head != ~0u) {
    i = free_head;
    free_head = slot_at(i)->next_free;
  } else {
    if (n == CHUNK_SLOTS * MAX_CHUNKS) goto out;
    if (atomic_load_explicit(&chunks[n / CHUNK_SLOTS],
                             memory_order_relaxed) == NULL) {
      slot *c = mgpu__aligned_alloc(64, CHUNK_SLOTS * sizeof(slot));
      if (c == NULL) goto out;
      memset(c, 0, CHUNK_SLOTS * sizeof(slot));
      atomic_store_explicit(&chunks[n / CHUNK_SLOTS], c, memory_order_release);
    }
    i = n;
    atomic_store_explicit(&nslots, n + 1, memory_order_release);
  }
  slot *s = slot_at(i);
  uint64_t gen = ST_GEN(atomic_load_explicit(&s->state, memory_order_relaxed));
  s->obj = obj;
  atomic_store_explicit(&s->type, (uint8_t)type, memory_order_relaxed);
  atomic_store_explicit(&s->state, gen << 32 | ST_LIVE, memory_order_release);
  h = ((uintptr_t)gen << 40) | ((uintptr_t)type << 32) | (uintptr_t)(i + 1);
out:
  mgpu__mutex_unlock(&table_lock);
  return h;
}

/* The slot of a handle of the type, or NULL with *code MGPU_EBADHANDLE. */
static slot *slot_of(uintptr_t h, mgpu__htype type, int *code) {
  uint32_t i = slot_index(h);
  uint32_t t = (uint32_t)((h >> 32) & 0xffu);
  if (h == 0 || t != (uint32_t)type || i == 0 ||
      i > atomic_load_explicit(&nslots, memory_order_acquire)) {
    *code = MGPU_EBADHANDLE;
    return NULL;
  }
  return slot_at(i - 1);
}

/* 0 when state st is the live, open object of handle h of the type, else
 * the code. A type that differs is a forged handle: right slot, wrong type
 * bits (the slot's type is stable while its generation is). */
static int open_code(const slot *s, uint64_t st, uintptr_t h,
                     mgpu__htype type) {
  if (!(st & ST_LIVE) || (st & ST_CLOSING) ||
      ST_GEN(st) != (uint32_t)((h >> 40) & GEN_MASK))
    return MGPU_EFREED;
  if (atomic_load_explicit(&s->type, memory_order_relaxed) != (uint8_t)type)
    return MGPU_EBADHANDLE;
  return 0;
}

static const char *const type_word[MGPU__H_COUNT] = {
#define MGPU__HTYPE_WORD(name, word, gone) [MGPU__H_##name] = word,
    MGPU__HANDLE_TYPES(MGPU__HTYPE_WORD)
#undef MGPU__HTYPE_WORD
};
static const char *const type_gone[MGPU__H_COUNT] = {
#define MGPU__HTYPE_GONE(name, word, gone) [MGPU__H_##name] = gone,
    MGPU__HANDLE_TYPES(MGPU__HTYPE_GONE)
#undef MGPU__HTYPE_GONE
};

/* Writes the detail of a failed lookup; returns NULL. */
static void *failed(int code, uintptr_t h, mgpu__htype type, const char *what,
                    int *err) {
  const char *word = type_word[type];
  if (code == MGPU_EFORK) /* the detail says why (util/error.c) */
    *err = mgpu__error(MGPU_EFORK, "%s", what);
  else if (h == 0)
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: NULL %s handle", what, word);
  else if (code == MGPU_EFREED)
    *err = mgpu__error(MGPU_EFREED, "%s: %s %p was already %s", what, word,
                       (void *)h, type_gone[type]);
  else if (code == MGPU_EAGAIN)
    *err = mgpu__error(MGPU_EAGAIN, "%s: %s %p has too many calls inside",
                       what, word, (void *)h);
  else
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: %p is not a valid %s handle",
                       what, (void *)h, word);
  return NULL;
}

/* The handles the calling thread lent itself (mgpu__handle_lend). */
static _Thread_local struct {
  int n;
  uintptr_t h[MGPU__LEND_MAX];
} lent;

void mgpu__handle_lend(const uintptr_t *h, int k) {
  lent.n = 0;
  for (int i = 0; i < k && lent.n < MGPU__LEND_MAX; i++)
    if (h[i] != 0) lent.h[lent.n++] = h[i];
}

void mgpu__handle_lend_end(void) { lent.n = 0; }

static int is_lent(uintptr_t h) {
  for (int i = 0; i < lent.n; i++)
    if (lent.h[i] == h) return 1;
  return 0;
}

/* Takes a use of an open handle; NULL with *code otherwise. A handle the
 * thread lent itself may be closing: its holders keep it from retiring
 * while the thread acts for them, and the use taken here does too. */
static void *hold(uintptr_t h, mgpu__htype type, int *code) {
  /* In a child forked after mgpu_init the objects' threads are in the
   * parent: every handle is refused there. */
  if (mgpu__forked_from()) {
    *code = MGPU_EFORK;
    return NULL;
  }
  slot *s = slot_of(h, type, code);
  if (s == NULL) return NULL;
  uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  do {
    /* CLOSING first: the thread-local look only when it is set (rare). */
    uint64_t seen = (st & ST_CLOSING) && lent.n > 0 && is_lent(h)
                        ? st & ~ST_CLOSING
                        : st;
    if ((*code = open_code(s, seen, h, type)) != 0) return NULL;
    if ((st & ST_USERS) == ST_USERS) {
      *code = MGPU_EAGAIN;
      return NULL;
    }
  } while (!atomic_compare_exchange_weak_explicit(
      &s->state, &st, st + 1, memory_order_acquire, memory_order_acquire));
  return s->obj;
}

void *mgpu__handle_get(uintptr_t h, mgpu__htype type, const char *what,
                       int *err) {
  int code = 0;
  void *obj = hold(h, type, &code);
  return obj != NULL ? obj : failed(code, h, type, what, err);
}

void *mgpu__handle_hold(uintptr_t h, mgpu__htype type) {
  int code = 0;
  return hold(h, type, &code);
}

void mgpu__handle_put(uintptr_t h) {
  if (h == 0) return;
  slot *s = slot_at(slot_index(h) - 1);
  uint64_t st = atomic_fetch_sub_explicit(&s->state, 1, memory_order_release);
  if ((st & ST_CLOSING) && (st & ST_USERS) == 1) {
    /* The last user of a closing slot: wake the retire waiting for it. */
    mgpu__mutex_lock(&close_lock);
    mgpu__cond_broadcast(&close_cond);
    mgpu__mutex_unlock(&close_lock);
  }
}

/* ---- pins ---- */

/* How many pins of h all threads hold now. Sequentially consistent loads:
 * see the top of the file. */
static int pins_of(uintptr_t h) {
  int n = 0, nrec = atomic_load(&pin_nrecords);
  for (int r = 0; r < nrec; r++) {
    pin_record *rec = &pin_records[r];
    int count = atomic_load(&rec->count);
    for (int k = 0; k < count && k < PIN_ENTRIES; k++)
      n += atomic_load_explicit(&rec->entry[k], memory_order_relaxed) == h;
  }
  return n;
}

/* The calling thread's record, taken on its first pin and given back when
 * it exits (a key's destructor); NULL when every record is taken. */
static _Thread_local pin_record *my_pins;
static pthread_once_t pin_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t pin_key;
static int pin_key_ok;

static void pin_record_free(void *arg) {
  pin_record *rec = arg;
  atomic_store_explicit(&rec->taken, 0, memory_order_release);
}

static void pin_key_make(void) {
  pin_key_ok = pthread_key_create(&pin_key, pin_record_free) == 0;
}

static pin_record *pin_record_get(void) {
  if (my_pins != NULL) return my_pins;
  pthread_once(&pin_key_once, pin_key_make);
  if (!pin_key_ok) return NULL;
  for (int r = 0; r < PIN_RECORDS; r++) {
    int free_ = 0;
    if (atomic_compare_exchange_strong(&pin_records[r].taken, &free_, 1)) {
      if (pthread_setspecific(pin_key, &pin_records[r]) != 0) {
        atomic_store(&pin_records[r].taken, 0);
        return NULL;
      }
      int n = atomic_load(&pin_nrecords);
      while (n < r + 1 &&
             !atomic_compare_exchange_weak(&pin_nrecords, &n, r + 1))
        continue;
      return my_pins = &pin_records[r];
    }
  }
  return NULL;
}

int mgpu__handle_pin(const uintptr_t *h, int k) {
  /* In a forked child the lookups say why (mgpu__handle_get). */
  if (mgpu__forked_from()) return -1;
  pin_record *rec = pin_record_get();
  if (rec == NULL) return -1;
  int mark = atomic_load_explicit(&rec->count, memory_order_relaxed);
  if (k > PIN_ENTRIES - mark) return -1;
  for (int i = 0; i < k; i++)
    atomic_store_explicit(&rec->entry[mark + i], h[i], memory_order_relaxed);
  atomic_exchange(&rec->count, mark + k); /* publish, before any check */
  return mark;
}

void *mgpu__handle_pinned(uintptr_t h, mgpu__htype type, const char *what,
                          int *err) {
  int code = 0; /* not forked: mgpu__handle_pin refuses to pin there */
  slot *s = slot_of(h, type, &code);
  if (s == NULL) return failed(code, h, type, what, err);
  uint64_t st = atomic_load(&s->state); /* after the publish: see the top */
  if ((code = open_code(s, st, h, type)) != 0)
    return failed(code, h, type, what, err);
  return s->obj;
}

void mgpu__handle_unpin(int mark) {
  pin_record *rec = my_pins;
  if (mark < 0 || rec == NULL) return;
  int count = atomic_load_explicit(&rec->count, memory_order_relaxed);
  if (mark >= count) return;
  atomic_exchange(&rec->count, mark);
  /* Nobody retiring: nobody waits for these pins. (Sequentially consistent:
   * a retire that counts itself after this load looks for pins after the
   * exchange above, and does not see them.) */
  if (atomic_load(&pin_closers) == 0) return;
  /* A closer that saw one of these pins waits for it: wake it. */
  for (int k = mark; k < count; k++) {
    uintptr_t h = atomic_load_explicit(&rec->entry[k], memory_order_relaxed);
    uint32_t i = slot_index(h);
    if (h == 0 || i == 0 || i > atomic_load(&nslots)) continue;
    if (atomic_load(&slot_at(i - 1)->state) & ST_CLOSING) {
      mgpu__mutex_lock(&close_lock);
      mgpu__cond_broadcast(&close_cond);
      mgpu__mutex_unlock(&close_lock);
      break;
    }
  }
}

/* Sets CLOSING on an open slot; returns it, or NULL with *code. */
static slot *close_slot(uintptr_t h, mgpu__htype type, int *code) {
  if (mgpu__forked_from()) {
    *code = MGPU_EFORK;
    return NULL;
  }
  slot *s = slot_of(h, type, code);
  if (s == NULL) return NULL;
  uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  do {
    if ((*code = open_code(s, st, h, type)) != 0) return NULL;
  } while (!atomic_compare_exchange_weak_explicit(&s->state, &st,
                                                  st | ST_CLOSING,
                                                  memory_order_seq_cst,
                                                  memory_order_acquire));
  return s;
}

void *mgpu__handle_close(uintptr_t h, mgpu__htype type, const char *what,
                         int *err) {
  int code = 0;
  slot *s = close_slot(h, type, &code);
  return s != NULL ? s->obj : failed(code, h, type, what, err);
}

void mgpu__handle_retire(uintptr_t h) {
  if (h == 0) return;
  uint32_t i = slot_index(h) - 1;
  slot *s = slot_at(i);
  atomic_fetch_add(&pin_closers, 1); /* before the look for pins */
  if ((atomic_load_explicit(&s->state, memory_order_acquire) & ST_USERS) !=
          0 ||
      pins_of(h) != 0) {
    mgpu__mutex_lock(&close_lock);
    while ((atomic_load_explicit(&s->state, memory_order_acquire) &
            ST_USERS) != 0 ||
           pins_of(h) != 0)
      mgpu__cond_wait(&close_cond, &close_lock);
    mgpu__mutex_unlock(&close_lock);
  }
  atomic_fetch_sub(&pin_closers, 1);
  uint64_t gen = (ST_GEN(atomic_load_explicit(&s->state,
                                              memory_order_relaxed)) + 1) &
                 GEN_MASK;
  mgpu__mutex_lock(&table_lock);
  s->obj = NULL;
  if (gen == 0) {
    /* Every generation was used: keep the slot dead (the last generation,
     * not live), so no stale handle can ever match a new object. */
    atomic_store_explicit(&s->state, (uint64_t)GEN_MASK << 32,
                          memory_order_release);
  } else {
    atomic_store_explicit(&s->state, gen << 32, memory_order_release);
    s->next_free = free_head;
    free_head = i;
  }
  mgpu__mutex_unlock(&table_lock);
}

void *mgpu__handle_release(uintptr_t h, mgpu__htype type, const char *what,
                           int *err) {
  void *obj = mgpu__handle_close(h, type, what, err);
  if (obj != NULL) mgpu__handle_retire(h);
  return obj;
}

void mgpu__handle_foreach(mgpu__htype type, void (*fn)(void *obj, void *arg),
                          void *arg) {
  /* One pass: each live object of the type is closed here (a concurrent
   * destroy that closed it first owns it), then fn retires it. */
  uint32_t n = atomic_load_explicit(&nslots, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++) {
    slot *s = slot_at(i);
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (!(st & ST_LIVE) || (st & ST_CLOSING)) continue;
    uintptr_t h = ((uintptr_t)ST_GEN(st) << 40) | ((uintptr_t)type << 32) |
                  (uintptr_t)(i + 1);
    int code = 0;
    if (close_slot(h, type, &code) == NULL) continue;
    fn(s->obj, arg); /* must retire the object's handle */
  }
}

int mgpu__handle_closing(uintptr_t h) {
  uint32_t i = slot_index(h);
  if (h == 0) return 0; /* no handle: nothing to free */
  if (i == 0 || i > atomic_load_explicit(&nslots, memory_order_acquire))
    return 1;
  uint64_t st = atomic_load_explicit(&slot_at(i - 1)->state,
                                     memory_order_acquire);
  return !(st & ST_LIVE) || (st & ST_CLOSING) ||
         ST_GEN(st) != (uint32_t)((h >> 40) & GEN_MASK);
}

int mgpu__handle_users(uintptr_t h, mgpu__htype type) {
  int code = 0;
  slot *s = slot_of(h, type, &code);
  if (s == NULL) return -1;
  return (int)(atomic_load_explicit(&s->state, memory_order_acquire) &
               ST_USERS) +
         pins_of(h);
}
