"""Hostile review, round 17: a reattach's charge for a container that ended while no runner
watched (runner.execution.container.recover). Each test failed before its fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runner.backends.base import ContainerState
from runner.execution import container
from runner.state.ledger import Attempt

pytestmark = pytest.mark.hostile

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
"""This host's time when the attempt started (its runner counted from the engine's start)."""


class _Engine:
    def __init__(self, state: ContainerState) -> None:
        self._state = state

    def state(self, name: str) -> ContainerState:
        return self._state


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(("skew", "charged"), [(0.0, 1000.0), (-500.0, 1000.0), (500.0, 1000.0)])
def test_an_end_while_no_runner_watched_is_charged_whole_whatever_the_engines_clock(
    skew: float, charged: float
) -> None:
    """The last heartbeat at 100 s, then the runner dies; the job ends at 1,000 s; the next
    runner finds it exited. The engine's FinishedAt was believed with no check of its clock:
    500 s behind this host's, the attempt was charged 500 s for 1,000 s run. Now FinishedAt
    counts from the last heartbeat only where the engine's StartedAt is where the ledger puts
    the start; else the engine's own start to end (one clock)."""
    off = timedelta(seconds=skew)
    real_end = T0 + timedelta(seconds=1000)
    state = ContainerState("exited", False, 0, False, "", _iso(T0 + off), _iso(real_end + off))
    attempt = Attempt(1, "c1", T0, started_at=T0, seconds=100.0,
                      last_beat_at=T0 + timedelta(seconds=100))  # fmt: skip
    found = container.recover(_Engine(state), attempt, now=real_end + timedelta(seconds=60))
    assert found.seconds == pytest.approx(charged, abs=0.01)
