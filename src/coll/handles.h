/* Handles of the coll and chan layers (communicators, barriers, channels).
 *
 * Like the core's handles, each is a slot number plus a generation, never a
 * pointer: a handle used after destroy is reported as MGPU_EFREED and never
 * dereferenced, even once its slot was reused. The table is process-wide and
 * guarded by one mutex; lookups are short. */
#ifndef MGPU_COLL_HANDLES_H
#define MGPU_COLL_HANDLES_H

#include <stdint.h>

typedef enum mgpu__obj_kind {
  MGPU__OBJ_COMM = 1,
  MGPU__OBJ_BARRIER = 2,
  MGPU__OBJ_STREAM_BARRIER = 3,
  MGPU__OBJ_CHANNEL = 4
} mgpu__obj_kind;

/* Stores obj; returns its handle, or 0 when the table is full. */
uintptr_t mgpu__obj_new(mgpu__obj_kind kind, void *obj);
/* The object of a live handle, or NULL with the error detail set
 * (MGPU_EBADHANDLE, MGPU_EFREED) and the code in *err. what names the
 * argument ("comm"). */
void *mgpu__obj_get(uintptr_t h, mgpu__obj_kind kind, const char *what,
                    int *err);
/* Retires the handle and returns its object (NULL with *err set). */
void *mgpu__obj_release(uintptr_t h, mgpu__obj_kind kind, const char *what,
                        int *err);

#endif /* MGPU_COLL_HANDLES_H */
