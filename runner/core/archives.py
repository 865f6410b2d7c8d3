"""Unpacking an asset's archive (tar or zip) safely into a fresh folder of the asset cache.

Long on purpose: the one safe reader of hostile archives (assets, bundles, agent runtimes),
every check of a member in one place so no caller keeps a copy of its own.

The archive's bytes match the digest its contract binds, but whoever made the archive is not
trusted. So every member is checked before anything of it is written, and the folder is written
only by this module, from scratch:

- names: relative, no ``..``, no NUL or backslash, each at most once; at most
  ``MAX_DEPTH`` components of at most ``MAX_COMPONENT`` bytes, ``MAX_PATH`` bytes in all;
- kinds: regular files and folders only. Links (symbolic or hard) are refused outright rather
  than judged "inside" or "outside" (a job that needs one can make it in its workspace), and so
  are devices, FIFOs and sockets;
- caps: the files and folders counted -- every folder made, named by a member or only
  implied by a deeper member's name -- and the bytes actually written (not what a header
  claims: a zip bomb's sizes may lie) against the host policy's ``maxUnpackedFiles`` and
  ``maxUnpackedBytes``; a member whose declared size would pass the cap is refused before
  any of it is read;
- the tar stream itself (:func:`open_tar`): a compressed tar's real size is not known
  beforehand, so the bytes decompressed are counted as they come and capped (the caps' bytes
  plus room for headers, :func:`stream_cap`), and no single header may ask for more than
  ``MAX_HEADER`` bytes (a pax header that declares gigabytes would be read into memory).

``runner verify-bundle`` (:mod:`runner.results.bundle.fixity`) reads bundles through the same
:func:`open_tar`, :func:`check_tar_member` and :class:`Writer`.

Files are created with ``O_EXCL | O_NOFOLLOW`` below folders this module made (each fsynced
when written), then every file is made read-only (0444) and every folder 0555, every folder is
fsynced, and only then is the tree renamed into place. A refused archive leaves nothing behind; any
failure while unpacking is :class:`UnsafeArchive`. Trees are walked iteratively (no recursion
however deep), and removed one folder at a time through file descriptors, never following a
link.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from runner.core import safefs

__all__ = [
    "MAX_LOOSE_DEPTH",
    "RefusedKind",
    "UnsafeArchive",
    "Writer",
    "check_tar_member",
    "open_tar",
    "remove_stale",
    "remove_tree",
    "sync_folders",
    "tree_bytes",
    "unpack",
    "unpack_tars",
]

CHUNK = 1024 * 1024
MAX_DEPTH = 64
"""Most components in a member's name (a deep name makes a folder per component)."""
MAX_LOOSE_DEPTH = 512
"""Most components in a member's name where ``strict`` is off (a bundle, which holds what a
job named): deeper than a job's disk quota walks (256), and shallow enough for the recursive
walks a bundle goes through (bagit's, Python's own: a bag 1,200 deep raised RecursionError
and left its unpacked copy behind)."""
MAX_COMPONENT = 255
"""Most bytes in one component of a member's name (NAME_MAX)."""
MAX_PATH = 4096
"""Most bytes in a member's whole name (PATH_MAX)."""
MAX_HEADER = 16 * 1024 * 1024
"""Most bytes one read of the tar stream may ask for: a header's (a pax header's data, a GNU
long name) -- member data is read a chunk at a time."""
HEADER_ROOM = 64 * 1024 * 1024
"""Bytes of headers, padding and end blocks a tar stream may hold beyond its members' data (and
``2 * BLOCKSIZE`` a member more), see :func:`stream_cap`."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeArchive(Exception):
    """The archive holds something this module refuses; the message names the member."""


class RefusedKind(UnsafeArchive):
    """A member of a kind this module never writes: a link (``link``), or a device, FIFO or
    other special file."""

    def __init__(self, message: str, *, link: bool) -> None:
        super().__init__(message)
        self.link = link


def member_parts(raw: str, *, strict: bool = True) -> list[str]:
    """The components of a member's name (``.`` and empty ones dropped) when it is one this
    module writes: relative, no ``..`` or NUL, within ``MAX_COMPONENT`` and ``MAX_PATH``;
    ``strict`` (an asset's archive) also no backslash and at most ``MAX_DEPTH`` parts (a
    bundle may hold what a job named so, at most ``MAX_LOOSE_DEPTH`` parts). Else
    :class:`UnsafeArchive` naming it."""
    if not raw or "\x00" in raw or (strict and "\\" in raw):
        raise UnsafeArchive(f"member {raw!r} has an empty name, a NUL or a backslash")
    if raw.startswith("/"):
        raise UnsafeArchive(f"member {raw!r} has an absolute path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"member {raw!r} climbs out with '..'")
    if len(parts) > (most := MAX_DEPTH if strict else MAX_LOOSE_DEPTH):
        raise UnsafeArchive(
            f"member {raw[:80]!r}... is {len(parts):,} parts deep, more than {most}"
        )
    if len(os.fsencode(raw)) > MAX_PATH or any(len(os.fsencode(p)) > MAX_COMPONENT for p in parts):
        raise UnsafeArchive(
            f"member {raw[:80]!r}... has a name longer than {MAX_PATH} bytes or a part "
            f"longer than {MAX_COMPONENT}"
        )
    return parts


def check_tar_member(m: tarfile.TarInfo, *, strict: bool = True) -> list[str]:
    """The components of a tar member's name (as :func:`member_parts`) when it is a member
    this module writes: a regular file or a folder (else :class:`RefusedKind`), whose name
    :func:`member_parts` allows (``strict`` or not). Reads only the header: the one check of a
    tar member, whether it is then unpacked (:func:`unpack`) or only scanned."""
    if m.issym() or m.islnk():
        raise RefusedKind(f"member {m.name!r} is a link ({m.linkname!r}); links are refused",
                          link=True)  # fmt: skip
    if not (m.isreg() or m.isdir()):
        raise RefusedKind(
            f"member {m.name!r} is a device, FIFO or other special file; only regular files "
            "and folders are unpacked",
            link=False,
        )
    return member_parts(m.name, strict=strict)


def stream_cap(max_bytes: int, max_files: int) -> int:
    """The most bytes of tar stream (decompressed) read for an archive whose members may hold
    ``max_bytes`` and number ``max_files``: their data, a header and a pax header each, and
    ``HEADER_ROOM`` for the rest."""
    return max_bytes + (max_files + 1) * 2 * tarfile.BLOCKSIZE + HEADER_ROOM


class _Capped:
    """A tar stream read through a cap on its position (the bytes decompressed so far, for a
    compressed tar) and on the size of one read; tarfile reads only through ``read``,
    ``seek`` and ``tell``."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw = raw
        self.limit = limit

    def _past(self) -> UnsafeArchive:
        return UnsafeArchive(
            f"the archive's tar stream runs past {self.limit:,} bytes (its members' caps plus "
            "room for headers): refused as a bomb"
        )

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0 or n > MAX_HEADER:
            raise UnsafeArchive(
                f"the archive has a header of more than {MAX_HEADER:,} bytes (a pax header or "
                "long name no real archive holds)"
            )
        data: bytes = self.raw.read(n)
        if self.raw.tell() > self.limit:
            raise self._past()
        return data

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        target = pos if whence == os.SEEK_SET else self.raw.tell() + pos
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target > self.limit:
            raise self._past()  # checked first: seeking a compressed stream decompresses
        return int(self.raw.seek(target))

    def tell(self) -> int:
        return int(self.raw.tell())

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


