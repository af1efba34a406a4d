#!/usr/bin/env python3
"""The internal-name check: an `mgpu__` name is for what files share, so a
global `mgpu__` symbol that no other object references should be `static`
(STYLE.md, Names).

Reads every object file of a build folder (`nm`), and for each object
compiled from src/ (or from the folders of src/ named) lists the global
`mgpu__` symbols it defines that no other object of the build (library,
plugins, modules, tools, tests) references. An object's source is read from
the path CMake gives it, DIR/CMakeFiles/TARGET.dir/SOURCE.o for a target of
the build folder's DIR ("__" for ".."), so libmgpu's objects, the CUDA and
OpenCL plugins' (src/backend/cuda, src/backend/opencl) and the MPI
module's (src/mpi) are all seen.

Exit 0 when there are none, 1 with one line per symbol
("OBJECT: defines mgpu__x, used by no other object"), 2 on bad usage.

Usage: tools/check-names.py --build DIR [FOLDER...]
(FOLDER: e.g. core backend/cuda; none: all of src/)
"""
import os
import re
import subprocess
import sys


def source_of(obj, build):
    """The source path of a CMake object, relative to the repository
    (e.g. "src/mpi/coll.c"), or None for an object CMake did not name."""
    rel = os.path.relpath(obj, build).replace(os.sep, "/")
    m = re.match(r"^(?:(.*)/)?CMakeFiles/[^/]+\.dir/(.+)\.o$", rel)
    if m is None:
        return None
    parts = (m.group(1) or "").split("/") + m.group(2).split("/")
    path = os.path.normpath("/".join(".." if p == "__" else p
                                     for p in parts if p))
    return None if path.startswith("..") else path.replace(os.sep, "/")


def symbols(paths):
    """{object: (defined globals, undefined references)}, one nm run each."""
    table = {p: (set(), set()) for p in paths}
    for flags, which in ((["--defined-only", "-g"], 0), (["--undefined-only"], 1)):
        out = subprocess.run(["nm", "-A"] + flags + paths, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            path, _, rest = line.partition(":")
            fields = rest.split()
            if path in table and fields and (which == 1 or len(fields) == 3):
                table[path][which].add(fields[-1])
    return table


def main(argv):
    args = list(argv)
    build, folders = None, []
    while args:
        a = args.pop(0)
        if a == "--build" and args:
            build = args.pop(0)
        elif a.startswith("-"):
            build = None
            break
        else:
            folders.append(a)
    if build is None:
        print("usage: tools/check-names.py --build DIR [FOLDER...]",
              file=sys.stderr)
        return 2
    objects = []
    for dirpath, _, files in os.walk(build):
        objects += [os.path.join(dirpath, f) for f in files
                    if f.endswith(".o")]
    table = symbols(sorted(objects))
    users = {}
    for o, (_, used) in table.items():
        for sym in used:
            users.setdefault(sym, set()).add(o)
    bad = 0
    sources = {o: source_of(o, build) for o in table}
    for folder in folders or [""]:
        top = "/".join(p for p in ("src", folder.strip("/")) if p) + "/"
        mine = [o for o in sorted(table)
                if (sources[o] or "").startswith(top)]
        if not mine:
            print("check-names: no objects of src/%s under %s" % (folder, build),
                  file=sys.stderr)
            return 2
        for o in mine:
            for sym in sorted(table[o][0]):
                if not sym.startswith("mgpu__"):
                    continue
                if users.get(sym, set()) - {o}:
                    continue
                print("%s: defines %s, used by no other object" % (
                    os.path.relpath(o, build), sym))
                bad += 1
    if bad:
        return 1
    print("check-names: every mgpu__ symbol of src/%s is used by another "
          "object" % ",".join(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
