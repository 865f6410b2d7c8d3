"""``runner export JOB``: one job's run as a sealed BagIt bag in one tar archive.

What goes in: the envelope and its signed statement; the contract as it ran (``task.json``,
and ``task.dsse.json`` when signed) with the parser catalog; ``execution/`` (the input
manifest, the budget file); every file of ``record/`` but its lock (the ledger, each
attempt's record, earlier envelopes), whatever its layout; and every file under ``output/``
that the envelope hashed (evidence, stdout and stderr, the job's ``result.json`` and the files
it lists). Not the inputs themselves (their manifest is enough) unless ``with_inputs``, and
never ``workspace/``.

Every file is reached from the job folder without following a link (:mod:`runner.core.safefs`)
and only if it is a regular file; anything else (a link the job planted, a FIFO), a file the
envelope names but could not hash, and a name a BagIt manifest cannot carry, is left out and
listed with the reason in ``runner-bundle.json``. So is every output file the run found holding
an agent's secret (``record/withheld.json``, :func:`runner.execution.agent_run.withhold`):
redacting it
would change the evidence the envelope hashes, so it stays on the host, and the export says
which file and why (the run's envelope says so too). An output file that no longer hashes to
what the envelope recorded stops the export: its bundle would not verify. The job's lock is
held throughout, so no runner writes the job meanwhile.

Long on purpose: what goes in (the plan and its walk by descriptors) and how it is made (the
bag, its seal, the archive) are one account of a bundle; the verifier reads it back in
``fixity``, ``signatures`` and ``verify``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runner._version import __version__
from runner.core import archives, safefs
from runner.core.errors import BundleInvalid, InfrastructureError
from runner.models.envelope import ResultEnvelope
from runner.results import attest
from runner.results.bundle import (
    BLOB_PREFIX,
    FETCH,
    INFO_FILE,
    INFO_KIND,
    MANIFEST,
    SEAL_FILE,
    SEAL_PREDICATE,
    TAGMANIFEST,
    blobs_dir,
    compressed,
    output_files,
    representable,
    stem,
)
from runner.state.jobdir import JobDir
from runner.trust import signing

__all__ = ["export", "quiet_bagit", "seal", "withheld"]

CHUNK = 1024 * 1024
MAX_ENVELOPE_BYTES = 64 * 1024 * 1024

RUNNER_FILES = (
    attest.ENVELOPE_FILE,
    attest.STATEMENT_FILE,
    attest.ENVELOPE_STATEMENT_FILE,
)
"""The job folder's own files, bundled when present."""
INPUT_FILES = ("input/task.json", "input/task.dsse.json", "input/parser-catalog.json")
"""What the runner itself put in input/: the contract as it ran and the parser catalog."""
WALKED = ("execution", "record")
"""Runner-owned folders bundled whole (their layout may change; nothing in them is named)."""
NEVER = frozenset({"record/lock"})


@dataclass(frozen=True)
class Skipped:
    path: str
    """Relative to the job folder."""
    why: str


@dataclass(frozen=True)
class Beside:
    path: str
    """Relative to the job folder (``data/<path>`` in the bag)."""
    sha256: str
    """Hex, no prefix."""
    size: int


@dataclass(frozen=True)
class Exported:
    archive: Path
    blobs: Path | None
    """The folder of files stored beside the archive (None when there are none)."""
    files: int
    """Files bundled, inside the archive and beside it."""
    inside_bytes: int
    beside: list[Beside]
    skipped: list[Skipped]
    seal_keyid: str


@dataclass(frozen=True)
class _Item:
    rel: str
    expected: str | None = None
    """``sha256:<hex>`` the envelope recorded, for a job's output file."""


def export(
    job_root: Path,
    archive: Path,
    *,
    runner_key: Path,
    issuer_keys: list[signing.TrustedKey],
    inline_max: int,
    max_total: int,
    with_inputs: bool = False,
) -> Exported:
    """Write ``archive`` (``.tar``, ``.tar.gz`` or ``.tgz``) from the job at ``job_root``;
    files over ``inline_max`` bytes go to ``<archive>.blobs/sha256/<hex>``. The bag is sealed
    with the private key at ``runner_key``; ``issuer_keys`` whose ids the envelope records as
    the contract's signers are carried (as information, never trusted) for auditors."""
    job = JobDir(job_root)
    if not job.envelope.is_file():
        raise BundleInvalid(
            f"{job_root} has no result.json: there is no run to export",
            hint="run the job first; `runner status JOB` shows where it stands",
        )
    private = signing.load_private_key(attest.runner_key(runner_key))
    with job.locked():
        return _export(job, archive, private, issuer_keys, inline_max, max_total, with_inputs)


