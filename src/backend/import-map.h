/* The import map of shared memory (backend/ipc.h), one for the host
 * backend (host/ipc.c) and one for the CUDA plugin (cuda/ipc.c).
 *
 * A process maps memory of a given key (exporter instance, object id) once:
 * a second import of the key takes another reference on the mapping, and
 * the mapping goes when the last reference does. Each backend keeps its own
 * entries, which start with an mgpu__import_entry (the map links them), and
 * maps and unmaps them itself; the map only finds, counts and links.
 *
 * Header-only, so that the plugin, which links nothing of libmgpu, carries
 * its own copy. The lock is a leaf (nothing is locked while it is held but
 * what the caller does in between mgpu__import_lock and
 * mgpu__import_unlock): a plain pthread mutex, unless the includer names
 * its own first (MGPU__IMPORT_MAP_MUTEX and the three macros beside it):
 * the host backend, in libmgpu, uses a ranked mgpu__mutex
 * (docs/ARCHITECTURE.md, "Lock order").
 */
#ifndef MGPU_BACKEND_IMPORT_MAP_H
#define MGPU_BACKEND_IMPORT_MAP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifndef MGPU__IMPORT_MAP_MUTEX
#define MGPU__IMPORT_MAP_MUTEX pthread_mutex_t
#define MGPU__IMPORT_MAP_MUTEX_INITIALIZER PTHREAD_MUTEX_INITIALIZER
#define MGPU__IMPORT_MAP_LOCK(m) pthread_mutex_lock(m)
#define MGPU__IMPORT_MAP_UNLOCK(m) pthread_mutex_unlock(m)
#endif

typedef struct mgpu__import_entry {
  uint64_t key[2];
  uintptr_t base;  /* the mapping's address */
  size_t map_size; /* and its length */
  int refs;
  struct mgpu__import_entry *next;
} mgpu__import_entry;

typedef struct mgpu__import_map {
  MGPU__IMPORT_MAP_MUTEX lock; /* guards head and every entry's refs and
                                 next */
  mgpu__import_entry *head;
} mgpu__import_map;

#define MGPU__IMPORT_MAP_INITIALIZER {MGPU__IMPORT_MAP_MUTEX_INITIALIZER, NULL}

static inline void mgpu__import_lock(mgpu__import_map *m) {
  MGPU__IMPORT_MAP_LOCK(&m->lock);
}

static inline void mgpu__import_unlock(mgpu__import_map *m) {
  MGPU__IMPORT_MAP_UNLOCK(&m->lock);
}

/* Takes another reference on the mapping of key: returns its base, or 0
 * when the key is not mapped (the caller maps it and adds it). */
static inline uintptr_t mgpu__import_ref(mgpu__import_map *m,
                                         const uint64_t key[2]) {
  uintptr_t base = 0;
  mgpu__import_lock(m);
  for (mgpu__import_entry *e = m->head; e != NULL; e = e->next)
    if (e->key[0] == key[0] && e->key[1] == key[1]) {
      e->refs++;
      base = e->base;
      break;
    }
  mgpu__import_unlock(m);
  return base;
}

/* Adds e, a new mapping of key with base and map_size set, holding one
 * reference. The map keeps e until mgpu__import_unref returns it. */
static inline void mgpu__import_add(mgpu__import_map *m, mgpu__import_entry *e,
                                    const uint64_t key[2]) {
  e->key[0] = key[0];
  e->key[1] = key[1];
  e->refs = 1;
  mgpu__import_lock(m);
  e->next = m->head;
  m->head = e;
  mgpu__import_unlock(m);
}

/* The link to the entry whose mapping holds address p, or NULL; the lock
 * held. */
static inline mgpu__import_entry **mgpu__import_link_locked(
    mgpu__import_map *m, uintptr_t p) {
  for (mgpu__import_entry **e = &m->head; *e != NULL; e = &(*e)->next)
    if (p >= (*e)->base && p < (*e)->base + (*e)->map_size) return e;
  return NULL;
}

/* The entry whose mapping holds address p, or NULL; the lock held. */
static inline mgpu__import_entry *mgpu__import_find_locked(mgpu__import_map *m,
                                                           uintptr_t p) {
  mgpu__import_entry **e = mgpu__import_link_locked(m, p);
  return e != NULL ? *e : NULL;
}

/* Drops one reference on the mapping that holds address p. Returns its
 * entry, taken out of the map, when that was the last one (the caller
 * unmaps and frees it); else NULL (also when p is not imported). */
static inline mgpu__import_entry *mgpu__import_unref(mgpu__import_map *m,
                                                     uintptr_t p) {
  mgpu__import_entry *gone = NULL;
  mgpu__import_lock(m);
  mgpu__import_entry **e = mgpu__import_link_locked(m, p);
  if (e != NULL && --(*e)->refs == 0) {
    gone = *e;
    *e = gone->next;
  }
  mgpu__import_unlock(m);
  return gone;
}

#endif /* MGPU_BACKEND_IMPORT_MAP_H */
