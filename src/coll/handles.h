/* Handles of the coll and chan layers (communicators, barriers, channels).
 *
 * They live in the core's handle table (src/core/handle.c) under types of
 * their own: a slot number plus a generation, never a pointer, so a handle
 * used after destroy is reported as MGPU_EFREED and never dereferenced, even
 * once its slot was reused. These wrappers add the error details. */
#ifndef MGPU_COLL_HANDLES_H
#define MGPU_COLL_HANDLES_H

#include <stdint.h>

#include "core/internal.h"

typedef enum mgpu__obj_kind {
  MGPU__OBJ_COMM = MGPU__H_COMM,
  MGPU__OBJ_BARRIER = MGPU__H_BARRIER,
  MGPU__OBJ_STREAM_BARRIER = MGPU__H_STREAM_BARRIER,
  MGPU__OBJ_CHANNEL = MGPU__H_CHANNEL
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
