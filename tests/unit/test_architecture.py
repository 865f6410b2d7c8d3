"""The shape of runner/: no import cycle anywhere (import-linter's layer contracts, run by
scripts/test.sh, forbid upward imports between layers; this forbids cycles inside a layer too),
every package named in the layers, an upward import shown to break them, and no module over
500 lines without saying why at its top."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2] / "runner"


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


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's own command on a source tree laid out as this checkout (runner/ and
    pyproject.toml), importing that tree's runner rather than this one."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_every_package_of_runner_is_in_the_layers() -> None:
    """A new package (or a module left at the top) cannot slip past the layer contract by not
    being named in it."""
    layers = next(c for c in _contracts() if c["name"].startswith("packages by domain"))
    named = {m.strip() for row in layers["layers"] for m in row.replace(":", "|").split("|")}
    present = {
        f"runner.{p.stem if p.is_file() else p.name}"
        for p in ROOT.iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file())
        or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert present - named == set(), "runner/ packages missing from the layers contract"
    assert named - present == set(), "the layers contract names packages that do not exist"


@pytest.mark.parametrize(
    ("importer", "statement", "contract"),
    [
        # the bottom importing the top
        ("core/log.py", "from runner.cli import _common", "packages by domain"),
        # one sibling importing the other on a row marked independent
        (
            "scheduling/kubernetes/render.py",
            "from runner.execution import orchestrator",
            "packages by domain",
        ),
        # inside a package: the container imports the attempt it runs
        ("execution/container.py", "from runner.execution import attempt", "execution:"),
    ],
)
def test_an_upward_import_breaks_the_layers(
    tmp_path: Path, importer: str, statement: str, contract: str
) -> None:
    """The contracts are checked, not only written: the same tree passes as it is and fails
    with one import that goes up (or across independent siblings) added."""
    shutil.copytree(ROOT, tmp_path / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    if importer == "core/log.py":  # once is enough for the baseline: the copy passes as is
        clean = _lint_imports(tmp_path)
        assert clean.returncode == 0, clean.stdout + clean.stderr
    module = tmp_path / "runner" / importer
    module.write_text(module.read_text() + f"\n{statement}  # noqa\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0, broken.stdout
    failing = [line for line in broken.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in failing), broken.stdout
    dotted = "runner." + importer.removesuffix(".py").replace("/", ".")
    assert dotted in broken.stdout, broken.stdout
