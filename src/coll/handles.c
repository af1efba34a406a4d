/* The coll and chan layers' handles: the core's handle table (slot plus
 * generation, see src/core/handle.c) under types of their own, with details
 * that name the kind of object and the argument. */
#include "coll/handles.h"

static const char *kind_name(mgpu__obj_kind kind) {
  switch (kind) {
    case MGPU__OBJ_COMM: return "communicator";
    case MGPU__OBJ_BARRIER: return "barrier";
    case MGPU__OBJ_STREAM_BARRIER: return "stream barrier";
    case MGPU__OBJ_CHANNEL: return "channel";
  }
  return "object";
}

uintptr_t mgpu__obj_new(mgpu__obj_kind kind, void *obj) {
  return mgpu__handle_new((mgpu__htype)kind, obj);
}

/* Writes the detail of a failed lookup; returns NULL. */
static void *lookup_failed(int code, mgpu__obj_kind kind, const char *what,
                           uintptr_t h, int *err) {
  if (h == 0)
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: NULL %s handle", what,
                       kind_name(kind));
  else if (code == MGPU_EFREED)
    *err = mgpu__error(MGPU_EFREED, "%s: %s used after it was destroyed",
                       what, kind_name(kind));
  else
    *err = mgpu__error(MGPU_EBADHANDLE, "%s: not a %s handle", what,
                       kind_name(kind));
  return NULL;
}

void *mgpu__obj_get(uintptr_t h, mgpu__obj_kind kind, const char *what,
                    int *err) {
  int code = 0;
  void *obj = mgpu__handle_get(h, (mgpu__htype)kind, &code);
  return obj != NULL ? obj : lookup_failed(code, kind, what, h, err);
}

void *mgpu__obj_release(uintptr_t h, mgpu__obj_kind kind, const char *what,
                        int *err) {
  int code = 0;
  void *obj = mgpu__handle_release(h, (mgpu__htype)kind, &code);
  return obj != NULL ? obj : lookup_failed(code, kind, what, h, err);
}
