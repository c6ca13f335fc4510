#!/usr/bin/python3
"""Fails on an include cycle among the project's own C++ files.

With --units a header and its source (foo.h with foo.cc) are one unit, so
two sources that include each other's headers are a cycle too (what
server/matmul_service.cc and multiply_stream_reactor.cc once did). Without
it, files: a cycle is a header that ends up including itself. Prints the
number of nodes checked, and each cycle found.

  scripts/check_include_cycles.py [--units] FOLDER ...
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def units(folders):
    files = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            files += [os.path.join(root, n) for n in names if n.endswith((".h", ".cc"))]
    return files


def main(argv):
    by_unit = "--units" in argv
    folders = [a for a in argv[1:] if a != "--units"]
    files = [f for f in units(folders) if "node_modules" not in f]
    unit = (lambda path: os.path.splitext(path)[0]) if by_unit else (lambda path: path)
    known = {unit(f) for f in files}
    graph = {}
    for f in files:
        with open(f, encoding="utf-8") as text:
            for inc in INCLUDE.findall(text.read()):
                a, b = unit(f), unit(inc)
                if a != b and b in known:
                    graph.setdefault(a, set()).add(b)
    cycles, state = [], {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(known):
        if node not in state:
            visit(node, [node])
    kind = "units" if by_unit else "files"
    print(f"include cycles: {len(known)} {kind} in {' '.join(folders)}, {len(cycles)} cycles")
    for c in cycles:
        print("  cycle: " + " -> ".join(c))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
