"""Disk and log quotas, enforced by the runner while the job runs.

Docker cannot cap a bind mount on this filesystem, so the runner measures:

- **Disk**: what ``output/`` and ``workspace/`` hold (allocated blocks, so sparse files count
  as what they take). A walk over a million files is not free, so walks are spaced by at least
  20 times the last walk's duration (and at least ``min_interval`` seconds): the measurement
  never costs more than about 5% of one core. Past the quota the job is stopped
  (``disk_quota_exceeded``); its files stay for inspection.
- **Logs**: each of stdout and stderr is capped. Past the cap the runner keeps the first and
  last halves: while the job runs it punches a hole in the middle (``fallocate``), so the
  disk is freed without touching the job's open file; at the end the file is rewritten as head
  + a marker + tail. Or, per policy, the job is stopped (``log_limit_exceeded``). Logs are
  never read whole into memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_BLOCK = 4096
CHUNK = 1024 * 1024


def allocated_bytes(roots: list[Path]) -> int:
    """Bytes allocated under ``roots`` (st_blocks), without following links."""
    total = 0
    stack = [str(r) for r in roots]
    while stack:
        top = stack.pop()
        try:
            entries = os.scandir(top)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


@dataclass
class DiskMeter:
    roots: list[Path]
    quota: int
    min_interval: float = 0.2
    peak: int = 0
    last: int = 0
    measurements: int = 0
    _next: float = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def measure(self) -> int:
        start = time.monotonic()
        self.last = allocated_bytes(self.roots)
        took = time.monotonic() - start
        self.measurements += 1
        self.peak = max(self.peak, self.last)
        self._next = time.monotonic() + max(self.min_interval, 20 * took)
        return self.last


def _libc_fallocate() -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    func = libc.fallocate
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    func.restype = ctypes.c_int
    return func


_FALLOCATE = _libc_fallocate()


def punch_hole(path: Path, offset: int, length: int) -> bool:
    """Free ``length`` bytes at ``offset`` without changing the file's size; False when the
    filesystem cannot."""
    if _FALLOCATE is None or length <= 0:
        return False
    try:
        # Never through a link: the job owns output/ and could aim the log at a host file.
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return bool(_FALLOCATE(fd, mode, offset, length) == 0)
    finally:
        os.close(fd)


@dataclass
class LogCap:
    """One capped log file: the first and last ``limit // 2`` bytes are kept."""

    path: Path
    limit: int
    root: Path
    """The output folder: a log that resolves outside it (through a link the job planted) is
    never touched."""
    punched_to: int = field(default=0)
    """The hole so far covers [head, punched_to)."""

    @property
    def head(self) -> int:
        return (self.limit // 2) // _BLOCK * _BLOCK

    def size(self) -> int:
        """The log's size; 0 when it is missing or not a plain file (a link the job made)."""
        try:
            if not self.path.resolve().is_relative_to(self.root.resolve()):
                return 0
            st = self.path.lstat()
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def over(self) -> bool:
        return self.size() > self.limit

    def trim(self) -> None:
        """Punch the middle out (block-aligned), keeping the head and about limit/2 of tail."""
        end = (self.size() - self.limit // 2) // _BLOCK * _BLOCK
        start = max(self.head, self.punched_to)
        if end > start and punch_hole(self.path, start, end - start):
            self.punched_to = end

    def compact(self) -> int:
        """After the job: rewrite as head + marker + tail; return the bytes dropped."""
        size = self.size()
        if size <= self.limit:
            return 0
        tail = self.limit - self.head
        dropped = size - self.head - tail
        marker = f"\n[runner: {dropped} bytes of this log were dropped past its cap]\n".encode()
        tmp = self.path.with_name(f".{self.path.name}.compact.tmp")
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as src, tmp.open("xb") as dst:
                _copy(src, dst, self.head)
                dst.write(marker)
                src.seek(size - tail)
                _copy(src, dst, tail)
            st = self.path.lstat()
            os.chown(tmp, st.st_uid, st.st_gid)
            os.chmod(tmp, st.st_mode & 0o777)
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
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

    def check(self) -> str | None:
        for log in self.logs:
            if log.over():
                if self.stop_on_log_limit:
                    return "log_limit_exceeded"
                log.trim()
        if self.disk.due() and self.disk.measure() > self.disk.quota:
            return "disk_quota_exceeded"
        return None
