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
from runner.staging import resolve_inside, sha256_file


def _read_one(
    output: Path,
    contract: VerifiedContract,
    index: int,
    max_bytes: int,
    version: str | None,
    hashed: dict[Path, tuple[str, int]],
) -> MeasurementResult:
    m = contract.model.measurements[index]
    rel = m.parser.evidencePath
    if not (output / rel).is_file() and not (output / rel).is_symlink():
        raise MissingEvidence(
            f"measurement {m.measurementId!r}: the job did not write {rel} under /job/output"
        )
    path = resolve_inside(output, rel)
    if not path.is_file():
        raise MissingEvidence(f"measurement {m.measurementId!r}: {rel} is not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise EvidenceParseError(
            f"measurement {m.measurementId!r}: {rel} is {size:,} bytes, over the host's "
            f"{max_bytes:,} byte cap for evidence; it was not read",
            hint="raise maxEvidenceMb in the host policy, or have the job write a smaller file",
        )
    if path not in hashed:  # several measurements often read one log: hash it once
        hashed[path] = sha256_file(path)
    sha256, size = hashed[path]
    version = version or m.parser.version
    parser = registry.get(m.parser.id, version)
    value = parser.parse(path, dict(m.parser.config))
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
    hashed: dict[Path, tuple[str, int]] = {}
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
                    category="missing_evidence"
                    if isinstance(exc, MissingEvidence)
                    else "parse_error",
                    reason=reason,
                )
            )
    return results, errors


def hash_logs(output: Path, paths: list[str]) -> list[FileRef]:
    """The job's stdout and stderr files, hashed (a missing one is recorded as missing)."""
    out = []
    for rel in paths:
        target = output / rel
        if target.is_file() and not target.is_symlink():
            sha256, size = sha256_file(target)
            out.append(FileRef(path=rel, sha256=f"sha256:{sha256}", size=size))
        else:
            out.append(FileRef(path=rel, exists=False, problem="does not exist"))
    return out
