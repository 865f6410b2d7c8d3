"""Shared fixtures. Tests marked ``docker`` use the real engine and the runner-cpu:local image that
``scripts/setup.sh`` builds; when either is missing they fail (never skip)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.contract import with_digest

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "examples" / "toy-evaluation"
SEED = ROOT / "tests" / "fixtures" / "seed-task.json"
IMAGE = "runner-cpu:local"
SESSION_LABEL = "runner-tests.session"
SESSION_ID = uuid.uuid4().hex


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="session", autouse=True)
def _isolated_host_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests never read the developer's own policy or trusted keys: an empty config dir, and
    no host switches from the environment."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("RUNNER_"):
            del os.environ[name]
    os.environ["RUNNER_CONFIG_DIR"] = str(tmp_path_factory.mktemp("runner-config"))
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def image_id() -> str:
    """Id of the locally built job image; fails (not skips) when the engine or image is absent."""
    info = _docker("info", "--format", "{{.ServerVersion}}")
    if info.returncode != 0:
        pytest.fail(
            f"the Docker engine is not reachable: {info.stderr.strip()} "
            "(scripts/setup.sh starts it)"
        )
    out = _docker("image", "inspect", "--format", "{{.Id}}", IMAGE)
    if out.returncode != 0:
        pytest.fail(f"{IMAGE} is missing: run scripts/setup.sh ({out.stderr.strip()})")
    return out.stdout.strip()


@pytest.fixture(scope="session", autouse=True)
def _no_containers_left() -> Iterator[None]:
    """After the session, no container of this test session may remain."""
    yield
    if shutil.which("docker") is None:
        return
    left = _docker("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}").stdout.split()
    if left:
        _docker("rm", "-f", *left)
        pytest.fail(f"containers left behind by the runner: {left}")


def session_containers() -> list[str]:
    return _docker("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}").stdout.split()


def toy_data() -> dict[str, Any]:
    return json.loads((TOY / "task.json").read_text())


def write_contract(
    folder: Path,
    image: str,
    *,
    command: list[str] | None = None,
    environment: dict[str, Any] | None = None,
    protocol: dict[str, Any] | None = None,
    measurements: list[dict[str, Any]] | None = None,
    with_inputs: bool = True,
) -> Path:
    """A contract in ``folder`` based on the toy one, pinned to ``image`` and re-digested."""
    data = toy_data()
    if with_inputs:
        shutil.copytree(TOY / "repository", folder / "repository", dirs_exist_ok=True)
        shutil.copy(TOY / "paper.md", folder / "paper.md")
    else:
        data.pop("paper")
        data.pop("repository")
    data["environment"]["image"] = image
    data["environment"].update(environment or {})
    if command is not None:
        data["protocol"]["command"] = command
        data["protocol"]["requiredCommandFragments"] = []
    data["protocol"].update(protocol or {})
    if measurements is not None:
        data["measurements"] = measurements
    path = folder / "task.json"
    path.write_text(json.dumps(with_digest(data), indent=2))
    return path


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def running_containers(name: str = "") -> list[str]:
    """This session's containers that are running (not merely created), by name fragment."""
    return _docker(
        "ps", "-q", "--filter", f"label={SESSION_LABEL}={SESSION_ID}",
        *(["--filter", f"name={name}"] if name else []),
    ).stdout.split()  # fmt: skip


def wait_running(proc: subprocess.Popen[str], name: str = "", timeout: float = 120) -> None:
    """Wait until a container of this session (``name`` fragment) runs; fail if ``proc`` ends
    first or none starts in time."""
    deadline = time.monotonic() + timeout
    while not running_containers(name):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no container of the job started"
        time.sleep(0.2)


def signal_when_running(
    proc: subprocess.Popen[str], sig: int, timeout: float = 120
) -> tuple[str, str]:
    """Send ``sig`` to ``proc`` once a container of this session runs; its stdout, stderr."""
    try:
        wait_running(proc, timeout=timeout)
        proc.send_signal(sig)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def start_job(
    contract: Path, state: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`runner run --json --allow-unsigned` with this session's label, in the background."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            "run",
            str(contract),
            "--state-dir",
            str(state),
            "--json",
            "--allow-unsigned",
            "--label",
            f"{SESSION_LABEL}={SESSION_ID}",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_job(
    contract: Path,
    state: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    unsigned: bool = True,
) -> tuple[int, dict[str, Any], str]:
    """``runner run --json`` with this session's label (and, unless ``unsigned`` is False,
    ``--allow-unsigned``); returns (exit code, envelope, stderr)."""
    proc = run_cli(
        "run",
        str(contract),
        "--state-dir",
        str(state),
        "--json",
        "--label",
        f"{SESSION_LABEL}={SESSION_ID}",
        *(["--allow-unsigned"] if unsigned else []),
        *extra,
        env=env,
    )
    try:
        envelope = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"stdout is not one JSON envelope:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.returncode, envelope, proc.stderr
