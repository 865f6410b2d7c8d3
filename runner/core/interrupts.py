"""Ctrl-C and SIGTERM held off while the runner writes what must not be cut in two.

The runner's handlers (runner.app.host.install_signal_handlers) turn the first SIGINT or
SIGTERM into a KeyboardInterrupt in the main thread, which lands between any two bytecodes.
One that lands in a ledger append after the line is on disk but before the ledger's own
account of it was updated left the runner taking its own event for another runner's (a
takeover): it stopped writing, and left its container running. Inside :func:`deferred` the
handlers call :func:`interrupt`, which only notes the signal; the KeyboardInterrupt is raised
as the outermost deferred block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["deferred", "interrupt"]

_depth = 0
_pending = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM (raised by :func:`interrupt`) until the block ends, and raise
    it then (an error the block raised meanwhile is its context)."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            _pending = False
            raise KeyboardInterrupt


def interrupt() -> None:
    """A signal handler's KeyboardInterrupt: raised now, or once the :func:`deferred` block
    the main thread is in ends."""
    global _pending
    if _depth > 0:
        _pending = True
        return
    raise KeyboardInterrupt
