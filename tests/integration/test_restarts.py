"""The runner's own death: kill -9 mid-run, reattach, never run twice, never reset the budget.
Real engine, real runner processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runner.state.ledger import parse_time, read_state
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    docker,
    run_cli,
    run_job,
    start_job,
    write_contract,
)
from tests.support.budget import check_bound

pytestmark = pytest.mark.docker

BEAT = 0.5


def _start(contract: Path, state: Path, *extra: str) -> subprocess.Popen[str]:
    return start_job(contract, state, "--heartbeat", str(BEAT), *extra)


def _ledger(state: Path) -> Path:
    (job,) = (state / "jobs").iterdir()
    return job / "record" / "ledger.jsonl"


def _wait_for(
    state: Path, event: str, count: int = 1, timeout: float = 60, *, reattached: bool = False
) -> None:
    """Until the ledger holds ``count`` events of type ``event`` (``reattached``: heartbeats a
    reattaching runner wrote, which it writes once it watches the container)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = state / "jobs"
        if jobs.exists() and any(jobs.iterdir()):
            path = _ledger(state)
            if path.exists():
                events = [json.loads(x) for x in path.read_bytes().splitlines() if x]
                seen = [e for e in events if e["type"] == event]
                if reattached:
                    seen = [e for e in seen if e["data"].get("reattached")]
                if len(seen) >= count:
                    return
        time.sleep(0.1)
    pytest.fail(f"no {event} in the ledger after {timeout} s")


def _containers(job_id_label: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=org.runner.job-id={job_id_label}").stdout.split()


def _job_id(state: Path) -> str:
    (job,) = (state / "jobs").iterdir()
    return job.name


def _finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, json.loads(out), err


def _true_running_time(state: Path) -> float:
    (job,) = (state / "jobs").iterdir()
    total = 0.0
    for kept in sorted((job / "record" / "attempts").glob("*/container-state.json")):
        st = json.loads(kept.read_text())
        started, finished = parse_time(st["StartedAt"]), parse_time(st["FinishedAt"])
        assert started is not None and finished is not None
        total += (finished - started).total_seconds()
    assert total > 0, "no attempt's container state was kept"
    return total


def _kill9(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=10)


SLEEP_THEN_REPORT = (
    "import json, sys, time\ntime.sleep(float(sys.argv[1]))\nprint(json.dumps({'accuracy': 0.5}))\n"
)


def _contract(tmp_path: Path, image_id: str, sleep: float, budget_s: float = 120) -> Path:
    return write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", SLEEP_THEN_REPORT, str(sleep)],
        environment={"timeoutMinutes": budget_s / 60},
    )


def test_kill9_mid_run_reattaches_to_the_one_container(tmp_path: Path, image_id: str) -> None:
    """kill -9 the runner mid-run and start it again: one container throughout, the job
    completes, and consumed time is the container's true running time within a heartbeat."""
    contract = _contract(tmp_path, image_id, sleep=5)
    state = tmp_path / "state"
    first = _start(contract, state)
    _wait_for(state, "heartbeat", 2)
    _kill9(first)
    job_id = _job_id(state)
    before = _containers(job_id)
    assert len(before) == 1, "the container keeps running when its runner dies"
    second = _start(contract, state)
    time.sleep(1)
    assert _containers(job_id) == before, "reattached, not started again"
    code, env, err = _finish(second)
    assert code == 0, err
    assert "reattaching" in err
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 1
    consumed = env["budget"]["consumedSeconds"]
    assert abs(consumed - _true_running_time(state)) <= BEAT, (consumed, _true_running_time(state))
    assert _containers(job_id) == []
    types = [e["type"] for e in map(json.loads, _ledger(state).read_bytes().splitlines())]
    assert types.count("attempt.starting") == 1 and types[-1] == "job.finished"


def repeated_kills(tmp_path: Path, image_id: str, budget: float) -> dict[str, Any]:
    """Start the runner and kill -9 it three times, then let a fourth finish the job; its
    envelope. The budget runs out while a runner watches, or while none does (on a loaded
    machine a runner takes seconds to start): which, the ledger says."""
    contract = _contract(tmp_path, image_id, sleep=60, budget_s=budget)
    state = tmp_path / "state"
    for _ in range(3):
        proc = _start(contract, state)
        _wait_for(state, "heartbeat", 1)
        time.sleep(1.2)
        _kill9(proc)
    code, env, err = _finish(_start(contract, state))
    assert code == 1, err
    assert env["failure"]["category"] == "timeout"
    assert env["budget"]["remainingSeconds"] == 0
    assert env["budget"]["attempts"] == 1
    return env


