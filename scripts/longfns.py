#!/usr/bin/env python3
"""Functions in src/ longer than N lines (default 60), tests left out.

A function runs from its `fn` line to the closing brace at its indentation.
Usage: scripts/longfns.py [N]
"""
import os
import re
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 60
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")

found = []
for d, _, files in os.walk(ROOT):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(d, f)
        lines = open(path).read().split("\n")
        in_tests = None
        for i, line in enumerate(lines):
            if re.match(r"\s*#\[cfg\(test\)\]", line):
                in_tests = len(line) - len(line.lstrip())
                break
        stop = i if in_tests is not None else len(lines)
        for i, line in enumerate(lines[:stop]):
            m = FN.match(line)
            if not m:
                continue
            indent = m.group(1)
            for j in range(i + 1, stop):
                if lines[j] == indent + "}":
                    n = j - i + 1
                    if n > LIMIT:
                        found.append((n, os.path.relpath(path, os.path.dirname(ROOT)), m.group(7), i + 1))
                    break
for n, path, name, at in sorted(found, reverse=True):
    print(f"{n:4d}  {path}:{at}  {name}")
sys.exit(1 if found else 0)
