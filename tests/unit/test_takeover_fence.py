"""Fencing from the scheduler before a takeover (:func:`runner.execution.takeover.fence`): the
decision logic with a fake of the Slurm seam (``Scheduler``), the virtual clock, no Slurm.
The real Slurm is in tests/integration/test_slurm_owner.py; the id and output guards of
Slurm's own seam (``SlurmFence``, ``Cluster._exec``) are here too."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import InfrastructureError, JobBusy
from runner.execution import takeover
from runner.planning.allocation import slurm_job
from runner.scheduling.slurm.cluster import Cluster, _read_capped
from runner.scheduling.slurm.fence import SlurmFence
from runner.state.ledger import Attempt, Ledger, read_state
from tests.support.clock import VirtualClock


class _Progress:
    def __init__(self) -> None:
        self.said: list[str] = []

    def stage(self, name: str, text: str) -> None:
        self.said.append(text)


class _Slurm:
    """A scheduler whose job ends ``ends_after`` looks after it was cancelled (None: never)."""

    def __init__(self, state: str | None, *, ended: bool = False, ends_after: int | None = 2):
        self.state, self.ended, self.ends_after = state, ended, ends_after
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.looks_after_cancel = 0

    def job(self, job_id: str) -> tuple[str, bool] | None:
        self.asked.append(job_id)
        if self.cancelled:
            self.looks_after_cancel += 1
            if self.ends_after is not None and self.looks_after_cancel >= self.ends_after:
                return ("CANCELLED", True)
            return ("COMPLETING", False)
        return None if self.state is None else (self.state, self.ended)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def end_wait_seconds(self) -> float:
        return 90.0


def _attempt(slurm: Any = None) -> Attempt:
    starting: dict[str, Any] = {"attempt": 1, "host": {"name": "node-a"}, "leaseSeconds": 1.0}
    if slurm is not None:
        starting["slurm"] = slurm
    return Attempt(1, "c", datetime(2026, 1, 1, tzinfo=UTC), starting)


def test_no_recorded_job_or_no_scheduler_leaves_the_lease_rule_alone() -> None:
    slurm = _Slurm("RUNNING")
    assert takeover.fence(_attempt(), slurm, None, "j", _Progress()) is None
    assert takeover.fence(_attempt({"jobId": "41"}), None, None, "j", _Progress()) is None
    assert slurm.asked == [] and slurm.cancelled == []


@pytest.mark.hostile
def test_a_recorded_id_that_is_not_ascii_digits_is_never_asked_or_cancelled() -> None:
    slurm = _Slurm("RUNNING")
    for bad in ("41;scancel -u root", "-1", "٤١", "4" * 21, 41, "", None, ["41"]):
        assert takeover.fence(_attempt({"jobId": bad}), slurm, None, "j", _Progress()) is None
    assert takeover.fence(_attempt("41"), slurm, None, "j", _Progress()) is None
    assert slurm.asked == [] and slurm.cancelled == []


def test_an_attempt_of_this_very_slurm_job_is_a_requeue_nothing_to_cancel() -> None:
    slurm = _Slurm("RUNNING")
    got = takeover.fence(_attempt({"jobId": "41"}), slurm, {"jobId": "41"}, "j", _Progress())
    assert got == {"jobId": "41", "cancelled": False, "state": "requeued"}
    assert slurm.asked == [] and slurm.cancelled == [], "never asks about or cancels itself"


def test_slurm_that_cannot_tell_leaves_the_lease_rule_and_says_so() -> None:
    progress = _Progress()
    got = takeover.fence(_attempt({"jobId": "41"}), _Slurm(None), None, "j", progress)
    assert got == {"jobId": "41", "cancelled": False, "state": "unknown"}
    assert "the lease rule alone" in progress.said[0]


def test_an_ended_job_is_not_cancelled() -> None:
    slurm = _Slurm("FAILED", ended=True)
    got = takeover.fence(_attempt({"jobId": "41"}), slurm, {"jobId": "42"}, "j", _Progress())
    assert got == {"jobId": "41", "cancelled": False, "state": "FAILED"}
    assert slurm.cancelled == []


@pytest.mark.parametrize("state", ["RUNNING", "PENDING", "SUSPENDED", "COMPLETING"])
def test_a_job_still_alive_is_cancelled_and_its_end_waited_for(
    state: str, virtual_clock: VirtualClock
) -> None:
    slurm = _Slurm(state, ends_after=3)
    progress = _Progress()
    got = takeover.fence(_attempt({"jobId": "41"}), slurm, {"jobId": "42"}, "j", progress)
    assert got == {"jobId": "41", "cancelled": True, "state": "CANCELLED", "was": state}
    assert slurm.cancelled == ["41"]
    assert slurm.looks_after_cancel == 3, "returns at the first look that sees the end"
    assert f"still {state}: cancelling it and waiting up to 90 s" in progress.said[0]


def test_a_cancelled_job_that_never_ends_refuses_the_takeover_within_the_bound(
    virtual_clock: VirtualClock,
) -> None:
    slurm = _Slurm("RUNNING", ends_after=None)
    began = virtual_clock.monotonic()
    with pytest.raises(JobBusy, match="did not end within 90 s of being cancelled"):
        takeover.fence(_attempt({"jobId": "41"}), slurm, None, "j", _Progress())
    waited = virtual_clock.monotonic() - began
    assert 90 <= waited <= 90 + takeover.FENCE_POLL_SECONDS


def _lost(tmp_path: Path, slurm: dict[str, Any], virtual_clock: VirtualClock) -> Ledger:
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    accepted = {"jobId": "j", "contractDigest": "sha256:" + "0" * 64, "limitSeconds": 600}
    ledger.append("job.accepted", "job.accepted", accepted)
    ledger.append("attempt-1.starting", "attempt.starting",
                  {"attempt": 1, "containerName": "c", "host": {"name": "node-a"},
                   "leaseSeconds": 1.0, "slurm": slurm})  # fmt: skip
    virtual_clock.advance(30.0)  # quiet for far more than two leases
    return ledger


def test_a_cancelled_attempt_is_charged_to_now_and_says_what_slurm_said(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    ledger = _lost(tmp_path, {"jobId": "41"}, virtual_clock)
    last = ledger.state.in_flight
    assert last is not None
    slurm = _Slurm("RUNNING", ends_after=2)
    takeover.close(ledger, last, "node-a", 1.0, "j", _Progress(), scheduler=slurm)
    (first,) = read_state(ledger.path).attempts
    assert first.finished is not None and first.finished["how"] == "host-lost"
    assert first.finished["slurm"] == {"jobId": "41", "cancelled": True, "state": "CANCELLED",
                                       "was": "RUNNING"}  # fmt: skip
    assert first.seconds >= 30.0 + 2 * takeover.FENCE_POLL_SECONDS - 0.01, "to now, not 2 leases"


def test_without_a_scheduler_the_charge_is_the_lease_rules(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    ledger = _lost(tmp_path, {"jobId": "41"}, virtual_clock)
    last = ledger.state.in_flight
    assert last is not None
    takeover.close(ledger, last, "node-a", 1.0, "j", _Progress())
    (first,) = read_state(ledger.path).attempts
    assert first.finished is not None and "slurm" not in first.finished
    assert first.seconds == pytest.approx(2.0), "its last event plus two leases"


def test_an_end_the_cancelled_jobs_runner_recorded_is_kept(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """The cancelled job's runner (or its Epilog) writes the attempt's end meanwhile: the
    takeover keeps that record and charges nothing more."""
    ledger = _lost(tmp_path, {"jobId": "41"}, virtual_clock)
    last = ledger.state.in_flight
    assert last is not None

    class _Records(_Slurm):
        def cancel(self, job_id: str) -> None:
            super().cancel(job_id)
            other = Ledger.open(ledger.path)
            other.append("attempt-1.finished", "attempt.finished",
                         {"attempt": 1, "exitCode": None, "oomKilled": False,
                          "classification": "cancelled", "seconds": 12.0})  # fmt: skip

    takeover.close(ledger, last, "node-a", 1.0, "j", _Progress(), scheduler=_Records("RUNNING"))
    (first,) = read_state(ledger.path).attempts
    assert first.finished is not None and first.finished["classification"] == "cancelled"
    assert first.seconds == 12.0
    assert ledger.state.in_flight is None, "this runner's ledger read it back"


def test_the_runner_records_the_slurm_job_it_runs_in() -> None:
    env = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "node-a", "SLURM_RESTART_COUNT": "2"}
    assert slurm_job(env) == {"jobId": "41", "node": "node-a", "restarts": 2}
    assert slurm_job({}) is None
    assert slurm_job({"SLURM_JOB_ID": "41 42"}) is None
    assert slurm_job({"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "-x;y"}) == {
        "jobId": "41", "restarts": 0
    }  # fmt: skip


@pytest.mark.hostile
def test_slurms_seam_refuses_ids_that_are_not_digits_and_caps_what_it_reads() -> None:
    fence = SlurmFence(Cluster(timeout=5))
    assert fence.job("41;id") is None
    with pytest.raises(InfrastructureError, match="not a Slurm job id"):
        fence.cancel("-u root")
    talk = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdout.write('x' * 5000)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    with pytest.raises(OverflowError):
        _read_capped(talk, 30, 1000)
    quiet = subprocess.Popen(
        [sys.executable, "-c", "print('12|RUNNING')"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert _read_capped(quiet, 30, 1000) == (b"12|RUNNING\n", b"")