def test_repeated_kills_add_up_to_one_budget(tmp_path: Path, image_id: str) -> None:
    """Killing the runner again and again never buys time: the job stops at the total, within
    the README's bound computed from what the ledger recorded (one heartbeat past the
    budget's end, or past the moment a reattaching runner found it spent, plus the stop's
    measured duration), and never charged less than the container ran."""
    budget = 6.0
    env = repeated_kills(tmp_path, image_id, budget)
    (checked,) = check_bound(tmp_path / "state", budget, BEAT)
    assert env["budget"]["consumedSeconds"] == pytest.approx(checked.charged, abs=0.001)
    assert checked.charged >= budget


ENDED = {"exited", "stopped"}
"""A container's status once its process has ended (Podman's "stopped": before its clean-up)."""


def _wait_started(cid: str) -> None:
    """Until the engine has started container ``cid``: ``attempt.started`` is in the ledger
    once the container is created, before the start call, and a runner killed in between
    leaves a container that never runs ("created"; seen in a gate under Podman)."""
    deadline = time.monotonic() + 60
    while json.loads(docker("inspect", cid).stdout)[0]["State"]["Status"] == "created":
        assert time.monotonic() < deadline, "the engine never started the job's container"
        time.sleep(0.05)


def test_container_that_ended_while_the_runner_was_dead(tmp_path: Path, image_id: str) -> None:
    """Its end is recorded from the engine; nothing is started again."""
    contract = _contract(tmp_path, image_id, sleep=1.5)
    state = tmp_path / "state"
    proc = _start(contract, state)
    _wait_for(state, "attempt.started")
    job_id = _job_id(state)
    (cid,) = _containers(job_id)
    _wait_started(cid)
    _kill9(proc)
    # It ends by itself while no runner runs (its 1.5 s, however long a loaded machine takes
    # to get there): waited for, not assumed after a fixed pause. Under Podman "stopped" is
    # that end too: its process has ended and conmon's clean-up, which would make it
    # "exited", has not run (under load it may never run once its runner is gone).
    deadline = time.monotonic() + 120
    while json.loads(docker("inspect", cid).stdout)[0]["State"]["Status"] not in ENDED:
        assert time.monotonic() < deadline, "the job's container never ended on its own"
        time.sleep(0.2)
    code, env, err = _finish(_start(contract, state))
    assert code == 0, err
    assert env["measurements"][0]["value"] == 0.5
    ledger = read_state(_ledger(state))
    assert len(ledger.attempts) == 1
    assert ledger.attempts[0].finished is not None
    assert ledger.attempts[0].finished["how"] == "recovered"
    assert env["budget"]["consumedSeconds"] >= _true_running_time(state) - 0.05
    assert _containers(job_id) == []


def test_vanished_container_starts_attempt_two(tmp_path: Path, image_id: str) -> None:
    """A container removed while the runner was dead: attempt 2 runs within what is left."""
    budget = 30.0
    contract = _contract(tmp_path, image_id, sleep=2, budget_s=budget)
    state = tmp_path / "state"
    proc = _start(contract, state)
    _wait_for(state, "heartbeat", 2)
    _kill9(proc)
    job_id = _job_id(state)
    docker("rm", "-f", *_containers(job_id))
    code, env, err = _finish(_start(contract, state))
    assert code == 0, err
    ledger = read_state(_ledger(state))
    assert [a.number for a in ledger.attempts] == [1, 2]
    assert ledger.attempts[0].finished is not None
    assert ledger.attempts[0].finished["how"] == "vanished"
    assert ledger.attempts[0].seconds >= 2 * BEAT
    assert env["budget"]["attempts"] == 2
    assert env["budget"]["consumedSeconds"] == pytest.approx(
        ledger.attempts[0].seconds + ledger.attempts[1].seconds, abs=0.01
    )
    assert env["budget"]["remainingSeconds"] < budget - 2


def test_two_runners_for_one_job(tmp_path: Path, image_id: str) -> None:
    """While one runner runs a job, a second one for the same job refuses and starts nothing.
    The job runs long enough for a second runner to start on a loaded machine (at 4 s, one
    that took longer found the job ended, and answered its envelope)."""
    contract = _contract(tmp_path, image_id, sleep=20)
    state = tmp_path / "state"
    first = _start(contract, state)
    _wait_for(state, "attempt.started")
    code, env, _ = run_job(contract, state)
    assert code == 4
    assert "being run by another runner" in env["failure"]["reason"]
    assert len(_containers(_job_id(state))) == 1
    code, _, err = _finish(first)
    assert code == 0, err


BUDGET_WATCH = (
    "import json, time\n"
    "read = lambda: json.load(open('/job/execution/runtime-budget.json'))['remainingSeconds']\n"
    "first = read()\n"
    "time.sleep(2.5)\n"
    "print(json.dumps({'first': first, 'later': read(), 'shrunk': first - read()}))\n"
)


