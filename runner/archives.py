"""Unpacking an asset's archive (tar or zip) safely into a fresh folder of the asset cache.

The archive's bytes match the digest its contract binds, but whoever made the archive is not
trusted. So every member is checked before anything of it is written, and the folder is written
only by this module, from scratch:

- names: relative, no ``..``, no NUL or backslash, each at most once;
- kinds: regular files and folders only. Links (symbolic or hard) are refused outright rather
  than judged "inside" or "outside" (a job that needs one can make it in its workspace), and so
  are devices, FIFOs and sockets;
- caps: the files and folders counted, and the bytes actually written (not what a header
  claims: a zip bomb's sizes may lie) against the host policy's ``maxUnpackedFiles`` and
  ``maxUnpackedBytes``.

Files are created with ``O_EXCL | O_NOFOLLOW`` below folders this module made, then every file
is made read-only (0444) and every folder 0555. A refused archive leaves nothing behind.
"""

from __future__ import annotations

import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

CHUNK = 1024 * 1024


class UnsafeArchive(Exception):
    """The archive holds something this module refuses; the message names the member."""


class _Writer:
    """Writes members below ``root``, counting files and bytes against the caps."""

    def __init__(self, root: Path, max_bytes: int, max_files: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.files = 0
        self.bytes = 0
        self.seen: set[str] = set()

    def _name(self, raw: str) -> list[str]:
        if not raw or "\x00" in raw or "\\" in raw:
            raise UnsafeArchive(f"member {raw!r} has an empty name, a NUL or a backslash")
        if raw.startswith("/"):
            raise UnsafeArchive(f"member {raw!r} has an absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchive(f"member {raw!r} climbs out with '..'")
        return parts

    def _count(self, raw: str, parts: list[str]) -> str | None:
        if not parts:  # the archive's own root ("./")
            return None
        rel = "/".join(parts)
        if rel in self.seen:
            raise UnsafeArchive(f"member {raw!r} appears twice")
        self.seen.add(rel)
        self.files += 1
        if self.files > self.max_files:
            raise UnsafeArchive(
                f"the archive holds more than {self.max_files:,} files and folders "
                "(the host policy's assets.maxUnpackedFiles)"
            )
        return rel

    def folder(self, raw: str) -> None:
        rel = self._count(raw, self._name(raw))
        if rel is not None:
            self._makedirs(rel, raw)

    def _makedirs(self, rel: str, raw: str) -> None:
        where = self.root
        for part in rel.split("/"):
            where = where / part
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                os.mkdir(where, 0o755)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeArchive(f"member {raw!r} needs {part!r} as a folder; it is a file")

    def file(self, raw: str, src: IO[bytes], declared: int) -> None:
        parts = self._name(raw)
        rel = self._count(raw, parts)
        if rel is None:
            raise UnsafeArchive(f"member {raw!r} is a file without a name")
        if len(parts) > 1:
            self._makedirs("/".join(parts[:-1]), raw)
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
        if written != declared:
            raise UnsafeArchive(f"member {raw!r} holds {written:,} bytes, its header says "
                                f"{declared:,}")  # fmt: skip

    def _too_big(self) -> UnsafeArchive:
        return UnsafeArchive(
            f"the archive unpacks to more than {self.max_bytes:,} bytes (the host policy's "
            "assets.maxUnpackedBytes)"
        )


def _tar_members(archive: Path, w: _Writer) -> None:
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for m in tar:
                if m.isdir():
                    w.folder(m.name)
                elif m.isreg():
                    src = tar.extractfile(m)
                    if src is None:  # pragma: no cover - isreg() members always have data
                        raise UnsafeArchive(f"member {m.name!r} has no data")
                    with src:
                        w.file(m.name, src, m.size)
                elif m.issym() or m.islnk():
                    raise UnsafeArchive(
                        f"member {m.name!r} is a link ({m.linkname!r}); links are refused"
                    )
                else:
                    raise UnsafeArchive(
                        f"member {m.name!r} is a device, FIFO or other special file; only "
                        "regular files and folders are unpacked"
                    )
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise UnsafeArchive(f"not a readable tar archive: {exc}") from None
    except OSError as exc:
        if exc.errno is not None:  # the host's own failure (a full disk ...), not the archive's
            raise
        raise UnsafeArchive(f"not a readable tar archive: {exc}") from None  # a bad gzip stream


def _zip_members(archive: Path, w: _Writer) -> None:
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


def _walk_bottom_up(root: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    yield from os.walk(root, topdown=False)


def make_read_only(root: Path) -> None:
    """Files 0444, folders 0555, below and including ``root`` (no link is there to follow)."""
    for folder, _dirs, files in _walk_bottom_up(root):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444, follow_symlinks=False)
        os.chmod(folder, 0o555)  # noqa: S103 - read-only: r-x for everyone is the point


def remove_tree(root: Path) -> None:
    """Remove a read-only tree this module made (folders made writable first)."""
    if not root.exists():
        return
    for folder, _dirs, _files in os.walk(root):
        os.chmod(folder, 0o755)  # noqa: S103 - writable again by its owner, to be removed
    shutil.rmtree(root)


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
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    remove_tree(tmp)
    tmp.mkdir(mode=0o755)
    w = _Writer(tmp, max_bytes, max_files)
    try:
        (_tar_members if kind == "tar" else _zip_members)(archive, w)
        make_read_only(tmp)
        os.rename(tmp, dest)
    except BaseException:
        remove_tree(tmp)
        raise
    return w.files, w.bytes
