"""A clock the test controls (installed with :func:`runner.core.clock.use`; the
``virtual_clock`` fixture in ``tests/conftest.py`` does it for one test).

Time stands still until someone sleeps: :meth:`VirtualClock.sleep` records the wait and moves
the clock on by it at once, and :meth:`VirtualClock.advance` moves it on without a sleep (time
passing while a runner is away, say). ``monotonic()`` and ``now()`` move together. It does not
jump on its own: a thread that waits on an event keeps real time (the runner's lease thread
polls that way), and reads this clock, which only the thread that sleeps moves. A sleep is
never shorter than asked, so a deadline the code computes on this clock is met exactly; what
the code waited is in ``sleeps``, for assertions on a backoff or a lease."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["VirtualClock"]


class VirtualClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._elapsed = 0.0
        self._origin = 10_000.0  # a monotonic reading far from 0, as the host's is
        self._wall = start or datetime.now(UTC)
        self.sleeps: list[float] = []
        """Every sleep asked for, in order."""
        self.on_sleep: Callable[[float], None] | None = None
        """Called after each sleep, with its seconds (a test acting "meanwhile")."""

    def monotonic(self) -> float:
        with self._lock:
            return self._origin + self._elapsed

    def now(self) -> datetime:
        with self._lock:
            return self._wall + timedelta(seconds=self._elapsed)

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")  # as time.sleep
        with self._lock:
            self.sleeps.append(seconds)
            self._elapsed += seconds
        if self.on_sleep is not None:
            self.on_sleep(seconds)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass without anyone sleeping."""
        with self._lock:
            self._elapsed += seconds

    @property
    def elapsed(self) -> float:
        """Seconds passed since the clock was made."""
        with self._lock:
            return self._elapsed
