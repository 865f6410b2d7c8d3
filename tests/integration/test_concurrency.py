"""Many runners at once on one state directory, in real containers on the real engine."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import SESSION_ID, SESSION_LABEL, run_cli, session_containers, write_contract

pytestmark = pytest.mark.docker

JOBS = 20
TIMEOUT_S = 300


def test_twenty_toy_jobs_at_once(tmp_path: Path, image_id: str) -> None:
    """20 concurrent `runner run`s on one state dir all succeed (0.819) and leave no container,
    held lock, GPU lock or temporary file behind, and every ledger verifies."""
    contract = write_contract(tmp_path, image_id)
    state = tmp_path / "state"
    ids = [f"concurrent-{i:02d}" for i in range(JOBS)]
    # The runners' own temp folder: only what they create is checked (other programs on the
    # machine may come and go in the system's /tmp).
    temp = tmp_path / "tmpdir"
    temp.mkdir()

    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "run",
                str(contract),
                "--json",
                "--allow-unsigned",
                "--state-dir",
                str(state),
                "--job-id",
                job_id,
                "--label",
                f"{SESSION_LABEL}={SESSION_ID}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(temp)},
        )
        for job_id in ids
    ]
    results: dict[str, tuple[int, str, str]] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for job_id, proc in zip(ids, procs, strict=True):
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results[job_id] = (proc.returncode, out, err)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    for job_id, (code, out, err) in results.items():
        assert code == 0, (job_id, code, err[-3000:])
        envelope = json.loads(out)
        assert envelope["jobId"] == job_id
        assert envelope["status"] == "succeeded", (job_id, envelope["failure"])
        (m,) = envelope["measurements"]
        assert m["value"] == 0.819, (job_id, m)
        assert Path(envelope["jobDir"]) == state / "jobs" / job_id

    assert session_containers() == []
    for job_id in ids:
        job = state / "jobs" / job_id
        lock = job / "record" / "lock"
        assert lock.is_file(), lock
        with lock.open("a") as handle:
            # Raises BlockingIOError if any runner still held the job's lock.
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
        assert sorted(job.rglob("*.tmp")) == []
        proc = run_cli("ledger", "verify", str(job), timeout=60)
        assert proc.returncode == 0, (job_id, proc.stdout, proc.stderr)
    assert sorted(state.rglob("*.tmp")) == []
    assert sorted(temp.iterdir()) == []
