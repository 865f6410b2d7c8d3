"""One ``flock(2)`` per cached digest, shared by the asset cache and the input cache."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def flocked(path: Path, *, wait: bool = True, timeout: float | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing); yields False when ``wait`` is
    off, or ``timeout`` seconds have passed, and another holds it. One open file description
    per use: never nest two for one path in one process (the second would wait on the first
    forever)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        if wait and timeout is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield True
            return
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.2)
        yield True
