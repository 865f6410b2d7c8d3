"""A bound on the CPU time a block of the main thread may take, for work whose cost a hostile
input sets and nothing else stops: a contract's regular expression over a job's log (Python's
``re`` backtracks: ``(\\d+)\\.(\\d+)`` over one line of 40,000 digits takes 8 s, and the time
grows with the square of the line's length).

:func:`cpu_limit` arms the process's profiling timer (``ITIMER_PROF``: CPU time, user and
system, of the whole process, so a loaded machine does not make it fire early) and its
``SIGPROF`` raises :class:`OverCpu` in the block. CPython's ``re`` looks for pending signals as
it matches (once every 4,096 steps of its matching loop, since 3.11), so the exception stops
even a match that would run for hours; elsewhere it lands between two bytecodes. A step can be
long (a repeat scanning a whole line): over a line of 1 MiB the block may run on some 20 s past
its bound before the exception lands.

Only the main thread can be bounded (Python runs signal handlers there): in another thread the
block runs unbounded, as it does where ``SIGPROF`` has a handler Python did not set (a C
profiler's, which could not be put back: told by the profiling timer running with no handler
of Python's). A handler and timer set from Python are put back as the block ends, the timer
with what was left of it less what the block used.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

__all__ = ["AGAIN", "OverCpu", "caught", "cpu_limit"]

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


class _Limit:
    """The block (:func:`cpu_limit`): a class, not a generator, so that ``__exit__`` is one
    frame the handler can tell (a signal handled as it starts, before it clears ``armed``,
    raised after the block had ended: a parse that returned was taken for one stopped, and its
    timer outlived it)."""

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"a CPU time limit must be positive, not {seconds}")
        self.seconds = seconds
        self.armed = False
        self.bounded = False
        self.previous: Any = None
        self.started = 0.0
        self.old = (0.0, 0.0)

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and (frame is None or frame.f_code is not _EXIT):
            raise OverCpu(self.seconds)

    def __enter__(self) -> _Limit:
        handler = signal.getsignal(signal.SIGPROF)
        if (
            threading.current_thread() is not threading.main_thread()
            or handler is None  # set outside Python before it started
            or (handler is signal.SIG_DFL and signal.getitimer(signal.ITIMER_PROF) != (0.0, 0.0))
        ):  # a timer armed with no handler of Python's: a C profiler's takes its signals
            return self
        self.previous = signal.signal(signal.SIGPROF, self._expired)
        self.bounded = True
        self.started = time.process_time()
        try:
            # Again every AGAIN seconds until the block ends: should code in it catch the
            # first (an ``except BaseException`` that does not raise again), the next lands.
            self.old = signal.setitimer(signal.ITIMER_PROF, self.seconds, AGAIN)
        except BaseException:
            signal.signal(signal.SIGPROF, self.previous)
            self.bounded = False
            raise
        self.armed = True  # after: a profiler's last SIGPROF before it is not this block's
        _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False
        if not self.bounded:
            return
        self.bounded = False
        if _active and _active[-1] is self:
            _active.pop()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, self.previous)
        old_delay, old_interval = self.old
        if old_delay > 0 or old_interval > 0:
            left = old_delay - (time.process_time() - self.started)
            signal.setitimer(signal.ITIMER_PROF, max(left, 1e-6), old_interval)


_EXIT = _Limit.__exit__.__code__
_active: list[_Limit] = []


def cpu_limit(seconds: float) -> _Limit:
    """Raise :class:`OverCpu` in the block once the process has used ``seconds`` of CPU time
    since it began (in the main thread; see the module for where the block runs unbounded)."""
    return _Limit(seconds)


def caught() -> None:
    """Said by code that caught :class:`OverCpu` and is writing why (a parser naming the
    line): the innermost block raises no more, so the message is not lost to the next one.
    What that code does after is its own to keep short."""
    if _active:
        _active[-1].armed = False
