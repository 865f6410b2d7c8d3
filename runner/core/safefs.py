"""Opening files that a contract author or a job controls, without being led astray.

Every path the runner reads below a folder it does not fully own (the contract's folder, a
job's ``output/``) is walked one component at a time from an open folder descriptor: each
folder with ``O_DIRECTORY | O_NOFOLLOW``, the last component with ``O_NOFOLLOW | O_NONBLOCK``
and an ``fstat`` check that it is a regular file. So no symbolic link anywhere on the way is
followed (not just the last component), a link swapped in after a check is refused by the
kernel rather than by a racy test, and a FIFO or a device node is refused without blocking
(opening a FIFO for reading with ``O_NONBLOCK`` returns at once). The folder at the base is
trusted: it is the caller's choice, not the hostile party's.

Callers turn :class:`UnsafePath` into their own category (an invalid contract for an input, a
missing or unreadable piece of evidence for a job's file) with :attr:`UnsafePath.problem`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

__all__ = [
    "DIR_FLAGS",
    "UnsafePath",
    "copy_sparse",
    "kind",
    "lstat_under",
    "makedirs_under",
    "next_down",
    "open_at",
    "open_folder_at",
    "open_regular",
    "open_under",
    "parent_fd",
    "parts",
    "read_named",
    "readlink_at",
    "walk",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_T = TypeVar("_T")
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a folder",
}


def walk(
    root: Path | str, *, max_depth: int | None = None, unreadable: str = "skip"
) -> Iterator[tuple[str, int, list[str], list[str]]]:
    """(folder, its depth below ``root``, subfolders, other entries) for ``root`` and every
    folder below it, top-down, with a stack rather than recursion (``os.walk`` recurses on
    Python 3.11: a tree a thousand deep, which a job makes in a blink, raised RecursionError in
    whatever walked it); no link followed (a link to a folder is among the other entries). The
    caller may prune or reorder ``subfolders`` in place, as with ``os.walk``; none is entered
    below ``max_depth``. A folder that cannot be listed (gone, a path past PATH_MAX) is
    skipped, or with ``unreadable="raise"`` its OSError raised. Depth first, keeping the
    paths of the folders on the way down and the names of those still to enter, not a path
    for each of those (a job's 20,000 folders at 3,800 bytes a path took 77 MB so)."""
    path: list[tuple[str, list[str]]] = []  # each folder on the way down, its subfolders left
    folder: str | None = os.fspath(root)
    while folder is not None:
        dirs: list[str] = []
        others: list[str] = []
        listed = True
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    (dirs if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
        except OSError:
            if unreadable == "raise":
                raise
            listed = False
        if listed:
            yield folder, len(path), dirs, others
            if max_depth is None or len(path) < max_depth:
                path.append((folder, dirs[::-1]))  # popped from the end: in the caller's order
        folder = None
        while path and folder is None:
            parent, todo = path[-1]
            if todo:
                folder = os.path.join(parent, todo.pop())
            else:
                path.pop()


def next_down(path_down: list[tuple[int, list[_T]]]) -> tuple[int, _T] | None:
    """The next folder to enter in a depth-first walk by descriptors: ``path_down`` holds,
    for each folder on the way down, its descriptor and what is left to enter below it (the
    next one last). Folders with nothing left are closed and left; (the parent's descriptor,
    the next item) to open from it, or None when the walk is done. A walk so holds a
    descriptor for each folder on its path, not one for every folder it has found: a dataset
    of 1,000 folders, or a job's ladder of them, ran one that opened each as it was found out
    of descriptors under the usual limit of 1,024."""
    while path_down:
        parent, todo = path_down[-1]
        if todo:
            return parent, todo.pop()
        os.close(parent)
        path_down.pop()
    return None


class UnsafePath(Exception):
    """``rel`` (below its base) cannot be opened as asked; ``problem`` says why, in words that
    complete the sentence "<rel> ..." (``does not exist``, ``is a FIFO``, ...)."""

    def __init__(self, rel: str, problem: str, *, missing: bool = False) -> None:
        super().__init__(f"{rel} {problem}")
        self.rel = rel
        self.problem = problem
        self.missing = missing
        """True when nothing is there at all (as opposed to something of the wrong kind)."""


def kind(mode: int) -> str:
    """``a regular file``, ``a folder``, ``a FIFO``, ... for an ``st_mode``."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "special")


def parts(rel: str) -> list[str]:
    """The components of a relative POSIX path; ``.`` and empty ones dropped, ``..`` refused
    (the contract models refuse it already; this is the last line)."""
    out = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in out or rel.startswith("/"):
        raise UnsafePath(rel, "leaves its folder ('..' or an absolute path)")
    return out


def _problem(rel: str, where: str, exc: OSError) -> UnsafePath:
    if exc.errno == errno.ENOENT:
        return UnsafePath(rel, "does not exist", missing=True)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        here = f" at {where!r}" if where and where != rel else ""
        return UnsafePath(rel, f"passes through a symbolic link or a non-folder{here}")
    return UnsafePath(rel, f"cannot be opened: {exc.strerror or exc}")


@contextmanager
def parent_fd(
    base: Path, rel: str, on_folder: Callable[[str, os.stat_result], None] | None = None
) -> Iterator[tuple[int, str]]:
    """``(descriptor of the folder holding rel's last component, that component)``, every
    folder on the way opened without following links (and shown to ``on_folder`` with its
    path so far and ``fstat``). The descriptor is closed on exit."""
    names = parts(rel)
    if not names:
        raise UnsafePath(rel or ".", "names the folder itself, not something in it")
    fd = os.open(base, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        done: list[str] = []
        for name in names[:-1]:
            done.append(name)
            try:
                nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _problem(rel, "/".join(done), exc) from None
            os.close(fd)
            fd = nxt
            if on_folder is not None:
                on_folder("/".join(done), os.fstat(fd))
        yield fd, names[-1]
    finally:
        os.close(fd)


def open_folder_at(dir_fd: int, name: str, rel: str) -> int:
    """A descriptor of the folder ``name`` in ``dir_fd``, never through a link (one swapped
    in since it was listed is refused)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _problem(rel, rel, exc) from None


def lstat_under(base: Path, rel: str) -> os.stat_result:
    """The ``lstat`` of ``base/rel`` reached without following any link on the way."""
    with parent_fd(base, rel) as (fd, name):
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            raise _problem(rel, rel, exc) from None


def open_at(dir_fd: int, name: str, rel: str, *, write: bool = False) -> int:
    """A descriptor of the regular file ``name`` in ``dir_fd`` (for reading, or for writing
    in place): never a link, never a FIFO or device (refused, without blocking), blocking
    mode restored."""
    flags = (_FILE_FLAGS & ~os.O_RDONLY) | os.O_WRONLY if write else _FILE_FLAGS
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(rel, "is a symbolic link") from None
        raise _problem(rel, rel, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(rel, f"is {kind(st.st_mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def readlink_at(dir_fd: int, name: str, rel: str) -> bytes:
    """The target text of the symbolic link ``name`` in ``dir_fd``, as bytes; the link is read,
    never followed. Anything else there is refused."""
    try:
        return os.readlink(os.fsencode(name), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise UnsafePath(rel, "is not a symbolic link") from None
        raise _problem(rel, rel, exc) from None


def open_under(base: Path, rel: str) -> BinaryIO:
    """``base/rel`` opened for reading: a regular file, no link anywhere below ``base``."""
    with parent_fd(base, rel) as (fd, name):
        return os.fdopen(open_at(fd, name, rel), "rb")


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading when its last component is a regular file (not a link, a
    FIFO or a device). For files whose folders were already walked with :func:`open_under`
    or :func:`lstat_under`; parsers open their evidence through it."""
    parent = path.parent
    fd = os.open(parent, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        return os.fdopen(open_at(fd, path.name, path.name), "rb")
    finally:
        os.close(fd)


def makedirs_under(base: Path, rel: str) -> None:
    """Create the folder ``base/rel`` and its parents, never through a link: a component
    that exists as anything but a real folder is refused (:class:`UnsafePath`)."""
    fd = os.open(base, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        for name in parts(rel):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            try:
                nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _problem(rel, name, exc) from None
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def read_named(path: Path, cap: int) -> bytes:
    """The bytes of ``path``, a file the operator named (links in it are the operator's and
    are followed), when it is a regular file of at most ``cap`` bytes: a FIFO or a device is
    refused without blocking, and never more than ``cap`` bytes are read. Raises
    :class:`UnsafePath` (``missing`` when there is nothing there) or OSError."""
    try:
        fd = os.open(path, _FILE_FLAGS & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        raise UnsafePath(str(path), "does not exist", missing=True) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(str(path), f"is {kind(st.st_mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        data = f.read(cap + 1)
    if len(data) > cap:
        raise UnsafePath(str(path), f"is larger than {cap:,} bytes")
    return data


COPY_CHUNK = 1024 * 1024
_ZEROS = bytes(COPY_CHUNK)


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _next_data(fd: int, pos: int, end: int) -> int:
    """Where the next data at or after ``pos`` starts (``end`` when only a hole is left);
    ``pos`` itself on a file system without SEEK_DATA (everything is data there)."""
    try:
        return min(os.lseek(fd, pos, os.SEEK_DATA), end)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no data past pos: a hole to the end (or past EOF)
            return end
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return pos
        raise


def _next_hole(fd: int, pos: int, end: int) -> int:
    try:
        return min(os.lseek(fd, pos, os.SEEK_HOLE), end)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EINVAL, errno.EOPNOTSUPP):
            return end
        raise


def copy_sparse(
    src: int,
    dst: int | None,
    size: int,
    digest: _Hash | None = None,
    *,
    on_write: Callable[[int], None] | None = None,
) -> int:
    """Copy the first ``size`` bytes of the open file ``src`` to the open, empty file ``dst``
    (None: only read), keeping holes: the source's holes (``SEEK_DATA``/``SEEK_HOLE``) are
    never read nor written, and a run of zeros in its data becomes a hole too. ``digest`` is
    fed every byte as the file reads (zeros for holes), so the hash is the file's. The one
    copy routine for every file the runner copies from a contract's or a job's folder
    (staging, the input cache's fallback copy, the working copy). ``on_write(n)`` is told of
    each ``n`` bytes of data written (before they are), and may raise to stop the copy.
    Returns the bytes copied: ``size``, or less when the file shrank meanwhile; ``dst`` is
    truncated to it."""
    pos = 0
    while pos < size:
        data = _next_data(src, pos, size)
        while pos < data:  # a hole: zeros for the hash, nothing read, nothing written
            n = min(COPY_CHUNK, data - pos)
            if digest is not None:
                digest.update(_ZEROS[:n])
            pos += n
        if pos >= size:
            break
        hole = _next_hole(src, pos, size)
        if hole <= pos:
            hole = size
        while pos < hole:
            chunk = os.pread(src, min(COPY_CHUNK, hole - pos), pos)
            if not chunk:  # shrank under us: what was there is what was copied
                size = pos
                break
            if digest is not None:
                digest.update(chunk)
            if dst is not None and chunk != _ZEROS[: len(chunk)]:
                if on_write is not None:
                    on_write(len(chunk))
                view = memoryview(chunk)
                at = pos
                while view:
                    done = os.pwrite(dst, view, at)
                    view, at = view[done:], at + done
            pos += len(chunk)
    if dst is not None:
        os.ftruncate(dst, pos)
    return pos
