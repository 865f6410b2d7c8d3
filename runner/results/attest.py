"""A result anyone can verify: two signed in-toto statements beside ``result.json``.

Long on purpose: what is signed and how it is checked again (every file read as hostile,
capped) stay side by side, so that the two never drift apart.

After writing ``result.json`` the runner signs two in-toto Statements v1, each in its own DSSE
envelope (one statement per file, as every DSSE reader takes it), with its own Ed25519 key
(made on first use):

``result.intoto.json``: SLSA Provenance v1 (``https://slsa.dev/provenance/v1``), how the result
    was produced, in the form SLSA and in-toto tools read. Subjects: ``result.json`` and the
    files under ``output/`` the result rests on (evidence, the job's result.json and the files
    it lists), each by SHA-256. ``buildType`` is :data:`BUILD_TYPE`; ``externalParameters``
    the contract (name, digest) and the job id; ``internalParameters`` what the host decided
    (its policy's digest and overrides, how the contract's signature verified, the attempt
    and the revision); ``resolvedDependencies`` the envelope's materials (the contract, every
    input, the image); ``builder`` this runner and its version; ``metadata`` the invocation
    and its times; ``byproducts`` the job's stdout and stderr.

``result.envelope.intoto.json``: predicate type :data:`ENVELOPE_PREDICATE_TYPE`, the envelope
    itself (described by ``contracts/result-envelope.schema.json``): the measurements with
    their parsers and evidence, status, budget, limits. Subjects: every output file the
    envelope hashed (logs included).

A result signed before SLSA provenance has only ``result.intoto.json``, holding the envelope
statement; it still verifies.

``runner verify-result`` takes a job folder, its ``result.json`` or either statement file
(:func:`locate`), and checks every signature and every signed file's hash, and re-parses
each value from its evidence as ``runner verify-bundle`` does (:func:`verify_result`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core import jsondepth, safefs
from runner.core.errors import SignatureInvalid
from runner.models.envelope import ResultEnvelope
from runner.trust import signing

__all__ = ["BUILD_TYPE", "ENVELOPE_FILE", "ENVELOPE_PREDICATE_TYPE", "ENVELOPE_STATEMENT_FILE",
           "PAYLOAD_TYPE", "PROVENANCE_TYPE", "STATEMENT_FILE", "STATEMENT_TYPE", "runner_key",
           "sign_result", "signed_files", "verify_result"]  # fmt: skip

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
ENVELOPE_PREDICATE_TYPE = "https://github.com/citeark/runner/result-envelope/v1"
"""The envelope as a predicate: its JSON Schema is contracts/result-envelope.schema.json."""
RUNNER_URI = "https://github.com/citeark/runner"
BUILD_TYPE = f"{RUNNER_URI}/buildtypes/contract-run/v1"
"""A signed contract run in a sealed container on one host (README, "A result anyone can
verify")."""

MAX_BYTES = 64 * 2**20
"""The largest result.json or statement read."""
ENVELOPE_FILE = "result.json"
STATEMENT_FILE = "result.intoto.json"
ENVELOPE_STATEMENT_FILE = "result.envelope.intoto.json"
JOB_FOLDERS = {
    "output": "a file the job wrote under output/ (its own claim, or its evidence)",
    "input": "a file staged for the job under input/",
    "record": "a file of the job's record/",
    "execution": "a file of the job's execution/",
}
"""The folders of a job folder, and what a file in them is."""
WHAT_IT_TAKES = (
    "pass the job folder, its result.json or its result.intoto.json "
    "(`runner status JOB` prints the job folder)"
)


def builder_id(version: str) -> str:
    """``runDetails.builder.id``: this runner at ``version``."""
    return f"{RUNNER_URI}@v{version}"


def runner_key(path: Path) -> Path:
    """The runner's private key at ``path`` (``.key``), made with its ``.pub`` on first use."""
    if not path.exists():
        # Another runner may make it at the same moment: its key is as good as ours.
        with contextlib.suppress(FileExistsError):
            signing.generate_key(path, path.with_suffix(".pub"))
    return path


# -- the statements -------------------------------------------------------------------------


def _descriptor(name: str, digest: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}, **extra}


