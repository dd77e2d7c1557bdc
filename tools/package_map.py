"""The package map of docs/architecture.md, drawn from the code's own imports.

Each room is a package of ``appliance`` (or a module at its top); an arrow A -> B
says some module of A imports some module of B (at the top or in a function).
A room is described by the first line of its docstring. The map goes between
``<!-- package-map:begin -->`` and ``<!-- package-map:end -->`` of
docs/architecture.md, as a Mermaid diagram and a table, so it cannot drift:
``make docs-check`` fails when it is out of date, ``make docs-architecture``
writes it. Usage::

    python tools/package_map.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- package-map:begin -->", "<!-- package-map:end -->"
PACKAGE = "appliance"
# Rooms drawn one level deeper: the foreign formats, each its own folder.
DEEPER = ("appliance.formats",)
# Generated code: drawn as one room, but its arrows are the protocols' own business.
HIDDEN = ("appliance._generated",)


def room_of(module: str) -> str:
    """The room a module belongs to: its package under ``appliance`` (a level deeper in DEEPER)."""
    parts = module.split(".")
    depth = 2
    for deeper in DEEPER:
        if module.startswith(deeper + ".") and len(parts) > 3:
            depth = 3
    return ".".join(parts[:depth])


def rooms_and_arrows() -> tuple[list[str], dict[str, set[str]]]:
    graph = grimp.build_graph(PACKAGE)
    arrows: dict[str, set[str]] = defaultdict(set)
    rooms: set[str] = set()
    for module in graph.modules:
        if module == PACKAGE or module.startswith(HIDDEN):
            continue
        room = room_of(module)
        rooms.add(room)
        for imported in graph.find_modules_directly_imported_by(module):
            other = room_of(imported)
            if imported == PACKAGE or imported.startswith(HIDDEN) or other == room:
                continue
            # A format's room inside formats/ is drawn apart from formats itself.
            arrows[room].add(other)
    return sorted(rooms), arrows


def summary(room: str) -> str:
    """The first line of the room's docstring (read, not imported: __main__ would run)."""
    path = ROOT / Path(*room.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = (ast.get_docstring(ast.parse(source.read_text())) or "").strip()
    return doc.split("\n")[0].strip().rstrip(".") if doc else ""


def short(room: str) -> str:
    return room.removeprefix(PACKAGE + ".")


def render() -> str:
    rooms, arrows = rooms_and_arrows()
    lines = [
        BEGIN,
        "<!-- written by tools/package_map.py (make docs-architecture); do not edit -->",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    for room in rooms:
        lines.append(f'    {_node(room)}["{short(room)}"]')
    for room in rooms:
        for other in sorted(arrows.get(room, ())):
            lines.append(f"    {_node(room)} --> {_node(other)}")
    lines += ["```", "", "| room | what it holds | imports |", "|---|---|---|"]
    for room in rooms:
        imports = ", ".join(short(o) for o in sorted(arrows.get(room, ()))) or "(nothing)"
        lines.append(f"| `{short(room)}` | {summary(room)} | {imports} |")
    lines.append(END)
    return "\n".join(lines)


def _node(room: str) -> str:
    return short(room).replace(".", "_")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    page = PAGE.read_text()
    if BEGIN not in page or END not in page:
        print(f"{PAGE} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    before, rest = page.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    updated = before + render() + after
    if args.check:
        if updated != page:
            print(
                f"{PAGE.relative_to(ROOT)}: the package map is out of date; run "
                "`make docs-architecture`",
                file=sys.stderr,
            )
            return 1
        return 0
    if updated != page:
        PAGE.write_text(updated)
        print(f"wrote the package map into {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
