#!/usr/bin/env python3
"""The layer check: each layer of src/ uses only the layers above it.

Two checks, each failing (exit 1, one line per offence):

- by include: every #include "..." of the .c, .h and .cu files under src/;
  a file may not include a header of a layer below its own, or of another
  folder of its own row (sideways);
- by symbol (with --build DIR, a configured and built tree): every object
  file's undefined symbols (readelf) are mapped to the folder whose object
  defines them. A folder of the library may reference only its own folder
  and the layers above it, whatever the source wrote (a local prototype, an
  `extern`, a public header); the link units outside the library see only
  what they can link: a backend plugin nothing of libmgpu (it reaches the
  library through its env table), the MPI module, the Python extensions
  and the tools (tools/, bench/) only libmgpu's exported public calls
  (mgpu_*, default visibility). Only a CUDA plugin may reference CUDA or
  NCCL, only an OpenCL plugin OpenCL, and MPI only the MPI module, the
  Python package's mgpu._mpi and the tools (nothing in libmgpu, nor
  mgpu._core, which `import mgpu` loads).

docs/ARCHITECTURE.md explains the order; this table is the one place that
writes down the layer of each folder.

Usage: tools/check-layers.py [--root DIR] [--build DIR]   (--root: the
repository, default the one holding this script; --build: a build folder
of it, for the symbol check)
"""
import os
import re
import subprocess
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


# The link units of a build folder, by where CMake puts their objects
# (relative to the build folder): (pattern, unit). Groups: the library's
# folder is its first path part under src/; a plugin is one unit of its own.
UNITS = [
    (re.compile(r"^CMakeFiles/mgpu_objects\.dir/src/([^/]+)/"), "lib"),
    (re.compile(r"^src/backend/([^/]+)/CMakeFiles/mgpu_\1\.dir/"), "plugin"),
    (re.compile(r"^src/mpi/CMakeFiles/mgpu_mpi\.dir/"), "mpi"),
    (re.compile(r"^python/CMakeFiles/mgpu_python\.dir/"), "python"),
    (re.compile(r"^python/CMakeFiles/mgpu_python_mpi\.dir/"), "python-mpi"),
    (re.compile(r"^CMakeFiles/(mgpu_tool|mgpu_toollib|mgpud)\.dir/"), "tools"),
]

# Vendor APIs and the one unit kind that may reference each.
VENDOR = [
    (re.compile(r"^(cuda|cu[A-Z]|__cuda|nccl|nvrtc)"), "CUDA", "cuda"),
    (re.compile(r"^cl[A-Z]"), "OpenCL", "opencl"),
    (re.compile(r"^P?MPI[X_]"), "MPI", None),
]


def unit_of(rel):
    """(unit, name) of an object file, or None for objects outside the
    check (tests, examples, fuzzers, peer baselines)."""
    for pattern, unit in UNITS:
        m = pattern.match(rel)
        if m:
            if unit == "lib":
                return ("lib", m.group(1))
            if unit == "plugin":
                return ("plugin", m.group(1))
            return (unit, unit)
    return None


def symbols(path):
    """(defined, undefined) global symbols of one object file: defined maps
    a name to True when it is exported (default visibility)."""
    out = subprocess.run(["readelf", "-sW", path], capture_output=True,
                         text=True, check=True).stdout
    defined, undefined = {}, set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":") or f[4] not in ("GLOBAL", "WEAK"):
            continue
        name = f[7].split("@")[0]
        if f[6] == "UND":
            undefined.add(name)
        else:
            defined[name] = f[5] == "DEFAULT"
    return defined, undefined


def objects(build):
    for dirpath, _, files in sorted(os.walk(build)):
        for name in sorted(files):
            if name.endswith(".o"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, build)
                u = unit_of(rel)
                if u:
                    yield rel, path, u


def check_symbols(build):
    """The symbol check over a build folder (see the module's comment)."""
    objs = [(rel, u, *symbols(path)) for rel, path, u in objects(build)]
    if not any(u[0] == "lib" for _, u, _, _ in objs):
        return [f"{build}: no object of libmgpu found (build it first)"]
    where = {}      # symbol -> (unit, name, exported)
    for _, u, defined, _ in objs:
        for sym, exported in defined.items():
            where.setdefault(sym, (u[0], u[1], exported))
    errors = []
    for rel, (unit, name), _, undefined in objs:
        for sym in sorted(undefined):
            why = offence(unit, name, sym, where.get(sym))
            if why:
                errors.append(f"{rel}: references {sym}, {why}")
    return errors


def offence(unit, name, sym, home):
    """Why `unit`/`name` may not reference `sym` defined at `home`, or None."""
    if home is None:
        for pattern, api, plugin in VENDOR:
            if pattern.match(sym) and not (unit == "plugin" and name == plugin) \
                    and not (api == "MPI" and unit in ("mpi", "python-mpi", "tools")):
                return f"a {api} call: only the {plugin or 'MPI'} " \
                       f"{'plugin' if plugin else 'module'} may use {api}"
        return None
    hunit, hname, exported = home
    if (hunit, hname) == (unit, name):
        return None
    if unit == "lib" and hunit == "lib":
        if hname not in RANK or name not in RANK:
            return f"defined in src/{hname}, a folder of no known layer"
        if RANK[hname] == RANK[name]:
            return f"defined in src/{hname}, beside {name} (sideways)"
        if RANK[hname] > RANK[name]:
            return f"defined in src/{hname}, a layer below {name}"
        return None
    if unit == "plugin":
        return f"defined in {label(home)}: a plugin links nothing of " \
               "libmgpu (it reaches the library through its env table)"
    if unit == "lib":
        return f"defined in {label(home)}, outside the library"
    if unit == "tools" and hunit in ("python", "python-mpi"):
        return f"defined in {label(home)}"
    if hunit in ("lib", "mpi") and exported and sym.startswith("mgpu_") \
            and not sym.startswith("mgpu__"):
        return None
    return f"defined in {label(home)}, not a public call (only mgpu_* " \
           "of include/ cross a link boundary)"


def label(home):
    unit, name, _ = home
    return {"lib": f"src/{name}", "plugin": f"the {name} plugin"}.get(
        unit, f"the {unit} unit")


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = None
    args = argv[1:]
    while args:
        if len(args) >= 2 and args[0] == "--root":
            root = args[1]
        elif len(args) >= 2 and args[0] == "--build":
            build = args[1]
        else:
            print("usage: tools/check-layers.py [--root DIR] [--build DIR]",
                  file=sys.stderr)
            return 2
        args = args[2:]
    if not os.path.isdir(os.path.join(root, "src")):
        print(f"check-layers: {root} has no src/", file=sys.stderr)
        return 2
    if not report(check(root), "include(s) break the layer order",
                  "every include of src/ follows the layer order"):
        return 1
    if build is not None and not report(
            check_symbols(build),
            "reference(s) break the layer order or a link boundary",
            "every symbol reference of the build follows the layer order "
            "and the link boundaries"):
        return 1
    return 0


def report(errors, bad, good):
    """Prints errors (one a line) and a closing line; True when none."""
    for e in errors:
        print(e)
    if errors:
        print(f"check-layers: {len(errors)} {bad} (docs/ARCHITECTURE.md)")
        return False
    print(f"check-layers: {good}")
    return True

if __name__ == "__main__":
    sys.exit(main(sys.argv))
