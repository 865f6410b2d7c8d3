"""One budget across hosts: an attempt another host left in flight is taken over by the rule
the README states (wait out two leases, charge to the last heartbeat plus two leases), a
runner that finds the ledger written by someone else removes its container and writes
nothing more (fencing), and one whose heartbeats cannot be written removes its container once
its lease runs out. The host is ``runner.core.hostid.name``, replaced here to play two hosts on one
state folder; the engine is the fake for the logic, the real one for fencing a real runner.

The tests that need the engine are in tests/integration/test_takeover.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend, FakeJob
from runner.core import hostid
from runner.core.errors import JobFenced
from runner.state.ledger import Ledger, read_state
from tests.support.clock import VirtualClock
from tests.unit.test_orchestrator_fake import (
    INF,
    _category,
    _contract,
    _Crash,
    _creates,
    _image,
    _options,
    _Progress,
    _run,
    _writes,
)
from tests.unit.test_orchestrator_fake import fake as fake

LEASE = 0.4


def _crash_mid_run(contract: Path, tmp_path: Path, fake: FakeBackend, lease: float = LEASE) -> None:
    """The runner dies once its container runs (as ``test_orchestrator_fake``'s, with a short
    lease recorded in its attempt)."""

    class _Dies(_Progress):
        def running(self, elapsed: float, budget: float) -> None:
            fake.frozen = True
            raise _Crash

    with pytest.raises(_Crash):
        _run(contract, _options(tmp_path, lease=lease), fake, _Dies())
    fake.frozen = False


def _on(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setattr(hostid, "name", lambda: host)


def _ledger(env: dict[str, Any]) -> Path:
    return Path(env["jobDir"]) / "record" / "ledger.jsonl"


def _the_ledger(tmp_path: Path) -> Path:
    (job,) = (tmp_path / "state" / "jobs").iterdir()
    return job / "record" / "ledger.jsonl"


def test_every_attempt_records_its_host(tmp_path: Path, fake: FakeBackend) -> None:
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    (first,) = read_state(_ledger(env)).attempts
    assert first.starting["host"]["name"] == hostid.name()
    assert first.starting["leaseSeconds"] == 120.0  # three heartbeats, never under 120 s
    assert env["attempts"][0]["host"] == hostid.name()


def test_another_hosts_lost_attempt_is_charged_and_the_job_goes_on_here(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    """Host A's runner dies mid-run; host B, past two leases, charges attempt 1 to its last
    heartbeat plus two leases, never asks its own engine about A's container, and runs
    attempt 2 within what is left."""
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1)
    _on(monkeypatch, "node-a")
    began = virtual_clock.monotonic()
    _crash_mid_run(contract, tmp_path, fake)
    ran = virtual_clock.monotonic() - began
    left_on_a = [c.spec.name for c in fake.containers.values()]
    virtual_clock.advance(2 * LEASE + 0.1)
    _on(monkeypatch, "node-b")
    fake.calls.clear()
    fake.jobs = FakeJob(work=_writes())
    waited = len(virtual_clock.sleeps)
    env = _run(contract, _options(tmp_path, lease=LEASE), fake)
    assert env["status"] == "succeeded", env["failure"]
    assert not [s for s in virtual_clock.sleeps[waited:] if s >= LEASE], "no lease wait: two passed"
    assert not [c for c in fake.calls if c[0] == "state" and c[1] in left_on_a]
    st = read_state(_ledger(env))
    lost, second = st.attempts
    assert lost.finished is not None
    assert lost.finished["how"] == "host-lost" and lost.finished["host"] == "node-a"
    assert lost.finished["classification"] == "interrupted"
    assert lost.seconds >= ran - 0.05, "never less than it can have run"
    assert lost.seconds <= ran + 2 * LEASE + 0.1, "to the last heartbeat plus two leases"
    assert second.starting["host"]["name"] == "node-b"
    assert [a["host"] for a in env["attempts"]] == ["node-a", "node-b"]
    assert env["budget"]["consumedSeconds"] == pytest.approx(st.consumed, abs=0.01)


def test_a_host_whose_runner_still_writes_is_not_taken_over(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    """Host B waits for attempt 1's lease to run out; host A's runner writes a heartbeat
    meanwhile, so B refuses (busy) and writes nothing."""
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1)
    _on(monkeypatch, "node-a")
    _crash_mid_run(contract, tmp_path, fake)
    path = _the_ledger(tmp_path)
    before = path.read_bytes()
    (first,) = read_state(path).attempts
    quiet_since = first.last_beat_at or first.started_at or first.starting_at  # its last word

    def a_still_alive(_: float) -> None:
        ledger = Ledger.open(path)  # host A's runner: one more heartbeat of attempt 1
        ledger.append("attempt-1.beat-late", "heartbeat",
                      {"attempt": 1, "attemptSeconds": 0.5, "consumedSeconds": 0.5})  # fmt: skip

    virtual_clock.on_sleep = a_still_alive  # while B waits
    waited, at_b = len(virtual_clock.sleeps), virtual_clock.now()
    _on(monkeypatch, "node-b")
    progress = _Progress()
    env = _run(contract, _options(tmp_path, lease=LEASE), fake, progress)
    # B's one wait: until two leases had passed since A's last heartbeat
    (wait,) = virtual_clock.sleeps[waited:]
    quiet = (at_b - quiet_since).total_seconds()
    assert 0 < quiet < LEASE and wait == pytest.approx(2 * LEASE - quiet, abs=1e-3)
    assert _category(env) == "infrastructure"
    assert "being run on host node-a" in env["failure"]["reason"]
    assert any("waiting" in detail for _, detail in progress.stages)
    after = path.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1
    assert read_state(path).in_flight is not None, "attempt 1 is still A's"


def test_a_spent_budget_ends_the_job_without_a_container(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1 / 60)
    _on(monkeypatch, "node-a")
    _crash_mid_run(contract, tmp_path, fake, lease=0.6)  # charged 1.2 s: the whole budget
    virtual_clock.advance(2 * 0.6 + 0.1)
    _on(monkeypatch, "node-b")
    creates = _creates(fake)
    env = _run(contract, _options(tmp_path, lease=LEASE), fake)
    assert _category(env) == "resource_exhausted"
    assert _creates(fake) == creates, "no container for a spent budget"


def test_a_runner_that_finds_the_ledger_written_by_another_stops_its_container(
    tmp_path: Path, fake: FakeBackend
) -> None:
    """Fencing: another host appends to the ledger while this runner watches its container;
    at its next heartbeat the runner removes the container, writes nothing more (no event,
    no envelope) and says why."""
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1)

    def other_host() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                path = _the_ledger(tmp_path)
                if b'"attempt.started"' in path.read_bytes():
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        ledger = Ledger.open(path)
        data = {"attempt": 1, "exitCode": None, "oomKilled": False,
                "classification": "interrupted", "seconds": 1.0, "how": "host-lost",
                "host": "node-b"}  # fmt: skip
        ledger.append("attempt-1.finished", "attempt.finished", data)

    taker = threading.Thread(target=other_host)
    taker.start()
    env = _run(contract, _options(tmp_path), fake)
    taker.join()
    assert _category(env) == "infrastructure"
    assert "another host took the job over" in env["failure"]["reason"]
    assert not fake.running() and not fake.containers, "its container is removed"
    path = _the_ledger(tmp_path)
    assert read_state(path).attempts[0].finished["host"] == "node-b"  # type: ignore[index]
    assert json.loads(path.read_bytes().splitlines()[-1])["type"] == "attempt.finished"
    assert not (path.parent.parent / "result.json").exists(), "no envelope of its own"


def test_a_runner_that_cannot_write_a_heartbeat_removes_its_container_at_the_lease(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat write that hangs (a network filesystem cut off) past the lease: the
    lease's thread removes the container while the runner still waits on the write."""
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1)
    real = Ledger.append
    hung: list[float] = []

    def append(self: Ledger, event_id: str, type_: Any, data: dict[str, Any]) -> Any:
        if type_ == "heartbeat" and not hung:  # hangs until the container is gone (real time:
            hung.append(time.monotonic())  # the lease's thread acts while this one waits)
            while fake.containers and time.monotonic() - hung[0] < 30:
                time.sleep(0.01)
            assert not fake.containers, "removed while the write still hung"
            assert time.monotonic() - hung[0] >= LEASE - 0.06, "not before the lease ran out"
        return real(self, event_id, type_, data)

    monkeypatch.setattr(Ledger, "append", append)
    env = _run(contract, _options(tmp_path, lease=LEASE), fake)
    assert _category(env) == "infrastructure"
    assert "no heartbeat could be written" in env["failure"]["reason"]
    assert hung and not fake.containers


