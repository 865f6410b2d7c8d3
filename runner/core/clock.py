"""The runner's one view of time, so that tests can control it: ``monotonic()`` (durations,
deadlines), ``now()`` (the UTC wall time written into records) and ``sleep()`` (a wait between
polls or retries) read the current :class:`Clock`, which is the real one (``time.monotonic``,
``datetime.now(UTC)``, ``time.sleep``) unless a test installed another with :func:`use`.

Only the code whose waits tests need to skip reads time through here: the fake backend's
containers, watching a container (its heartbeats and lease), the ledger's timestamps, taking a
job over from another host, lock polling, a pull's retries, the Kubernetes and ``runner wait``
polls. A thread that waits on a :class:`threading.Event` keeps the real wait (a poll interval,
not a duration) and reads the time here. Imports nothing of the runner.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "RealClock", "current", "monotonic", "now", "sleep", "use"]


class Clock(Protocol):
    """What the runner asks of time."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The host's clocks: what production runs on."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


_current: Clock = RealClock()


def current() -> Clock:
    """The clock in use."""
    return _current


def monotonic() -> float:
    """Seconds on a clock that never goes back (``time.monotonic``)."""
    return _current.monotonic()


def now() -> datetime:
    """The wall time, in UTC (``datetime.now(UTC)``)."""
    return _current.now()


def sleep(seconds: float) -> None:
    """Wait ``seconds`` (``time.sleep``)."""
    _current.sleep(seconds)


@contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Read time from ``clock`` inside the block (tests), the previous one after it."""
    global _current  # the one switch, for tests
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous
