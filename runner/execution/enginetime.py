"""An engine's times on this host's clock: when an attempt's container started and ended, as
the engine says, believed only within what this runner saw of it.

The budget counts on this host's monotonic clock (:mod:`runner.core.clock`); an engine reports
``StartedAt`` and ``FinishedAt`` on its own wall clock, which for a remote engine may differ.
So an engine's time is kept within a window this runner saw (:func:`on_this_clock`): the start
within the start call (:func:`started_at`, which also says whether the engine's clock agreed),
and the end of a container that ended by itself between the runner's watch and the moment the
engine told of it (:class:`EndWindow`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from runner.backends.base import Backend
from runner.core import clock
from runner.core.errors import RunnerError
from runner.state.ledger import parse_time

__all__ = [
    "RECORDED_START_SLACK",
    "EndWindow",
    "on_this_clock",
    "started_as_recorded",
    "started_at",
]


@dataclass(frozen=True)
class EndWindow:
    """Where the end of a container that ended by itself lies on this host's monotonic clock
    (``runner.core.clock``): after ``running``, when this runner's watch began (the
    container's start, or the reattach that found it running), and no later than ``seen``,
    when the runner learnt of the end. ``origin`` is the attempt's start on the same clock.
    Made only when the engine's clock was found to agree with this host's
    (:attr:`~runner.execution.container.Watch.engine_clock_agrees`)."""

    origin: float
    running: float
    seen: float

    def seconds(self, finished_at: str | None) -> float:
        """The attempt's running seconds to the engine's own ``FinishedAt``, kept within the
        window; to ``seen`` when the engine gives none. An engine that tells of an end late
        (rootful Podman under load: 0.65 s after it) is not charged for: the job did not run
        then."""
        return round(on_this_clock(finished_at, self.running, self.seen) - self.origin, 3)


def started_at(
    backend: Backend, container_id: str, before: float, after: float
) -> tuple[float, bool]:
    """When the container started, on this host's monotonic clock (``runner.core.clock``): the
    engine's ``StartedAt`` of the start this runner asked for between ``before`` and ``after``, kept
    within that call (a remote engine's clock may differ); ``after`` when the engine cannot
    say. Counting from there, no moment the job ran goes uncharged. And whether the engine's
    clock agrees with this host's: its ``StartedAt`` fell within the call, as it must."""
    try:
        when = backend.state(container_id).started_at
    except RunnerError:
        return after, False
    mapped = on_this_clock(when, before - 1.0, after + 1.0)
    return min(max(mapped, before), after), before <= mapped <= after


def on_this_clock(engine_time: str | None, low: float, high: float) -> float:
    """An engine's time (``StartedAt``, ``FinishedAt``) on this host's monotonic clock, kept
    within ``low`` and ``high``, what this runner saw of it; ``high`` when the engine gives
    none."""
    when = parse_time(engine_time)
    if when is None:
        return high
    mono, wall = clock.monotonic(), clock.now()
    try:
        return min(max(mono - (wall - when).total_seconds(), low), high)
    except OverflowError:  # a year-9999 answer
        return high


RECORDED_START_SLACK = 0.1
"""How far (seconds) the engine's ``StartedAt`` may lie from where the ledger's heartbeats put
an attempt's start for a reattach to find the engine's clock in agreement
(:func:`started_as_recorded`). The two are one instant when it agrees, but for the moment
between a heartbeat's seconds and its time being read and the wall clock's slew since; an
engine whose clock is off by less than this may have its end believed up to this early."""


def started_as_recorded(engine_time: str | None, beat_at: datetime | None, seconds: float) -> bool:
    """Whether the engine's ``StartedAt`` is where the ledger puts the attempt's start: its
    last heartbeat's time (``beat_at``) less the attempt's seconds at that heartbeat, within
    :data:`RECORDED_START_SLACK` (a reattach's check that the engine's clock agrees with this
    host's). The runner that started the attempt counted from the engine's ``StartedAt`` when
    that fell within its start call (:func:`started_at`), and every heartbeat since, a
    reattaching runner's too, keeps that origin; one that found the engine's clock off counted
    from its own time, which such an engine's ``StartedAt`` does not match. No heartbeat yet:
    no (``attempt.started`` is written before the start call, so it bounds nothing)."""
    started = parse_time(engine_time)
    if started is None or beat_at is None:
        return False
    try:
        recorded = beat_at - timedelta(seconds=seconds)
    except OverflowError:  # a ledger's seconds past any date
        return False
    return abs((started - recorded).total_seconds()) <= RECORDED_START_SLACK