@contextlib.contextmanager
def open_tar(f: IO[bytes], *, max_bytes: int, max_files: int) -> Iterator[tarfile.TarFile]:
    """A tar (plain, gzip, bzip2 or xz, told by its first bytes) read from the open file ``f``
    through :class:`_Capped`: at most :func:`stream_cap` bytes decompressed, no header read of
    more than ``MAX_HEADER``. ``tar.fileobj`` is the capped stream (at the member data)."""
    head = f.read(6)
    f.seek(0)
    raw: Any
    if head.startswith(b"\x1f\x8b"):
        raw = gzip.GzipFile(fileobj=f, mode="rb")
    elif head.startswith(b"BZh"):
        raw = bz2.BZ2File(f)
    elif head.startswith(b"\xfd7zXZ\x00"):
        raw = lzma.LZMAFile(f)  # noqa: SIM115 - closed below
    else:
        raw = f
    try:
        stream = _Capped(raw, stream_cap(max_bytes, max_files))
        with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
            yield tar
    finally:
        if raw is not f:
            raw.close()


class Writer:
    """Writes members below ``root``, counting files and bytes against the caps; each file is
    fsynced unless ``sync`` is off (a temporary folder, as ``runner verify-bundle``'s); names
    as :func:`member_parts` allows them (``strict`` or not)."""

    def __init__(
        self, root: Path, max_bytes: int, max_files: int, *, sync: bool = True, strict: bool = True
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.sync = sync
        self.strict = strict
        self.files = 0
        """Files and folders made (folders implied by a deeper member's name included)."""
        self.bytes = 0
        self.seen: set[str] = set()
        """Names of the members so far."""
        self.folders: set[str] = set()
        """Folders made so far (relative)."""
        self.executables: set[str] = set()
        """Files whose member had an execute bit (kept executable only where asked)."""

    def _name(self, raw: str) -> list[str]:
        return member_parts(raw, strict=self.strict)

    def _count(self) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise UnsafeArchive(
                f"the archive holds more than {self.max_files:,} files and folders "
                "(the host policy's assets.maxUnpackedFiles; folders a member's name implies "
                "count too)"
            )

    def _member(self, raw: str, parts: list[str]) -> str | None:
        if not parts:  # the archive's own root ("./")
            return None
        rel = "/".join(parts)
        if rel in self.seen:
            raise UnsafeArchive(f"member {raw!r} appears twice")
        self.seen.add(rel)
        return rel

    def folder(self, raw: str) -> None:
        parts = self._name(raw)
        if self._member(raw, parts) is not None:
            self._makedirs(parts, raw)

    def _makedirs(self, parts: list[str], raw: str) -> None:
        """Make the folders ``parts`` names, each counted against the cap when made."""
        where = self.root
        for i, part in enumerate(parts):
            where = where / part
            rel = "/".join(parts[: i + 1])
            if rel in self.folders:
                continue
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                self._count()
                os.mkdir(where, 0o755)
                self.folders.add(rel)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeArchive(f"member {raw!r} needs {part!r} as a folder; it is a file")
            self.folders.add(rel)

    def file(self, raw: str, src: IO[bytes], declared: int, mode: int = 0) -> None:
        parts = self._name(raw)
        rel = self._member(raw, parts)
        if rel is None:
            raise UnsafeArchive(f"member {raw!r} is a file without a name")
        if mode & 0o111:
            self.executables.add(rel)
        if len(parts) > 1:
            self._makedirs(parts[:-1], raw)
        self._count()
        if self.bytes + declared > self.max_bytes:
            raise self._too_big()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.root / rel, flags, 0o644)
        except FileExistsError:
            raise UnsafeArchive(f"member {raw!r} appears twice") from None
        written = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(min(CHUNK, declared - written + 1)):
                written += len(chunk)
                self.bytes += len(chunk)
                if written > declared:
                    raise UnsafeArchive(f"member {raw!r} holds more than the {declared:,} bytes "
                                        "its header says")  # fmt: skip
                if self.bytes > self.max_bytes:
                    raise self._too_big()
                out.write(chunk)
            out.flush()
            if self.sync:
                os.fsync(out.fileno())  # on disk before the tree is renamed into place
        if written != declared:
            raise UnsafeArchive(f"member {raw!r} holds {written:,} bytes, its header says "
                                f"{declared:,}")  # fmt: skip

    def _too_big(self) -> UnsafeArchive:
        return UnsafeArchive(
            f"the archive unpacks to more than {self.max_bytes:,} bytes (the host policy's "
            "assets.maxUnpackedBytes)"
        )


