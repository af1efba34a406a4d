"""mgpu.store: device buffers shared between processes through the store
daemon (``mgpud`` or ``mgpu store serve``; docs/store.md).

    import mgpu, mgpu.store, numpy as np
    mgpu.init(devices="host:1")
    with mgpu.store.connect("/tmp/s.sock") as st:
        oid = st.put(np.arange(4, dtype="f4"), name="x")
        a = st.get("x", dtype="f4")      # read-only, no copy
        print(np.asarray(a))             # [0. 1. 2. 3.]
"""
from mgpu._core import Store, StoreArray, StoreMirror  # noqa: F401

connect = Store.connect
