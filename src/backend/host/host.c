/* The host backend: each device is a set of worker threads with a memory
 * budget; its "device memory" is host memory.
 *
 * A stream is an in-order queue of operations. A stream with work is put on
 * its device's ready list; a worker takes it, runs its head operation, and
 * puts it back if more is queued (or, when no other stream waits there,
 * runs the next one itself: putting it back would wake a second worker for
 * nothing). A stream is on the ready list or run by a
 * worker at most once at a time, so its operations run in order, while
 * several streams of one device run on several workers at once.
 *
 * Events: recording gives the event a new sequence number at call time and
 * queues an operation that marks that number complete. A wait captures the
 * latest sequence number at call time; the waiting stream parks itself on the
 * event when it reaches the wait early, and the recording worker puts it back
 * on its device's ready list. Workers never block on each other.
 *
 * A worker that finds its ready list empty first watches the list's count
 * for up to its device's spin budget (mgpu__spin_until, util/thread.h: the
 * budget doubles, to 64 us, after a watch that saw work and halves, to
 * 1 us, after one that did not; it pauses the CPU while fewer threads of
 * the process spin than there are CPUs and yields it otherwise), then
 * sleeps on the device's work condition until a stream is pushed or the
 * device stops (watch_for_work, worker.c); a push wakes a sleeper only
 * when more streams are ready than workers watch. A worker counts itself
 * busy (mgpu__cpu_busy) from taking work until it runs out. A graph part
 * whose next node waits for another device's node watches its signal the
 * same way, then parks its stream on the graph's board and gives the
 * worker back; but while every CPU is busy it keeps watching, yielding at
 * each turn (graph.c tells why).
 *
 * Copies into device memory of 256 KiB or more use non-temporal stores.
 *
 * Observability: each operation is timed where it runs, on the worker.
 * Copies add their time to their path's metric; while a trace is recorded,
 * each operation becomes a span on its stream's track (named by the tag the
 * layer above pushed, else by its kind), and a wait that ran after a record
 * becomes an arrow from the record to the waiting stream.
 *
 * Files: this one holds the table; queue.c the ready list and operations,
 * worker.c the workers and how each operation runs, device.c devices,
 * memory.c memory and peer access, stream.c streams, event.c events,
 * work.c the work queued on streams, graph.c graphs, ipc.c memory shared
 * between processes, kernels.c the built-in kernels; host-internal.h their
 * state.
 */
#include "backend/host/host-internal.h"
#include "backend/ipc.h"
#include "mgpu/dlpack.h"

const mgpu__backend_env *mgpu__host_env;

static const mgpu__backend_claim_ops host_claim_ops = {
    .stream_claim = mgpu__host_stream_claim,
    .stream_release = mgpu__host_stream_release,
    .stream_lock_idle = mgpu__host_stream_lock_idle,
    .stream_unlock_idle = mgpu__host_stream_unlock_idle,
};

static const mgpu__backend_ipc_ops host_ipc_ops = {
    .alloc = mgpu__host_ipc_alloc,
    .free = mgpu__host_ipc_free,
    .export_fd = mgpu__host_ipc_export_fd,
    .import = mgpu__host_ipc_import,
    .protect = mgpu__host_ipc_protect,
    .unimport = mgpu__host_ipc_unimport,
};

static const mgpu__backend_loss_ops host_loss_ops = {
    .lose = mgpu__host_lose,
    .lost = mgpu__host_lost,
};

static const mgpu__backend_graph_ops host_graph_ops = {
    .create = mgpu__host_graph_create,
    .launch = mgpu__host_graph_launch,
    .cancel = mgpu__host_graph_cancel,
    .destroy = mgpu__host_graph_destroy,
};

static const mgpu__backend_ops host_ops = {
    .name = "host",
    .kind = MGPU_BACKEND_HOST,
    .caps = {
        .mem_model = MGPU__MEM_MODEL_HOST,
        .host_visible = 1u << MGPU_MEM_DEVICE | 1u << MGPU_MEM_PINNED |
                        1u << MGPU_MEM_UNIFIED,
        .splits_share_memory = 0,
        .kernel_variant = MGPU__KERNEL_HOST_FN,
        .dlpack_device = kDLCPU,
        .dlpack_unified = kDLCPU,
        .dlpack_pinned = 0,
        /* Both halves of a staged copy are memcpy on two cores: 1 MiB keeps
         * the bounce buffers in the last-level cache. */
        .staging_chunk = (size_t)1 << 20,
        .graph_fill_16bit = 0,
    },
    .probe = mgpu__host_probe,
    .open = mgpu__host_open,
    .close = mgpu__host_close,
    .props = mgpu__host_props,
    .make_current = mgpu__host_make_current,
    .mem_alloc = mgpu__host_mem_alloc,
    .mem_free = mgpu__host_mem_free,
    .mem_free_detached = mgpu__host_mem_free_detached,
    .mem_info = mgpu__host_mem_info,
    .stream_create = mgpu__host_stream_create,
    .stream_destroy = mgpu__host_stream_destroy,
    .stream_synchronize = mgpu__host_stream_synchronize,
    .stream_query = mgpu__host_stream_query,
    .stream_native = mgpu__host_stream_native,
    .event_create = mgpu__host_event_create,
    .event_destroy = mgpu__host_event_destroy,
    .event_record = mgpu__host_event_record,
    .event_synchronize = mgpu__host_event_synchronize,
    .event_query = mgpu__host_event_query,
    .event_elapsed_ms = mgpu__host_event_elapsed_ms,
    .stream_wait_event = mgpu__host_stream_wait_event,
    .memcpy_async = mgpu__host_memcpy_async,
    .memcpy2d_async = mgpu__host_memcpy2d_async,
    .memset_async = mgpu__host_memset_async,
    .launch = mgpu__host_launch,
    .builtin = mgpu__host_builtin,
    .host_callback = mgpu__host_host_callback,
    .peer_can_access = mgpu__host_peer_can_access,
    .peer_enable = mgpu__host_peer_enable,
    .peer_disable = mgpu__host_peer_disable,
    .memcpy_peer_async = mgpu__host_memcpy_peer_async,
    .claim = &host_claim_ops,
    .ipc = &host_ipc_ops,
    .loss = &host_loss_ops,
    .graph = &host_graph_ops,
};

const mgpu__backend_ops *mgpu__host_backend(const mgpu__backend_env *e) {
  mgpu__host_env = e;
  return &host_ops;
}