def _outputs(envelope: ResultEnvelope, *, logs: bool) -> list[dict[str, Any]]:
    """The output files the result rests on, as ResourceDescriptors named ``output/<path>``."""
    seen: dict[str, str] = {}
    for m in envelope.measurements:
        seen[m.evidence.path] = m.evidence.sha256
    refs = list(envelope.logs) if logs else []
    if envelope.agentResult is not None:
        refs += [envelope.agentResult.file, *envelope.agentResult.listed]
    for ref in refs:
        if ref.exists and ref.sha256:
            seen[ref.path] = ref.sha256
    return [_descriptor(f"output/{path}", digest) for path, digest in sorted(seen.items())]


def envelope_statement(envelope: ResultEnvelope) -> dict[str, Any]:
    """The envelope itself as the predicate; subjects every output file it hashed."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": _outputs(envelope, logs=True),
        "predicateType": ENVELOPE_PREDICATE_TYPE,
        "predicate": envelope.model_dump(mode="json"),
    }


def _present(values: dict[str, Any]) -> dict[str, Any]:
    """SLSA reads unset, null and empty alike: leave them out."""
    return {k: v for k, v in values.items() if v not in (None, {}, [])}


def provenance(envelope: ResultEnvelope, envelope_bytes: bytes) -> dict[str, Any]:
    """SLSA Provenance v1 of the result: ``result.json`` (``envelope_bytes``, exactly as
    written) and the output files it rests on, made from the contract, inputs and image."""
    sig = envelope.signature
    internal = _present(
        {
            "policy": _present(
                {"digest": envelope.policy.digest, "overrides": envelope.policy.overrides}
            )
            if envelope.policy
            else None,
            "contractSignature": _present({"status": sig.status, "keyIds": sig.keyIds})
            if sig
            else None,
            "attempt": envelope.attempt,
            "revision": envelope.revision,
            "regrade": envelope.regrade.model_dump(mode="json") if envelope.regrade else None,
        }
    )
    invocation = f"{envelope.jobId}/attempt-{envelope.attempt or 1}"
    if envelope.revision > 1:
        invocation += f"/revision-{envelope.revision}"
    outputs = _outputs(envelope, logs=False)
    named = {o["name"] for o in outputs}
    byproducts = [
        _descriptor(f"output/{ref.path}", ref.sha256, mediaType="text/plain")
        for ref in envelope.logs
        if ref.exists and ref.sha256 and f"output/{ref.path}" not in named
    ]
    build = {
        "buildType": BUILD_TYPE,
        "externalParameters": _present(
            {
                "contract": _present(
                    {"name": envelope.contractName, "digest": envelope.contractDigest}
                ),
                "jobId": envelope.jobId,
            }
        ),
        "internalParameters": internal,
        "resolvedDependencies": [_present(m.model_dump(mode="json")) for m in envelope.materials],
    }
    run = {
        "builder": {
            "id": builder_id(envelope.runnerVersion),
            "version": {"runner": envelope.runnerVersion},
        },
        "metadata": {
            "invocationId": invocation,
            "startedOn": envelope.timings.startedAt,
            "finishedOn": envelope.timings.finishedAt,
        },
        "byproducts": byproducts,
    }
    digest = hashlib.sha256(envelope_bytes).hexdigest()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [_descriptor(ENVELOPE_FILE, digest), *outputs],
        "predicateType": PROVENANCE_TYPE,
        "predicate": {"buildDefinition": _present(build), "runDetails": _present(run)},
    }


def sign_result(envelope: ResultEnvelope, job_root: Path, key_path: Path) -> Path:
    """Write ``<job>/result.envelope.intoto.json`` and ``<job>/result.intoto.json`` (the
    provenance of ``<job>/result.json`` as it is on disk); return the latter's path."""
    from runner.state.jobdir import atomic_write

    private = signing.load_private_key(runner_key(key_path))
    written = (job_root / ENVELOPE_FILE).read_bytes()
    for name, stmt in (
        (ENVELOPE_STATEMENT_FILE, envelope_statement(envelope)),
        (STATEMENT_FILE, provenance(envelope, written)),
    ):
        payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
        dsse = signing.sign(payload, private, payload_type=PAYLOAD_TYPE)
        atomic_write(job_root / name, signing.dumps_envelope(dsse).encode())
    return job_root / STATEMENT_FILE