def _tar_members(archive: Path, w: Writer) -> None:
    try:
        with (
            archive.open("rb") as f,
            open_tar(f, max_bytes=w.max_bytes, max_files=w.max_files) as tar,
        ):
            for m in tar:
                check_tar_member(m, strict=w.strict)
                if m.isdir():
                    w.folder(m.name)
                    continue
                src = tar.extractfile(m)
                if src is None:  # pragma: no cover - isreg() members always have data
                    raise UnsafeArchive(f"member {m.name!r} has no data")
                with src:
                    w.file(m.name, src, m.size, m.mode)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise UnsafeArchive(f"not a readable tar archive: {exc}") from None
    except RecursionError:  # tarfile follows a chain of pax headers by recursion
        raise UnsafeArchive("not a readable tar archive: a chain of headers too long") from None
    except OSError as exc:
        if exc.errno is not None:  # the host's own failure (a full disk ...), not the archive's
            raise
        raise UnsafeArchive(f"not a readable tar archive: {exc}") from None  # a bad gzip stream


def _zip_members(archive: Path, w: Writer) -> None:
    try:
        with zipfile.ZipFile(archive) as z:
            infos = z.infolist()
            if len(infos) > w.max_files:
                raise UnsafeArchive(
                    f"the archive holds {len(infos):,} members, more than {w.max_files:,} "
                    "(the host policy's assets.maxUnpackedFiles)"
                )
            for info in infos:
                mode = info.external_attr >> 16
                if info.is_dir():
                    w.folder(info.filename)
                    continue
                if stat.S_ISLNK(mode):
                    raise UnsafeArchive(f"member {info.filename!r} is a link; links are refused")
                if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                    raise UnsafeArchive(
                        f"member {info.filename!r} is a device, FIFO or other special file; "
                        "only regular files and folders are unpacked"
                    )
                with z.open(info) as src:
                    w.file(info.filename, src, info.file_size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError,
            zlib.error, lzma.LZMAError) as exc:  # fmt: skip
        raise UnsafeArchive(f"not a readable zip archive: {exc}") from None
    except RuntimeError as exc:  # an encrypted member
        raise UnsafeArchive(f"cannot unpack: {exc}") from None