def _export(
    job: JobDir,
    archive: Path,
    private: Ed25519PrivateKey,
    issuer_keys: list[signing.TrustedKey],
    inline_max: int,
    max_total: int,
    with_inputs: bool,
) -> Exported:
    with safefs.open_under(job.root, "result.json") as f:
        raw = f.read(MAX_ENVELOPE_BYTES + 1)
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise BundleInvalid(f"{job.envelope} is over {MAX_ENVELOPE_BYTES:,} bytes")
    envelope = ResultEnvelope.model_validate_json(raw)
    items, skipped = _plan(job, envelope, with_inputs)
    work = Path(tempfile.mkdtemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".work"))
    blobs = blobs_dir(archive)
    beside: list[Beside] = []
    before = set(os.listdir(blobs / "sha256")) if (blobs / "sha256").is_dir() else set()
    done = False
    try:
        bag = work / stem(archive)
        bag.mkdir()
        total = inside = files = 0
        for item in items:
            if not representable(item.rel):
                skipped.append(Skipped(item.rel, "its name cannot be written in a BagIt manifest"))
                continue
            placed = _copy(job.root, item, bag, blobs, inline_max, max_total - total)
            if isinstance(placed, Skipped):
                skipped.append(placed)
                continue
            files += 1
            if isinstance(placed, Beside):
                beside.append(placed)
                total += placed.size
            else:
                inside += placed
                total += placed
        skipped = list({s.path: s for s in skipped}.values())
        _make_bag(bag, envelope, beside, skipped, issuer_keys, private, inline_max, with_inputs)
        keyid = seal(bag, private, envelope.jobId)
        _write_tar(bag, archive)
        done = True
    finally:
        with contextlib.suppress(OSError):  # the job's tree, however deep (no recursion)
            archives.remove_tree(work)
        if not done:  # nothing written: not the files this export put beside, either
            for b in beside:
                if b.sha256 not in before:
                    (blobs / "sha256" / b.sha256).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (blobs / "sha256").rmdir()
                blobs.rmdir()
    return Exported(
        archive=archive,
        blobs=blobs if beside else None,
        files=files,
        inside_bytes=inside,
        beside=beside,
        skipped=skipped,
        seal_keyid=keyid,
    )


def _plan(
    job: JobDir, envelope: ResultEnvelope, with_inputs: bool
) -> tuple[list[_Item], list[Skipped]]:
    """What to bundle (paths relative to the job folder), and what is left out already."""
    items: dict[str, _Item] = {}
    skipped: list[Skipped] = []
    for rel in (*RUNNER_FILES, *INPUT_FILES):
        if os.path.lexists(job.root / rel):
            items[rel] = _Item(rel)
    for folder in (*WALKED, *(("input",) if with_inputs else ())):
        files, left_out = _walk(job.root, folder)
        skipped += left_out
        for rel in files:
            if rel not in NEVER:
                items.setdefault(rel, _Item(rel))
    for path, digest, problem in output_files(envelope):
        try:
            rel = "/".join(["output", *safefs.parts(path)])
        except safefs.UnsafePath as exc:
            skipped.append(Skipped(f"output/{path}", exc.problem))
            continue
        if rel.count("/") > _DEEPEST:  # a file the job named (its result.json lists any)
            skipped.append(Skipped(rel, _TOO_DEEP))
            continue
        if digest is None:
            skipped.append(
                Skipped(rel, f"not hashed in the envelope: it {problem or 'has no digest'}")
            )
        else:
            items.setdefault(rel, _Item(rel, digest))
    for rel, why in withheld(job).items():
        if items.pop(rel, None) is not None:
            skipped.append(Skipped(rel, why))
    return sorted(items.values(), key=lambda i: i.rel), skipped


WITHHELD = "record/withheld.json"
"""The run's list of output files that hold an agent's secret (``agent_run.withhold``)."""


