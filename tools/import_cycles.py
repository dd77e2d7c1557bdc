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
    """Each circle of imports, as the modules on it (first the one whose import closes it)."""
    graph = grimp.build_graph(package)
    found: dict[frozenset[str], list[str]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported == importer or imported not in graph.modules:
                continue
            # importer -> imported closes a circle if imported leads back to importer.
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                circle = [importer, *back[:-1]]
                found.setdefault(frozenset(circle), circle)
    return sorted(found.values())


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
