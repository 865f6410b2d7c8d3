"""Reading measurements from the job's evidence files through the registered parsers."""

from __future__ import annotations

from pathlib import Path

from runner.contract import VerifiedContract
from runner.envelope import (
    EvidenceRef,
    FileRef,
    MeasurementError,
    MeasurementResult,
    ParserRef,
)
from runner.errors import EvidenceError, EvidenceParseError, MissingEvidence
from runner.parsers import registry
from runner.safefs import UnsafePath
from runner.staging import job_file_problem, sha256_under


def _read_one(
    output: Path,
    contract: VerifiedContract,
    index: int,
    max_bytes: int,
    version: str | None,
    hashed: dict[str, tuple[str | None, int]],
) -> MeasurementResult:
    m = contract.model.measurements[index]
    rel = m.parser.evidencePath
    where = f"measurement {m.measurementId!r}"
    if rel not in hashed:  # several measurements often read one log: hash it once
        try:
            hashed[rel] = sha256_under(output, rel, max_bytes)
        except UnsafePath as exc:
            if exc.missing:
                raise MissingEvidence(
                    f"{where}: the job did not write {rel} under /job/output"
                ) from None
            raise EvidenceParseError(f"{where}: {rel} {job_file_problem(exc)}") from None
        except OSError as exc:
            raise EvidenceParseError(f"{where}: {rel} cannot be read: {exc.strerror}") from exc
    sha256, size = hashed[rel]
    if sha256 is None:
        raise EvidenceParseError(
            f"{where}: {rel} is {size:,} bytes, over the host's {max_bytes:,} byte cap for "
            "evidence; it was not read",
            hint="raise maxEvidenceMb in the host policy, or have the job write a smaller file",
        )
    version = version or m.parser.version
    parser = registry.get(m.parser.id, version)
    try:
        value = parser.parse(output / rel, dict(m.parser.config))
    except EvidenceError:
        raise
    except Exception as exc:  # a job's file is the job's problem, never a runner crash
        raise EvidenceParseError(
            f"{where}: {m.parser.id} version {version} could not read {rel}: "
            f"{type(exc).__name__}: {exc}"[:2000]
        ) from exc
    return MeasurementResult(
        measurementId=m.measurementId,
        metric=m.metric,
        unit=m.unit,
        value=value,
        parser=ParserRef(id=m.parser.id, version=version),
        evidence=EvidenceRef(path=rel, sha256=f"sha256:{sha256}", size=size),
    )


def read_measurements(
    output: Path,
    contract: VerifiedContract,
    max_bytes: int,
    versions: dict[str, str] | None = None,
) -> tuple[list[MeasurementResult], list[MeasurementError]]:
    """Every measurement the evidence yields, and why the others failed. ``versions`` picks
    another parser version per measurement id (re-grading); by default the contract's."""
    results: list[MeasurementResult] = []
    errors: list[MeasurementError] = []
    hashed: dict[str, tuple[str | None, int]] = {}
    for i, m in enumerate(contract.model.measurements):
        try:
            version = (versions or {}).get(m.measurementId)
            results.append(_read_one(output, contract, i, max_bytes, version, hashed))
        except EvidenceError as exc:
            reason = exc.message
            if not reason.startswith("measurement"):
                reason = f"measurement {m.measurementId!r}: {reason}"
            errors.append(
                MeasurementError(
                    measurementId=m.measurementId,
                    category=exc.category,
                    reason=reason,
                )
            )
    return results, errors


def hash_logs(output: Path, paths: list[str], max_bytes: int) -> list[FileRef]:
    """The job's stdout and stderr files, hashed; one that is missing, a link (anywhere on
    its path), not a regular file or over ``max_bytes`` is recorded with the reason."""
    out = []
    for rel in paths:
        try:
            sha256, size = sha256_under(output, rel, max_bytes)
        except UnsafePath as exc:
            out.append(FileRef(path=rel, exists=False, problem=job_file_problem(exc)))
            continue
        except OSError as exc:
            out.append(FileRef(path=rel, problem=f"cannot be read: {exc.strerror}"))
            continue
        if sha256 is None:
            problem = f"is {size:,} bytes, over the {max_bytes:,} byte cap; not hashed"
            out.append(FileRef(path=rel, size=size, problem=problem))
        else:
            out.append(FileRef(path=rel, sha256=f"sha256:{sha256}", size=size))
    return out