def withheld(job: JobDir) -> dict[str, str]:
    """``{path: why}`` of the files the run withheld from export (``output/...``); a list that
    cannot be read, or a run that could not be redacted, raises :class:`BundleInvalid` (what
    it names must never leave: not in a bundle, nor on a report page)."""
    try:
        with safefs.open_under(job.root, WITHHELD) as f:
            raw = f.read(MAX_ENVELOPE_BYTES + 1)
    except safefs.UnsafePath as exc:
        if exc.missing:
            return {}
        raise BundleInvalid(f"{WITHHELD}: {exc.problem}") from None
    try:
        listed = json.loads(raw)
        files, blind = listed["files"], listed.get("unredactable")
        held = {str(f["path"]): f"is withheld: {f['why']}" for f in files}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BundleInvalid(
            f"{job.root / WITHHELD} is not the list the run wrote",
            hint="it names output files that hold an agent's secret; restore it, or run the "
            "job again",
        ) from None
    if blind is not None:  # what the run could not redact: none of it may leave
        raise BundleInvalid(
            f"{job.root} cannot be exported: {blind}",
            hint="its streams were not kept, and no file of its output could be checked for "
            "the agent's secrets; run the job again with its secrets readable and unchanged",
        )
    return held


_DEEPEST = archives.MAX_LOOSE_DEPTH - 3
"""The most parts a folder's path below the job folder may have and be bundled: in the bag
it is below ``<bag>/data/``, and a file in it is one part more (a verifier refuses a member
deeper than :data:`runner.core.archives.MAX_LOOSE_DEPTH`)."""
_TOO_DEEP = f"lies more than {_DEEPEST} folders deep; not bundled"


def _walk(root: Path, rel: str) -> tuple[list[str], list[Skipped]]:
    """Every regular file below ``root/rel`` (relative to ``root``), walked by descriptors
    without following any link; what is neither a file nor a folder is returned as skipped."""
    files: list[str] = []
    skipped: list[Skipped] = []
    try:
        with safefs.parent_fd(root, rel) as (parent, name):
            top = safefs.open_folder_at(parent, name, rel)
    except safefs.UnsafePath as exc:
        if not exc.missing:
            skipped.append(Skipped(rel, exc.problem))
        return files, skipped
    path_down: list[tuple[int, list[str]]] = []
    fd: int | None = top
    here = rel
    try:
        while fd is not None:
            subfolders: list[str] = []
            path_down.append((fd, subfolders))
            with os.scandir(fd) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                sub = f"{here}/{entry.name}"
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    files.append(sub)
                elif stat.S_ISDIR(st.st_mode) and sub.count("/") >= _DEEPEST:
                    skipped.append(Skipped(sub, _TOO_DEEP))
                elif stat.S_ISDIR(st.st_mode):
                    subfolders.append(sub)
                else:
                    skipped.append(Skipped(sub, f"is {safefs.kind(st.st_mode)}; not followed"))
            subfolders.reverse()  # entered in name order
            fd = None
            while fd is None and (down := safefs.next_down(path_down)) is not None:
                parent, here = down
                try:
                    fd = safefs.open_folder_at(parent, here.rsplit("/", 1)[1], here)
                except safefs.UnsafePath as exc:
                    skipped.append(Skipped(here, exc.problem))
    finally:
        for held, _ in path_down:
            os.close(held)
    return files, skipped


def _copy(
    root: Path, item: _Item, bag: Path, blobs: Path, inline_max: int, room: int
) -> Beside | int | Skipped:
    """Copy one file into the bag (its size), or beside it when over ``inline_max`` (a
    :class:`Beside`); never through a link, never more than the size it had when opened."""
    try:
        f = safefs.open_under(root, item.rel)
    except safefs.UnsafePath as exc:
        return Skipped(item.rel, f"{exc.problem}; not followed" if not exc.missing else exc.problem)
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > room:
            raise BundleInvalid(
                f"{item.rel} ({size:,} bytes) would take the bundle over its cap",
                hint="raise --max-total-mb, or export with a lower --inline-max-mb only if the "
                "cap is on the archive alone (it counts the files beside it too)",
            )
        if size > inline_max:
            (blobs / "sha256").mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=blobs / "sha256", prefix=".", suffix=".tmp")
            os.close(fd)
            dst = Path(tmp)
        else:
            dst = bag / item.rel
            dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest, copied = _copy_stream(f, dst, size)
        except OSError as exc:
            dst.unlink(missing_ok=True)
            raise InfrastructureError(f"cannot bundle {item.rel}: {exc.strerror or exc}") from exc
    if item.expected is not None and f"sha256:{digest}" != item.expected:
        dst.unlink(missing_ok=True)
        raise BundleInvalid(
            f"{item.rel} now hashes to sha256:{digest}; the envelope recorded {item.expected}",
            hint="the job's files were changed after the run, so a bundle of them would not "
            "verify; nothing was exported",
        )
    if size > inline_max:
        os.replace(dst, blobs / "sha256" / digest)
        return Beside(item.rel, digest, copied)
    return copied


