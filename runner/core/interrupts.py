"""Ctrl-C and SIGTERM held off while the runner writes what must not be cut in two.

The runner's handlers (runner.app.host.install_signal_handlers) turn the first SIGINT or
SIGTERM into a KeyboardInterrupt in the main thread, which lands between any two bytecodes.
One that landed in a ledger append after the line was on disk but before the ledger's own
account of it was updated left the runner taking its own event for another runner's (a
takeover): it stopped writing, and left its container running. Inside :func:`deferred` the
handlers call :func:`interrupt`, which only notes the signal; the KeyboardInterrupt is raised
as the outermost deferred block ends.

Only the main thread's blocks hold an interrupt (Python runs signal handlers there); a block
in another thread holds nothing. Under a handler that is not the runner's (Python's own, in a
program that embeds the runner) a KeyboardInterrupt lands anywhere, as it always did.
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["deferred", "interrupt"]

_depth = 0
_pending = False


class _Deferred:
    """The block: its count taken as the last step of ``__enter__`` and given back as the
    first of ``__exit__``, so that no interrupt lands between either and the block."""

    def __init__(self) -> None:
        self._counted = False

    def __enter__(self) -> None:
        global _depth
        if threading.current_thread() is threading.main_thread():
            self._counted = True
            _depth += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        global _depth, _pending
        if not self._counted:
            return
        _depth -= 1
        if _depth == 0 and _pending:
            _pending = False
            raise KeyboardInterrupt


def deferred() -> _Deferred:
    """Hold a Ctrl-C or SIGTERM (raised by :func:`interrupt`) until the block ends, and raise
    it then (an error the block raised meanwhile is its context)."""
    return _Deferred()


def interrupt() -> None:
    """A signal handler's KeyboardInterrupt: raised now, or once the :func:`deferred` block
    the main thread is in ends."""
    global _pending
    if _depth > 0:
        _pending = True
        return
    raise KeyboardInterrupt
