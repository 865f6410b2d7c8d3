"""`runner job wait --json`: one vocabulary for every end of a Slurm job (the envelope's
``status``, with ``category`` saying why), whether its runner wrote an envelope or not. The
ends themselves come from real Slurm in tests/integration/test_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.cli.wait import outcome
from runner.scheduling.slurm.cluster import Ended

LOG = Path("/state/slurm/job/slurm-7.out")


def _ended(envelope: dict[str, object] | None, state: str) -> Ended:
    return Ended("job", "7", state, envelope, LOG)


def test_a_job_cancelled_queued_or_running_is_failed_cancelled_alike() -> None:
    running = outcome(
        _ended({"status": "failed", "failure": {"category": "cancelled", "reason": "x"}},
               "CANCELLED")
    )  # fmt: skip
    queued = outcome(_ended(None, "CANCELLED"))
    for end in (running, queued):
        assert (end["status"], end["category"]) == ("failed", "cancelled")
    assert "before its runner wrote an envelope" in queued["reason"]


@pytest.mark.parametrize("state", ["FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"])
def test_an_end_without_an_envelope_is_failed_infrastructure_naming_state_and_log(
    state: str,
) -> None:
    end = outcome(_ended(None, state))
    assert (end["status"], end["category"]) == ("failed", "infrastructure")
    assert state in end["reason"] and str(LOG) in end["reason"]
    assert end["envelope"] is None


@pytest.mark.parametrize("status", ["succeeded", "failed", "partial"])
def test_with_an_envelope_the_status_is_the_envelopes(status: str) -> None:
    env = {"status": status, "failure": None}
    end = outcome(_ended(env, "COMPLETED"))
    assert end["status"] == status and end["envelope"] is env
