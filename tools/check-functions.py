#!/usr/bin/env python3
"""The function-length check: no function of src/ (or of the named folders
of src/) is longer than the limit (60 lines), so that each reads on one
screen. Every C and CUDA source and header counts (.c, .h, .cu, .cuh), the
backends, plugins and modules included.

A function's length counts its lines from the one with its opening brace to
the one with its closing brace, both included. The scan is lexical: it
skips comments, string and character literals and preprocessor lines, and
takes each brace opened at file level after a parenthesised parameter list
as a function body (struct, union, enum and initializer braces are not).

Exit 0 when every function fits, 1 with one line per function over the
limit ("path:line: name is N lines (limit L)"), 2 on bad usage.

Usage: tools/check-functions.py [--root DIR] [--limit N] [FOLDER...]
(FOLDER relative to DIR/src, e.g. core backend/cuda; none: all of src/;
--root: the repository, default the one holding this script)
"""
import os
import re
import sys

LIMIT = 60
SOURCES = (".c", ".h", ".cu", ".cuh")


def strip_code(text):
    """Returns text with comments and literals blanked, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(j - i - 2, 0) + (c if j - i > 1 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """Yields (name, first line, length in lines) of each function."""
    lines = strip_code(text).split("\n")
    depth, start, name, head = 0, None, None, ""
    for lineno, line in enumerate(lines, 1):
        if depth == 0 and line.lstrip().startswith("#"):
            head = ""
            continue
        for ch in line:
            if ch == "{":
                if depth == 0:
                    m = re.search(r"([A-Za-z_]\w*)\s*\([^;{}]*\)\s*$", head)
                    is_fn = m is not None and not re.search(
                        r"=\s*$|\b(struct|union|enum)\b[^(]*$", head)
                    start, name = (lineno, m.group(1)) if is_fn else (None, None)
                depth += 1
            elif ch == "}":
                depth = max(depth - 1, 0)
                if depth == 0:
                    if start is not None:
                        yield name, start, lineno - start + 1
                    start, head = None, ""
            elif depth == 0:
                head += ch
                if ch == ";":
                    head = ""
        if depth == 0:
            head += " "


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    limit, folders = LIMIT, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("--root", "--limit") and args:
            v = args.pop(0)
            if a == "--root":
                root = v
            elif v.isdigit():
                limit = int(v)
            else:
                print("check-functions: --limit takes a number", file=sys.stderr)
                return 2
        elif a.startswith("-"):
            print(__doc__.strip().splitlines()[-3], file=sys.stderr)
            return 2
        else:
            folders.append(a)
    bad = 0
    for folder in folders or [""]:
        top = os.path.join(root, "src", folder)
        if not os.path.isdir(top):
            print("check-functions: no folder src/%s" % folder, file=sys.stderr)
            return 2
        for dirpath, _, files in sorted(os.walk(top)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for name, line, length in functions(text):
                    if length > limit:
                        print("%s:%d: %s is %d lines (limit %d)" % (
                            os.path.relpath(path, root), line, name, length,
                            limit))
                        bad += 1
    if bad:
        return 1
    print("check-functions: every function of src/%s fits in %d lines" % (
        ",".join(folders), limit))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