def _copy_stream(f: BinaryIO, dst: Path, size: int) -> tuple[str, int]:
    """The first ``size`` bytes of ``f`` copied to ``dst`` by the one copy routine
    (:func:`runner.core.safefs.copy_sparse`: a sparse evidence file stays sparse in the bundle's
    folder), with their SHA-256."""
    digest = hashlib.sha256()
    with dst.open("wb") as out:
        copied = safefs.copy_sparse(f.fileno(), out.fileno(), size, digest)
    return digest.hexdigest(), copied


@contextlib.contextmanager
def quiet_bagit() -> Iterator[None]:
    """bagit.py logs each file it hashes and warns of each bad one; the runner reports those
    itself."""
    logger = logging.getLogger("bagit")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _make_bag(
    bag: Path,
    envelope: ResultEnvelope,
    beside: list[Beside],
    skipped: list[Skipped],
    issuer_keys: list[signing.TrustedKey],
    private: Ed25519PrivateKey,
    inline_max: int,
    with_inputs: bool,
) -> None:
    """Turn the folder into a bag (payload under data/), add the files stored beside it to
    the manifest and fetch.txt, and write runner-bundle.json."""
    import bagit

    info = {
        "Bag-Software-Agent": f"runner {__version__} (bagit.py {bagit.VERSION})",
        "External-Identifier": envelope.jobId or "",
        "External-Description": f"runner job {envelope.jobId}: {envelope.status}, result "
        f"envelope revision {envelope.revision}",
        "Runner-Contract-Digest": envelope.contractDigest or "",
    }
    with quiet_bagit():
        bagit.make_bag(str(bag), info, checksums=["sha256"])
    if beside:
        with (bag / MANIFEST).open("a", encoding="utf-8") as manifest:
            for b in beside:
                manifest.write(f"{b.sha256}  data/{b.path}\n")
        (bag / FETCH).write_text(
            "".join(f"{BLOB_PREFIX}{b.sha256} {b.size} data/{b.path}\n" for b in beside),
            encoding="utf-8",
        )
    signers = set(envelope.signature.keyIds) if envelope.signature else set()
    record: dict[str, Any] = {
        "schemaVersion": "1.0",
        "kind": INFO_KIND,
        "runnerVersion": __version__,
        "createdAt": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "jobId": envelope.jobId,
        "envelopeRevision": envelope.revision,
        "inlineMaxBytes": inline_max,
        "withInputs": with_inputs,
        "beside": [{"path": f"data/{b.path}", "sha256": b.sha256, "size": b.size} for b in beside],
        "skipped": [{"path": s.path, "why": s.why} for s in skipped],
        "keys": {
            "runner": [_pem(private.public_key())],
            "issuer": [_pem(k.public) for k in issuer_keys if any(k.named_by(s) for s in signers)],
        },
    }
    (bag / INFO_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    with quiet_bagit():
        made = bagit.Bag(str(bag))
        total, count = (int(x) for x in str(made.info["Payload-Oxum"]).split(".", 1))
        # Payload-Oxum counts the whole payload, so that a bag completed from fetch.txt
        # validates with any BagIt tool.
        made.info["Payload-Oxum"] = f"{total + sum(b.size for b in beside)}.{count + len(beside)}"
        made.save()


def _pem(public: Any) -> str:
    pem: bytes = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem.decode("ascii")


def seal(bag: Path, private: Ed25519PrivateKey, job_id: str | None) -> str:
    """Sign the bag's tag manifest (which covers everything else) into ``bundle.intoto.json``;
    return the signing key's id."""
    digest = hashlib.sha256((bag / TAGMANIFEST).read_bytes()).hexdigest()
    statement = {
        "_type": attest.STATEMENT_TYPE,
        "subject": [{"name": TAGMANIFEST, "digest": {"sha256": digest}}],
        "predicateType": SEAL_PREDICATE,
        "predicate": {
            "jobId": job_id,
            "bag": bag.name,
            "runnerVersion": __version__,
            "sealedAt": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        },
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    dsse = signing.sign(payload, private, payload_type=attest.PAYLOAD_TYPE)
    (bag / SEAL_FILE).write_text(signing.dumps_envelope(dsse), encoding="utf-8")
    return signing.key_id(private.public_key())


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Archive members with no owner of this host and plain modes."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def _write_tar(bag: Path, archive: Path) -> None:
    """The bag as one tar archive (gzip for .tar.gz and .tgz), written whole or not at all."""
    fd, tmp = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with tarfile.open(
            tmp, "w:gz" if compressed(archive) else "w", format=tarfile.PAX_FORMAT
        ) as tar:
            tar.add(bag, arcname=bag.name, filter=_plain)
        os.chmod(tmp, 0o644)
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
