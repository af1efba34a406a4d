/* The handle table of the coll and chan layers; see handles.h.
 *
 * Encoding: bits 0-3 the kind, bits 4-23 the slot, bits 24 and up the slot's
 * generation, which starts at 1 and grows on every release, so no live handle
 * is 0 and a stale one never matches a reused slot. */
#include "coll/handles.h"

#include <pthread.h>
#include <stddef.h>

#include "core/internal.h"

#define SLOTS 4096

typedef struct slot {
  void *obj;       /* NULL: free */
  uint32_t gen;    /* generation of the current (or next) object */
  int kind;
} slot;

/* table_lock guards every field of table and next_free_hint. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static slot table[SLOTS];
static unsigned next_free_hint;

static const char *kind_name(int kind) {
  switch (kind) {
    case MGPU__OBJ_COMM: return "communicator";
    case MGPU__OBJ_BARRIER: return "barrier";
    case MGPU__OBJ_STREAM_BARRIER: return "stream barrier";
    case MGPU__OBJ_CHANNEL: return "channel";
  }
  return "object";
}

uintptr_t mgpu__obj_new(mgpu__obj_kind kind, void *obj) {
  uintptr_t h = 0;
  pthread_mutex_lock(&table_lock);
  for (unsigned i = 0; i < SLOTS; i++) {
    unsigned s = (next_free_hint + i) % SLOTS;
    if (table[s].obj != NULL) continue;
    if (table[s].gen == 0) table[s].gen = 1;
    table[s].obj = obj;
    table[s].kind = kind;
    h = ((uintptr_t)table[s].gen << 24) | ((uintptr_t)s << 4) |
        (uintptr_t)kind;
    next_free_hint = (s + 1) % SLOTS;
    break;
  }
  pthread_mutex_unlock(&table_lock);
  return h;
}

/* Called with table_lock held. */
static slot *lookup(uintptr_t h, mgpu__obj_kind kind, const char *what,
                    int *err) {
  if (h == 0) {
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: NULL %s handle", what,
                       kind_name(kind));
    return NULL;
  }
  unsigned s = (unsigned)((h >> 4) & 0xfffff);
  uint32_t gen = (uint32_t)(h >> 24);
  if ((int)(h & 15) != (int)kind || s >= SLOTS || gen == 0) {
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: not a %s handle", what,
                       kind_name(kind));
    return NULL;
  }
  slot *sl = &table[s];
  if (sl->gen != gen || sl->obj == NULL || sl->kind != (int)kind) {
    *err = mgpu__error(MGPU_EFREED, "%s: %s used after it was destroyed",
                       what, kind_name(kind));
    return NULL;
  }
  return sl;
}

void *mgpu__obj_get(uintptr_t h, mgpu__obj_kind kind, const char *what,
                    int *err) {
  pthread_mutex_lock(&table_lock);
  slot *sl = lookup(h, kind, what, err);
  void *obj = sl ? sl->obj : NULL;
  pthread_mutex_unlock(&table_lock);
  return obj;
}

void *mgpu__obj_release(uintptr_t h, mgpu__obj_kind kind, const char *what,
                        int *err) {
  pthread_mutex_lock(&table_lock);
  slot *sl = lookup(h, kind, what, err);
  void *obj = NULL;
  if (sl != NULL) {
    obj = sl->obj;
    sl->obj = NULL;
    sl->gen = (sl->gen + 1) & 0xffffffu;
    if (sl->gen == 0) sl->gen = 1;
  }
  pthread_mutex_unlock(&table_lock);
  return obj;
}
