# ---------------------------------------------------------------------------
# Peer access

def peer_can_access(a, b):
    """True when device a can copy to or read device b directly."""
    cdef int yes = 0
    _check(mgpu_peer_can_access(_devno(a), _devno(b), &yes))
    return bool(yes)


def peer_enable(a, b):
    """Turns direct copies between a and b on."""
    _check(mgpu_peer_enable(_devno(a), _devno(b)))


def peer_disable(a, b):
    """Turns direct copies off: copies between a and b go host-staged."""
    _check(mgpu_peer_disable(_devno(a), _devno(b)))


def copy_path(src, dst):
    """The path a copy from src to dst takes now ("direct", "staged"...)."""
    cdef mgpu_copy_path p
    _check(mgpu_copy_path_get(_devno(src), _devno(dst), &p))
    return mgpu_copy_path_name(p).decode()


# ---------------------------------------------------------------------------
# Metrics

def metrics():
    """Every device's counters: a dict with ``ndevices``,
    ``load_imbalance`` and ``devices`` (one dict per device)."""
    cdef mgpu_metrics m
    m.size = sizeof(m)
    _check(mgpu_metrics_snapshot(&m))
    return {"ndevices": m.ndevices, "load_imbalance": m.load_imbalance,
            "devices": mgpu_py_metrics(&m)}


def reset_metrics():
    """Sets every counter to 0 (and every peak to the current value)."""
    _check(mgpu_metrics_reset())