def test_job_sees_its_remaining_budget_shrink(tmp_path: Path, image_id: str) -> None:
    probe = {
        "measurementId": "shrunk",
        "metric": "shrunk",
        "unit": "s",
        "parser": {
            "id": "json.scalar",
            "version": "1",
            "evidencePath": "logs/evaluation.log",
            "config": {"pointer": "/shrunk"},
        },
    }
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", BUDGET_WATCH],
        measurements=[probe],
        environment={"timeoutMinutes": 1},
    )
    code, env, err = run_job(contract, tmp_path / "state", "--heartbeat", str(BEAT))
    assert code == 0, err
    assert env["measurements"][0]["value"] >= 2.5 - 2 * BEAT


def test_status_and_cleanup(tmp_path: Path, image_id: str) -> None:
    """`runner status` reads the ledger; `runner cleanup` leaves a running job's container."""
    contract = _contract(tmp_path, image_id, sleep=30)
    state = tmp_path / "state"
    proc = _start(contract, state)
    _wait_for(state, "heartbeat", 1)
    _kill9(proc)
    job_id = _job_id(state)
    status = run_cli("status", job_id, "--state-dir", str(state), "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["container"]["state"] == "running"
    assert info["attempts"][0]["end"] == "in flight"
    swept = json.loads(run_cli("cleanup", "--state-dir", str(state), "--dry-run", "--json").stdout)
    kept = {c["name"]: c["why"] for c in swept["kept"]}
    (name,) = [n for n in kept if job_id in n]
    assert "reattaches" in kept[name]
    # Interrupt the reattached runner: the container is stopped and removed, budget kept.
    # Once it watches the container (its first heartbeat says it reattached): a runner stopped
    # before then leaves the container to the next one, as the one killed above did.
    proc = _start(contract, state)
    _wait_for(state, "heartbeat", reattached=True)
    proc.send_signal(2)
    code, env, err = _finish(proc)
    assert code == 130 and env["failure"]["category"] == "cancelled", (env["failure"], err)
    assert _containers(job_id) == []


def test_corrupt_ledger_leaves_the_job_untouched(tmp_path: Path, image_id: str) -> None:
    """A tampered ledger stops the runner (exit 4) without overwriting the job's envelope."""
    contract = _contract(tmp_path, image_id, sleep=0)
    state = tmp_path / "state"
    code, env, _ = run_job(contract, state)
    assert code == 0
    ledger = _ledger(state)
    lines = ledger.read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"attempt":1', b'"attempt":7')
    ledger.write_bytes(b"\n".join(lines) + b"\n")
    envelope = Path(env["jobDir"]) / "result.json"
    before = envelope.read_bytes()
    code, refused, _ = run_job(contract, state)
    assert code == 4 and "corrupt" in refused["failure"]["reason"]
    assert envelope.read_bytes() == before


def test_status_never_repairs_a_ledger(tmp_path: Path, image_id: str) -> None:
    """`runner status` reads a torn ledger without cutting it: only a runner repairs."""
    contract = _contract(tmp_path, image_id, sleep=0)
    state = tmp_path / "state"
    assert run_job(contract, state)[0] == 0
    ledger = _ledger(state)
    with ledger.open("ab") as f:
        f.write(b'{"schemaVersion":"1.0","se')
    before = ledger.read_bytes()
    status = run_cli("status", _job_id(state), "--state-dir", str(state), "--json")
    assert status.returncode == 0, status.stderr
    assert ledger.read_bytes() == before
    assert list(ledger.parent.glob("ledger.jsonl.torn-*")) == []


def test_resume_after_the_contract_expired(tmp_path: Path, image_id: str) -> None:
    """A job accepted while its signed contract was valid is reattached after it expires."""
    keys = tmp_path / "trusted"
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    assert (
        run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys)).returncode == 0
    )
    # The contract must still be valid when the first runner starts its attempt (a loaded
    # machine takes seconds to get there), and the job run on after it expires.
    contract = _contract(tmp_path, image_id, sleep=40)
    signed = run_cli(
        "sign", str(contract), "--key", str(tmp_path / "issuer.key"), "--expires-in", "15s",
        "--json",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    envelope = Path(json.loads(signed.stdout)["envelope"])
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            "run",
            str(envelope),
            "--state-dir",
            str(state),
            "--json",
            "--heartbeat",
            str(BEAT),
            "--trusted-keys",
            str(keys),
            "--label",
            f"{SESSION_LABEL}={SESSION_ID}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(state, "heartbeat", 1)
    _kill9(proc)
    expires = datetime.fromisoformat(json.loads(signed.stdout)["expiresAt"])
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.5)
    fresh = run_cli("verify", str(envelope), "--trusted-keys", str(keys))
    assert fresh.returncode == 3 and "expired" in fresh.stderr
    code, env, stderr = run_job(envelope, state, "--trusted-keys", str(keys), unsigned=False)
    assert code == 0, (env, stderr)
    assert env["budget"]["attempts"] == 1
