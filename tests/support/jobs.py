"""Helpers for tests that run jobs: the toy contract pinned as a test needs it, and `runner
run` in this test session (its containers carry the session's label, so a test never touches
another's). The contract writer and the docker CLI helper live in :mod:`runner.testing` (the
benchmark uses them too); ``tests.support`` re-exports them.

Tests import these from ``tests.support``; ``conftest.py`` holds only fixtures.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.contract import with_digest
from runner.testing import TOY, docker, toy_data
from tests.support import cli

ROOT = Path(__file__).resolve().parent.parent.parent
SEED = ROOT / "tests" / "fixtures" / "seed-task.json"
SESSION_LABEL = "runner-tests.session"
SESSION_ID = uuid.uuid4().hex


def session_containers() -> list[str]:
    """The session's containers still there, once its free egress slots are removed as
    `runner cleanup` removes them (they outlive jobs by design; a busy one stays, listed)."""
    from runner import backends
    from runner.egress import slots as egress

    egress.reap(backends.default(), idle_seconds=0.0, labels={SESSION_LABEL: SESSION_ID})
    return docker("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}").stdout.split()


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m runner ARGS`` with this process's environment and ``env``; run in a fork of
    the pre-imported zygote (:mod:`tests.support.cli`) wherever that is the same."""
    return cli.run(list(args), env={**os.environ, **(env or {})}, timeout=timeout)


def running_containers(name: str = "") -> list[str]:
    """This session's containers that are running (not merely created), by name fragment."""
    return docker(
        "ps", "-q", "--filter", f"label={SESSION_LABEL}={SESSION_ID}",
        *(["--filter", f"name={name}"] if name else []),
    ).stdout.split()  # fmt: skip


def wait_running(
    proc: cli.Forked | subprocess.Popen[str], name: str = "", timeout: float = 120
) -> None:
    """Wait until a container of this session (``name`` fragment) runs; fail if ``proc`` ends
    first or none starts in time."""
    deadline = time.monotonic() + timeout
    while not running_containers(name):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no container of the job started"
        time.sleep(0.2)


def signal_when_running(
    proc: cli.Forked | subprocess.Popen[str], sig: int, timeout: float = 120
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
) -> cli.Forked | subprocess.Popen[str]:
    """`runner run --json --allow-unsigned` with this session's label, in the background, as
    ``subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True, env=env)`` (``env``: the whole
    environment, else this process's); forked from the zygote wherever that is the same."""
    args = [
        "run",
        str(contract),
        "--state-dir",
        str(state),
        "--json",
        "--allow-unsigned",
        "--label",
        f"{SESSION_LABEL}={SESSION_ID}",
        *extra,
    ]
    return cli.popen(args, env=dict(os.environ) if env is None else env)


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


FAKE_IMAGE_ID = "sha256:" + "ab" * 32
"""An image id no engine has: for contracts that are only verified, signed or planned."""


def toy_input_digests() -> dict[str, str]:
    """The digests of the toy's inputs, as `runner pin` binds them: ``{"paper": ...,
    "repository": ...}``."""
    from runner.staging import jobdir as staging

    data = toy_data()
    return {
        name: staging.hash_input(TOY, f"$.{name}.path", data[name]["path"]).digest
        for name in ("paper", "repository")
    }


def contract_data(**changes: Any) -> dict[str, Any]:
    """The toy contract pinned to :data:`FAKE_FAKE_IMAGE_ID` and to its inputs' digests, valid
    for the next hour, re-digested; ``changes`` set top-level fields (None removes one) or, as
    ``env_<field>``, environment fields."""
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = FAKE_IMAGE_ID
    for name, digest in toy_input_digests().items():
        data[name]["digest"] = digest
    now = datetime.now(UTC).replace(microsecond=0)
    data["issuedAt"] = now.isoformat()
    data["expiresAt"] = (now + timedelta(hours=1)).isoformat()
    for key, value in changes.items():
        if key.startswith("env_"):
            data["environment"][key[4:]] = value
        elif value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return with_digest(data)


@contextlib.contextmanager
def building_the_tree() -> Iterator[None]:
    """Held while pip builds this checkout in place (setuptools writes ``ROOT/build/``): two
    such builds at once (under ``pytest -n 2``, the wheel test's and the README commands'
    test's) removed each other's files mid-copy ("No such file or directory")."""
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"runner-tests-build-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
