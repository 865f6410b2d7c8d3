"""The runner's log: off by default, text or JSON lines on stderr when asked (issue 18).

The tests that need no engine are in tests/unit/test_logging.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_cli, run_job, write_contract


@pytest.mark.docker
def test_quiet_by_default_and_json_lines_when_asked(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id)
    code, envelope, stderr = run_job(contract, tmp_path / "quiet")
    assert code == 0
    assert not [line for line in stderr.splitlines() if line.startswith(("{", "runner: info"))]

    code, envelope, stderr = run_job(
        contract, tmp_path / "logged", "--log-level", "info", "--log-format", "json"
    )
    assert code == 0, stderr
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert events, stderr
    assert all({"ts", "level", "event"} <= set(e) for e in events)
    job = envelope["jobId"]
    stages = {e.get("stage") for e in events}
    assert {"contract", "stage", "image", "container"} <= stages
    started = [e for e in events if e["event"].startswith("attempt 1 started")]
    assert started and started[0]["jobId"] == job and started[0]["attempt"] == 1
    end = events[-1]
    assert end["event"] == "job succeeded" and end["jobId"] == job and end["attempt"] == 1
    # what the runner does, never the job's environment
    assert "RUNNER_STDOUT" not in stderr and "HOME=" not in stderr


@pytest.mark.docker
def test_a_refusal_is_logged_with_its_category(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id)
    proc = run_cli(
        "run", str(contract), "--state-dir", str(tmp_path / "s"), "--log-level", "warning",
        "--log-format", "json",
    )  # fmt: skip
    assert proc.returncode == 3
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    refused = [e for e in events if e.get("category") == "signature_invalid"]
    assert refused and refused[0]["level"] == "warning"
