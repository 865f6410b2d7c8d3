"""Disk and log quotas, enforced by the runner while the job runs.

Docker cannot cap a bind mount on this filesystem, so the runner measures:

- **Disk**: what ``output/`` and ``workspace/`` hold (allocated blocks, so sparse files count
  as what they take). A walk over a million files is not free, so walks are spaced by at least
  20 times the last walk's duration (and at least ``min_interval`` seconds): the measurement
  never costs more than about 5% of one core. Past the quota the job is stopped
  (``disk_quota_exceeded``), and measured once more as its container ends
  (``runner.execution.attempt._disk_at_end``); its files stay for inspection.
- **Logs**: each of stdout and stderr is capped. Past the cap the runner keeps the first and
  last halves: while the job runs it punches a hole in the middle (``fallocate``), so the
  disk is freed without touching the job's open file; at the end the file is rewritten as head
  + a marker + tail. Or, per policy, the job is stopped (``log_limit_exceeded``). Logs are
  never read whole into memory.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from runner.core import safefs

if TYPE_CHECKING:  # imported where a job uses it: a job without one never does
    from runner.agents import transcript

__all__ = [
    "MAX_DEPTH",
    "DiskMeter",
    "Guards",
    "LogCap",
    "TooDeep",
    "Unmeasured",
    "Unreadable",
    "allocated_bytes",
]

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_BLOCK = 4096
CHUNK = 1024 * 1024


MAX_DEPTH = 256
"""How deep below each root the meter walks. It holds a descriptor for each folder on the
path it is in, no more: a walk that held one for every folder it had still to enter ran out
of descriptors under a job's chain of folders a thousand deep, each with a sibling left for
later, and counted nothing past that (a third of such a tree under a limit of 1,024
descriptors; the rest of the runner's files and sockets failed meanwhile). A folder deeper
than this is not walked: :class:`TooDeep`, and the job is taken to be over its quota."""


class Unmeasured(Exception):
    """Something below a measured root cannot be counted: the job is taken to be over its
    quota (a job that hides files from the meter is stopped as one that wrote too much)."""


class TooDeep(Unmeasured):
    """A folder below a measured root is nested deeper than :data:`MAX_DEPTH`."""


class Unreadable(Unmeasured):
    """A folder of the runner's own uid below a measured root that it may not list, or whose
    entries it may not stat: a job run as the runner's uid (a runner not run as root, on
    Docker) can ``chmod 000`` its folder, and the files in it went uncounted. A folder of
    another uid (a rootless engine's job, whose uids are mapped into a user namespace) that
    the runner may not read is not the job's doing against the meter: it is skipped, as
    before (docs/security.md says so)."""


_DENIED = frozenset({errno.EACCES, errno.EPERM})


def _counted(exc: OSError, what: str, owner: int | None) -> None:
    """What an OSError in the walk means: gone, made a link, or denied by a folder of another
    uid (skipped), or denied by one of the runner's own (:class:`Unreadable`); ``owner`` is
    the uid of the folder that denied it."""
    if exc.errno in _DENIED and owner == os.geteuid():
        raise Unreadable(f"{what} cannot be read by the runner: {exc.strerror}") from None


def _owner(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_uid
    except OSError:
        return None


def allocated_bytes(roots: list[Path]) -> int:
    """Bytes allocated under ``roots`` (st_blocks), never following a link: each folder is
    opened from its parent's descriptor with ``O_NOFOLLOW``, so a folder the job swaps for a
    link while it is measured is skipped, not walked. Depth first, with a descriptor open for
    each folder on the path and none for those still to be entered; :class:`TooDeep` for a
    folder deeper than :data:`MAX_DEPTH`, :class:`Unreadable` for one it may not list or an
    entry it may not stat."""
    total = 0
    for root in roots:
        try:
            fd = os.open(root, safefs.DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _counted(exc, f"{root.name}/", os.lstat(root).st_uid)
            continue
        path: list[tuple[int, list[tuple[str, int]]]] = []  # open folders, subfolders to enter
        try:
            while fd >= 0:
                subfolders: list[tuple[str, int]] = []  # name, owner
                path.append((fd, subfolders))
                owner = _owner(fd)
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            try:
                                st = entry.stat(follow_symlinks=False)
                            except OSError as exc:
                                _counted(exc, "an entry", owner)
                                continue
                            total += st.st_blocks * 512
                            if stat.S_ISDIR(st.st_mode):
                                subfolders.append((entry.name, st.st_uid))
                except OSError as exc:
                    _counted(exc, "a folder", owner)
                fd = _next_folder(path)
        finally:
            for held, _ in path:
                os.close(held)
    return total


def _next_folder(path: list[tuple[int, list[tuple[str, int]]]]) -> int:
    """The next folder to measure, opened: a subfolder of the deepest folder on ``path`` that
    has one left (those with none are closed and left); -1 when none is left."""
    while (down := safefs.next_down(path)) is not None:
        parent, (name, owner) = down
        if len(path) > MAX_DEPTH:
            raise TooDeep(f"a folder is nested more than {MAX_DEPTH} deep")
        try:
            return os.open(name, safefs.DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            _counted(exc, "a folder", owner)
            continue  # gone, made a link, or another uid's: not walked
    return -1


@dataclass
class DiskMeter:
    roots: list[Path]
    quota: int
    min_interval: float = 0.2
    peak: int = 0
    last: int = 0
    measurements: int = 0
    unmeasured: str | None = None
    """Why a measurement could not count all (:class:`Unmeasured`), when one could not."""
    _next: float = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def measure(self) -> int:
        """What the roots hold now; one byte over the quota when something in them cannot be
        counted (:class:`Unmeasured`: nested too deep, or unreadable): a job that hides files
        so is stopped as one over its quota."""
        start = time.monotonic()
        try:
            self.last = allocated_bytes(self.roots)
        except Unmeasured as exc:
            self.unmeasured = str(exc)
            self.last = max(self.last, self.quota + 1)
        took = time.monotonic() - start
        self.measurements += 1
        self.peak = max(self.peak, self.last)
        self._next = time.monotonic() + max(self.min_interval, 20 * took)
        return self.last


@functools.cache
def _libc_fallocate() -> Callable[..., int] | None:
    """fallocate(2) from the libc this process runs with, looked up on the first hole punched:
    at import, ``ctypes.util.find_library`` ran ``/sbin/ldconfig -p`` in every runner process
    (and ctypes was imported) for a call few jobs need."""
    import ctypes

    try:
        func = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    func.restype = ctypes.c_int
    return func


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``length`` bytes at ``offset`` of the open file ``fd`` without changing its size;
    False when the filesystem cannot."""
    fallocate = _libc_fallocate() if length > 0 else None
    if fallocate is None:
        return False
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    return bool(fallocate(fd, mode, offset, length) == 0)


@dataclass
class LogCap:
    """One capped log file: the first and last ``limit // 2`` bytes are kept.

    The job owns ``output/`` and may swap any folder on the log's path for a link while it
    runs: every access walks the path from ``root`` without following links
    (:mod:`runner.core.safefs`) and touches only a regular file, so a hole is never punched, nor a
    file rewritten, anywhere but in the job's own log."""

    path: Path
    limit: int
    root: Path
    """The output folder the log's path is relative to."""
    punched_to: int = field(default=0)
    """The hole so far covers [head, punched_to)."""

    @property
    def head(self) -> int:
        return (self.limit // 2) // _BLOCK * _BLOCK

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(self.root))

    def size(self) -> int:
        """The log's size; 0 when it is missing or not a plain file reached without links."""
        try:
            st = safefs.lstat_under(self.root, self.rel)
        except (safefs.UnsafePath, OSError):
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def over(self) -> bool:
        return self.size() > self.limit

    def trim(self) -> None:
        """Punch the middle out (block-aligned), keeping the head and about limit/2 of tail."""
        try:
            with safefs.parent_fd(self.root, self.rel) as (parent, name):
                fd = safefs.open_at(parent, name, self.rel, write=True)
        except (safefs.UnsafePath, OSError):
            return
        try:
            end = (os.fstat(fd).st_size - self.limit // 2) // _BLOCK * _BLOCK
            start = max(self.head, self.punched_to)
            if end > start and punch_hole(fd, start, end - start):
                self.punched_to = end
        finally:
            os.close(fd)

    def compact(self) -> int:
        """After the job: rewrite as head + marker + tail; return the bytes dropped."""
        try:
            with safefs.parent_fd(self.root, self.rel) as (parent, name):
                return self._compact_at(parent, name)
        except (safefs.UnsafePath, FileNotFoundError):
            return 0

    def _compact_at(self, parent: int, name: str) -> int:
        src_fd = safefs.open_at(parent, name, self.rel)
        with os.fdopen(src_fd, "rb") as src:
            st = os.fstat(src_fd)
            size = st.st_size
            if size <= self.limit:
                return 0
            tail = self.limit - self.head
            dropped = size - self.head - tail
            marker = f"\n[runner: {dropped} bytes of this log were dropped past its cap]\n"
            tmp = f".{name}.compact.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            try:
                with os.fdopen(os.open(tmp, flags, 0o600, dir_fd=parent), "wb") as dst:
                    _copy(src, dst, self.head)
                    dst.write(marker.encode())
                    src.seek(size - tail)
                    _copy(src, dst, tail)
                    os.fchown(dst.fileno(), st.st_uid, st.st_gid)
                    os.fchmod(dst.fileno(), st.st_mode & 0o777)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=parent)
        return dropped


def _copy(src: BinaryIO, dst: BinaryIO, count: int) -> None:
    while count > 0:
        chunk = src.read(min(CHUNK, count))
        if not chunk:
            return
        dst.write(chunk)
        count -= len(chunk)


@dataclass
class Guards:
    """Checked by the watch loop: returns why the job must stop, or None."""

    disk: DiskMeter
    logs: list[LogCap]
    stop_on_log_limit: bool
    agent: transcript.AgentGuard | None = None
    """An agent's turn and cost limits, read from the runner's capture of its stdout and the
    proxy's count of its model requests (agent_planned runs)."""

    def check(self) -> str | None:
        # The agent's transcript first: it is read before a cap punches its middle out.
        if self.agent is not None and (over := self.agent.check()) is not None:
            return over
        for log in self.logs:
            if log.over():
                if self.stop_on_log_limit:
                    return "log_limit_exceeded"
                log.trim()
        if self.disk.due() and self.disk.measure() > self.disk.quota:
            return "disk_quota_exceeded"
        return None

    def breached(self) -> str | None:
        """What the job's files show now, measured at once and changing nothing: a quota the
        job broke while no runner watched it (or at the very end)."""
        if self.disk.measure() > self.disk.quota:
            return "disk_quota_exceeded"
        if self.stop_on_log_limit and any(log.over() for log in self.logs):
            return "log_limit_exceeded"
        if self.agent is not None:
            return self.agent.check()
        return None
