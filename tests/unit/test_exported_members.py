"""The runner's public surface, as httpx's test_exported_members.py checks its own.

- ``runner`` exports the few names its docstring names, ``runner.testing`` the helpers for
  code that embeds the runner; everything else is private.
- Every module of runner/ (bar ``__main__`` and the ``_``-private ones) says in ``__all__``
  which of its names other modules may import, and each of those names exists.
- No module of runner/, benchmarks/ or scripts/ imports from a runner module a name outside
  that module's ``__all__`` (``from runner.a import b`` where ``b`` is a submodule is fine,
  and so is ``b.name`` where ``name`` is in b's ``__all__``); a ``_``-private module is
  imported only from inside its own package. So the boundary holds from now on: a new
  import across modules either uses a listed name or lists it, in review.

Tests may import internals (white-box tests of a module's private helpers are what they
are), so tests/ is not checked. Benchmarks and scripts are checked: they use the runner as
code that embeds it would.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import runner
import runner.testing

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("runner", "benchmarks", "scripts")


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split(".")[1:])


def _modules() -> list[str]:
    names = ["runner"]
    names += [m.name for m in pkgutil.walk_packages(runner.__path__, "runner.")]
    return sorted(names)


PUBLIC = [m for m in _modules() if not _private(m)]


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _bound(scope: ast.AST) -> set[str]:
    """Names a function binds other than by import (its arguments, its assignments), not
    counting nested functions: such a name shadows a module imported under it."""
    names: set[str] = set()
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        a = scope.args
        names |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, not descending into the functions and classes it defines."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _uses(source: str, me: str) -> Iterator[tuple[int, str, str]]:
    """(line, module, name) for each name ``me`` takes from a runner module: ``from
    runner.a import name``, and ``b.name`` where ``b`` is a module imported under that name
    (``from runner.a import b``, ``import runner.a.b as b``, ``import runner.a.b``)."""
    tree = ast.parse(source)

    def scope(node: ast.AST, outer: dict[str, str]) -> Iterator[tuple[int, str, str]]:
        bound = _bound(node)
        aliases = {k: v for k, v in outer.items() if k not in bound}
        own = list(_own_nodes(node))
        for child in own:
            if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                if child.module.split(".")[0] != "runner":
                    continue
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    if _is_module(sub):
                        aliases[a.asname or a.name] = sub
                    elif child.module != me:
                        yield child.lineno, child.module, a.name
            elif isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.split(".")[0] == "runner":
                        aliases[a.asname or "runner"] = a.name if a.asname else "runner"
        for child in own:
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
                if child.value.id not in aliases:
                    continue
                chain, up = [child.attr], child  # the whole dotted chain a.b.c
                while isinstance(parent := _parents.get(id(up)), ast.Attribute):
                    chain.append(parent.attr)
                    up = parent
                current = aliases[child.value.id]
                for part in chain:
                    if _is_module(f"{current}.{part}"):
                        current = f"{current}.{part}"
                        continue
                    if current != me:
                        yield child.lineno, current, part
                    break
            if isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
            ):
                yield from scope(child, aliases)

    # An attribute's parent, where that is an attribute of it (the next link of a dotted
    # chain): the only parents the chain walk above asks for.
    _parents = {id(p.value): p for p in ast.walk(tree) if isinstance(p, ast.Attribute)}
    yield from scope(tree, {})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _checked_files() -> list[Path]:
    return sorted(p for top in CHECKED for p in (ROOT / top).rglob("*.py"))


def _exports(name: str) -> list[str]:
    module: ModuleType = importlib.import_module(name)
    exported: list[str] = module.__all__
    return exported


def _violations(source: str, me: str) -> list[str]:
    found = []
    for line, module, name in sorted(_uses(source, me)):
        if _private(module):
            package = module.rsplit(".", 1)[0]
            if not (me == package or me.startswith(f"{package}.")):
                found.append(f"{me}:{line} imports {name} from private module {module}")
        elif name not in _exports(module):
            found.append(f"{me}:{line} imports {name} from {module}, not in its __all__")
    return found


def test_runner_exports_what_its_docstring_names() -> None:
    public = ["ResultEnvelope", "RunOptions", "RunnerError", "VerifiedContract", "run", "verify"]
    assert sorted(runner.__all__) == sorted([*public, "__version__"])
    api = (runner.__doc__ or "").split("Public API::", 1)[1].split("\n\n")[1]
    assert sorted(api.split("import", 1)[1].replace(",", " ").split()) == sorted(public)
    for name in runner.__all__:
        assert getattr(runner, name) is not None, name


def test_runner_testing_exports_its_helpers() -> None:
    from runner.backends.fake import FakeBackend

    assert runner.testing.FakeBackend is FakeBackend
    for name in runner.testing.__all__:
        assert getattr(runner.testing, name) is not None, name
    documented = {n for n in runner.testing.__all__ if f"`{n}`" in (runner.testing.__doc__ or "")}
    assert {"FakeBackend", "FakeJob", "write_contract", "outside", "docker"} <= documented


@pytest.mark.parametrize("name", PUBLIC)
def test_module_lists_its_exports(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    for member in module.__all__:
        assert hasattr(module, member), f"{name}.__all__ names {member}, which it lacks"
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ repeats a name"


def test_imports_across_modules_use_only_exported_names() -> None:
    found: list[str] = []
    for path in _checked_files():
        found += _violations(path.read_text(encoding="utf-8"), _module_name(path))
    assert not found, "\n".join(found)


def test_the_check_sees_an_internal_import() -> None:
    source = (
        "from runner.core import errors, locks\n"
        "from runner.core.errors import RunnerError, not_exported\n"
        "from runner.parsers._lines import iter_lines\n"
        "import runner.core.log as log\n"
        "def f(locks):\n"
        "    errors.hidden\n"
        "    locks.anything\n"  # an argument, not the module
        "    log.configure, log.secret\n"
    )
    assert [v.split(" ", 1)[1] for v in _violations(source, "benchmarks.example")] == [
        "imports not_exported from runner.core.errors, not in its __all__",
        "imports iter_lines from private module runner.parsers._lines",
        "imports hidden from runner.core.errors, not in its __all__",
        "imports secret from runner.core.log, not in its __all__",
    ]
    assert _violations("from runner.parsers._lines import iter_lines\n", "runner.parsers.x") == []
