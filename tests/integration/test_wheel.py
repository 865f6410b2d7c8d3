"""The distribution as a user gets it: the tree's wheel, installed without -e into a fresh venv
with no network (dependencies and build tools from the wheelhouse scripts/setup.sh fills), then
a smoke test of the installed `runner` (issue 18)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner._version import DISTRIBUTION, __version__
from tests.support import ROOT, TOY, building_the_tree

WHEELHOUSE = ROOT / ".wheelhouse"

pytestmark = pytest.mark.slow  # builds the wheel and installs it into a fresh venv


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HOME": str(cwd)},
    )


def test_the_wheel_installs_and_runs(tmp_path: Path) -> None:
    assert (WHEELHOUSE / ".stamp").is_file(), "run scripts/setup.sh: it fills .wheelhouse/"
    offline = ["--no-index", "--find-links", str(WHEELHOUSE)]
    with building_the_tree():
        built = _run(
            sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-w", tmp_path / "dist",
            ROOT, cwd=tmp_path,
        )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("reproduction_runner-*.whl")
    assert wheel.name.startswith(f"reproduction_runner-{__version__}-")
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    installed = _run(venv / "bin" / "pip", "install", *offline, wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    runner = venv / "bin" / "runner"

    where = _run(
        venv / "bin" / "python", "-c", "import runner; print(runner.__file__)", cwd=tmp_path
    )
    assert where.stdout.startswith(str(venv)), where.stdout  # not the source tree

    version = _run(runner, "--version", "--json", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    info = json.loads(version.stdout)
    assert info["runner"] == __version__ and info["distribution"] == DISTRIBUTION

    schema = _run(runner, "schema", "execution-contract", cwd=tmp_path)
    assert schema.stdout == (ROOT / "contracts" / "execution-contract.schema.json").read_text()
    shipped = venv / "share" / "reproduction-runner" / "contracts"
    assert sorted(p.name for p in shipped.iterdir()) == sorted(
        p.name for p in (ROOT / "contracts").glob("*.json")
    )
    licence = list(
        venv.glob("lib/python*/site-packages/reproduction_runner-*.dist-info/licenses/LICENSE")
    )
    assert licence and "Apache License" in licence[0].read_text()

    given = _run(  # the result.json schema a job is given ships in the package, whole
        venv / "bin" / "python", "-c",
        "import sys; from runner.models import selfreport; "
        "sys.stdout.buffer.write(selfreport.schema_bytes())",
        cwd=tmp_path,
    )  # fmt: skip
    assert given.stdout == (ROOT / "contracts" / "agent-result.schema.json").read_text()
    check = _run(venv / "bin" / "python", "-m", "runner.app.schemas", "--check", cwd=tmp_path)
    assert check.returncode == 2 and "runner schema NAME" in check.stdout, check.stderr
    assert "Traceback" not in check.stderr

    verify = _run(
        runner, "verify", TOY / "task.json", "--allow-unsigned", "--allow-unpinned-image",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["valid"] is True

    completion = _run(runner, "completion", "bash", cwd=tmp_path)
    assert completion.returncode == 0 and "cluster" in completion.stdout  # grouped spellings
    assert "bundle" in completion.stdout
