"""Reading measurements from the job's evidence files through the registered parsers."""

from __future__ import annotations

from pathlib import Path

from runner.contract import VerifiedContract
from runner.envelope import (
    EvidenceRef,
    MeasurementError,
    MeasurementResult,
    ParserRef,
)
from runner.errors import EvidenceError, MissingEvidence
from runner.parsers import registry
from runner.staging import resolve_inside, sha256_file


def _read_one(output: Path, contract: VerifiedContract, index: int) -> MeasurementResult:
    m = contract.model.measurements[index]
    rel = m.parser.evidencePath
    if not (output / rel).is_file() and not (output / rel).is_symlink():
        raise MissingEvidence(
            f"measurement {m.measurementId!r}: the job did not write {rel} under /job/output"
        )
    path = resolve_inside(output, rel)
    if not path.is_file():
        raise MissingEvidence(f"measurement {m.measurementId!r}: {rel} is not a regular file")
    sha256, size = sha256_file(path)
    parser = registry.get(m.parser.id, m.parser.version)
    value = parser.parse(path, dict(m.parser.config))
    return MeasurementResult(
        measurementId=m.measurementId,
        metric=m.metric,
        unit=m.unit,
        value=value,
        parser=ParserRef(id=m.parser.id, version=m.parser.version),
        evidence=EvidenceRef(path=rel, sha256=f"sha256:{sha256}", size=size),
    )


def read_measurements(
    output: Path, contract: VerifiedContract
) -> tuple[list[MeasurementResult], list[MeasurementError]]:
    """Every measurement the evidence yields, and why the others failed."""
    results: list[MeasurementResult] = []
    errors: list[MeasurementError] = []
    for i, m in enumerate(contract.model.measurements):
        try:
            results.append(_read_one(output, contract, i))
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
