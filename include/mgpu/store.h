/* mgpu store: device buffers shared between processes through a daemon.
 *
 * A daemon (`mgpud`, or `mgpu store serve`) owns the memory; clients connect
 * over a UNIX socket, create objects on a device, fill them, seal them, and
 * other processes get them by id or by name and map them without a copy:
 * memfd + mmap on host devices, cuMem POSIX file descriptors (or legacy CUDA
 * IPC handles) on CUDA devices. docs/store.md is the guide.
 *
 * Lifetimes (the daemon enforces them, see docs/store.md):
 * - every create and get takes a reference held by this connection; release
 *   drops it. An object deleted while referenced stays alive, and mapped,
 *   until its last reference goes; it can no longer be got.
 * - a connection that closes (the process exits or is killed) releases all
 *   its references and aborts the objects it created but did not seal.
 * - a daemon that dies or restarts makes every later call on the connection
 *   return MGPU_ESTORE with a detail; objects already mapped stay readable
 *   until released. Connect again to reach a new daemon.
 *
 * Devices are named across processes by UUID, so "device 1" of a client is
 * matched with the daemon's device of the same UUID whatever the order of
 * MGPU_DEVICES in each process.
 *
 * Threads: one mgpu_store connection may be used from several threads; its
 * calls are serialized. An object belongs to the connection that returned
 * it. A disconnect while other threads are inside calls on the connection
 * makes those calls return (MGPU_ESTORE) and waits for them before it frees
 * anything.
 *
 * A sealed object is immutable: on host devices the memory itself is sealed
 * against writes through any descriptor or mapping; on CUDA devices every
 * mapping mgpu makes is read-only (docs/store.md says what the driver
 * cannot enforce).
 */
#ifndef MGPU_STORE_H
#define MGPU_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/core.h"
#include "mgpu/visibility.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest object name, in bytes (names are 1..255 bytes, no control
 * characters). */
#define MGPU_STORE_NAME_MAX 255

typedef struct mgpu_store mgpu_store;               /* one connection */
typedef struct mgpu_store_object mgpu_store_object; /* one reference held */

/* ---- the daemon ---------------------------------------------------------- */

typedef struct mgpu_store_server_config {
  size_t size;          /* sizeof(mgpu_store_server_config) */
  const char *path;     /* socket path. NULL: $XDG_RUNTIME_DIR/mgpu/store.sock,
                           else /tmp/mgpu-$UID/store.sock (directory 0700) */
  size_t capacity;      /* bytes per device. 0: MGPU_STORE_CAPACITY, else
                           the device's memory */
  long allow_gid;       /* a group whose processes may connect too. -1:
                           only the daemon's own user */
} mgpu_store_server_config;

#define MGPU_STORE_SERVER_CONFIG_INITIALIZER \
  { sizeof(mgpu_store_server_config), NULL, 0, -1 }

/* Runs the daemon on the devices mgpu_init opened (it must be initialized)
 * until SIGINT or SIGTERM arrives, or mgpu_store_server_stop is called from
 * a signal handler or another thread. The path is taken under a lock file
 * (path + ".lock"): refuses (MGPU_EALREADY, naming the pid) to start when a
 * daemon already serves the path, MGPU_EEXIST when something other than a
 * socket is there (never removed; only a dead daemon's socket is), and
 * MGPU_EACCES when the socket's directory is not private to this user.
 * Returns 0 after a clean stop, which removes the socket and the lock. */
MGPU_EXTERN int mgpu_store_serve(const mgpu_store_server_config *config);

/* Asks a running mgpu_store_serve to stop. Async-signal-safe. */
MGPU_EXTERN void mgpu_store_server_stop(void);

/* Writes the default socket path into buf (n bytes). Returns 0 or
 * MGPU_EINVAL when it does not fit. */
MGPU_EXTERN int mgpu_store_default_path(char *buf, size_t n);

/* ---- connections ----------------------------------------------------- */

/* Connects to the daemon at path (NULL: the default path) and says hello.
 * MGPU_ESTORE when no daemon answers. MGPU_EACCES when the daemon or the
 * socket's permissions refuse this process's user, and when this process
 * does not trust the daemon: it must run as this user or root (or a user
 * MGPU_STORE_TRUST names: comma-separated names or uids), and the default
 * path's directory must be this user's, writable by no one else. The
 * caller owns *store until mgpu_store_disconnect. */
MGPU_EXTERN int mgpu_store_connect(mgpu_store **store, const char *path);

/* Releases every object still held through the connection (unmapping it
 * and freeing its buffer), then closes it. Calls other threads are making
 * on the connection return MGPU_ESTORE and are waited for; later calls are
 * MGPU_EBADHANDLE. Returns 0 even when the daemon is gone. */
MGPU_EXTERN int mgpu_store_disconnect(mgpu_store *store);

/* ---- objects --------------------------------------------------------- */

/* Creates an object of size bytes on device dev (an mgpu device of this
 * process: mgpu must be initialized), named name (NULL: unnamed; a taken
 * name is MGPU_EEXIST). *obj is writable by this process until
 * mgpu_store_seal. A create that does not fit the device's capacity after
 * evicting unheld sealed objects is MGPU_ENOMEM naming the device, the
 * request and what is held; one that could not fit even then evicts
 * nothing. */
