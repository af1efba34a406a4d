# ---------------------------------------------------------------------------
# Graphs: a step captured once from streams and launched again and again
# (include/mgpu/graph.h, docs/graphs.md).

cdef extern from "mgpu.h" nogil:
    ctypedef struct mgpu_graph:
        pass
    ctypedef struct mgpu_graph_exec:
        pass
    int mgpu_graph_destroy(mgpu_graph *graph)
    int mgpu_graph_node_count(const mgpu_graph *graph)
    int mgpu_graph_instantiate(mgpu_graph *graph, mgpu_graph_exec **exec)
    int mgpu_graph_launch(mgpu_graph_exec *exec, mgpu_stream *stream)
    int mgpu_graph_exec_synchronize(mgpu_graph_exec *exec)
    int mgpu_graph_exec_destroy(mgpu_graph_exec *exec)
    int mgpu_stream_begin_capture(mgpu_stream *stream)
    int mgpu_stream_end_capture(mgpu_stream *stream, mgpu_graph **graph)
    int mgpu_stream_is_capturing(mgpu_stream *stream)
    enum:
        MGPU_EINVAL


# The (fn, args) tuples of stream callbacks added while some capture is in
# progress: a captured callback runs at every launch, so its tuple must live
# as long as the graph; the capture that ends hands them to its Graph.
_captured_calls = []


cdef class Graph:
    """A captured step, ready to launch (``mgpu_graph_exec``).

    Made by ``with mgpu.capture(stream) as g:``; usable after the block.
    ``launch()`` queues one run on the capture's stream (or another);
    ``close()`` waits for the launches and frees the graph.
    """
    cdef mgpu_graph_exec *x
    cdef readonly Stream stream
    cdef readonly int nodes
    cdef object calls

    def __init__(self, Stream stream not None):
        self.stream = stream
        self.calls = []

    def launch(self, Stream stream=None):
        """Queues one run of the graph after the work queued on stream
        (default: the stream it was captured from)."""
        cdef Stream s = self.stream if stream is None else stream
        if self.x == NULL:
            raise ERRORS[MGPU_EINVAL]("the graph was not captured, or is "
                                      "closed", "")
        _check(mgpu_graph_launch(self.x, s.s))

    def synchronize(self):
        """Waits for the launches so far; raises the first failure of a
        node on a device other than the launching stream's."""
        cdef int rc = 0
        if self.x != NULL:
            with nogil:
                rc = mgpu_graph_exec_synchronize(self.x)
        _check(rc)

    def close(self):
        """Waits for the launches and frees the graph."""
        cdef int rc = 0
        cdef mgpu_graph_exec *x = self.x
        self.x = NULL
        if x != NULL and mgpu_is_initialized():
            with nogil:
                rc = mgpu_graph_exec_destroy(x)
        self.calls = []
        if rc != MGPU_EFREED:
            _check(rc)

    def __dealloc__(self):
        if self.x != NULL and mgpu_is_initialized():
            with nogil:
                mgpu_graph_exec_destroy(self.x)

    def __repr__(self):
        return "<mgpu.Graph of %d nodes%s>" % (
            self.nodes, "" if self.x != NULL else ", not ready")


class capture:
    """``with mgpu.capture(stream) as g:`` records the work queued on
    stream (and on the streams that join it through events) instead of
    running it; after the block ``g`` is a Graph to launch. A call that
    cannot be recorded raises inside the block (a synchronize of the
    stream: NotSupportedError); an exception leaving the block ends the
    capture and drops what was recorded."""

    def __init__(self, Stream stream not None):
        self.stream = stream
        self.graph = Graph(stream)

    def __enter__(self):
        self._calls_before = len(_captured_calls)
        _check(mgpu_stream_begin_capture((<Stream>self.stream).s))
        return self.graph

    def __exit__(self, exc_type, exc, tb):
        cdef mgpu_graph *g = NULL
        cdef mgpu_graph_exec *x = NULL
        cdef Graph graph = self.graph
        rc = mgpu_stream_end_capture((<Stream>self.stream).s, &g)
        graph.calls = _captured_calls[self._calls_before:]
        del _captured_calls[self._calls_before:]
        if exc_type is not None:
            if g != NULL:
                mgpu_graph_destroy(g)
            return False
        _check(rc)
        graph.nodes = mgpu_graph_node_count(g)
        rc = mgpu_graph_instantiate(g, &x)
        mgpu_graph_destroy(g)
        _check(rc)
        graph.x = x
        return False