def signed_files(stmt: dict[str, Any]) -> list[tuple[str, str]]:
    """``(name, sha256 hex)`` of every file a statement signs: its subjects and, for SLSA
    provenance, its byproducts. Raises KeyError, TypeError or AttributeError when malformed."""
    out = [(str(s["name"]), str(s["digest"]["sha256"])) for s in stmt["subject"]]
    if stmt.get("predicateType") == PROVENANCE_TYPE:
        for b in stmt["predicate"].get("runDetails", {}).get("byproducts", []):
            out.append((str(b["name"]), str(b["digest"]["sha256"])))
    return out


# -- finding what to verify -----------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """The files of one signed result: the folder it lies in (taken as its job folder)."""

    job: Path
    provenance: Path | None
    """``result.intoto.json`` holding SLSA provenance; None for a result signed before it."""
    envelope_statement: Path | None
    envelope: Path | None
    """``result.json``, when it is there."""
    output: Path | None
    """The output folder whose files are checked (None: not checked)."""


def _peek(path: Path) -> Any:
    if path.name.endswith((".tar", ".tar.gz", ".tgz")):
        raise SignatureInvalid(
            f"{path} is an archive, not a result",
            hint=f"check a bundle from `runner export` with `runner verify-bundle {path}`",
        )
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES // 2**20} MiB")
        return jsondepth.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SignatureInvalid(
            f"{path} is not a result: it is not readable JSON ({exc})", hint=WHAT_IT_TAKES
        ) from exc


def _predicate_type(dsse: dict[str, Any]) -> object:
    """The predicate type an in-toto envelope's payload names, read before verifying: only
    to tell which file this is. Nothing read here is trusted."""
    try:
        return jsondepth.loads(signing._b64(dsse.get("payload"), "payload")).get("predicateType")
    except (SignatureInvalid, ValueError, AttributeError):
        return None


def _beside(folder: Path, name: str) -> Path | None:
    return folder / name if (folder / name).is_file() else None


def _in_folder(job: Path) -> tuple[Path | None, Path | None]:
    """``(provenance, envelope statement)`` by their names in a job folder; a
    ``result.intoto.json`` from before SLSA provenance is the envelope statement."""
    statement = _beside(job, STATEMENT_FILE)
    if statement is None:
        if _beside(job, ENVELOPE_FILE):
            raise SignatureInvalid(
                f"{job} has {ENVELOPE_FILE} but no {STATEMENT_FILE}: this result is not signed",
                hint="the runner signs every result it writes; a result copied without its "
                f"{STATEMENT_FILE} cannot be verified",
            )
        raise SignatureInvalid(
            f"{job} holds no result (no {ENVELOPE_FILE}, no {STATEMENT_FILE})", hint=WHAT_IT_TAKES
        )
    data = _peek(statement)
    if isinstance(data, dict) and _predicate_type(data) == ENVELOPE_PREDICATE_TYPE:
        return None, statement
    return statement, _beside(job, ENVELOPE_STATEMENT_FILE)


def locate(path: Path, output_dir: Path | None = None) -> Location:
    """The signed result that ``path`` names: a job folder, its ``result.json``, or a
    statement file. The folder it lies in is its job folder, whose ``output/`` is checked
    unless ``output_dir`` names another. Raises :class:`SignatureInvalid` naming the file
    it needs when ``path`` is something else."""
    if path.is_dir():
        job = path
        if path.name == "output" and _beside(path.parent, ENVELOPE_FILE):
            raise SignatureInvalid(
                f"{path} is the job's output folder", hint=f"pass the job folder, {path.parent}"
            )
        provenance, envelope_stmt = _in_folder(job)
    elif not path.exists():
        raise SignatureInvalid(f"{path} does not exist", hint=WHAT_IT_TAKES)
    else:
        job = path.parent
        kind = _classify(path, _peek(path))
        if kind == ENVELOPE_FILE:
            provenance, envelope_stmt = _in_folder(job)
        elif kind == PROVENANCE_TYPE:
            provenance, envelope_stmt = path, _beside(job, ENVELOPE_STATEMENT_FILE)
        else:  # the envelope statement: its provenance beside it, or one from before it
            beside = _beside(job, STATEMENT_FILE)
            provenance = None
            if beside is not None and beside != path:
                provenance = _in_folder(job)[0]
            envelope_stmt = path
    if output_dir is None and (job / "output").is_dir():
        output_dir = job / "output"
    return Location(job, provenance, envelope_stmt, _beside(job, ENVELOPE_FILE), output_dir)


