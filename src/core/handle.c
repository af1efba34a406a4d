/* The handle table: every public handle (the kinds of MGPU__HANDLE_TYPES,
 * core/internal.h) is a slot number plus a generation; one lookup for all.
 *
 * A handle is ((generation << 40) | (type << 32) | (slot + 1)). Releasing a
 * handle bumps its slot's generation, so a stale handle never matches again,
 * even after the slot is reused: a use after free is reported, not followed.
 * Slots live in fixed chunks that are never moved or freed, so the table
 * itself outlives mgpu_shutdown and a handle kept across a re-init is still
 * recognized as stale.
 *
 * table_lock serializes handing out and releasing slots (free_head, the
 * chunks' allocation, a slot's next_free). Lookups take no lock: a slot's
 * tag (generation, type, live bit) and object are atomics; new publishes
 * the object before the tag, release kills the tag before it clears the
 * object, and a lookup reads the tag, the object, then the tag again and
 * trusts the object only if the tag was live and unchanged. Every call
 * looks up several handles, and the lock was most of a small collective's
 * cost. (As before, the caller must not race its own release of a handle
 * against a use of it: the table tells stale from live, it does not keep an
 * object alive.) */
#include <stdatomic.h>
#include <stdlib.h>

#include "core/internal.h"

#define CHUNK_SLOTS 4096u
#define MAX_CHUNKS 1024u
#define GEN_MASK 0xffffffu

/* A slot's tag: generation << 9 | type << 1 | live. */
#define TAG(gen, type, live) \
  (((uint64_t)(gen) << 9) | ((uint64_t)(type) << 1) | (uint64_t)(live))

typedef struct slot {
  _Atomic(void *) obj;    /* NULL when free */
  _Atomic uint64_t tag;   /* generation (bumped on release), type, live */
  uint32_t next_free;     /* table_lock */
} slot;

static mgpu__mutex table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(slot *) chunks[MAX_CHUNKS];
static _Atomic uint32_t nslots;  /* slots handed out at least once */
static uint32_t free_head = ~0u; /* index of the first free slot (lock) */

static slot *slot_at(uint32_t i) {
  return &atomic_load_explicit(&chunks[i / CHUNK_SLOTS],
                               memory_order_acquire)[i % CHUNK_SLOTS];
}

static uint32_t tag_gen(uint64_t tag) { return (uint32_t)(tag >> 9); }

uintptr_t mgpu__handle_new(mgpu__htype type, void *obj) {
  uintptr_t h = 0;
  mgpu__mutex_lock(&table_lock);
  uint32_t i;
  int fresh = 0;
  if (free_head != ~0u) {
    i = free_head;
    free_head = slot_at(i)->next_free;
  } else {
    uint32_t n = atomic_load_explicit(&nslots, memory_order_relaxed);
    if (n == CHUNK_SLOTS * MAX_CHUNKS) goto out;
    if (atomic_load_explicit(&chunks[n / CHUNK_SLOTS], memory_order_relaxed) ==
        NULL) {
      slot *c = calloc(CHUNK_SLOTS, sizeof(slot));
      if (c == NULL) goto out;
      atomic_store_explicit(&chunks[n / CHUNK_SLOTS], c, memory_order_release);
    }
    i = n;
    fresh = 1;
  }
  slot *s = slot_at(i);
  uint32_t gen = tag_gen(atomic_load_explicit(&s->tag, memory_order_relaxed));
  atomic_store_explicit(&s->obj, obj, memory_order_relaxed);
  atomic_store_explicit(&s->tag, TAG(gen, type, 1), memory_order_release);
  if (fresh) atomic_store_explicit(&nslots, i + 1, memory_order_release);
  h = ((uintptr_t)gen << 40) | ((uintptr_t)type << 32) | (uintptr_t)(i + 1);
out:
  mgpu__mutex_unlock(&table_lock);
  return h;
}

/* The slot of h, whatever its state; NULL (and *err) when h cannot name a
 * slot of this type. */
static slot *lookup(uintptr_t h, mgpu__htype type, int *err) {
  uint32_t i = (uint32_t)(h & 0xffffffffu);
  uint32_t t = (uint32_t)((h >> 32) & 0xffu);
  if (h == 0 || t != (uint32_t)type || i == 0 ||
      i > atomic_load_explicit(&nslots, memory_order_acquire)) {
    *err = MGPU_EBADHANDLE;
    return NULL;
  }
  return slot_at(i - 1);
}

/* The live tag h must find in its slot. */
static uint64_t live_tag(uintptr_t h, mgpu__htype type) {
  return TAG((uint32_t)((h >> 40) & GEN_MASK), type, 1);
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
  if (h == 0)
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: NULL %s handle", what, word);
  else if (code == MGPU_EFREED)
    *err = mgpu__error(MGPU_EFREED, "%s: %s %p was already %s", what, word,
                       (void *)h, type_gone[type]);
  else
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: %p is not a valid %s handle",
                       what, (void *)h, word);
  return NULL;
}

void *mgpu__handle_get(uintptr_t h, mgpu__htype type, const char *what,
                       int *err) {
  int code = 0;
  slot *s = lookup(h, type, &code);
  void *obj = NULL;
  if (s != NULL) {
    uint64_t want = live_tag(h, type);
    if (atomic_load_explicit(&s->tag, memory_order_acquire) == want) {
      obj = atomic_load_explicit(&s->obj, memory_order_acquire);
      if (atomic_load_explicit(&s->tag, memory_order_acquire) != want)
        obj = NULL;
    }
    if (obj == NULL) code = MGPU_EFREED;
  }
  return obj != NULL ? obj : failed(code, h, type, what, err);
}

void *mgpu__handle_release(uintptr_t h, mgpu__htype type, const char *what,
                           int *err) {
  int code = 0;
  mgpu__mutex_lock(&table_lock);
  slot *s = lookup(h, type, &code);
  void *obj = NULL;
  if (s != NULL) {
    uint64_t want = live_tag(h, type);
    uint32_t gen = tag_gen(want);
    if (atomic_load_explicit(&s->tag, memory_order_relaxed) == want) {
      /* Dead first, so a lookup that read the object sees the change. */
      atomic_store_explicit(&s->tag, TAG((gen + 1) & GEN_MASK, 0, 0),
                            memory_order_release);
      obj = atomic_load_explicit(&s->obj, memory_order_relaxed);
      atomic_store_explicit(&s->obj, NULL, memory_order_release);
      uint32_t i = (uint32_t)(h & 0xffffffffu) - 1;
      s->next_free = free_head;
      free_head = i;
    }
    if (obj == NULL) code = MGPU_EFREED;
  }
  mgpu__mutex_unlock(&table_lock);
  return obj != NULL ? obj : failed(code, h, type, what, err);
}

void mgpu__handle_foreach(mgpu__htype type, void (*fn)(void *obj, void *arg),
                          void *arg) {
  /* Collect first, then call without the lock: fn releases handles. */
  for (;;) {
    void *obj = NULL;
    mgpu__mutex_lock(&table_lock);
    uint32_t n = atomic_load_explicit(&nslots, memory_order_relaxed);
    for (uint32_t i = 0; i < n && obj == NULL; i++) {
      slot *s = slot_at(i);
      uint64_t tag = atomic_load_explicit(&s->tag, memory_order_relaxed);
      if ((tag & 1) && ((tag >> 1) & 0xffu) == (uint64_t)type)
        obj = atomic_load_explicit(&s->obj, memory_order_relaxed);
    }
    mgpu__mutex_unlock(&table_lock);
    if (obj == NULL) return;
    fn(obj, arg); /* must release the object's handle */
  }
}


