"""The fixity checks of ``runner verify-bundle``: the archive (what files it holds, their
names, kinds and declared sizes against the caps, the bag's Payload-Oxum and the free space,
all before anything is unpacked; then unpacked through :mod:`runner.core.archives`), the tag
manifest (each tag file's digest, no file it does not list), and the payload (bagit.py's
validation of every sha256, and each file stored beside the archive in the blobs folder).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from runner.core import archives, safefs
from runner.results.bundle import BLOB_PREFIX, INFO_FILE, MANIFEST, SEAL_FILE, TAGMANIFEST
from runner.results.bundle.bag import Bag, Check, MiB, Problem, Report, Stop
from runner.results.bundle.export import quiet_bagit

__all__ = ["FixityChecks", "extract", "sha256_file"]

CHUNK = MiB
END_MAX = MiB
"""What may follow a tar's last member: its end blocks and record padding (10 KiB by default)."""
HEX64 = re.compile(r"[0-9a-f]{64}")
REQUIRED_TAGS = ("bagit.txt", "bag-info.txt", MANIFEST, INFO_FILE)


def extract(
    archive: Path, dest: Path, max_total: int, max_files: int, report: Report
) -> tuple[Path, list[Problem]]:
    """Unpack the archive into ``dest``, refusing what a bundle never holds; its one top
    folder, and the problems of bytes that belong to no file. Two passes over one open file:
    the first writes nothing (names, kinds, declared sizes against the caps, the bag's
    Payload-Oxum and ``dest``'s free space); the second writes with :class:`archives.Writer`
    the very members the first saw, no more bytes than they declared."""

    def stop(file: str, message: str) -> Stop:
        report.problems.append(Problem(file, message))
        report.checks.append(Check("archive", "failed", f"{file}: {message}"))
        return Stop()

    name = archive.name
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait
    except FileNotFoundError:
        raise stop(name, "does not exist") from None
    except OSError as exc:
        raise stop(name, f"cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise stop(name, "is not a regular file")
        scan = _Scan(name, max_total, max_files, dest, stop)
        try:
            with archives.open_tar(f, max_bytes=max_total, max_files=max_files) as tar:
                for member in tar:
                    scan.member(member, tar)
        except Stop:
            raise
        except archives.UnsafeArchive as exc:
            raise stop(name, str(exc)) from None
        except (OSError, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError,
                RecursionError) as exc:  # fmt: skip
            if scan.top is None:
                raise stop(name, f"is not a readable tar archive: {exc}") from None
            scan.damage = str(exc)  # after some members: the second pass names what it hides
        top = scan.fits()
        f.seek(0)
        afterwards = _unpack(f, dest, top, scan, stop)
    report.checks.append(Check("archive", "ok", f"{len(scan.seen):,} entries in {top}/"))
    return dest / top, afterwards


_OXUM = re.compile(rb"^Payload-Oxum:[ \t]*(\d{1,20})\.(\d{1,20})[ \t]*\r?$", re.MULTILINE)
"""At most 20 digits a number (10^20 bytes is past any payload): a number of thousands of digits
is no Payload-Oxum, never an int() past Python's digit limit (a ValueError)."""
_COUNT = re.compile(r"[0-9]{1,20}")
"""A size in fetch.txt: ASCII digits, at most 20 (never an int() past Python's digit limit)."""
_ENCODING = re.compile(rb"^Tag-File-Character-Encoding:[ \t]*([^\r\n]*)", re.MULTILINE)
BAG_INFO_MAX = MiB
"""Most bytes of bag-info.txt read before unpacking (for its Payload-Oxum)."""
BLOCK = 4096
"""What a file or folder takes on disk at least, for the free-space check."""


class _Scan:
    """The first pass: every member checked from its header alone (its data is skipped, so
    nothing is written and, for a plain tar, not even read), the bag's Payload-Oxum read from
    bag-info.txt; each declared size is checked against the caps and the Payload-Oxum the
    moment its header is read, before any of its data."""

    def __init__(
        self,
        name: str,
        max_total: int,
        max_files: int,
        dest: Path,
        stop: Callable[[str, str], Stop],
    ) -> None:
        self.name, self.max_total, self.max_files, self.stop = name, max_total, max_files, stop
        self.where = dest.parent
        self.free = shutil.disk_usage(dest).free
        """Bytes free where it is to be unpacked."""
        self.top: str | None = None
        self.seen: set[str] = set()
        self.folders: set[str] = set()
        """Every folder the members name or imply (the writer makes and counts them)."""
        self.names: set[str] = set()
        """``seen`` and ``folders`` together: what the bundle unpacks to, counted."""
        self.members: list[tuple[str, bytes, int]] = []
        """(name, type, size) of each member in order: the second pass must see the same."""
        self.total = 0
        self.disk = 0
        self.payload = 0
        self.payload_files = 0
        self.oxum: tuple[int, int] | None = None
        self.damage: str | None = None

    def member(self, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        stop = self.stop
        parts = PurePosixPath(member.name).parts
        if member.name.startswith("/") or not parts or ".." in parts:
            raise stop(member.name, "leaves the bundle's folder (absolute, or '..')")
        if self.top is None:
            self.top = parts[0]
        if parts[0] != self.top or (len(parts) == 1 and not member.isdir()):
            raise stop(member.name, f"is outside the bag's one folder {self.top}/")
        try:
            archives.check_tar_member(member, strict=False)
        except archives.RefusedKind as exc:
            kind = "a link" if exc.link else "not a plain file"
            raise stop(member.name, f"is {kind}; a bundle holds only files and folders") from None
        except archives.UnsafeArchive as exc:
            raise stop(member.name, str(exc)) from None
        key = "/".join(parts)
        if key in self.seen:
            raise stop(key, "is in the archive twice")
        self.seen.add(key)
        self.members.append((member.name, member.type, member.size))
        # Deepest first, up to a folder known already (its own are known too): each folder's
        # name is made once. The count is kept as it grows: a union of the two sets for every
        # member made 80,000 members take 65 s.
        self.names.add(key)
        for i in range(len(parts) if member.isdir() else len(parts) - 1, 0, -1):
            folder = "/".join(parts[:i])
            if folder in self.folders:
                break
            self.folders.add(folder)
            self.names.add(folder)
        if len(self.names) > self.max_files:
            raise stop(self.name, f"holds over {self.max_files:,} files and folders")
        self.total += member.size
        self.disk += -(-member.size // BLOCK) * BLOCK + BLOCK
        if self.total > self.max_total:
            raise stop(
                self.name, f"unpacks to over {self.max_total:,} bytes (raise --max-total-mb)"
            )
        if self.disk > self.free:
            raise stop(
                member.name,
                f"brings what the archive unpacks to {self.total:,} bytes ({self.disk:,} on "
                f"disk); the temporary folder {self.where} has {self.free:,} bytes free: point "
                "TMPDIR at a folder with room",
            )
        if member.isreg() and parts[1:] == ("bag-info.txt",):
            self.bag_info(member, tar)
        if member.isreg() and len(parts) > 2 and parts[1] == "data":
            self.payload += member.size
            self.payload_files += 1
        self.check_oxum(member.name)

    def bag_info(self, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        if member.size > BAG_INFO_MAX:
            raise self.stop(member.name, f"is over {BAG_INFO_MAX:,} bytes, more than it ever holds")
        src = tar.extractfile(member)
        data = src.read(BAG_INFO_MAX) if src is not None else b""
        found = _OXUM.findall(data)
        if len(found) != 1:
            raise self.stop(
                member.name,
                "declares no Payload-Oxum (or more than one, or numbers of over 20 digits), "
                "so the payload's size cannot be "
                "checked before unpacking (runner export always writes one)",
            )
        self.oxum = (int(found[0][0]), int(found[0][1]))

    def check_oxum(self, where: str) -> None:
        if self.oxum is None:
            return
        size, count = self.oxum
        if self.payload > size or self.payload_files > count:
            raise self.stop(
                where,
                f"brings the payload to {self.payload:,} bytes in {self.payload_files:,} files; "
                f"bag-info.txt's Payload-Oxum says the whole payload is {size:,} bytes in "
                f"{count:,} files: refused before anything is unpacked",
            )

    def fits(self) -> str:
        """After the scan: the bag's folder, when its Payload-Oxum was read and holds."""
        if self.top is None:
            raise self.stop(self.name, "holds no bag folder")
        if self.oxum is None and self.damage is not None:
            raise self.stop(self.name, f"is damaged before its Payload-Oxum: {self.damage}")
        if self.oxum is None:
            raise self.stop(
                f"{self.top}/bag-info.txt",
                "is missing, so the payload's size cannot be checked before unpacking",
            )
        self.check_oxum(self.name)
        return self.top


def _unpack(
    f: Any, dest: Path, top: str, scan: _Scan, stop: Callable[[str, str], Stop]
) -> list[Problem]:
    """The second pass: the members the scan saw, written by :class:`archives.Writer` (no link
    followed, no file made twice, no more bytes than declared); the padding after each and
    the end of the archive checked as it goes."""
    name = scan.name
    files = len(scan.names)
    writer = archives.Writer(dest, scan.total, files, sync=False, strict=False)
    afterwards: list[Problem] = []
    try:
        with archives.open_tar(f, max_bytes=scan.total, max_files=scan.max_files) as tar:
            stream = tar.fileobj
            if stream is None:  # pragma: no cover - tarfile always sets it
                raise stop(name, "is not a readable tar archive")
            i = 0
            for member in tar:
                if i >= len(scan.members) or scan.members[i] != (
                    member.name,
                    member.type,
                    member.size,
                ):
                    raise stop(member.name, "changed while it was verified (not what was read)")
                i += 1
                if member.isdir():
                    writer.folder(member.name)
                    continue
                src = tar.extractfile(member)
                if src is None:  # pragma: no cover - a regular file always has data
                    raise stop(member.name, "has no data")
                with src:
                    writer.file(member.name, src, member.size)
                padding = -member.size % tarfile.BLOCKSIZE
                if padding:
                    stream.seek(member.offset_data + member.size)
                    if stream.read(padding).strip(b"\0"):
                        rel = "/".join(PurePosixPath(member.name).parts[1:])
                        afterwards.append(
                            Problem(rel, "the archive's padding after it is not zeros")
                        )
            # The end of the archive is zeros (a tar record's padding, never more than
            # END_MAX), and reading to it checks gzip's CRC.
            after = 0
            while chunk := stream.read(CHUNK):
                after += len(chunk)
                if chunk.strip(b"\0") or after > END_MAX:
                    afterwards.append(
                        Problem(name, "has bytes after its last member (or a damaged header)")
                    )
                    break
    except Stop:
        raise
    except archives.UnsafeArchive as exc:
        if "runs past" not in str(exc):
            raise stop(name, str(exc)) from None
        afterwards.append(Problem(name, "has bytes after its last member (or a damaged header)"))
    except (OSError, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError,
            RecursionError) as exc:  # fmt: skip
        afterwards.append(Problem(name, f"is damaged: {exc}"))
    if not (dest / top).is_dir():
        raise stop(name, "holds no bag folder")
    return afterwards


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with safefs.open_regular(path) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class FixityChecks(Bag):
    """The checks of the bag's own manifests: the tag files and the payload."""

    def tag_files(self) -> str:
        before = len(self.report.problems)
        raw = self.read(TAGMANIFEST, 16 * MiB)
        if raw is None:
            self.problem(TAGMANIFEST, "is missing")
            raise Stop
        listed: dict[str, str] = {}
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            self.problem(TAGMANIFEST, "is not UTF-8")
            raise Stop from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            digest, _, name = line.strip().partition(" ")
            name = name.strip()
            try:
                safe = bool(name) and safefs.parts(name) == name.split("/")
            except safefs.UnsafePath:
                safe = False
            safe = safe and not name.startswith("data/")
            if not HEX64.fullmatch(digest) or not safe:
                self.problem(TAGMANIFEST, f"line {number} is not '<sha256> <tag file>'")
                raise Stop
            listed[name] = digest
        for name in REQUIRED_TAGS:
            if name not in listed:
                self.problem(TAGMANIFEST, f"does not cover {name}")
        for name, want in listed.items():
            try:
                have = sha256_file(self.top / name)
            except (safefs.UnsafePath, OSError):
                self.problem(name, "is listed in the tag manifest but not in the bundle")
                continue
            if have != want:
                self.problem(name, f"sha256 is {have}; the tag manifest says {want}")
        for folder, dirs, files in os.walk(self.top):
            here = Path(folder).relative_to(self.top)
            if here == Path("."):
                dirs[:] = [d for d in dirs if d != "data"]
            for f in files:
                rel = (here / f).as_posix()
                if rel not in listed and rel not in {TAGMANIFEST, SEAL_FILE}:
                    self.problem(rel, "is in the bundle but not in its tag manifest")
        if len(self.report.problems) > before:
            raise Stop  # bagit.py would read tag files that are not what was sealed
        return f"{len(listed)} tag files as the tag manifest says"

    def payload(self) -> str:
        import bagit

        self.utf8_tags()
        with quiet_bagit():
            try:
                bag = bagit.Bag(str(self.top))
                holes = list(bag.fetch_entries())
            except (bagit.BagError, ValueError, OSError) as exc:
                self.problem(None, f"not a valid bag: {self.clean(str(exc))}")
                raise Stop from None
            self.digests = {
                name: hashes["sha256"].lower()
                for name, hashes in bag.entries.items()
                if name.startswith("data/") and "sha256" in hashes
            }
            hole_bytes = hole_count = 0
            for url, size, name in holes:
                name = os.path.normpath(name)
                digest = self.digests.get(name)
                if digest is None:
                    self.problem("fetch.txt", f"lists {name}, which the manifest does not")
                    continue
                if url != f"{BLOB_PREFIX}{digest}" or not _COUNT.fullmatch(size):
                    self.problem("fetch.txt", f"does not fetch {name} by its digest and size")
                    continue
                if (self.top / name).exists():
                    continue  # in the archive after all: bagit.py checks it
                self.blob(name, digest, int(size))
                bag.entries.pop(name, None)
                hole_bytes += int(size)
                hole_count += 1
            declared = bag.info.pop("Payload-Oxum", None)
            try:
                bag.validate(processes=1)
            except bagit.BagValidationError as exc:
                for d in exc.details:
                    if isinstance(d, bagit.ChecksumMismatch):
                        self.problem(d.path, f"sha256 is {d.found}; the manifest says {d.expected}")
                    elif isinstance(d, bagit.FileMissing):
                        self.problem(d.path, "is listed in the manifest but not in the bundle")
                    elif isinstance(d, bagit.UnexpectedFile):
                        self.problem(d.path, "is in the bundle but not in its manifest")
                    else:
                        self.problem(None, self.clean(str(d)))
                if not exc.details:
                    self.problem(None, self.clean(exc.message))
                raise Stop from None
            except bagit.BagError as exc:
                self.problem(None, f"not a valid bag: {self.clean(str(exc))}")
                raise Stop from None
            present = [self.top / p for p in bag.payload_files()]
        size = sum(p.stat().st_size for p in present) + hole_bytes
        count = len(present) + hole_count
        if declared is not None and declared != f"{size}.{count}":
            self.problem(
                "bag-info.txt", f"Payload-Oxum is {declared}; the payload is {size}.{count}"
            )
        self.report.skipped = [
            {"path": str(s.get("path")), "why": str(s.get("why"))}
            for s in self.info.get("skipped", [])
            if isinstance(s, dict)
        ]
        beside = f", {hole_count} of them beside the archive" if hole_count else ""
        return f"{count:,} files, {size:,} bytes, each as the manifest says{beside}"

    def utf8_tags(self) -> None:
        """bagit.txt names UTF-8 as its tag files' encoding, as `runner export` writes it:
        bagit.py opens every tag file with the codec named there, and one that is no text
        encoding (rot13), or two named, raises TypeError from inside it."""
        raw = self.read("bagit.txt", 64 * 1024) or b""
        named = _ENCODING.findall(raw)  # once: bagit.py makes two values a list, no codec
        said = ", ".join(n.decode("ascii", "replace").strip() for n in named) or "none"
        if len(named) != 1 or said.lower().replace("_", "-") not in ("utf-8", "utf8"):
            self.problem(
                "bagit.txt",
                f"names {said[:64]!r} as Tag-File-Character-Encoding; a bundle's tag files "
                "are UTF-8 (what `runner export` writes)",
            )
            raise Stop

    def blob(self, name: str, digest: str, size: int) -> None:
        """A payload file stored beside the archive: present, regular, of its size and digest."""
        rel = f"sha256/{digest}"
        where = self.blobs / rel
        try:
            f = safefs.open_under(self.blobs, rel)
        except (safefs.UnsafePath, OSError) as exc:
            self.absent.add(name)
            if isinstance(exc, safefs.UnsafePath) and not exc.missing:
                self.problem(name, f"is stored beside the bundle, but {where} {exc.problem}")
            else:
                self.problem(
                    name,
                    f"is stored beside the bundle and absent: no {where} ({size:,} bytes); put "
                    "the archive's .blobs folder beside it, or pass --blobs DIR",
                )
            return
        digest_now = hashlib.sha256()
        got = 0
        with f:
            while got <= size and (chunk := f.read(CHUNK)):
                digest_now.update(chunk)
                got += len(chunk)
        if got != size:
            self.problem(name, f"is stored beside the bundle as {where}, of {got:,} bytes, not "
                         f"{size:,}")  # fmt: skip
        elif digest_now.hexdigest() != digest:
            self.problem(name, f"is stored beside the bundle as {where}, whose sha256 is "
                         f"{digest_now.hexdigest()}, not {digest}")  # fmt: skip
        else:
            self.beside[name] = where
            self.report.beside.append(name)
