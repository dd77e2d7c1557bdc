"""Fail when any two modules of the appliance import each other, however indirectly.

import-linter's contracts keep the layers apart; this finds any circle between
modules, including one closed by an import inside a function (grimp reads those
too): such an import hides a circle rather than breaking it. ``make lint`` runs
it. Usage::

    python tools/import_cycles.py [--package appliance]
"""

from __future__ import annotations

import argparse
import sys

import grimp


def cycles(package: str) -> list[list[str]]:
    """Each group of modules that import one another (Tarjan's strongly connected components)."""
    graph = grimp.build_graph(package)
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        # Iterative, so a deep import chain cannot exhaust the recursion limit.
        nonlocal counter
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            advanced = False
            for other in imported:
                if other not in graph.modules:
                    continue
                if other not in index:
                    index[other] = low[other] = counter
                    counter += 1
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                    advanced = True
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--package", default="appliance")
    args = parser.parse_args()
    found = cycles(args.package)
    for group in found:
        print("import circle: " + " <-> ".join(group), file=sys.stderr)
    if found:
        print(
            f"{len(found)} import circle(s): move the piece both sides need into a module "
            "below them (a function-level import does not break a circle)",
            file=sys.stderr,
        )
        return 1
    print(f"no import circles in {args.package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
