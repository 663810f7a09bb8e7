#!/usr/bin/env python3
"""Fails (exit 1) when tiler's units include each other in a cycle.

A unit is src/<folder>/<name>.cpp with include/tiler/<folder>/<name>.hpp (or a private src/ header beside it);
unit A uses unit B when a file of A includes B's header. The floors (cmake/floors.cmake) keep includes from
running up a floor; this keeps the units of one floor from leaning on each other both ways, so each can be read,
tested and replaced from the bottom up. Prints every cycle with the include lines that close it.
Usage: check_units.py SOURCE_DIR
"""
import os
import re
import sys

PUBLIC = re.compile(r'^#include\s*[<"]tiler/([a-z0-9_/]+)\.hpp[>"]')
PRIVATE = re.compile(r'^#include\s*"([a-z0-9_./]+)\.hpp"')


def unit_graph(root):
    """unit -> {used unit: 'file:line: include'}"""
    uses = {}
    for base in ("src", os.path.join("include", "tiler")):
        for folder, _, names in os.walk(os.path.join(root, base)):
            for name in sorted(names):
                if not name.endswith((".cpp", ".hpp")):
                    continue
                path = os.path.join(folder, name)
                unit = os.path.splitext(os.path.relpath(path, os.path.join(root, base)))[0]
                edges = uses.setdefault(unit, {})
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        used = None
                        m = PUBLIC.match(line)
                        if m:
                            used = m.group(1)
                        elif base == "src":
                            m = PRIVATE.match(line)
                            if m:
                                here = os.path.dirname(unit)
                                used = os.path.normpath(os.path.join(here, m.group(1)))
                        if used and used != unit:
                            where = f"{os.path.relpath(path, root)}:{number}: {line.strip()}"
                            edges.setdefault(used, where)
    return uses


def cycles(uses):
    """The strongly connected components of more than one unit (Tarjan's, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(uses):
        if start in index:
            continue
        work = [(start, iter(sorted(uses[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            unit, children = work[-1]
            advanced = False
            for child in children:
                if child not in uses:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(uses[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[unit] = min(low[unit], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[unit])
            if low[unit] == index[unit]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == unit:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    uses = unit_graph(root)
    found = cycles(uses)
    for component in found:
        members = set(component)
        print("units that include each other: " + " <-> ".join(component))
        for unit in component:
            for used, where in sorted(uses[unit].items()):
                if used in members:
                    print("  " + where)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
