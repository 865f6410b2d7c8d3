"""One budget across hosts: an attempt another host left in flight is taken over by the rule
the README states (wait out two leases, charge to the last heartbeat plus two leases), a
runner that finds the ledger written by someone else removes its container and writes
nothing more (fencing), and one whose heartbeats cannot be written removes its container once
its lease runs out. The host is ``runner.core.hostid.name``, replaced here to play two hosts on one
state folder; the engine is the fake for the logic, the real one for fencing a real runner.

The tests that need no engine are in tests/unit/test_takeover.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.state.ledger import Ledger, read_state
from tests.support import SESSION_ID, SESSION_LABEL, docker, run_cli, start_job, write_contract
from tests.unit.test_orchestrator_fake import fake as fake


@pytest.mark.docker
def test_a_real_runner_fenced_mid_run_removes_its_container(tmp_path: Path, image_id: str) -> None:
    """The same with the real engine and a real runner process: another host's event in the
    ledger, and within a heartbeat the container is gone and the runner exits 4 with no
    envelope of its own."""
    contract = write_contract(
        tmp_path, image_id, command=["sleep", "60"], environment={"timeoutMinutes": 2}
    )
    state = tmp_path / "state"
    proc = start_job(contract, state, "--heartbeat", "0.5")
    ledger = state / "jobs" / "*" / "record" / "ledger.jsonl"
    deadline = time.monotonic() + 60
    while not any(b'"heartbeat"' in p.read_bytes() for p in Path("/").glob(str(ledger)[1:])):
        assert time.monotonic() < deadline, "no heartbeat within 60 s"
        time.sleep(0.1)
    (job,) = (state / "jobs").iterdir()
    path = job / "record" / "ledger.jsonl"
    label = f"label=org.runner.job-id={job.name}"
    assert docker("ps", "-q", "--filter", label).stdout.split(), "its container runs"
    data = {"attempt": 1, "exitCode": None, "oomKilled": False, "classification": "interrupted",
            "seconds": 5.0, "how": "host-lost", "host": "node-b"}  # fmt: skip
    Ledger.open(path).append("attempt-1.finished", "attempt.finished", data)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert "another host took the job over" in json.loads(out)["failure"]["reason"]
    assert docker("ps", "-aq", "--filter", label).stdout.split() == [], "container removed"
    assert json.loads(path.read_bytes().splitlines()[-1])["eventId"] == "attempt-1.finished"
    assert not (job / "result.json").exists()


FIRST_ATTEMPT_HANGS = (
    "import json, os, time\n"
    "mark = '/job/workspace/tried'\n"
    "if not os.path.exists(mark):\n"
    "    open(mark, 'w').close()\n"
    "    time.sleep(120)\n"
    "print(json.dumps({'accuracy': 0.5}))\n"
)


def _wait_beat(state: Path) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in (state / "jobs").glob("*/record/ledger.jsonl"):
            if b'"heartbeat"' in path.read_bytes():
                return path
        time.sleep(0.1)
    pytest.fail("no heartbeat within 60 s")


# Slurm job ids no cluster of the test command reaches: the single-node and the two-node
# clusters share this engine and number their jobs from 1, so a made-up "40" was a real job
# of the two-node test running beside this one, and this test's sweep stopped its container.
OURS = "slurm.job-id=4000000041"
OTHER = "slurm.job-id=4000000040"


@pytest.mark.docker
def test_cleanup_orphans_stops_a_dead_runners_container_and_records_its_end(
    tmp_path: Path, image_id: str
) -> None:
    """What a Slurm epilog runs: the runner was killed (kill -9), its container runs on.
    `runner cleanup --orphans --label ...` stops that container (and only that job's), records
    the attempt interrupted and charged to its end, and the next run starts attempt 2 with
    what is left (a job on another host could not have reached this engine)."""
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", FIRST_ATTEMPT_HANGS],
        environment={"timeoutMinutes": 3},
    )  # fmt: skip
    state = tmp_path / "state"
    proc = start_job(contract, state, "--heartbeat", "0.5", "--label", OURS)
    path = _wait_beat(state)
    time.sleep(1)
    proc.kill()
    proc.wait(timeout=10)
    job = path.parent.parent
    label = f"label=org.runner.job-id={job.name}"
    assert docker("ps", "-q", "--filter", label).stdout.split(), "it runs on, unwatched"
    other = run_cli("cleanup", "--orphans", "--label", OTHER, "--json")
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["removed"] == [], "another Slurm job's label: left alone"
    plain = run_cli("cleanup", "--label", OURS, "--json")
    assert [k["why"] for k in json.loads(plain.stdout)["kept"]] == [
        "its ledger says it still runs; `runner run` on the job reattaches to it"
    ]
    swept = run_cli("cleanup", "--orphans", "--label", OURS, "--json")
    assert swept.returncode == 0, swept.stderr
    (gone,) = json.loads(swept.stdout)["removed"]
    assert "stopped, attempt 1 recorded interrupted" in gone["why"]
    assert docker("ps", "-aq", "--filter", label).stdout.split() == []
    (first,) = read_state(path).attempts
    assert first.finished is not None and first.finished["how"] == "orphan-stopped"
    assert first.finished["classification"] == "interrupted"
    assert first.seconds >= 1.5, "charged from its start to its stop, never less"
    code_env = run_cli("run", str(contract), "--state-dir", str(state), "--json",
                       "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}")  # fmt: skip
    assert code_env.returncode == 0, code_env.stderr
    env = json.loads(code_env.stdout)
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 2
    assert env["budget"]["consumedSeconds"] >= first.seconds
