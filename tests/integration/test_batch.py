"""`runner run A B C`: a batch of contracts, each job in its own forked process, on the real
engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runner.contract import with_digest
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    run_cli,
    session_containers,
    signal_when_running,
    wait_running,
    write_contract,
)

pytestmark = pytest.mark.docker

SLEEP = ["python3", "-c", "import time; time.sleep(120)"]


def _batch(state: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "runner",
        "run",
        "--state-dir",
        str(state),
        "--allow-unsigned",
        "--label",
        f"{SESSION_LABEL}={SESSION_ID}",
        *args,
    ]


def _contract(
    tmp_path: Path, folder: str, image_id: str, name: str | None = None, **kwargs: object
) -> Path:
    """The toy contract in its own folder; under its own ``name`` (so its own job id)."""
    (tmp_path / folder).mkdir()
    path = write_contract(tmp_path / folder, image_id, **kwargs)  # type: ignore[arg-type]
    if name is not None:
        data = json.loads(path.read_text())
        data["name"] = name
        path.write_text(json.dumps(with_digest(data)))
    return path


def _start(state: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _batch(state, "--json", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_batch_runs_each_contract_and_answers_in_order(tmp_path: Path, image_id: str) -> None:
    """Three toy contracts and one with a broken digest: one JSON array in argument order,
    each job with its own folder and ledger, and the exit code of the worst family (3)."""
    # Distinct names, so distinct jobs: one contract is one job id, run once.
    good = [_contract(tmp_path, f"toy{i}", image_id, f"batch-toy-{i}") for i in range(3)]
    broken = _contract(tmp_path, "broken", image_id)
    data = json.loads(broken.read_text())
    data["contractDigest"] = "sha256:" + "0" * 64
    broken.write_text(json.dumps(data))
    state = tmp_path / "state"

    proc = subprocess.run(
        _batch(state, "--json", "--parallel", "3", *map(str, [*good, broken])),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    envelopes = json.loads(proc.stdout)
    assert [e["contractName"] for e in envelopes[:3]] == [f"batch-toy-{i}" for i in range(3)]
    for envelope in envelopes[:3]:
        assert envelope["status"] == "succeeded", envelope["failure"]
        assert envelope["measurements"][0]["value"] == 0.819
        job = Path(envelope["jobDir"])
        assert json.loads((job / "result.json").read_text())["jobId"] == envelope["jobId"]
        assert run_cli("ledger", "verify", str(job)).returncode == 0
    assert envelopes[3]["failure"]["category"] == "invalid_contract"
    assert "digest" in envelopes[3]["failure"]["reason"]
    assert session_containers() == []

    human = subprocess.run(
        _batch(state, *map(str, good)), capture_output=True, text=True, timeout=300, check=False
    )
    assert human.returncode == 0, human.stderr[-3000:]
    assert "3 jobs: 3 succeeded" in human.stdout
    assert "toy-accuracy = 0.819" in human.stdout


def test_sigterm_stops_the_running_jobs_and_starts_no_more(tmp_path: Path, image_id: str) -> None:
    """SIGTERM to a batch reaches the running job (its container is stopped, `cancelled`); the
    contracts not yet started end `cancelled` without running; the batch exits 130."""
    contracts = [
        _contract(tmp_path, f"sleep{i}", image_id, command=[*SLEEP, str(i)]) for i in (1, 2)
    ]
    state = tmp_path / "state"
    proc = _start(state, "--parallel", "1", *map(str, contracts))
    out, err = signal_when_running(proc, signal.SIGTERM)
    assert proc.returncode == 130, err[-3000:]
    first, second = json.loads(out)
    assert first["failure"]["category"] == "cancelled"
    assert first["container"] is not None and first["container"]["stoppedByRunner"] is True
    assert second["failure"]["category"] == "cancelled"
    assert "before" in second["failure"]["reason"] and second["container"] is None
    assert session_containers() == []


def test_a_job_process_killed_outright_still_gets_an_envelope(
    tmp_path: Path, image_id: str
) -> None:
    """A child killed with SIGKILL says nothing: the batch answers `infrastructure` for it,
    naming the signal, and the other job's result stands. Its container is left running, as
    after any runner crash, for the next run of that job to recover
    (tests/integration/test_restarts.py)."""
    sleeper = _contract(tmp_path, "sleep", image_id, "batch-sleeper", command=SLEEP)
    toy = _contract(tmp_path, "toy", image_id)
    state = tmp_path / "state"
    proc = _start(state, "--parallel", "2", str(sleeper), str(toy))
    try:
        victim = _child_holding(proc.pid, "batch-sleeper", deadline=time.monotonic() + 120)
        wait_running(proc, "batch-sleeper")
        victim.kill()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-3000:]
    lost, done = json.loads(out)
    assert lost["failure"]["category"] == "infrastructure"
    assert "killed by signal 9" in lost["failure"]["reason"]
    assert done["status"] == "succeeded"
    (orphan,) = session_containers()
    subprocess.run(["docker", "rm", "-f", orphan], capture_output=True, check=True)


def _child_holding(pid: int, fragment: str, *, deadline: float) -> psutil.Process:
    """The batch's child process that holds a file whose path contains ``fragment`` (a job
    holds its job folder's lock file open while it runs)."""
    while time.monotonic() < deadline:
        for child in psutil.Process(pid).children():
            try:
                if any(fragment in f.path for f in child.open_files()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no child of {pid} holds a file under {fragment}")


def test_job_id_is_refused_for_a_batch(tmp_path: Path, image_id: str) -> None:
    """--job-id names one job: with two contracts it is a usage error (exit 2)."""
    a = _contract(tmp_path, "a", image_id)
    proc = run_cli("run", str(a), str(a), "--job-id", "x", "--allow-unsigned")
    assert proc.returncode == 2
    assert "--job-id names one job" in proc.stderr
