"""The test session clears the runner's own host variables (tests/support/hostenv.py) and no
other ``RUNNER_*``: a CI service's ``RUNNER_TEMP`` and ``RUNNER_OS`` reach the tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tests.support.hostenv import HOST_VARIABLES

SEEN = ("RUNNER_TEMP", "RUNNER_OS", "RUNNER_POLICY", "RUNNER_ENGINE", "RUNNER_CONFIG_DIR")
READ = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|env_flag\()\s*["'](RUNNER_\w+)["']""")


def test_session_environment() -> None:
    """In a session: none of the runner's host variables but the session's own config dir.
    Run by the test below in a session of its own (``HOSTENV_PROBE``: where to say what it saw)."""
    assert [n for n in HOST_VARIABLES if n in os.environ] == ["RUNNER_CONFIG_DIR"]
    if probe := os.environ.get("HOSTENV_PROBE"):
        Path(probe).write_text(json.dumps({n: os.environ.get(n) for n in SEEN}))


def test_a_ci_services_runner_variables_survive(tmp_path: Path) -> None:
    probe = tmp_path / "seen.json"
    env = {
        **os.environ,
        "RUNNER_TEMP": str(tmp_path),
        "RUNNER_OS": "Linux",
        "RUNNER_POLICY": "/nonexistent/policy.json",
        "RUNNER_ENGINE": "podman",
        "RUNNER_CONFIG_DIR": "/nonexistent/config",
        "HOSTENV_PROBE": str(probe),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(ROOT)}::test_session_environment"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(probe.read_text())
    assert seen["RUNNER_TEMP"] == str(tmp_path) and seen["RUNNER_OS"] == "Linux"
    assert seen["RUNNER_POLICY"] is None and seen["RUNNER_ENGINE"] is None
    assert seen["RUNNER_CONFIG_DIR"] not in (None, "/nonexistent/config")


def test_every_variable_the_runner_reads_is_listed() -> None:
    """A ``RUNNER_*`` the runner reads from its environment but the list lacks would leak a
    developer's setting into the tests."""
    read = {
        name for path in (ROOT / "runner").rglob("*.py") for name in READ.findall(path.read_text())
    }
    assert {"RUNNER_CONFIG_DIR", "RUNNER_ALLOW_UNSIGNED", "RUNNER_ENGINE"} <= read  # it sees reads
    assert sorted(read - set(HOST_VARIABLES)) == []
    assert sorted(set(HOST_VARIABLES) - read) == []
