#!/usr/bin/env python3
"""Import cycles between the top-level modules of each crate.

A crate's top-level modules (src/X.rs or src/X/) form a graph: X -> Y when
X's non-test code names `crate::Y::...`. A cycle means neither module can be
read, tested or moved without the other (issue 33: "no import cycles inside
any crate"). Prints each cycle with the names its edges use and exits 1 if
there is one; `make lint` runs it.

Usage: scripts/module_cycles.py [CRATES_DIR]   (default: crates/ next to this script)
"""
import collections
import glob
import os
import re
import sys


def modules(src):
    """Top-level module name -> its source files (lib.rs and main.rs are roots, not modules)."""
    m = {}
    for p in glob.glob(src + "/**/*.rs", recursive=True):
        top = os.path.relpath(p, src).split("/")[0].removesuffix(".rs")
        if top not in ("lib", "main"):
            m.setdefault(top, []).append(p)
    return m


def code(path):
    """The file's non-test code without comments (tests may reach anywhere)."""
    if path.endswith("_tests.rs") or "/tests/" in path:
        return ""
    t = open(path).read()
    k = t.find("#[cfg(test)]\nmod tests")
    if k >= 0:
        t = t[:k]
    return re.sub(r"//.*", "", t)


def edges(src):
    m = modules(src)
    why = collections.defaultdict(set)
    for top, files in m.items():
        for f in files:
            t = code(f)
            for mm in re.finditer(r"\bcrate::([a-z_][a-z0-9_]*)(::[A-Za-z_][A-Za-z0-9_]*)?", t):
                if mm.group(1) in m and mm.group(1) != top:
                    why[(top, mm.group(1))].add((mm.group(2) or "::*")[2:])
            for group in re.findall(r"use crate::\{([^}]*)\}", t):
                for d in re.findall(r"\b([a-z_][a-z0-9_]*)::", group):
                    if d in m and d != top:
                        why[(top, d)].add("{..}")
    graph = {k: set() for k in m}
    for a, b in why:
        graph[a].add(b)
    return graph, why


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "crates")
    found = 0
    for src in sorted(glob.glob(os.path.join(root, "*", "src"))):
        graph, why = edges(src)
        for comp in cycles(graph):
            found += 1
            crate = os.path.basename(os.path.dirname(src))
            print(f"{crate}: {' <-> '.join(comp)}")
            for (a, b), names in sorted(why.items()):
                if a in comp and b in comp:
                    print(f"  {a} -> {b}: {', '.join(sorted(names)[:4])}")
    if found:
        print(f"{found} module cycle(s)")
        sys.exit(1)


if __name__ == "__main__":
    main()