def _classify(path: Path, data: Any) -> str:
    """What a file given is: ``result.json``, SLSA provenance or the envelope statement (by
    their types); raise naming the file it needs for anything else."""
    if isinstance(data, dict) and {"payloadType", "payload", "signatures"} <= set(data):
        if data.get("payloadType") == signing.PAYLOAD_TYPE:
            raise SignatureInvalid(
                f"{path} is a signed contract, not a result",
                hint=f"check a contract with `runner verify {path}`; verify-result checks what "
                f"a run produced: {WHAT_IT_TAKES}",
            )
        kind = _predicate_type(data)
        if kind in (PROVENANCE_TYPE, ENVELOPE_PREDICATE_TYPE):
            return str(kind)
        seal = " (a bundle's seal)" if path.name == "bundle.intoto.json" else ""
        raise SignatureInvalid(
            f"{path} is a signed statement of type {kind!r}{seal}, not a runner result",
            hint=f"a bundle is checked whole with `runner verify-bundle ARCHIVE`; {WHAT_IT_TAKES}",
        )
    if isinstance(data, dict) and data.get("kind") == "runner.result-envelope":
        return ENVELOPE_FILE
    for folder in path.absolute().parents:
        if folder.name in JOB_FOLDERS and _beside(folder.parent, ENVELOPE_FILE):
            raise SignatureInvalid(
                f"{path} is {JOB_FOLDERS[folder.name]}, not the runner's signed result",
                hint=f"pass the job folder, {folder.parent}",
            )
    raise SignatureInvalid(
        f"{path} is neither a job folder, a result envelope ({ENVELOPE_FILE}) nor a signed "
        f"result statement ({STATEMENT_FILE})",
        hint=WHAT_IT_TAKES,
    )


# -- verifying ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verified:
    envelope: dict[str, Any]
    """The result envelope, as signed."""
    keyids: tuple[str, ...]
    location: Location
    statements: tuple[tuple[Path, str], ...]
    """The statement files whose signatures verified, with their predicate types."""
    signed: int
    """Output files the statements sign."""
    checked: int
    """Of those, checked against the output folder."""
    provenance: dict[str, Any] | None
    """The SLSA provenance statement (None for a result signed before it)."""
    notes: tuple[str, ...]


