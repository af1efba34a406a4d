# The C API of libmgpu as the extension uses it (include/mgpu/*.h).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "mgpu.h" nogil:
    const char *mgpu_strerror(int code)
    const char *mgpu_err_name(int code)
    const char *mgpu_error_detail()
    void mgpu_error_clear()
    enum:
        MGPU_ENODEV
        MGPU_EFREED
        MGPU_EAGAIN
        MGPU_ECANCELED
        MGPU_EREADONLY
        MGPU_ETIMEDOUT
        MGPU_EOVERLAP
    unsigned mgpu_version()
    const char *mgpu_version_string()

    enum: MGPU_MAX_DEVICES
    ctypedef struct mgpu_config:
        size_t size
        const char *devices
        size_t host_mem
        int log_level
        int host_workers
        int host_peer
        size_t staging_chunk
        int staging_depth
        const char *plugin_path
        int cuda_green
        int cuda_busy
        const char *trace
    int mgpu_init(const mgpu_config *config)
    int mgpu_shutdown()
    int mgpu_is_initialized()
    int mgpu_timeout_ms()

    ctypedef enum mgpu_backend_kind:
        MGPU_BACKEND_HOST
        MGPU_BACKEND_CUDA
        MGPU_BACKEND_OPENCL
    ctypedef struct mgpu_device_props:
        size_t size
        char name[96]
        char backend[16]
        mgpu_backend_kind backend_kind
        int ordinal, split_index, split_count
        size_t total_mem, free_mem
        int cc_major, cc_minor, multiprocessors, numa_node, peer_capable
        char pci_bus_id[32]
        char uuid[40]
    int mgpu_device_count()
    int mgpu_device_get_props(int dev, mgpu_device_props *props)
    int mgpu_set_device(int dev)
    int mgpu_get_device(int *dev)
    int mgpu_device_synchronize(int dev)
    ctypedef int (*mgpu_device_fn)(int dev, void *arg) noexcept
    int mgpu_run_on_device(int dev, mgpu_device_fn fn, void *arg)
    ctypedef struct mgpu_work:
        pass
    int mgpu_run_on_device_async(int dev, mgpu_device_fn fn, void *arg, mgpu_work **work)
    int mgpu_work_wait(mgpu_work *work)

    ctypedef enum mgpu_mem_kind:
        MGPU_MEM_DEVICE
        MGPU_MEM_PINNED
        MGPU_MEM_UNIFIED
    ctypedef struct mgpu_buffer:
        pass
    int mgpu_malloc(mgpu_buffer **buf, int dev, size_t size)
    int mgpu_malloc_host(mgpu_buffer **buf, int dev, size_t size)
    int mgpu_malloc_unified(mgpu_buffer **buf, int dev, size_t size)
    int mgpu_free(mgpu_buffer *buf)
    void *mgpu_buffer_ptr(const mgpu_buffer *buf)
    size_t mgpu_buffer_size(const mgpu_buffer *buf)
    int mgpu_buffer_device(const mgpu_buffer *buf)
    int mgpu_buffer_is_readonly(const mgpu_buffer *buf)

    ctypedef struct mgpu_stream:
        pass
    ctypedef struct mgpu_event:
        pass
    int mgpu_stream_create(mgpu_stream **stream, int dev)
    int mgpu_stream_destroy(mgpu_stream *stream)
    int mgpu_stream_synchronize(mgpu_stream *stream)
    int mgpu_stream_query(mgpu_stream *stream)
    void *mgpu_stream_native(const mgpu_stream *stream)
    int mgpu_event_create(mgpu_event **event, int dev)
    int mgpu_event_destroy(mgpu_event *event)
    int mgpu_event_record(mgpu_event *event, mgpu_stream *stream)
    int mgpu_stream_wait_event(mgpu_stream *stream, mgpu_event *event)
    int mgpu_event_synchronize(mgpu_event *event)
    int mgpu_event_query(mgpu_event *event)
    int mgpu_event_elapsed_ms(mgpu_event *start, mgpu_event *end, float *ms)
    int mgpu_stream_add_callback(mgpu_stream *stream, void (*fn)(void *arg) noexcept, void *arg)

    ctypedef enum mgpu_dtype:
        MGPU_FLOAT32
        MGPU_FLOAT64
        MGPU_INT32
        MGPU_INT64
        MGPU_FLOAT16
        MGPU_BFLOAT16
    ctypedef enum mgpu_op:
        MGPU_SUM
        MGPU_PROD
        MGPU_MIN
        MGPU_MAX

    int mgpu_memcpy_htod(mgpu_buffer *dst, size_t dst_offset, const void *host, size_t size)
    int mgpu_memcpy_htod_async(mgpu_buffer *dst, size_t dst_offset, const void *host, size_t size, mgpu_stream *stream)
    int mgpu_memcpy_dtoh(void *host, const mgpu_buffer *src, size_t src_offset, size_t size)
    int mgpu_memcpy(mgpu_buffer *dst, size_t dst_offset, const mgpu_buffer *src, size_t src_offset, size_t size)
    int mgpu_memcpy_async(mgpu_buffer *dst, size_t dst_offset, const mgpu_buffer *src, size_t src_offset, size_t size, mgpu_stream *stream)
    int mgpu_memset_async(mgpu_buffer *dst, size_t offset, int value, size_t size, mgpu_stream *stream)
    int mgpu_peer_can_access(int a, int b, int *yes)
    int mgpu_peer_enable(int a, int b)
    int mgpu_peer_disable(int a, int b)
    ctypedef enum mgpu_copy_path:
        pass
    int mgpu_copy_path_get(int src, int dst, mgpu_copy_path *path)
    const char *mgpu_copy_path_name(mgpu_copy_path path)

    # Partly declared: the counters are read in C (_core.pyx), from the
    # header's own list of them.
    ctypedef struct mgpu_metrics:
        size_t size
        int ndevices
        double load_imbalance
    int mgpu_metrics_snapshot(mgpu_metrics *out)
    int mgpu_metrics_reset()

    ctypedef struct mgpu_comm:
        pass
    int mgpu_comm_create(const int *devs, int n, mgpu_comm **comm)
    int mgpu_comm_destroy(mgpu_comm *comm)
    int mgpu_comm_abort(mgpu_comm *comm)
    int mgpu_allreduce(mgpu_comm *comm, int rank, const mgpu_buffer *send, mgpu_buffer *recv, size_t count, mgpu_dtype dtype, mgpu_op op, mgpu_stream *stream)
    int mgpu_broadcast(mgpu_comm *comm, int rank, const mgpu_buffer *send, mgpu_buffer *recv, size_t count, mgpu_dtype dtype, int root, mgpu_stream *stream)
    int mgpu_allgather(mgpu_comm *comm, int rank, const mgpu_buffer *send, mgpu_buffer *recv, size_t count, mgpu_dtype dtype, mgpu_stream *stream)
    int mgpu_reduce_scatter(mgpu_comm *comm, int rank, const mgpu_buffer *send, mgpu_buffer *recv, size_t count, mgpu_dtype dtype, mgpu_op op, mgpu_stream *stream)
    int mgpu_group_begin()
    int mgpu_group_end()

    ctypedef struct mgpu_channel:
        pass
    int mgpu_channel_create(int src_dev, int dst_dev, size_t msg_size, int capacity, mgpu_channel **chan)
    int mgpu_channel_destroy(mgpu_channel *chan)
    int mgpu_channel_send(mgpu_channel *chan, const mgpu_buffer *src, size_t offset, size_t size, mgpu_stream *stream)
    int mgpu_channel_recv(mgpu_channel *chan, mgpu_buffer *dst, size_t offset, size_t *size, mgpu_stream *stream)
    int mgpu_channel_send_timeout(mgpu_channel *chan, const mgpu_buffer *src, size_t offset, size_t size, mgpu_stream *stream, int timeout_ms)
    int mgpu_channel_recv_timeout(mgpu_channel *chan, mgpu_buffer *dst, size_t offset, size_t *size, mgpu_stream *stream, int timeout_ms)
    int mgpu_channel_close(mgpu_channel *chan)

    ctypedef uint64_t mgpu_task
    ctypedef int (*mgpu_task_fn)(int dev, mgpu_stream *stream, void *arg) noexcept
    ctypedef struct mgpu_pool:
        pass
    ctypedef struct mgpu_pool_opts:
        size_t size
        int ndevices
        const int *devices
    int mgpu_pool_create(mgpu_pool **pool, const mgpu_pool_opts *opts)
    int mgpu_pool_destroy(mgpu_pool *pool)
    int mgpu_pool_submit_fn(mgpu_pool *pool, mgpu_task_fn fn, void *arg, mgpu_task *task)
    int mgpu_pool_wait(mgpu_pool *pool, mgpu_task task)
    int mgpu_pool_release(mgpu_pool *pool, mgpu_task task)
    int mgpu_pool_wait_all(mgpu_pool *pool)

    ctypedef enum mgpu_dist_kind:
        MGPU_DIST_BLOCK
        MGPU_DIST_CYCLIC
        MGPU_DIST_BLOCK_CYCLIC
        MGPU_DIST_WEIGHTED
    ctypedef struct mgpu_range:
        size_t begin, end
    ctypedef struct mgpu_dist_opts:
        size_t size
        mgpu_dist_kind kind
        size_t block
        int ndevices
        const int *devices
        const double *weights
    ctypedef struct mgpu_dist:
        pass
    int mgpu_dist_create(mgpu_dist **dist, size_t n, const mgpu_dist_opts *opts)
    void mgpu_dist_destroy(mgpu_dist *dist)
    int mgpu_dist_nparts(const mgpu_dist *dist)
    int mgpu_dist_device(const mgpu_dist *dist, int part)
    size_t mgpu_dist_count(const mgpu_dist *dist, int part)
    size_t mgpu_dist_nranges(const mgpu_dist *dist, int part)
    mgpu_range mgpu_dist_range(const mgpu_dist *dist, int part, size_t k)

