#!/usr/bin/env python3
"""The layer check: each layer of src/ uses only the layers above it.

Reads every #include "..." of the .c, .h and .cu files under src/ and fails
(exit 1, one line per offence naming the file and line) when a file includes
a header of a layer below its own, or of another folder of its own row
(sideways). docs/ARCHITECTURE.md explains the order; this table is the
one place that writes down the layer of each folder.

Usage: tools/check-layers.py [--root DIR]   (DIR: the repository, default
the one holding this script)
"""
import os
import re
import sys

# The layers, from the top (the floor every layer may use) down. A file may
# include headers of its own folder and of the folders of the rows above its
# own; folders of one row do not include each other. src/mpi and src/store
# are the modules; tools/, bench/, examples/ and tests/ are outside
# src/ and use the public headers only.
LAYERS = [
    ("util",),                          # platform: threads, errors, log, NUMA
    ("obs",),                           # the recording floor: metrics, trace
    ("backend",),                       # the backend table, host, CUDA plugin
    ("core",),                          # init, config, handles, devices, memory
    ("copy",),                          # the one copy entry point and its paths
    ("topo",),                          # the link matrix (measures copies)
    ("part", "sched", "coll", "chan", "graph"),  # distributions, tasks,
                                        # collectives, channels, graphs
    ("mpi", "store"),                   # modules built on the layers above
]

# Public headers (include/mgpu/) belong to the layer that implements them:
# mgpu/<folder>.h to that folder, and these. mgpu/core.h also carries the
# types every layer shares (mgpu_config, the device properties, the kinds,
# MGPU_MAX_DEVICES, MGPU_EXTERN), so it is open to every layer, as are the
# version and visibility headers; mgpu.h (everything) is for users only.
PUBLIC = {
    "mgpu/error.h": "util",
    "mgpu/metrics.h": "obs",
    "mgpu/trace.h": "obs",
    "mgpu/fault.h": "util",
    "mgpu/module.h": "util",
    "mgpu/interop.h": "core",
}
SHARED_TYPES = {"mgpu/core.h", "mgpu/version.h", "mgpu/visibility.h",
                "mgpu/dlpack.h"}

RANK = {folder: i for i, row in enumerate(LAYERS) for folder in row}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def header_folder(target):
    """The folder (layer) a quoted include belongs to, or None if unknown."""
    if target in SHARED_TYPES:
        return "*"
    if target == "mgpu.h":
        return None
    if target.startswith("mgpu/"):
        if target in PUBLIC:
            return PUBLIC[target]
        name = target[len("mgpu/"):-len(".h")]
        return name if name in RANK else None
    return target.split("/")[0] if "/" in target else None


def check(root):
    src = os.path.join(root, "src")
    errors = []
    for dirpath, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            parts = os.path.relpath(path, src).split(os.sep)
            own = parts[0] if len(parts) > 1 else None
            if own not in RANK:
                errors.append(f"{rel}: folder src/{own} has no layer in "
                              "tools/check-layers.py")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    if "/" not in target and not target.startswith("mgpu"):
                        # A header next to the file: its own folder.
                        if os.path.exists(os.path.join(dirpath, target)):
                            continue
                    folder = header_folder(target)
                    where = f"{rel}:{lineno}: includes \"{target}\""
                    if folder == "*" or folder == own:
                        continue
                    if folder is None or folder not in RANK:
                        errors.append(f"{where}, a header of no known layer "
                                      "(add it to tools/check-layers.py)")
                    elif RANK[folder] == RANK[own]:
                        errors.append(f"{where}: {folder} sits beside {own} "
                                      "in the layer order (sideways)")
                    elif RANK[folder] > RANK[own]:
                        errors.append(f"{where}: {folder} is a layer below "
                                      f"{own}")
    return errors


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(argv) == 3 and argv[1] == "--root":
        root = argv[2]
    elif len(argv) != 1:
        print("usage: tools/check-layers.py [--root DIR]", file=sys.stderr)
        return 2
    if not os.path.isdir(os.path.join(root, "src")):
        print(f"check-layers: {root} has no src/", file=sys.stderr)
        return 2
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check-layers: {len(errors)} include(s) break the layer order "
              "(docs/ARCHITECTURE.md)")
        return 1
    print("check-layers: every include of src/ follows the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