def _statement(
    path: Path, trusted: list[signing.TrustedKey]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    try:  # a file of a job folder anyone may have made: a regular file, capped
        dsse = jsondepth.loads(safefs.read_named(path, MAX_BYTES))
    except (safefs.UnsafePath, OSError, ValueError) as exc:
        raise SignatureInvalid(f"{path} is not a readable signed result: {exc}") from exc
    if not isinstance(dsse, dict):
        raise SignatureInvalid(f"{path} is not a DSSE envelope")
    verified = signing.verify_envelope(dsse, trusted, 1, payload_type=PAYLOAD_TYPE)
    try:
        stmt = jsondepth.loads(verified.payload)
    except ValueError as exc:
        raise SignatureInvalid(f"{path}: the signed payload is not JSON") from exc
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise SignatureInvalid(f"{path} is not an in-toto Statement v1")
    return stmt, verified.keyids


def _envelope_bytes(path: Path) -> bytes:
    try:  # as capped as the statements (a sparse 16 GiB one is refused, not read)
        return safefs.read_named(path, MAX_BYTES)
    except (safefs.UnsafePath, OSError) as exc:
        raise SignatureInvalid(f"{path} is not a readable envelope: {exc}") from None


def _check_provenance(path: Path, stmt: dict[str, Any]) -> None:
    if stmt.get("predicateType") != PROVENANCE_TYPE:
        raise SignatureInvalid(f"{path} is not SLSA provenance: {stmt.get('predicateType')!r}")
    build = stmt.get("predicate", {}).get("buildDefinition", {})
    if build.get("buildType") != BUILD_TYPE:
        raise SignatureInvalid(
            f"{path} is SLSA provenance of another build type, {build.get('buildType')!r}",
            hint=f"a runner result's build type is {BUILD_TYPE}",
        )


def verify_result(
    path: Path, trusted: list[signing.TrustedKey], output_dir: Path | None = None
) -> Verified:
    """Check every signature of the result at ``path`` (see :func:`locate`), that
    ``result.json`` is the one signed, every signed file under the output folder, and each
    value re-parsed from its evidence there; raise :class:`SignatureInvalid` on any mismatch."""
    from runner.evidence import read as evidence

    loc = locate(path, output_dir)
    keyids: set[str] = set()
    files: dict[str, str] = {}
    notes: list[str] = []
    statements: list[tuple[Path, str]] = []
    envelope: dict[str, Any] | None = None
    written = _envelope_bytes(loc.envelope) if loc.envelope else None
    prov: dict[str, Any] | None = None
    try:
        if loc.provenance is not None:
            prov, ids = _statement(loc.provenance, trusted)
            _check_provenance(loc.provenance, prov)
            keyids.update(ids)
            statements.append((loc.provenance, PROVENANCE_TYPE))
            signed = dict(signed_files(prov))
            want = signed.pop(ENVELOPE_FILE, None)
            if want is None:
                raise SignatureInvalid(f"{loc.provenance} does not sign {ENVELOPE_FILE}")
            if written is None:
                notes.append(f"no {ENVELOPE_FILE} beside it: its values are not shown")
            elif hashlib.sha256(written).hexdigest() != want:
                raise SignatureInvalid(
                    f"{loc.envelope} is not the {ENVELOPE_FILE} that {loc.provenance} signs",
                    hint="the envelope was changed after it was signed",
                )
            else:
                envelope = jsondepth.loads(written)
            files.update(signed)
        if loc.envelope_statement is not None:
            stmt, ids = _statement(loc.envelope_statement, trusted)
            if stmt.get("predicateType") != ENVELOPE_PREDICATE_TYPE:
                raise SignatureInvalid(f"{loc.envelope_statement} is not a runner result statement")
            keyids.update(ids)
            statements.append((loc.envelope_statement, ENVELOPE_PREDICATE_TYPE))
            if written is not None and stmt.get("predicate") != jsondepth.loads(written):
                raise SignatureInvalid(
                    f"{loc.envelope} is not the envelope that {loc.envelope_statement} signs",
                    hint="the envelope was changed after it was signed",
                )
            envelope = envelope or stmt.get("predicate")
            files.update(signed_files(stmt))
        elif loc.provenance is not None:
            notes.append(f"no {ENVELOPE_STATEMENT_FILE} beside it (the envelope as a predicate)")
        if loc.provenance is None:
            notes.append("signed by a runner from before SLSA provenance: one statement")
    except (KeyError, TypeError, AttributeError) as exc:
        raise SignatureInvalid(f"{path}: a signed statement is malformed: {exc!r}") from exc
    if envelope is None:
        raise SignatureInvalid(
            f"neither {ENVELOPE_FILE} nor {ENVELOPE_STATEMENT_FILE} is beside {path}: "
            "there are no values to show",
            hint=WHAT_IT_TAKES,
        )
    outputs = {n.removeprefix("output/"): d for n, d in files.items() if n.startswith("output/")}
    checked = _check_outputs(loc.output, outputs) if loc.output is not None else 0
    if loc.output is not None:  # the values re-parsed, as verify-bundle does
        try:
            evidence.confirm_values(loc.job, loc.output, envelope, outputs)
        except evidence.NotConfirmed as exc:
            raise SignatureInvalid(exc.message, hint=exc.hint or evidence.NOT_GIVEN) from None
    elif envelope.get("measurements"):
        notes.append("values not re-parsed: no output folder to read the evidence from")
    return Verified(
        envelope,
        tuple(sorted(keyids)),
        loc,
        tuple(statements),
        len(outputs),
        checked,
        prov,
        tuple(notes),
    )


def _check_outputs(output_dir: Path, signed: dict[str, str]) -> int:
    from runner.core.safefs import UnsafePath
    from runner.staging.jobdir import sha256_under

    bad = []
    for rel, want in sorted(signed.items()):
        try:
            digest, _ = sha256_under(output_dir, rel, sys.maxsize)
        except UnsafePath as exc:
            bad.append(f"{rel}: {exc.problem}")
            continue
        if digest != want:
            bad.append(f"{rel}: sha256 {digest} is not the signed one")
    if bad:
        raise SignatureInvalid(
            "the output folder does not match the signed result: " + "; ".join(bad),
            hint="the evidence was changed after the run; the signed values no longer "
            "rest on these files",
        )
    return len(signed)