MGPU_EXTERN int mgpu_store_create(mgpu_store *store, int dev, size_t size,
                                  const char *name, mgpu_store_object **obj);

/* Seals an object this connection created: read-only from then on, in this
 * process too, and gettable by others. MGPU_ENOENT when another connection
 * deleted it first, MGPU_EALREADY when it is sealed already. */
MGPU_EXTERN int mgpu_store_seal(mgpu_store_object *obj);

/* Gets a sealed object by id or by name, mapped read-only into this
 * process. MGPU_ENOENT for an unknown or deleted object, MGPU_EAGAIN for
 * one not sealed yet. The caller owns *obj until mgpu_store_release. */
MGPU_EXTERN int mgpu_store_get(mgpu_store *store, uint64_t id,
                               mgpu_store_object **obj);
MGPU_EXTERN int mgpu_store_get_by_name(mgpu_store *store, const char *name,
                                       mgpu_store_object **obj);

/* Drops the reference: frees the object's buffer, unmaps it, and tells the
 * daemon. The handle is invalid afterwards. Also when the daemon is gone
 * (MGPU_ESTORE is then returned, but everything local is freed). */
MGPU_EXTERN int mgpu_store_release(mgpu_store_object *obj);

/* Deletes an object by id or by name: it can no longer be got, and its
 * memory goes once the last reference is released (at once if none is
 * held). *deferred (may be NULL) is 1 when references kept it alive. */
MGPU_EXTERN int mgpu_store_delete(mgpu_store *store, uint64_t id,
                                  int *deferred);
MGPU_EXTERN int mgpu_store_delete_by_name(mgpu_store *store, const char *name,
                                          int *deferred);

/* What an object handle holds. On an invalid handle these return 0, NULL
 * or -1 and set the error detail. */
MGPU_EXTERN uint64_t mgpu_store_object_id(const mgpu_store_object *obj);
MGPU_EXTERN size_t mgpu_store_object_size(const mgpu_store_object *obj);
/* This process's mgpu device holding the object, or -1 when mgpu is not
 * initialized or has no device of the object's UUID open. The store names a
 * device by its GPU, which the parts of a split GPU (cuda:0/4) share: a
 * created object is on the device its create named, a got one on the
 * first open device of its GPU. */
MGPU_EXTERN int mgpu_store_object_device(const mgpu_store_object *obj);
/* The mapping: a host address on host devices, a device address on CUDA
 * devices. Read-only once sealed (writes fault). */
MGPU_EXTERN void *mgpu_store_object_ptr(const mgpu_store_object *obj);
/* The object as an mgpu_buffer of its device, usable by every mgpu call
 * (copies, kernels, collectives); read-only once got or sealed: writes into
 * it are MGPU_EREADONLY. NULL when the object has no local device. Owned by
 * the object: freed by mgpu_store_release; mgpu_free of it is MGPU_EINVAL. */
MGPU_EXTERN mgpu_buffer *mgpu_store_object_buffer(const mgpu_store_object *obj);

/* ---- host mirror (vineyard's CUDABufferMirror) ------------------------ */

/* Gives a pinned host copy of the object in *host, filled from the device
 * when fill is 1. One mirror per object at a time (MGPU_EALREADY). */
MGPU_EXTERN int mgpu_store_mirror_begin(mgpu_store_object *obj, int fill,
                                        void **host);
/* Ends the mirror: writes the host copy back to the device when the object
 * is still writable (created here and not sealed), then frees the copy. */
MGPU_EXTERN int mgpu_store_mirror_end(mgpu_store_object *obj);

/* ---- list and stats -------------------------------------------------- */

typedef struct mgpu_store_entry {
  uint64_t id;
  char name[MGPU_STORE_NAME_MAX + 1]; /* "" when unnamed */
  char device_uuid[40];
  uint64_t bytes;
  int sealed;
  int deleted;    /* deleted, alive until its references go */
  uint32_t refs;  /* references held, over every connection */
} mgpu_store_entry;

/* Lists every object (deleted ones still referenced too). *entries is
 * malloc'ed: free it with mgpu_store_list_free. */
MGPU_EXTERN int mgpu_store_list(mgpu_store *store, mgpu_store_entry **entries,
                                size_t *count);
MGPU_EXTERN void mgpu_store_list_free(mgpu_store_entry *entries);

typedef struct mgpu_store_device_stats {
  char uuid[40];
  int backend_kind;   /* mgpu_backend_kind */
  uint64_t capacity;  /* bytes */
  uint64_t in_use;    /* bytes of every live object */
  uint64_t held;      /* bytes of objects someone references */
  uint64_t objects;   /* live objects */
} mgpu_store_device_stats;

typedef struct mgpu_store_stats {
  size_t size;         /* sizeof(mgpu_store_stats), set by the caller */
  uint32_t clients;    /* connections open, this one included */
  uint64_t objects;    /* live objects */
  uint64_t refs;       /* references held */
  uint64_t evictions;  /* objects evicted since the daemon started */
  int ndevices;
  mgpu_store_device_stats devices[MGPU_MAX_DEVICES];
} mgpu_store_stats;

/* Fills *stats (stats->size must be set). */
MGPU_EXTERN int mgpu_store_stats_get(mgpu_store *store, mgpu_store_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_STORE_H */
