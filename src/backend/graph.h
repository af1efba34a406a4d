/* A device's part of a graph, as the optional graph slots of the backend
 * table take it (backend.h: graph_create, graph_launch, graph_destroy).
 *
 * The graph layer (src/graph/exec.c) cuts an executable graph into one part
 * per device: that device's nodes in an order that respects every edge, as
 * raw pointers checked by the core. An edge between two devices is a
 * signal: the node before it posts the signal once it ran, the node after
 * it waits for the post of the same launch. Signals live on a board that
 * the graph layer owns and every part of one graph shares; a launch is
 * numbered, and a signal holds 2 * launch, plus 1 when its node did not
 * run because its device was lost (the waiter's stream then fails with
 * MGPU_EDEVLOST, as a wait for a lost device's event does). A part whose
 * next node must wait spins briefly, then gives its worker back: its stream
 * parks on the board (as on an event) until a post puts it back on its
 * device's ready list, and the part goes on from that node.
 *
 * A backend may also keep to parts without a board (the CUDA plugin, whose
 * parts are CUDA graphs): it refuses with MGPU_ENOTSUP what needs one, and
 * the graph layer falls back as src/graph/parts.c says.
 *
 * C only: read by the backends' C code and the graph layer.
 */
#ifndef MGPU_BACKEND_GRAPH_H
#define MGPU_BACKEND_GRAPH_H

#include <stdatomic.h>

#include "backend/backend.h"
#include "util/thread.h"

typedef struct mgpu__graph_board mgpu__graph_board;
struct mgpu__graph_board {
  /* Held by the graph layer and by every backend part made over the board
   * (a part lives until its last queued run is done, which may be after
   * the graph layer let go): the last mgpu__graph_board_unref frees it
   * with release, the graph layer's. */
  _Atomic int refs;
  void (*release)(mgpu__graph_board *b);
  _Atomic uint64_t *signals; /* by signal */
  int *signal_device;        /* by signal: the device of its node */
  int nsignals;
  /* Streams parked until a post (the backend's, linked through its own
   * field): lock guards the list; nparked counts them, so that a post
   * looks at the list only when someone waits. Taken under a device's
   * lock (docs/ARCHITECTURE.md, "Lock order"). */
  mgpu__mutex lock;
  struct mgpu__bstream *parked;
  _Atomic int nparked;
  /* By signal, the spin budget of its waits: each edge adapts its own, so
   * that a wait that is usually long (the launch's end, while the other
   * device computes) soon parks at once without shortening the spin of
   * one that its partner usually meets in time. */
  mgpu__spin *spins;
};

static inline void mgpu__graph_board_ref(mgpu__graph_board *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

static inline void mgpu__graph_board_unref(mgpu__graph_board *b) {
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
    b->release(b);
}

typedef enum mgpu__bgraph_kind {
  MGPU__BG_NOP = 0,
  MGPU__BG_COPY,     /* dst, src, size (host-reachable memory) */
  MGPU__BG_MEMSET,   /* dst, value, size */
  MGPU__BG_LAUNCH,   /* kernel, grid, block, args */
  MGPU__BG_BUILTIN,  /* builtin */
  MGPU__BG_CALLBACK  /* fn(arg) */
} mgpu__bgraph_kind;

typedef struct mgpu__bgraph_node {
  mgpu__bgraph_kind kind;
  int node; /* its index in the graph, for details and traces */
  void *dst;
  const void *src;
  size_t size;
  int value;
  const mgpu_kernel *kernel;
  mgpu_dim3 grid, block;
  const void *args; /* copied by graph_create */
  size_t args_size;
  mgpu__builtin builtin;
  void (*fn)(void *arg);
  void *arg;
  const int *waits; /* signals to wait for before it runs */
  int nwaits;
  int signal; /* the signal it posts, or -1 */
} mgpu__bgraph_node;

typedef struct mgpu__bgraph_part {
  const mgpu__bgraph_node *nodes; /* copied by graph_create */
  int n;
  mgpu__graph_board *board; /* NULL when no node waits or posts */
  /* Streams of other devices (the same backend's) whose first failure the
   * part takes over once its nodes ran, so that the stream it runs on
   * reports it (copied by graph_create; the streams outlive the part's
   * runs, unless graph_cancel was called: a cancelled part adopts nothing
   * from then on). The graph layer's tail of a launch uses it. */
  struct mgpu__bstream *const *adopt;
  int nadopt;
} mgpu__bgraph_part;

#endif /* MGPU_BACKEND_GRAPH_H */
