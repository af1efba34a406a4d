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
 * table_lock guards every field below. */
#include <stdlib.h>

#include "core/internal.h"
#include "util/fault.h"

#define CHUNK_SLOTS 4096u
#define MAX_CHUNKS 1024u
#define GEN_MASK 0xffffffu

typedef struct slot {
  void *obj;      /* NULL when free */
  uint32_t gen;   /* bumped on release */
  uint8_t type;   /* mgpu__htype of the live object */
  uint32_t next_free;
} slot;

static mgpu__mutex table_lock = PTHREAD_MUTEX_INITIALIZER;
static slot *chunks[MAX_CHUNKS];
static uint32_t nslots;          /* slots handed out at least once */
static uint32_t free_head = ~0u; /* index of the first free slot */

static slot *slot_at(uint32_t i) {
  return &chunks[i / CHUNK_SLOTS][i % CHUNK_SLOTS];
}

uintptr_t mgpu__handle_new(mgpu__htype type, void *obj) {
  uintptr_t h = 0;
  mgpu__mutex_lock(&table_lock);
  uint32_t i;
  if (free_head != ~0u) {
    i = free_head;
    free_head = slot_at(i)->next_free;
  } else {
    if (nslots == CHUNK_SLOTS * MAX_CHUNKS) goto out;
    if (chunks[nslots / CHUNK_SLOTS] == NULL) {
      chunks[nslots / CHUNK_SLOTS] = mgpu__calloc(CHUNK_SLOTS, sizeof(slot));
      if (chunks[nslots / CHUNK_SLOTS] == NULL) goto out;
    }
    i = nslots++;
  }
  slot *s = slot_at(i);
  s->obj = obj;
  s->type = (uint8_t)type;
  h = ((uintptr_t)s->gen << 40) | ((uintptr_t)type << 32) | (uintptr_t)(i + 1);
out:
  mgpu__mutex_unlock(&table_lock);
  return h;
}

/* Caller holds table_lock. */
static slot *lookup(uintptr_t h, mgpu__htype type, int *err) {
  uint32_t i = (uint32_t)(h & 0xffffffffu);
  uint32_t t = (uint32_t)((h >> 32) & 0xffu);
  uint32_t gen = (uint32_t)((h >> 40) & GEN_MASK);
  if (h == 0 || t != (uint32_t)type || i == 0 || i > nslots) {
    *err = MGPU_EBADHANDLE;
    return NULL;
  }
  slot *s = slot_at(i - 1);
  if (s->gen != gen || s->obj == NULL || s->type != type) {
    *err = MGPU_EFREED;
    return NULL;
  }
  return s;
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
  else
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: %p is not a valid %s handle",
                       what, (void *)h, word);
  return NULL;
}

void *mgpu__handle_get(uintptr_t h, mgpu__htype type, const char *what,
                       int *err) {
  int code = 0;
  /* In a child forked after mgpu_init the objects' threads are in the
   * parent: refuse before the lock (its holder may not exist here). */
  if (mgpu__forked_from()) return failed(MGPU_EFORK, h, type, what, err);
  mgpu__mutex_lock(&table_lock);
  slot *s = lookup(h, type, &code);
  void *obj = s ? s->obj : NULL;
  mgpu__mutex_unlock(&table_lock);
  return obj != NULL ? obj : failed(code, h, type, what, err);
}

void *mgpu__handle_release(uintptr_t h, mgpu__htype type, const char *what,
                           int *err) {
  int code = 0;
  if (mgpu__forked_from()) return failed(MGPU_EFORK, h, type, what, err);
  mgpu__mutex_lock(&table_lock);
  slot *s = lookup(h, type, &code);
  void *obj = NULL;
  if (s != NULL) {
    obj = s->obj;
    s->obj = NULL;
    s->gen = (s->gen + 1) & GEN_MASK;
    uint32_t i = (uint32_t)(h & 0xffffffffu) - 1;
    s->next_free = free_head;
    free_head = i;
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
    for (uint32_t i = 0; i < nslots && obj == NULL; i++) {
      slot *s = slot_at(i);
      if (s->obj != NULL && s->type == type) obj = s->obj;
    }
    mgpu__mutex_unlock(&table_lock);
    if (obj == NULL) return;
    fn(obj, arg); /* must release the object's handle */
  }
}


