"""Comparing a job with its replays: pure functions from envelopes to the reproducibility report
(:class:`~runner.models.replay.ReplayReport`), no engine, no files.

Every run is compared with the original (run 0). A measurement is identical when every run read
the same value (numbers by value, so ``1`` and ``1.0`` are one value while ``true`` and ``1``
are not; NaN equals NaN: the same outcome each time); an evidence file when every run's
envelope records the same sha256 for it. A value or a file that one run has and another has not
is a difference, so a failed replay is never hidden: it differs wherever it read nothing. What
differed first is found in the contract's order: each measurement, then its evidence file where
a measurement first names it.

The values come from evidence a job wrote: they are compared and counted, never trusted for
more (any length, any code point, integers past a float's range, NaN and infinities).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from runner.contract.models import ExecutionContract
from runner.models.envelope import ResultEnvelope
from runner.models.replay import (
    EvidenceComparison,
    EvidenceHash,
    FirstDifference,
    MeasurementComparison,
    MeasurementValue,
    ReplayRun,
    Value,
)

__all__ = [
    "Binding",
    "Compared",
    "bindings",
    "compare",
    "run_record",
    "shown",
    "summary",
    "usable",
]


@dataclass(frozen=True)
class Binding:
    """One measurement of the contract, as the comparison needs it (in the contract's order)."""

    measurement_id: str
    metric: str
    unit: str
    evidence_path: str


def bindings(contract: ExecutionContract) -> list[Binding]:
    """The contract's measurements, in its order."""
    return [
        Binding(m.measurementId, m.metric, m.unit, m.parser.evidencePath)
        for m in contract.measurements
    ]


def run_record(
    run: int,
    envelope: ResultEnvelope | None,
    *,
    job_id: str | None,
    job_dir: str | None,
    contract_digest: str,
    problem: str | None = None,
) -> ReplayRun:
    """One run as the report lists it. A run with no envelope, or whose envelope names another
    contract than ``contract_digest``, is failed and its values are not compared (see
    :func:`usable`)."""
    if envelope is not None and envelope.contractDigest != contract_digest and problem is None:
        problem = (
            f"its envelope names contract {envelope.contractDigest}, not the original's "
            f"{contract_digest}; its values are not compared"
        )
    if envelope is None:
        return ReplayRun(
            run=run,
            jobId=job_id,
            jobDir=job_dir,
            status=None,
            failed=True,
            problem=problem or "it left no envelope",
        )
    return ReplayRun(
        run=run,
        jobId=job_id or envelope.jobId,
        jobDir=job_dir or envelope.jobDir,
        status=envelope.status,
        failure=envelope.failure,
        failed=envelope.status != "succeeded" or problem is not None,
        problem=problem,
        contractDigest=envelope.contractDigest,
        runSeconds=envelope.timings.runSeconds,
    )


def usable(run: ReplayRun, envelope: ResultEnvelope | None) -> ResultEnvelope | None:
    """The envelope whose values are compared: none for a run with a problem (another
    contract, no envelope)."""
    return envelope if run.problem is None else None


@dataclass(frozen=True)
class Compared:
    measurements: list[MeasurementComparison]
    evidence: list[EvidenceComparison]
    first: FirstDifference | None


_MISSING_RUN = "run failed: no envelope"
_UNREAD = ("no measurement",)
"""The key of why a run read no value for a measurement its envelope does not name (a tuple:
never a measurement id)."""


def compare(
    order: Sequence[Binding],
    envelopes: Sequence[ResultEnvelope | None],
    job_ids: Sequence[str | None] | None = None,
) -> Compared:
    """Each measurement and evidence file of ``order`` across ``envelopes`` (the original first;
    None: a run whose values cannot be compared), and what differed first."""
    ids = list(job_ids) if job_ids is not None else [None] * len(envelopes)
    values = [_values(env) for env in envelopes]
    hashes = [_hashes(env) for env in envelopes]
    measurements: list[MeasurementComparison] = []
    evidence: list[EvidenceComparison] = []
    first: FirstDifference | None = None
    seen: dict[str, int] = {}
    for b in order:
        got = [_value_of(run, values[run], b.measurement_id) for run in range(len(envelopes))]
        m = _measurement(b, got)
        measurements.append(m)
        if first is None and m.firstDifferentRun is not None:
            i = m.firstDifferentRun
            first = FirstDifference(
                kind="measurement",
                measurementId=b.measurement_id,
                path=None,
                run=i,
                jobId=ids[i] if i < len(ids) else None,
                detail=f"{b.measurement_id}: the original read {_said(got[0])}, replay {i} "
                f"read {_said(got[i])}",
            )
        if b.evidence_path in seen:
            index = seen[b.evidence_path]
            e = evidence[index]
            evidence[index] = e.model_copy(
                update={"measurementIds": [*e.measurementIds, b.measurement_id]}
            )
            continue
        seen[b.evidence_path] = len(evidence)
        files = [_hash_of(run, hashes[run], b.evidence_path) for run in range(len(envelopes))]
        e = _evidence(b, files)
        evidence.append(e)
        if first is None and e.firstDifferentRun is not None:
            i = e.firstDifferentRun
            first = FirstDifference(
                kind="evidence",
                measurementId=None,
                path=b.evidence_path,
                run=i,
                jobId=ids[i] if i < len(ids) else None,
                detail=f"{b.evidence_path}: the original's is {_file(files[0])}, replay {i}'s "
                f"is {_file(files[i])}",
            )
    return Compared(measurements, evidence, first)


def summary(
    compared: Compared, runs: Sequence[ReplayRun], times: int, *, complete: bool
) -> tuple[bool, list[int], str]:
    """``(identical, failed replays, one sentence)`` of a comparison of ``runs`` (the original
    first) of which ``times`` replays were asked for."""
    replays = runs[1:]
    original = runs[0]
    failed = [r.run for r in replays if r.failed]
    status_differs = [r.run for r in replays if r.status != original.status or r.problem]
    same = (
        complete
        and not status_differs
        and all(m.identical for m in compared.measurements)
        and all(e.identical for e in compared.evidence)
    )
    parts: list[str] = []
    if not complete:
        parts.append(f"{len(replays)} of {times} replays ran so far (or the rest were stopped)")
    if failed:
        parts.append(
            f"{len(failed)} of {len(replays)} replays failed (run "
            + ", ".join(str(i) for i in failed)
            + ")"
        )
    n_m, n_e = len(compared.measurements), len(compared.evidence)
    diff_m = sum(1 for m in compared.measurements if not m.identical)
    diff_e = sum(1 for e in compared.evidence if not e.identical)
    if same:
        parts.append(
            f"all {len(replays)} replays reproduced the original exactly: {n_m} measurement"
            f"{'s' if n_m != 1 else ''} and {n_e} evidence file{'s' if n_e != 1 else ''} "
            "identical"
        )
    elif diff_m or diff_e:
        parts.append(f"{diff_m} of {n_m} measurements and {diff_e} of {n_e} evidence files differ")
    if compared.first is not None:
        parts.append(f"first difference: {compared.first.detail}")
    elif not same and status_differs:
        parts.append(
            "the replays' status differs from the original's "
            f"({original.status}) in run " + ", ".join(str(i) for i in status_differs)
        )
    text = "; ".join(parts)
    return same, failed, (text[:1].upper() + text[1:] + ".") if text else "Nothing to compare."


# --- values -----------------------------------------------------------------------------


def shown(value: Value | None, limit: int = 80) -> str:
    """A value for a person: JSON, ASCII only (a control character, any non-ASCII code point,
    a lone surrogate escaped), at most ``limit`` characters."""
    if isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        digits = len(str(abs(value)))
        text = f"{'-' if value < 0 else ''}<an integer of {digits} digits>"
    else:
        text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _said(v: MeasurementValue) -> str:
    return shown(v.value) if v.missing is None else f"nothing ({v.missing})"


def _file(h: EvidenceHash) -> str:
    if h.sha256 is None:
        return "not read"
    return f"{h.sha256[:19]}… ({h.size:,} bytes)" if h.size is not None else h.sha256[:19] + "…"


def _values(env: ResultEnvelope | None) -> dict[Any, Any] | None:
    """measurementId -> value or ``(missing, category)``; None for a run with no envelope."""
    if env is None:
        return None
    out: dict[Any, Any] = {}
    for err in env.measurementErrors:
        out.setdefault(err.measurementId, ("missing", str(err.category)))
    if env.failure is not None:  # what it did not read: the run failed before its parsers
        out[_UNREAD] = ("missing", f"run failed: {env.failure.category} at {env.failure.stage}")
    for m in env.measurements:
        if not isinstance(out.get(m.measurementId), _Read):
            out[m.measurementId] = _Read(m.value)
    return out


@dataclass(frozen=True)
class _Read:
    value: Value


def _value_of(run: int, values: dict[Any, Any] | None, mid: str) -> MeasurementValue:
    if values is None:
        return MeasurementValue(run=run, value=None, missing=_MISSING_RUN)
    got = values.get(mid)
    if isinstance(got, _Read):
        return MeasurementValue(run=run, value=got.value)
    if isinstance(got, tuple):
        return MeasurementValue(run=run, value=None, missing=got[1])
    why = values.get(_UNREAD, ("missing", "not in the envelope"))[1]
    return MeasurementValue(run=run, value=None, missing=why)


def _key(v: MeasurementValue) -> tuple[Any, ...]:
    """What two values must share to be the same value."""
    value = v.value
    if v.missing is not None:
        return ("missing",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, int | float):
        return ("number", value)  # 1 == 1.0, compared exactly (an int past 2**53 too)
    return ("str", value)


def _first_different(keys: list[tuple[Any, ...]]) -> int | None:
    return next((i for i in range(1, len(keys)) if keys[i] != keys[0]), None)


def _writable(value: Value | None) -> Value | None:
    """``value`` as the report can write it: a string's lone surrogates (JSON evidence can
    carry them; UTF-8 cannot) as U+FFFD. Compared before this, so never made equal by it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def _measurement(b: Binding, got: list[MeasurementValue]) -> MeasurementComparison:
    keys = [_key(v) for v in got]
    lo, hi, span, rel = _spread([v.value for v in got if v.value is not None])
    return MeasurementComparison(
        measurementId=b.measurement_id,
        metric=b.metric,
        unit=b.unit,
        values=[v.model_copy(update={"value": _writable(v.value)}) for v in got],
        identical=len(set(keys)) <= 1,
        min=_writable(lo),
        max=_writable(hi),
        range=span,
        relativeSpread=rel,
        firstDifferentRun=_first_different(keys),
    )


def _spread(
    read: list[Value],
) -> tuple[Value | None, Value | None, int | float | None, float | None]:
    """min, max, range, relative spread of the values read (see MeasurementComparison)."""
    if not read:
        return None, None, None, None
    if all(isinstance(v, bool) for v in read):
        return min(read), max(read), None, None
    if all(isinstance(v, str) for v in read):
        texts = [v for v in read if isinstance(v, str)]
        return min(texts), max(texts), None, None
    numbers = [v for v in read if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) != len(read) or any(isinstance(v, float) and math.isnan(v) for v in numbers):
        return None, None, None, None  # of different kinds, or a NaN: no order
    lo, hi = min(numbers), max(numbers)
    if not all(math.isfinite(v) for v in numbers if isinstance(v, float)):
        return lo, hi, None, None
    try:
        span: int | float = hi - lo
    except OverflowError:  # an int past a float's range less a float
        return lo, hi, None, None
    if isinstance(span, float) and not math.isfinite(span):
        return lo, hi, None, None
    exact = [Fraction(v) for v in numbers]
    if lo == hi:
        return lo, hi, span, 0.0
    mean = sum(exact, Fraction(0)) / len(exact)
    if mean == 0:
        return lo, hi, span, None
    try:
        rel = float((max(exact) - min(exact)) / abs(mean))
    except OverflowError:
        return lo, hi, span, None
    return lo, hi, span, rel if math.isfinite(rel) else None


# --- evidence ---------------------------------------------------------------------------


def _hashes(env: ResultEnvelope | None) -> dict[str, tuple[str, int]] | None:
    """evidence path -> (sha256, size) from the envelope's evidence records."""
    if env is None:
        return None
    out: dict[str, tuple[str, int]] = {}
    for m in env.measurements:
        out.setdefault(m.evidence.path, (m.evidence.sha256, m.evidence.size))
    return out


def _hash_of(run: int, hashes: dict[str, tuple[str, int]] | None, path: str) -> EvidenceHash:
    got = (hashes or {}).get(path)
    if got is None:
        return EvidenceHash(run=run, sha256=None)
    return EvidenceHash(run=run, sha256=got[0], size=got[1])


def _evidence(b: Binding, files: list[EvidenceHash]) -> EvidenceComparison:
    keys = [(f.sha256,) for f in files]
    return EvidenceComparison(
        path=b.evidence_path,
        measurementIds=[b.measurement_id],
        hashes=files,
        identical=len(set(keys)) <= 1,
        firstDifferentRun=_first_different(keys),
    )
