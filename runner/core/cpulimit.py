"""A bound on the CPU time a block of the main thread may take, for work whose cost a hostile
input sets and nothing else stops: a contract's regular expression over a job's log (Python's
``re`` backtracks: ``(\\d+)\\.(\\d+)`` over one line of 40,000 digits takes 8 s, and the time
grows with the square of the line's length).

:func:`cpu_limit` arms the process's profiling timer (``ITIMER_PROF``: CPU time, user and
system, of the whole process, so a loaded machine does not make it fire early) and its
``SIGPROF`` raises :class:`OverCpu` in the block. CPython's ``re`` looks for pending signals as
it matches (every 4,096 steps, since 3.11), so the exception stops even a match that would run
for hours; elsewhere it lands between two bytecodes.

Only the main thread can be bounded (Python runs signal handlers there): in another thread the
block runs unbounded, as it does where ``SIGPROF`` has a handler Python did not set (a C
profiler's, which could not be put back: told by the profiling timer running with no handler
of Python's). A handler and timer set from Python are put back as
the block ends, the timer with what was left of it less what the block used.

``re`` looks for signals once every 4,096 steps of its matching loop, and a step can be long
(a repeat scanning a whole line): over a line of 1 MiB the block may run on some 20 s past its
bound before the exception lands.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["AGAIN", "OverCpu", "cpu_limit"]

AGAIN = 1.0
"""CPU seconds between one :class:`OverCpu` and the next, while the block goes on: time for
the code that caught it to say where it stopped."""


class OverCpu(BaseException):
    """The block used more than :attr:`seconds` of CPU time and was stopped. A
    ``BaseException``, as ``KeyboardInterrupt`` is: the ``except Exception`` of code inside the
    block (a parser's fallback) does not swallow it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"stopped after {seconds:.1f} s of CPU time")
        self.seconds = seconds


class _Armed:
    """Whether this block's SIGPROF may raise: cleared as the block ends, before the timer
    is disarmed, so a signal that arrives then raises nothing outside it."""

    def __init__(self) -> None:
        self.on = False


@contextmanager
def cpu_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OverCpu` in the block once the process has used ``seconds`` of CPU time
    since it began (in the main thread; see the module for where the block runs unbounded)."""
    if seconds <= 0:
        raise ValueError(f"a CPU time limit must be positive, not {seconds}")
    handler = signal.getsignal(signal.SIGPROF)
    if (
        threading.current_thread() is not threading.main_thread()
        or handler is None  # set outside Python before it started
        or (handler is signal.SIG_DFL and signal.getitimer(signal.ITIMER_PROF) != (0.0, 0.0))
    ):  # a timer armed with no handler of Python's: a C profiler's handler takes its signals
        yield
        return
    armed = _Armed()

    def expired(signum: int, frame: FrameType | None) -> None:
        if armed.on:
            raise OverCpu(seconds)

    previous = signal.signal(signal.SIGPROF, expired)
    started = time.process_time()
    old_delay, old_interval = 0.0, 0.0
    try:
        # Again every AGAIN seconds until the block ends: should code in it catch the first
        # (an ``except BaseException`` that does not raise again), the next one lands.
        old_delay, old_interval = signal.setitimer(signal.ITIMER_PROF, seconds, AGAIN)
        armed.on = True  # after: a profiler's last SIGPROF before it is not this block's
        yield
    finally:
        armed.on = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        if old_delay > 0 or old_interval > 0:
            left = old_delay - (time.process_time() - started)
            signal.setitimer(signal.ITIMER_PROF, max(left, 1e-6), old_interval)
