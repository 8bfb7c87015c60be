#!/usr/bin/env python3
"""The module graph of src/: files as nodes, `crate::`/`super::` paths as edges.

Prints the import circles (strongly connected components of more than one
file) and every file over the size limit; exits 1 when there is a circle.
Usage: scripts/modgraph.py [--edges] [--max-lines N]
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def files():
    out = {}
    for d, _, fs in os.walk(ROOT):
        if os.path.relpath(d, ROOT).startswith("bin"):
            continue
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                out[module_of(p)] = p
    return out


def strip_tests(text):
    # comments and doc links are not imports
    text = re.sub(r"//[^\n]*", "", text)
    # drop `#[cfg(test)] mod tests { ... }` blocks: test code may import anything
    m = re.search(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text


PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super)((?:::\w+)*)::\{([^;]*)\};", re.S)


def paths_in(text):
    for m in USE_GROUP.finditer(text):
        base = m.group(1) + m.group(2)
        for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", m.group(3))):
            item = item.strip()
            if item and item != "self":
                yield (base + "::" + item.split("::")[0]).split("::")
            elif item == "self":
                yield base.split("::")
        # nested groups: `a::{b, c}` inside the group
        for inner in re.finditer(r"(\w+)::\{([^}]*)\}", m.group(3)):
            for it in inner.group(2).split(","):
                it = it.strip()
                if it and it != "self":
                    yield (base + "::" + inner.group(1) + "::" + it).split("::")
    for m in PATH.finditer(text):
        yield [m.group(1)] + m.group(2).strip(":").split("::")


def resolve(mod, parts, mods):
    if parts[0] == "crate":
        cur = ()
    else:
        cur = mod
        # a mod.rs's `super` is its folder's parent; a file's `super` its folder
        while parts and parts[0] == "super":
            cur = cur[:-1]
            parts = parts[1:]
        parts = ["x"] + parts
    best = None
    for i in range(1, len(parts)):
        cand = cur + tuple(parts[1 : i + 1])
        if cand in mods:
            best = cand
    return best


def main():
    max_lines = 500
    if "--max-lines" in sys.argv:
        max_lines = int(sys.argv[sys.argv.index("--max-lines") + 1])
    mods = files()
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        text = strip_tests(open(p).read())
        for parts in paths_in(text):
            t = resolve(m, parts, mods)
            if t is not None and t != m and t != m[: len(t)]:
                edges[m].add(t)
    if "--edges" in sys.argv:
        for m in sorted(edges):
            for t in sorted(edges[m]):
                print("::".join(m), "->", "::".join(t))
    # Tarjan
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                sccs.append(comp)

    for v in sorted(mods):
        if v not in index:
            visit(v)
    for comp in sccs:
        print("circle:", " ".join(sorted("::".join(c) for c in comp)))
    for m, p in sorted(mods.items()):
        n = sum(1 for _ in open(p))
        if n > max_lines:
            print(f"long file: {os.path.relpath(p, os.path.dirname(ROOT))} {n} lines")
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main())
