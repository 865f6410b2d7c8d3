"""The runner's one owner of ``flock(2)``: every lock file it takes (the caches' per-digest
locks, a job's ``record/lock``, the GPU allocator's, the egress slots') goes through here.

A lock is held by an open file description: it lasts while the descriptor is open (or until
:func:`release`), and every other open of the file, in this process or another, sees it as
held. Never take one lock file twice in one process through two opens: the second waits on
the first (or is refused, without ``wait``)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.core import clock

__all__ = [
    "acquire",
    "flocked",
    "is_held",
    "open_lock_file",
    "open_own_lock_file",
    "open_private_lock_file",
    "release",
    "share",
    "try_lock",
]

Opener = Callable[[Path], int]
"""Opens (creating) a lock file for reading and writing; returns its descriptor."""


def open_lock_file(path: Path, *, mode: int = 0o666, follow_links: bool = True) -> int:
    """Open ``path`` read-write, created with ``mode`` (less the umask) when missing, never
    inherited by a program this process starts; ``follow_links`` off refuses a link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    return os.open(path, flags, mode)


def open_own_lock_file(path: Path) -> int:
    """:func:`open_lock_file` that never follows a link at ``path``: a link found there
    (planted by someone who can write the folder) is removed and the runner's own file made
    in its place, so no file is created or locked where the link leads."""
    return _open_own(path, 0o666)


def open_private_lock_file(path: Path) -> int:
    """:func:`open_own_lock_file` of a lock no other user may hold: made ``0600``, and made so
    when found readable by others (flock needs only a descriptor open for reading, so a lock
    file others can read is one any local user can hold for as long as they like)."""
    fd = _open_own(path, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_own(path: Path, mode: int) -> int:
    for _ in range(3):
        try:
            return open_lock_file(path, mode=mode, follow_links=False)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return open_lock_file(path, mode=mode, follow_links=False)


def share(fd: int) -> None:
    """Take a shared lock of the open file ``fd`` (waiting while someone holds it
    exclusively): held, it keeps :func:`acquire` of the same file from others."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def acquire(fd: int, *, wait: bool = True, timeout: float | None = None, poll: float = 0.2) -> bool:
    """Take the exclusive lock of the open file ``fd``: blocking until it is ours (``wait``,
    no ``timeout``); one try (no ``wait``); or tries every ``poll`` seconds until ``timeout``
    seconds have passed. Whether it is ours."""
    if wait and timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = clock.monotonic() + (timeout or 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if not wait or clock.monotonic() >= deadline:
                return False
            clock.sleep(poll)


def release(fd: int) -> None:
    """Let go of a lock taken on ``fd`` and close it (unlocked first, so that no copy of the
    descriptor a fork left behind holds it on)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def try_lock(path: Path, *, opener: Opener = open_lock_file) -> int | None:
    """The lock of ``path`` taken at once, as an open descriptor to hold for as long as the
    lease lasts (then :func:`release` it); None when another holds it."""
    fd = opener(path)
    try:
        got = acquire(fd, wait=False)
    except BaseException:
        os.close(fd)
        raise
    if not got:
        os.close(fd)
        return None
    return fd


def is_held(path: Path) -> bool:
    """Whether someone holds the lock of ``path`` right now (a missing file: no one). The probe
    takes the lock for an instant when it is free: a holder that tries once may be refused
    meanwhile, so holders wait out a moment's refusal.

    The path may come from someone else (a holder's record in a shared folder names it), so
    the probe creates nothing and never opens through a link or anything but a regular file:
    a link there, a FIFO or a device is no one's lock (the runner's own locks are regular
    files, a link found where one belongs replaced first by :func:`open_own_lock_file`). A
    file this user may not read is taken as held: what cannot be seen is not reclaimed."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        return exc.errno != errno.ELOOP
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        if not acquire(fd, wait=False):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def flocked(
    path: Path,
    *,
    wait: bool = True,
    timeout: float | None = None,
    poll: float = 0.2,
    opener: Opener = open_own_lock_file,
    parents: bool = True,
) -> Iterator[bool]:
    """Hold the exclusive lock of ``path`` (created if missing, its folder too with
    ``parents``) for the ``with`` block; yields whether it is ours, as :func:`acquire`
    decides with ``wait``, ``timeout`` and ``poll``. ``opener``: how the file is opened."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = opener(path)
    try:
        got = acquire(fd, wait=wait, timeout=timeout, poll=poll)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield got
    finally:
        if got:
            release(fd)
        else:
            os.close(fd)
