"""Long on purpose: the ten checks are one sequence over one unpacked bag, each a method of one
verifier that records what it found, so that the order in which problems are found (and so
the file the first one names) is read in one place.

``runner verify-bundle ARCHIVE``: check a bundle of one run, offline, with no engine.

The checks, in this order; each problem names its file, relative to the bag's folder:

1. *archive*: a tar of one top folder holding only files and folders (no link, device or
   FIFO, no name twice, no ``..``, names as :func:`runner.core.archives.member_parts` allows),
   within the caps. A first pass reads only headers and writes nothing: each member's
   declared size is checked against the caps and the bag's Payload-Oxum (from bag-info.txt)
   as its header is read, and the whole against the temporary folder's free space; the
   stream decompressed is capped (:func:`runner.core.archives.open_tar`). Only then is it
   unpacked, by :class:`runner.core.archives.Writer` (no tarfile extraction filter is relied on),
   into a fresh temporary folder (removed afterwards);
2. *seal*: ``bundle.intoto.json`` verifies against a trusted runner key and signs the
   tag manifest's digest;
3. *tag files*: each file the tag manifest lists hashes to it; no other file outside
   ``data/``;
4. *payload*: bagit.py validates the bag (completeness, every sha256); each file stored
   beside it (``fetch.txt``) is checked in the blobs folder: there, a regular file, of the
   listed size and digest;
5. *ledger*: its hash chain, order and pairing (:func:`runner.state.ledger.verify_file`);
6. *contract*: ``task.json`` verifies (schema, digest) and is the one the envelope names;
   ``task.dsse.json`` verifies against a trusted issuer key and signs exactly it;
7. *statement*: ``result.intoto.json`` (SLSA provenance) and ``result.envelope.intoto.json``
   verify against a trusted runner key; the provenance is of this runner's build type, signs
   the bundled ``result.json`` and names its contract; the envelope statement's predicate is
   the bundled envelope; each file either signs is bundled with that digest (a result signed
   before provenance has the envelope statement alone, as ``result.intoto.json``);
8. *envelope*: every file it hashed is bundled with that digest, and the ledger's
   ``job.finished`` names it (or, once re-graded, an earlier revision bundled in record/);
9. *measurements*: each value, re-parsed from the bundled evidence with the parser (id,
   version) the envelope records, is the envelope's value;
10. *inputs*: each bundled input file hashes to its entry in the input manifest.

A signature that only a key the bundle carries verifies (none trusted here), and an unsigned
contract, are reported UNVERIFIED: a problem, unless ``allow_untrusted``. Nothing here
imports the docker SDK or talks to an engine.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import ValidationError

from runner.contract import VerifiedContract, parse_json, verify_data
from runner.core import archives, jsondepth, safefs
from runner.core.errors import Category, RunnerError, SignatureInvalid
from runner.evidence import read as evidence
from runner.models.envelope import ResultEnvelope
from runner.results import attest
from runner.results.bundle import (
    BLOB_PREFIX,
    INFO_FILE,
    INFO_KIND,
    MANIFEST,
    SEAL_FILE,
    SEAL_PREDICATE,
    TAGMANIFEST,
    blobs_dir,
    output_files,
)
from runner.results.bundle.export import quiet_bagit
from runner.state import ledger
from runner.trust import signing

MiB = 1024 * 1024
CHUNK = MiB
END_MAX = MiB
"""What may follow a tar's last member: its end blocks and record padding (10 KiB by default)."""
HEX64 = re.compile(r"[0-9a-f]{64}")
REQUIRED_TAGS = ("bagit.txt", "bag-info.txt", MANIFEST, INFO_FILE)
ENVELOPE = "data/result.json"
STATEMENT = "data/result.intoto.json"
ENVELOPE_STATEMENT = "data/result.envelope.intoto.json"
LEDGER = "data/record/ledger.jsonl"
CONTRACT = "data/input/task.json"
SIGNED_CONTRACT = "data/input/task.dsse.json"
INPUT_MANIFEST = "data/execution/input-manifest.json"

Status = Literal["ok", "failed", "unverified", "not run"]


