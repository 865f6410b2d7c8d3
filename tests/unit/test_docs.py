"""The documentation site's reference pages (docs/reference/, written by scripts/gen_docs.py)
are those the code generates now, every CLI command has its section, and the declared
environment variables (runner/core/envvars.py) are exactly the ones the code reads."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from runner.app import schemas
from runner.cli import COMMANDS, build_parser
from runner.core import envvars
from runner.planning import plan

ROOT = Path(__file__).resolve().parents[2]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_fails_on_a_stale_or_extra_page(tmp_path: Path, monkeypatch) -> None:
    gen = _gen_docs()
    monkeypatch.setattr(gen, "REFERENCE", tmp_path)
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    cli = tmp_path / "cli.md"
    cli.write_text(cli.read_text().replace("## `runner run`", "## `runner go`"))
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    (tmp_path / "notes.md").write_text("# hand-written\n")
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    assert not (tmp_path / "notes.md").exists()


def test_every_cli_command_and_option_is_in_the_reference() -> None:
    gen = _gen_docs()
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    headings = set(re.findall(r"^#+ `runner ([^`]+)`$", text, re.M))
    walked = {" ".join(words): parser for words, _, parser in gen.commands(build_parser())}
    assert set(walked) >= COMMANDS
    assert {"verify ledger", "verify bundle", "job status", "cache ls", "cache prune", "gpu ls",
            "gpu cdi"} <= set(walked)  # fmt: skip
    assert set(walked) == headings
    for name, parser in walked.items():
        heading = re.compile(rf"^#+ `runner {re.escape(name)}`$", re.M)
        section = heading.split(text, 1)[1].split("\n#", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != "==SUPPRESS==":
                    assert option in section, f"runner {name}: {option} is not documented"


def _is_environ(node: ast.expr) -> bool:
    """``os.environ``, or a mapping passed around as ``env``/``environ`` (not an attribute
    such as an adapter's declared ``.env``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ("env", "environ")


def _environ_reads(tree: ast.AST) -> set[str]:
    """Names read from the environment: ``os.environ.get(N)``, ``os.environ[N]``,
    ``env.get(N)`` on a mapping named env/environ, ``os.getenv(N)``, ``env_flag(N)``, where N
    is spelled as a variable (upper case; a dict named env has camelCase keys)."""
    found: set[str] = set()

    def holder(node: ast.expr) -> str | None:
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Name):
            return node.id
        return None

    for node in ast.walk(tree):
        name: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (
                isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value)
            ) or holder(f) in ("getenv", "env_flag"):
                name = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value)
        ):
            name = node.slice
        value = name.value if isinstance(name, ast.Constant) else None
        # Spelled as a variable: a dict's keys (an envelope's) are camelCase.
        if isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
            found.add(value)
    return found


def _sources() -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text())) for p in sorted((ROOT / "runner").rglob("*.py"))]


def test_the_declared_environment_variables_are_the_ones_read() -> None:
    read: set[str] = set()
    for _, tree in _sources():
        read |= _environ_reads(tree)
    declared = {v.name for v in envvars.READ}
    assert read - declared == set(), "read but not declared in runner/core/envvars.py"
    assert declared - read == set(), "declared in runner/core/envvars.py but never read"


def test_every_runner_variable_named_in_the_code_is_declared() -> None:
    declared = {v.name for v in (*envvars.READ, *envvars.SET_IN_JOB)}
    named: dict[str, Path] = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"(?<![A-Za-z0-9_])RUNNER_[A-Z0-9_]+", node.value):
                    named.setdefault(name, path)
    undeclared = {n: str(p.relative_to(ROOT)) for n, p in named.items() if n not in declared}
    assert undeclared == {}


def test_the_job_environment_is_declared() -> None:
    env = plan._environment("job-1", "stdout.txt", "stderr.txt", None, None)
    declared = {v.name for v in envvars.SET_IN_JOB}
    assert set(env) - declared == set()
    assert "RUNNER_ATTEMPT" in declared and "NVIDIA_VISIBLE_DEVICES" in declared


def test_the_reader_finds_each_form_of_read() -> None:
    tree = ast.parse(
        "import os\n"
        "os.environ.get('A')\nos.environ['B']\nenv.get('C')\nos.getenv('D')\n"
        "env_flag('E')\nother.get('F')\nenv.get('jobId')\nadapter.env.get('PATH')\nenv['G'] = '1'\n"
    )
    assert _environ_reads(tree) == {"A", "B", "C", "D", "E"}


def test_the_readmes_exit_code_table_is_the_generated_one() -> None:
    """The README keeps one generated block, the exit codes: it is current, and a stale copy is
    rewritten to it by runner.app.schemas (what `python -m runner.app.schemas` does)."""
    text = (ROOT / "README.md").read_text()
    assert "<!-- exit-codes:begin -->" in text and "<!-- exit-codes:end -->" in text
    assert schemas.readme_with_blocks(text) == text
    stale = text.replace("| 2 | the command line was wrong |", "| 2 | wrong |")
    assert stale != text
    assert schemas.readme_with_blocks(stale) == text


def test_no_tracked_file_keeps_a_merge_conflicts_markers() -> None:
    """A conflict left in a file (once in development/layout.md, inside a code block where
    the strict docs build does not see it) is found here."""
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
    files = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    found = []
    for name in filter(None, files):
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 4 * 1024 * 1024:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in marker.finditer(text)]
    assert not found, found
