"""The shape of runner/: no import cycle anywhere (import-linter's layer contracts, run by
scripts/test.sh, forbid upward imports between layers; this forbids cycles inside a layer too),
and no module over 500 lines without saying why at its top."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent / "runner"


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_in_runner() -> None:
    """Function-level imports count; imports only for type checking do not."""
    graph = grimp.build_graph("runner", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(name)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.c", imported="a.d")
    assert _cycles(graph) == [["a.b", "a.c"]]


def test_long_modules_say_why() -> None:
    long = {
        str(path.relative_to(ROOT.parent)): path.read_text()
        for path in ROOT.rglob("*.py")
        if len(path.read_text().splitlines()) > 500
    }
    unexplained = [name for name, text in long.items() if "Long on purpose:" not in text[:3000]]
    assert unexplained == [], "modules over 500 lines without 'Long on purpose:' at their top"