@dataclass(frozen=True)
class Problem:
    file: str | None
    """Relative to the bag's folder (the archive's name for a problem of the archive)."""
    message: str
    category: Category = Category.BUNDLE_INVALID

    def __str__(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


@dataclass
class Check:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Keys:
    """The keys the auditor trusts: runner keys (the seal, the result statement) and issuer
    keys (the contract)."""

    runner: list[signing.TrustedKey]
    issuer: list[signing.TrustedKey]


@dataclass
class Report:
    archive: str
    bag: str | None = None
    checks: list[Check] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    job_id: str | None = None
    status: str | None = None
    measurements: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    """What the export left out, and why (from runner-bundle.json)."""
    beside: list[str] = field(default_factory=list)
    """Payload files stored beside the archive that were checked in the blobs folder."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def category(self) -> Category | None:
        return self.problems[0].category if self.problems else None

    def as_json(self) -> dict[str, Any]:
        first = self.problems[0] if self.problems else None
        return {
            "valid": self.valid,
            "category": self.category.value if self.category else None,
            "archive": self.archive,
            "bag": self.bag,
            "jobId": self.job_id,
            "status": self.status,
            "firstProblem": {"file": first.file, "message": first.message} if first else None,
            "problems": [
                {"file": p.file, "message": p.message, "category": p.category.value}
                for p in self.problems
            ],
            "checks": [
                {"check": c.name, "status": c.status, "detail": c.detail} for c in self.checks
            ],
            "warnings": self.warnings,
            "measurements": self.measurements,
            "beside": self.beside,
            "skipped": self.skipped,
        }


class _Stop(Exception):
    """Later checks cannot run on what is left."""


def verify(
    archive: Path,
    *,
    keys: Keys,
    blobs: Path | None = None,
    allow_untrusted: bool = False,
    max_total: int = 64 * 1024 * MiB,
    max_files: int = 200_000,
) -> Report:
    """Check the bundle at ``archive`` (files stored beside it in ``blobs``, default
    ``<archive>.blobs``); every problem found is in the report, the first one first."""
    report = Report(str(archive))
    with tempfile.TemporaryDirectory(prefix="runner-verify-bundle-") as tmp:
        try:
            top, afterwards = _extract(archive, Path(tmp), max_total, max_files, report)
        except _Stop:
            return report
        report.bag = top.name
        _Verifier(top, blobs or blobs_dir(archive), keys, allow_untrusted, report).run()
    if afterwards:
        # Bytes that carry no file (tar padding, what follows the end, the gzip trailer):
        # reported after the files, so that a damaged header is named by the files it hides.
        report.problems += afterwards
        report.checks[0] = Check("archive", "failed", str(afterwards[0]))
    return report


def _extract(
    archive: Path, dest: Path, max_total: int, max_files: int, report: Report
) -> tuple[Path, list[Problem]]:
    """Unpack the archive into ``dest``, refusing what a bundle never holds; its one top
    folder, and the problems of bytes that belong to no file. Two passes over one open file:
    the first writes nothing (names, kinds, declared sizes against the caps, the bag's
    Payload-Oxum and ``dest``'s free space); the second writes with :class:`archives.Writer`
    the very members the first saw, no more bytes than they declared."""

    def stop(file: str, message: str) -> _Stop:
        report.problems.append(Problem(file, message))
        report.checks.append(Check("archive", "failed", f"{file}: {message}"))
        return _Stop()

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
        except _Stop:
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


_OXUM = re.compile(rb"^Payload-Oxum:[ \t]*(\d+)\.(\d+)[ \t]*\r?$", re.MULTILINE)
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
        stop: Callable[[str, str], _Stop],
    ) -> None:
        self.name, self.max_total, self.max_files, self.stop = name, max_total, max_files, stop
        self.where = dest.parent
        self.free = shutil.disk_usage(dest).free
        """Bytes free where it is to be unpacked."""
        self.top: str | None = None
        self.seen: set[str] = set()
        self.folders: set[str] = set()
        """Every folder the members name or imply (the writer makes and counts them)."""
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
        if not (member.isreg() or member.isdir()):
            kind = "a link" if member.issym() or member.islnk() else "not a plain file"
            raise stop(member.name, f"is {kind}; a bundle holds only files and folders")
        try:
            archives.member_parts(member.name, strict=False)
        except archives.UnsafeArchive as exc:
            raise stop(member.name, str(exc)) from None
        key = "/".join(parts)
        if key in self.seen:
            raise stop(key, "is in the archive twice")
        self.seen.add(key)
        self.members.append((member.name, member.type, member.size))
        last = len(parts) if member.isdir() else len(parts) - 1
        self.folders.update("/".join(parts[:i]) for i in range(1, last + 1))
        if len(self.seen | self.folders) > self.max_files:
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
                "declares no Payload-Oxum (or more than one), so the payload's size cannot be "
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
    f: Any, dest: Path, top: str, scan: _Scan, stop: Callable[[str, str], _Stop]
) -> list[Problem]:
    """The second pass: the members the scan saw, written by :class:`archives.Writer` (no link
    followed, no file made twice, no more bytes than declared); the padding after each and
    the end of the archive checked as it goes."""
    name = scan.name
    files = len(scan.seen | scan.folders)
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
    except _Stop:
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


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with safefs.open_regular(path) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _carried(info: dict[str, Any], role: str) -> list[signing.TrustedKey]:
    """The public keys runner-bundle.json carries for ``role``: to tell damage from an
    unknown signer, never to trust."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    out = []
    keys = info.get("keys")
    for pem in keys.get(role, []) if isinstance(keys, dict) else []:
        try:
            public = serialization.load_pem_public_key(str(pem).encode())
        except (ValueError, TypeError):
            continue
        if isinstance(public, Ed25519PublicKey):
            out.append(signing.TrustedKey(signing.key_id(public), public, "carried in the bundle"))
    return out


class _Verifier:
    def __init__(
        self, top: Path, blobs: Path, keys: Keys, allow_untrusted: bool, report: Report
    ) -> None:
        self.top = top
        self.blobs = blobs
        self.keys = keys
        self.allow_untrusted = allow_untrusted
        self.report = report
        self.info: dict[str, Any] = {}
        self.digests: dict[str, str] = {}
        """Payload file -> hex sha256, from the (verified) manifest."""
        self.beside: dict[str, Path] = {}
        """Payload file stored beside -> its checked blob."""
        self.absent: set[str] = set()
        self.envelope: ResultEnvelope | None = None
        self.envelope_raw = b""
        self.ledger_state: ledger.LedgerState | None = None
        self.contract: VerifiedContract | None = None

    # -- plumbing ---------------------------------------------------------------------------

    def problem(
        self, file: str | None, message: str, category: Category = Category.BUNDLE_INVALID
    ) -> None:
        self.report.problems.append(Problem(file, message, category))

    def read(self, rel: str, cap: int) -> bytes | None:
        """A file of the bag (None when absent); over ``cap`` is a problem, and stops."""
        try:
            with safefs.open_under(self.top, rel) as f:
                data = f.read(cap + 1)
        except safefs.UnsafePath as exc:
            if exc.missing:
                return None
            self.problem(rel, exc.problem)
            raise _Stop from None
        if len(data) > cap:
            self.problem(rel, f"is over {cap:,} bytes, more than such a file ever holds")
            raise _Stop
        return data

    def loaded(self) -> ResultEnvelope:
        """The bundled envelope (the checks that need it run only once it is read)."""
        if self.envelope is None:
            raise _Stop
        return self.envelope

    def clean(self, text: str) -> str:
        """bagit.py's messages, without this run's temporary folder."""
        return text.replace(f"{self.top}{os.sep}", "").replace(str(self.top), ".")

    def run(self) -> None:
        steps: list[tuple[str, Callable[[], str | None]]] = [
            ("seal", self.seal),
            ("tag files", self.tag_files),
            ("payload", self.payload),
            ("envelope", self.load_envelope),
            ("ledger", self.check_ledger),
            ("contract", self.check_contract),
            ("statement", self.statement),
            ("files", self.envelope_files),
            ("measurements", self.measurements),
            ("inputs", self.inputs),
        ]
        for i, (name, step) in enumerate(steps):
            before = len(self.report.problems)
            warned = len(self.report.warnings)
            try:
                detail = step()
            except _Stop:
                self.record(name, before, warned, None)
                for later, _ in steps[i + 1 :]:
                    self.report.checks.append(
                        Check(later, "not run", f"not run after the {name} check failed")
                    )
                return
            self.record(name, before, warned, detail)

    def record(self, name: str, before: int, warned: int, detail: str | None) -> None:
        new = self.report.problems[before:]
        if new:
            status: Status = "failed"
            if all(p.message.startswith("UNVERIFIED") for p in new):
                status = "unverified"
            detail = str(new[0]).replace("UNVERIFIED: ", "", 1)
            self.report.checks.append(Check(name, status, detail))
        elif len(self.report.warnings) > warned:
            detail = self.report.warnings[-1].replace("UNVERIFIED: ", "", 1)
            self.report.checks.append(Check(name, "unverified", detail))
        else:
            self.report.checks.append(Check(name, "ok", detail or ""))

    def signed(
        self, rel: str, raw: bytes, payload_type: str, role: Literal["runner", "issuer"]
    ) -> tuple[bytes | None, str]:
        """The payload of the DSSE envelope ``raw`` and who signed it, if a trusted key of
        ``role`` verifies it; when only a key the bundle carries does, the payload too, with
        an UNVERIFIED problem (or warning, when allowed). None when nothing verifies it."""
        try:
            envelope = jsondepth.loads(raw)
            if not isinstance(envelope, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            self.problem(rel, f"is not a DSSE envelope: {exc}", Category.SIGNATURE_INVALID)
            return None, ""
        trusted = self.keys.runner if role == "runner" else self.keys.issuer
        why = f"no {role} key is trusted here"
        if trusted:
            try:
                verified = signing.verify_envelope(envelope, trusted, 1, payload_type)
            except SignatureInvalid as exc:
                why = exc.message
            else:
                sources = {k.keyid: k.source for k in trusted}
                by = ", ".join(f"{k} ({sources[k]})" for k in verified.keyids)
                return verified.payload, f"signed by {by}"
        carried = _carried(self.info, role)
        try:
            verified = signing.verify_envelope(envelope, carried, 1, payload_type)
        except SignatureInvalid as exc:
            if trusted or carried or "no trusted keys" not in exc.message:
                nor = ", nor with the key the bundle carries" if carried else ""
                self.problem(
                    rel,
                    f"its signature does not verify with any trusted {role} key{nor} ({why})",
                    Category.SIGNATURE_INVALID,
                )
                return None, ""
            self.untrusted(
                rel, f"UNVERIFIED: {why}, and the bundle carries no {role} key to check it with",
                role,
            )  # fmt: skip
            return None, ""
        ids = ", ".join(verified.keyids)
        note = (
            f"UNVERIFIED: signed by {ids}, the {role}'s key the bundle carries, which is not "
            f"trusted here ({why}); it proves the file undamaged, not who made it"
        )
        self.untrusted(rel, note, role)
        return verified.payload, f"signed by {ids} (untrusted)"

    def untrusted(self, rel: str, note: str, role: str) -> None:
        """What no trusted key vouches for: a warning when allowed, else a problem."""
        if self.allow_untrusted:
            self.report.warnings.append(f"{rel}: {note}")
            return
        fix = "--key" if role == "runner" else "--issuer-key"
        self.problem(
            rel,
            f"{note}; pass {fix} with the {role}'s public key, or --allow-untrusted",
            Category.SIGNATURE_INVALID,
        )

    # -- the checks -------------------------------------------------------------------------

    def seal(self) -> str | None:
        info_raw = self.read(INFO_FILE, 16 * MiB)
        try:
            info = jsondepth.loads(info_raw) if info_raw is not None else {}
        except (ValueError, UnicodeDecodeError):
            info = {}
        if isinstance(info, dict) and info.get("kind") == INFO_KIND:
            self.info = info
        raw = self.read(SEAL_FILE, MiB)
        if raw is None:
            self.problem(SEAL_FILE, "is missing: the bag is not sealed", Category.SIGNATURE_INVALID)
            return None
        payload, by = self.signed(SEAL_FILE, raw, attest.PAYLOAD_TYPE, "runner")
        if payload is None:
            return None
        try:
            stmt = jsondepth.loads(payload)
            if stmt.get("_type") != attest.STATEMENT_TYPE:
                raise ValueError("not an in-toto statement")
            if stmt.get("predicateType") != SEAL_PREDICATE:
                raise ValueError(f"its predicateType is {stmt.get('predicateType')!r}")
            (want,) = [
                s["digest"]["sha256"] for s in stmt["subject"] if s.get("name") == TAGMANIFEST
            ]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.problem(SEAL_FILE, f"is not a bundle seal: {exc}")
            return None
        try:
            have = _sha256_file(self.top / TAGMANIFEST)
        except (safefs.UnsafePath, OSError):
            self.problem(TAGMANIFEST, "is missing: nothing in the bag is covered")
            raise _Stop from None
        if have != want:
            self.problem(TAGMANIFEST, f"sha256 is {have}; the seal signs {want}")
        return f"{TAGMANIFEST} {by}"

    def tag_files(self) -> str:
        before = len(self.report.problems)
        raw = self.read(TAGMANIFEST, 16 * MiB)
        if raw is None:
            self.problem(TAGMANIFEST, "is missing")
            raise _Stop
        listed: dict[str, str] = {}
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            self.problem(TAGMANIFEST, "is not UTF-8")
            raise _Stop from None
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
                raise _Stop
            listed[name] = digest
        for name in REQUIRED_TAGS:
            if name not in listed:
                self.problem(TAGMANIFEST, f"does not cover {name}")
        for name, want in listed.items():
            try:
                have = _sha256_file(self.top / name)
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
            raise _Stop  # bagit.py would read tag files that are not what was sealed
        return f"{len(listed)} tag files as the tag manifest says"

    def payload(self) -> str:
        import bagit

        with quiet_bagit():
            try:
                bag = bagit.Bag(str(self.top))
                holes = list(bag.fetch_entries())
            except (bagit.BagError, ValueError, OSError) as exc:
                self.problem(None, f"not a valid bag: {self.clean(str(exc))}")
                raise _Stop from None
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
                if url != f"{BLOB_PREFIX}{digest}" or not size.isdigit():
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
                raise _Stop from None
            except bagit.BagError as exc:
                self.problem(None, f"not a valid bag: {self.clean(str(exc))}")
                raise _Stop from None
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

    def load_envelope(self) -> str:
        raw = self.read(ENVELOPE, 64 * MiB)
        if raw is None:
            self.problem(ENVELOPE, "is missing: the bundle has no result")
            raise _Stop
        try:
            self.envelope = ResultEnvelope.model_validate_json(raw)
        except ValidationError as exc:
            self.problem(ENVELOPE, f"is not a result envelope: {str(exc).splitlines()[0]}")
            raise _Stop from None
        self.envelope_raw = raw
        self.report.job_id = self.envelope.jobId
        self.report.status = self.envelope.status
        return (
            f"job {self.envelope.jobId}, {self.envelope.status}, revision {self.envelope.revision}"
        )

    def check_ledger(self) -> str | None:
        path = self.top / LEDGER
        if not path.is_file():
            if self.envelope is not None and self.envelope.budget is not None:
                self.problem(LEDGER, "is missing; the envelope records a budget from it")
            return "no ledger: the job was refused before it had one"
        problems = ledger.verify_file(path)
        for p in problems:
            self.problem(LEDGER, str(p))
        self.ledger_state = ledger.read_state(path)
        return f"{len(path.read_bytes().splitlines())} events, chain and order intact"

    def check_contract(self) -> str | None:
        env = self.loaded()
        raw = self.read(CONTRACT, 4 * MiB)
        if raw is None:
            self.problem(CONTRACT, "is missing: the values cannot be re-parsed without it")
            return None
        try:
            contract = verify_data(
                parse_json(raw, CONTRACT), raw, self.top / "data" / "input", CONTRACT
            )
        except RunnerError as exc:
            self.problem(CONTRACT, exc.message)
            return None
        if contract.digest != env.contractDigest:
            self.problem(CONTRACT, f"is {contract.digest}; the envelope names {env.contractDigest}")
            return None
        self.contract = contract
        signed = env.signature is not None and env.signature.status == "verified"
        dsse = self.read(SIGNED_CONTRACT, 8 * MiB)
        if dsse is None:
            if signed:
                self.problem(
                    SIGNED_CONTRACT, "is missing; the envelope says the contract was signed"
                )
                return None
            note = "UNVERIFIED: the contract was not signed (the run was local development)"
            if self.allow_untrusted:
                self.report.warnings.append(f"{CONTRACT}: {note}")
            else:
                self.problem(
                    CONTRACT, f"{note}; pass --allow-untrusted to accept it",
                    Category.SIGNATURE_INVALID,
                )  # fmt: skip
            return None
        payload, by = self.signed(SIGNED_CONTRACT, dsse, signing.PAYLOAD_TYPE, "issuer")
        if payload is not None and payload != raw:
            self.problem(SIGNED_CONTRACT, f"signs other bytes than {CONTRACT}")
        if not signed:
            self.problem(
                SIGNED_CONTRACT, "is there, but the envelope says the contract was unsigned"
            )
        return f"{contract.digest}, {by}"

    def statement(self) -> str | None:
        raw = self.read(STATEMENT, 64 * MiB)
        if raw is None:
            self.problem(
                STATEMENT, "is missing: the result is not signed", Category.SIGNATURE_INVALID
            )
            return None
        stmt, files, by = self.result_statement(STATEMENT, raw)
        if stmt is None:
            return None
        if stmt.get("predicateType") == attest.ENVELOPE_PREDICATE_TYPE:
            # A result signed before SLSA provenance: the envelope statement alone.
            count = self.envelope_statement(STATEMENT, stmt, files)
            return f"{by}; its {count} files and the envelope are the bundled ones"
        count = self.provenance(stmt, files)
        raw = self.read(ENVELOPE_STATEMENT, 64 * MiB)
        if raw is None:
            self.problem(
                ENVELOPE_STATEMENT,
                f"is missing: {STATEMENT} is there, the envelope's own statement is not",
                Category.SIGNATURE_INVALID,
            )
            return None
        envelope_stmt, files, _ = self.result_statement(ENVELOPE_STATEMENT, raw)
        if envelope_stmt is not None:
            self.envelope_statement(ENVELOPE_STATEMENT, envelope_stmt, files)
        many = f"{count} output file{'s' if count != 1 else ''}"
        return f"{by}; its provenance (result.json, {many}) and envelope statement match the bag"

    def result_statement(
        self, rel: str, raw: bytes
    ) -> tuple[dict[str, Any] | None, dict[str, str], str]:
        """The in-toto statement in ``rel``, the files it signs and who signed it, if a
        runner key verifies it and it is one of the runner's two (None after recording a
        problem)."""
        payload, by = self.signed(rel, raw, attest.PAYLOAD_TYPE, "runner")
        if payload is None:
            return None, {}, by
        try:
            stmt = jsondepth.loads(payload)
            if stmt.get("_type") != attest.STATEMENT_TYPE:
                raise ValueError("not an in-toto statement")
            kind = stmt.get("predicateType")
            if kind not in (attest.PROVENANCE_TYPE, attest.ENVELOPE_PREDICATE_TYPE):
                raise ValueError(f"its predicateType is {kind!r}")
            files = dict(attest.signed_files(stmt))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.problem(rel, f"is not a runner result statement: {exc}")
            return None, {}, by
        return stmt, files, by

    def provenance(self, stmt: dict[str, Any], files: dict[str, str]) -> int:
        """SLSA provenance: of this runner's build type, signing the bundled result.json and
        output files, made from the contract the envelope names."""
        build = stmt["predicate"].get("buildDefinition", {})
        if build.get("buildType") != attest.BUILD_TYPE:
            self.problem(
                STATEMENT, f"is provenance of another build type: {build.get('buildType')!r}"
            )
        files = dict(files)
        want = files.pop(attest.ENVELOPE_FILE, None)
        have = hashlib.sha256(self.envelope_raw).hexdigest()
        if want != have:
            self.problem(ENVELOPE, f"sha256 is {have}; {STATEMENT} signs {want}")
        contract = self.loaded().contractDigest
        deps = {
            f"sha256:{d.get('digest', {}).get('sha256')}"
            for d in build.get("resolvedDependencies", [])
            if str(d.get("name", "")).startswith("contract:")
        }
        if contract is not None and deps != {contract}:
            self.problem(STATEMENT, f"names contract {sorted(deps)}; the envelope ran {contract}")
        self.signed_outputs(STATEMENT, files)
        return len(files)

    def envelope_statement(self, rel: str, stmt: dict[str, Any], files: dict[str, str]) -> int:
        """The envelope as the predicate: the bundled one, and its files the bundled ones."""
        if stmt.get("predicateType") != attest.ENVELOPE_PREDICATE_TYPE:
            self.problem(rel, f"its predicateType is {stmt.get('predicateType')!r}")
        if stmt.get("predicate") != jsondepth.loads(self.envelope_raw):
            self.problem(ENVELOPE, f"is not the envelope that {rel} signs")
        self.signed_outputs(rel, files)
        return len(files)

    def signed_outputs(self, rel: str, files: dict[str, str]) -> None:
        for name, want in files.items():
            path = self.payload_path(name.removeprefix("output/"))
            have = self.digests.get(path) if path and name.startswith("output/") else None
            if have is None:
                self.problem(rel, f"signs {name}, which is not in the bundle{self.why(path)}")
            elif have != want:
                self.problem(path, f"sha256 is {have}; the signed statement says {want}")

    def payload_path(self, output_rel: str) -> str:
        """``data/output/<path>`` for a path under output/ ('' when it leaves output/)."""
        try:
            return "/".join(["data", "output", *safefs.parts(output_rel)])
        except safefs.UnsafePath:
            return ""

    def why(self, rel: str) -> str:
        for s in self.report.skipped:
            if f"data/{s['path']}" == rel:
                return f" (left out at export: it {s['why']})"
        return ""

    def envelope_files(self) -> str:
        env = self.loaded()
        hashed: set[str] = set()
        for path, digest, _ in output_files(env):
            rel = self.payload_path(path)
            if digest is None or rel in hashed:
                continue
            have = self.digests.get(rel)
            hashed.add(rel)
            if have is None:
                self.problem(
                    rel or path, f"is hashed in the envelope but not in the bundle{self.why(rel)}"
                )
            elif f"sha256:{have}" != digest:
                self.problem(rel, f"sha256 is {have}; the envelope recorded {digest}")
        finished = self.ledger_state.finished if self.ledger_state else None
        if finished is None:
            return f"{len(hashed)} files it hashed are bundled as it says"
        want = finished.get("envelopeSha256")
        have = "sha256:" + hashlib.sha256(self.envelope_raw).hexdigest()
        if env.revision <= 1 and want != have:
            self.problem(ENVELOPE, f"is {have}; the ledger's job.finished names {want}")
        elif env.revision > 1 and want not in self.earlier_envelopes():
            self.problem(
                LEDGER,
                f"its job.finished names envelope {want}, which is no earlier revision bundled "
                "under data/record/",
            )
        names = "it" if env.revision <= 1 else "the revision it re-grades (in data/record/)"
        return f"{len(hashed)} files it hashed are bundled as it says; the ledger names {names}"

    def earlier_envelopes(self) -> set[str]:
        return {
            f"sha256:{digest}"
            for name, digest in self.digests.items()
            if name.startswith("data/record/") and re.fullmatch(r"result-.*\.json", Path(name).name)
        }

    def measurements(self) -> str | None:
        env, contract = self.loaded(), self.contract
        if contract is None:
            if env.measurements:
                self.problem(CONTRACT, "without the contract no value can be re-parsed")
            return None
        for m in env.measurements:
            rel = self.payload_path(m.evidence.path)
            bundled = rel in self.digests and rel not in self.absent
            path = self.beside.get(rel, self.top / rel) if bundled else None
            try:
                value = evidence.reparse(m, contract, path, "not bundled")
            except evidence.NotConfirmed as exc:
                self.problem((rel or ENVELOPE) if exc.of_evidence else ENVELOPE, exc.message)
                continue
            self.report.measurements[m.measurementId] = value
        return (
            ", ".join(f"{k} = {v!r}" for k, v in self.report.measurements.items())
            or "no measurement to re-parse"
        )

    def inputs(self) -> str | None:
        raw = self.read(INPUT_MANIFEST, 64 * MiB)
        if raw is None:
            return "no input manifest"
        try:
            entries = {str(e["path"]): str(e["sha256"]) for e in jsondepth.loads(raw)["files"]}
        except (ValueError, TypeError, KeyError) as exc:
            self.problem(INPUT_MANIFEST, f"is not an input manifest: {exc}")
            return None
        bundled = {k: v for k, v in self.digests.items() if k.startswith("data/input/")}
        for rel, have in sorted(bundled.items()):
            want = entries.get(rel.removeprefix("data/input/"))
            if want is None:
                self.problem(rel, "is not in the input manifest")
            elif want.removeprefix("sha256:") != have:
                self.problem(rel, f"sha256 is {have}; the input manifest says {want}")
        return f"{len(bundled)} of {len(entries)} input files bundled, each as the manifest says"