def _walk(root: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """(folder, subfolders, other entries) for ``root`` and every folder below it
    (:func:`runner.core.safefs.walk`: no recursion, no link followed; an unlistable folder is
    an error here)."""
    for folder, _depth, dirs, others in safefs.walk(root, unreadable="raise"):
        yield folder, dirs, others


def tree_bytes(root: Path) -> int:
    """The bytes of the files below ``root`` (walked without recursion, no link followed)."""
    total = 0
    for folder, _dirs, others in _walk(root):
        for name in others:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def make_read_only(root: Path, executables: frozenset[str] = frozenset()) -> None:
    """Files 0444 (0555 for those named in ``executables``, relative to ``root``), folders
    0555, below and including ``root`` (no link is there to follow)."""
    folders = []
    for folder, _dirs, files in _walk(root):
        for name in files:
            path = os.path.join(folder, name)
            mode = 0o555 if os.path.relpath(path, root) in executables else 0o444
            os.chmod(path, mode, follow_symlinks=False)
        folders.append(folder)
    for folder in reversed(folders):  # the deepest first: a 0555 folder's entries stay settable
        os.chmod(folder, 0o555)  # noqa: S103 - read-only: r-x for everyone is the point


def sync_folders(root: Path, *, below: bool = True) -> None:
    """fsync ``root`` (and every folder below it): their entries are on disk, so a tree renamed
    into place after this is whole after a crash, never a folder with files missing."""
    for folder in (f for f, _d, _o in _walk(root)) if below else [os.fspath(root)]:
        fd = os.open(folder, _DIR_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_tree(root: Path) -> None:
    """Remove a tree (read-only folders made writable first), however deep: one folder open
    at a time, entered and left through file descriptors (``..`` to go up), so neither a path
    longer than PATH_MAX nor a deep tree's open descriptors nor recursion stop it; a link is
    removed, never followed."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(root)
        return
    fd = os.open(root, _DIR_FLAGS)
    try:
        stack: list[tuple[str, list[str]]] = []
        here, todo = "", _clear(fd)
        while True:
            if todo:
                name = todo.pop()
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                stack.append((here, todo))
                here, todo = name, _clear(fd)
                continue
            if not stack:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(here, dir_fd=fd)
            here, todo = stack.pop()
    finally:
        os.close(fd)
    os.rmdir(root)


def _clear(fd: int) -> list[str]:
    """Make the open folder writable, remove what is not a folder in it; its subfolders."""
    os.fchmod(fd, 0o700)
    dirs = []
    with os.scandir(fd) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    return dirs


def remove_stale(folder: Path, prefix: str) -> None:
    """Remove the temporary folders (``.<prefix>….tmp``) that unpacks left in ``folder`` (a
    killed runner, a failed clean-up); the caller holds the digest's lock. Best effort."""
    try:
        names = [e.name for e in os.scandir(folder)]
    except OSError:
        return
    for name in names:
        if name.startswith(f".{prefix}") and name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                remove_tree(folder / name)


def unpack(
    archive: Path,
    kind: Literal["tar", "zip"],
    dest: Path,
    *,
    max_bytes: int,
    max_files: int,
) -> tuple[int, int]:
    """Unpack ``archive`` into ``dest`` (which must not exist), read-only; (files, bytes).
    Raises :class:`UnsafeArchive` and leaves no ``dest`` behind."""
    return _unpack_into(
        dest,
        lambda w: (_tar_members if kind == "tar" else _zip_members)(archive, w),
        max_bytes=max_bytes,
        max_files=max_files,
        executable=False,
    )


def unpack_tars(
    archives: Sequence[Path], dest: Path, *, max_bytes: int, max_files: int
) -> tuple[int, int]:
    """Unpack the tar ``archives`` into the one new tree ``dest``, as :func:`unpack` does,
    except that a file whose member has an execute bit stays executable (0555): for programs
    (an agent's runtime) rather than data. A name two archives hold is refused."""

    def fill(w: Writer) -> None:
        for archive in archives:
            _tar_members(archive, w)

    return _unpack_into(dest, fill, max_bytes=max_bytes, max_files=max_files, executable=True)


def _unpack_into(
    dest: Path,
    fill: Callable[[Writer], None],
    *,
    max_bytes: int,
    max_files: int,
    executable: bool,
) -> tuple[int, int]:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    remove_tree(tmp)
    tmp.mkdir(mode=0o755)
    w = Writer(tmp, max_bytes, max_files)
    try:
        try:
            fill(w)
            make_read_only(tmp, frozenset(w.executables) if executable else frozenset())
            sync_folders(tmp)
            os.rename(tmp, dest)
            sync_folders(dest.parent, below=False)
        except UnsafeArchive:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever it is, the archive is not unpacked
            raise UnsafeArchive(f"cannot unpack: {type(exc).__name__}: {exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):  # what is left is removed by the next fetch
            remove_tree(tmp)
        raise
    return w.files, w.bytes