def test_an_append_after_someone_elses_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    mine = Ledger(path)
    mine.append("job.accepted", "job.accepted", {"limitSeconds": 60.0})
    theirs = Ledger.open(path)
    theirs.append("job.finished-0", "job.finished", {"status": "cancelled"})
    with pytest.raises(JobFenced, match="another host took the job over"):
        mine.check_owned()
    size = path.stat().st_size
    with pytest.raises(JobFenced):
        mine.append("job.finished-0", "job.finished", {"status": "succeeded"})
    assert path.stat().st_size == size, "nothing written"


def test_cleanup_removes_a_taken_over_attempts_container_even_while_a_runner_holds_the_job(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    """Host A's container outlived its runner; host B took the job over (attempt 1 closed
    host-lost) and holds the job's lock. `runner cleanup` on A (here: the same fake engine)
    removes attempt 1's container: its attempt has ended in the ledger, whoever holds the job
    now; a review found it kept as "a runner is watching it"."""
    from runner.execution import sweeper
    from runner.state.jobdir import JobDir

    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1)
    _on(monkeypatch, "node-a")
    _crash_mid_run(contract, tmp_path, fake)
    (left,) = fake.containers.values()
    virtual_clock.advance(2 * LEASE + 0.1)
    _on(monkeypatch, "node-b")
    fake.jobs = FakeJob(work=_writes())
    env = _run(contract, _options(tmp_path, lease=LEASE), fake)
    assert env["status"] == "succeeded"
    assert left.id in fake.containers, "A's container still there (another engine, really)"
    with JobDir(Path(env["jobDir"])).locked():  # a runner holds the job
        report = sweeper.sweep(fake, state_dir=tmp_path / "state")
    assert [r["why"] for r in report["removed"]] == ["its attempt has finished in the ledger"]
    assert left.id not in fake.containers