cdef extern from "mgpu/dlpack.h" nogil:
    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor
    ctypedef enum DLDeviceType:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLCUDAManaged
    ctypedef struct DLDevice:
        DLDeviceType device_type
        int32_t device_id
    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor:
        void *data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void *manager_ctx
        void (*deleter)(DLManagedTensor *self) noexcept nogil
    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void *manager_ctx
        void (*deleter)(DLManagedTensorVersioned *self) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor
    enum: DLPACK_FLAG_BITMASK_READ_ONLY

cdef extern from "mgpu/interop.h" nogil:
    int mgpu_buffer_dlpack(mgpu_buffer *buf, size_t offset, DLDataType dtype, int ndim, const int64_t *shape, const int64_t *strides, DLManagedTensorVersioned **managed)
    int mgpu_stream_order_native(mgpu_stream *stream, void *native)
    int mgpu_buffer_dldevice(mgpu_buffer *buf, DLDevice *device)
    int mgpu_buffer_from_dlpack(mgpu_buffer **buf, int dev, DLManagedTensorVersioned *managed)

# The headers' initializers, as values (Cython cannot use a braced
# initializer macro directly).
cdef extern from *:
    """
    static mgpu_config mgpu_py_config_init(void) {
      mgpu_config c = MGPU_CONFIG_INITIALIZER; return c; }
    static mgpu_pool_opts mgpu_py_pool_opts_init(void) {
      mgpu_pool_opts o = MGPU_POOL_OPTS_INITIALIZER; return o; }
    static mgpu_dist_opts mgpu_py_dist_opts_init(void) {
      mgpu_dist_opts o = MGPU_DIST_OPTS_INITIALIZER; return o; }
    """
    mgpu_config mgpu_py_config_init() nogil
    mgpu_pool_opts mgpu_py_pool_opts_init() nogil
    mgpu_dist_opts mgpu_py_dist_opts_init() nogil

