"""mgpu.trace: a timeline of what every device did, as a Chrome trace-event
JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing open, and
that `mgpu trace view` draws (docs/trace.md).

    mgpu.trace.start("run.json")
    ...                                   # mgpu work, from any thread
    with mgpu.trace.span("check"):        # a span of your own
        ...
    mgpu.trace.stop()                     # writes run.json

``mgpu.init(trace="run.json")`` records from init to shutdown.
"""
import contextlib

from mgpu._core import (trace_active as active, trace_now_ns as now_ns,
                        trace_start as start, trace_stats as stats,
                        trace_stop as stop, trace_span as _span)

__all__ = ["start", "stop", "active", "stats", "now_ns", "span"]


@contextlib.contextmanager
def span(name):
    """Records the with-block as a span named name on the calling thread's
    track (nothing when not recording)."""
    t0 = now_ns()
    try:
        yield
    finally:
        _span(name, t0, now_ns())
