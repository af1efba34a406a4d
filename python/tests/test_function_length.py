"""Every function of the package's sources (python/: .py, .pyx, .pxi) and of
its tests reads on one screen: at most 80 lines, signature to last line of
its body. One that grows past it holds two ideas: split it there."""
import glob
import os
import re

LIMIT = 80
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # python/

# A def, cdef or cpdef function or method (not a cdef class, attribute or
# extern block), with its indentation.
DEF = re.compile(r"^(\s*)(?:async\s+)?(?:c?p?def)\s+(?!class\b|extern\b)"
                 r"[\w\[\]\*\s,.]*?\b(\w+)\s*\(")


def lengths(text):
    """(first line, name, lines) of each function in Python or Cython text:
    a body is every line indented deeper than its def, blank lines inside
    counted."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = DEF.match(line)
        if not m:
            continue
        indent, last = len(m.group(1)), i
        for k in range(i + 1, len(lines)):
            t = lines[k]
            if not t.strip():
                continue
            if len(t) - len(t.lstrip()) <= indent and not t.lstrip().startswith((")", "]")):
                break
            last = k
        yield i + 1, m.group(2), last - i + 1


def sources():
    found = []
    for pattern in ("mgpu/*.py", "mgpu/*.pyx", "mgpu/*.pxi", "tests/*.py"):
        found += glob.glob(os.path.join(ROOT, pattern))
    return sorted(found)


def test_measure_counts_a_body():
    text = "def f(a,\n      b):\n    x = 1\n\n    return x\n\n\ndef g():\n    pass\n"
    assert list(lengths(text)) == [(1, "f", 5), (8, "g", 2)]
    text = "cdef class C:\n    cdef int n\n    cdef _m(self, int k):\n        pass\n"
    assert list(lengths(text)) == [(3, "_m", 2)]


def test_no_function_over_80_lines():
    files = sources()
    assert any(f.endswith("_core.pyx") for f in files), files
    long = ["%s:%d %s (%d lines)" % (os.path.relpath(f, ROOT), first, name, n)
            for f in files
            for first, name, n in lengths(open(f, encoding="utf-8").read())
            if n > LIMIT]
    assert long == [], "functions over %d lines: %s" % (LIMIT, long)