cdef extern from "mgpu/trace.h" nogil:
    ctypedef struct mgpu_trace_stats:
        size_t size
        uint64_t events
        uint64_t dropped
        uint64_t threads
    int mgpu_trace_start(const char *path)
    int mgpu_trace_stop()
    int mgpu_trace_active()
    int mgpu_trace_stats_get(mgpu_trace_stats *out)
    void mgpu_trace_span(const char *name, uint64_t start_ns, uint64_t end_ns)
    uint64_t mgpu_trace_now_ns()

cdef extern from "mgpu.h" nogil:
    # include/mgpu/store.h
    enum: MGPU_STORE_NAME_MAX
    ctypedef struct mgpu_store:
        pass
    ctypedef struct mgpu_store_object:
        pass
    int mgpu_store_connect(mgpu_store **store, const char *path)
    int mgpu_store_disconnect(mgpu_store *store)
    int mgpu_store_create(mgpu_store *store, int dev, size_t size, const char *name, mgpu_store_object **obj)
    int mgpu_store_seal(mgpu_store_object *obj)
    int mgpu_store_get(mgpu_store *store, uint64_t id, mgpu_store_object **obj)
    int mgpu_store_get_by_name(mgpu_store *store, const char *name, mgpu_store_object **obj)
    int mgpu_store_release(mgpu_store_object *obj)
    int mgpu_store_delete(mgpu_store *store, uint64_t id, int *deferred)
    int mgpu_store_delete_by_name(mgpu_store *store, const char *name, int *deferred)
    uint64_t mgpu_store_object_id(const mgpu_store_object *obj)
    size_t mgpu_store_object_size(const mgpu_store_object *obj)
    int mgpu_store_object_device(const mgpu_store_object *obj)
    void *mgpu_store_object_ptr(const mgpu_store_object *obj)
    mgpu_buffer *mgpu_store_object_buffer(const mgpu_store_object *obj)
    int mgpu_store_mirror_begin(mgpu_store_object *obj, int fill, void **host)
    int mgpu_store_mirror_end(mgpu_store_object *obj)
    ctypedef struct mgpu_store_entry:
        uint64_t id
        char name[256]
        char device_uuid[40]
        uint64_t bytes
        int sealed
        int deleted
        uint32_t refs
    int mgpu_store_list(mgpu_store *store, mgpu_store_entry **entries, size_t *count)
    void mgpu_store_list_free(mgpu_store_entry *entries)
    ctypedef struct mgpu_store_device_stats:
        char uuid[40]
        int backend_kind
        uint64_t capacity
        uint64_t in_use
        uint64_t held
        uint64_t objects
    ctypedef struct mgpu_store_stats:
        size_t size
        uint32_t clients
        uint64_t objects
        uint64_t refs
        uint64_t evictions
        int ndevices
        mgpu_store_device_stats devices[64]
    int mgpu_store_stats_get(mgpu_store *store, mgpu_store_stats *stats)
