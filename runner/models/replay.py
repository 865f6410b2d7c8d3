"""The reproducibility report of ``runner replay``: the same signed contract run again as jobs of
their own, each compared with the original, measurement by measurement and evidence file by
evidence file.

``contracts/replay-report.schema.json`` is generated from these models; they hold no logic beyond
their fields. The comparison is :mod:`runner.results.replay`'s; the runs are
:mod:`runner.app.replay`'s. The report is written to the original job's
``record/replays.json``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runner.models.envelope import Failure, Status

__all__ = [
    "REPORT_FILE",
    "EvidenceComparison",
    "EvidenceHash",
    "FirstDifference",
    "MeasurementComparison",
    "MeasurementValue",
    "ReplayLink",
    "ReplayReport",
    "ReplayRun",
    "Value",
]

REPORT_FILE = "replays.json"
"""The report's name in the original job's ``record/`` (``runner replay`` writes it, ``runner
report`` shows it)."""

Value = bool | int | float | str
"""A measurement's value as its parser read it (the envelope's ``MeasurementResult.value``)."""


class _Model(BaseModel):
    # A value that is not a finite number (never one a parser gives; an envelope edited by hand
    # may hold one) is written "NaN", "Infinity" or "-Infinity", never as a bare NaN (not JSON)
    # nor as null (which here means "not read").
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


class ReplayRun(_Model):
    """One of the runs compared: the original job (run 0) or one of its replays (1, 2 ...)."""

    run: int = Field(description="0: the original job; 1, 2 ...: the replays, in the order run.")
    jobId: str | None = Field(description="The run's job id; null when it never became a job.")
    jobDir: str | None = Field(description="The run's job folder; null when none was made.")
    status: Status | None = Field(
        description="Its envelope's status; null when the run left no envelope."
    )
    failure: Failure | None = Field(
        default=None, description="Its envelope's failure (category, stage, reason), if any."
    )
    failed: bool = Field(
        description="The run did not succeed: its envelope says failed or partial, or it left "
        "none, or it ran another contract than the original (see problem)."
    )
    problem: str | None = Field(
        default=None,
        description="What kept the run from being compared in full: no envelope, another "
        "contract, a runner error.",
    )
    contractDigest: str | None = Field(
        default=None, description="The contract its envelope says ran (must be the original's)."
    )
    runSeconds: float | None = Field(
        default=None, description="How long its container ran (the envelope's timings)."
    )


class MeasurementValue(_Model):
    """One run's value of one measurement."""

    run: int = Field(description="The run (0: the original).")
    value: Value | None = Field(
        description="The value its parser read; null when it was not read (see missing)."
    )
    missing: str | None = Field(
        default=None,
        description="Why there is no value: the measurement error's category "
        "(missing_evidence, parse_error), or 'run failed' for a run with no envelope.",
    )


class MeasurementComparison(_Model):
    """One measurement of the contract across every run."""

    measurementId: str
    metric: str
    unit: str
    values: list[MeasurementValue] = Field(description="Each run's value, the original first.")
    identical: bool = Field(
        description="Every run read the same value (numbers by value, so 1 and 1.0 are the "
        "same; true and 1 are not; NaN equals NaN); a value missing in one run and not in "
        "another is a difference."
    )
    min: Value | None = Field(
        description="The least value read (numbers by value, strings by code point, false "
        "before true); null when none was read or the values are of different kinds."
    )
    max: Value | None = Field(description="The greatest value read; as min.")
    range: int | float | None = Field(
        description="Numbers only: max - min (exact for integers); null for other kinds, when "
        "fewer than one number was read, or when a value is not finite."
    )
    relativeSpread: float | None = Field(
        description="Numbers only: range / |mean of the values|; 0 when they are all equal; "
        "null when the mean is 0 and they differ, or as range."
    )
    firstDifferentRun: int | None = Field(
        description="The first replay whose value differs from the original's; null: none."
    )


class EvidenceHash(_Model):
    """One run's evidence file, as its envelope's evidence records hash it."""

    run: int = Field(description="The run (0: the original).")
    sha256: str | None = Field(
        description="sha256:<hex> of the file as its parser read it; null when no measurement "
        "of that run read it (missing, unparseable, or the run failed)."
    )
    size: int | None = Field(default=None, description="Its size in bytes, when read.")


class EvidenceComparison(_Model):
    """One evidence file the contract's measurements read, across every run."""

    path: str = Field(description="Relative to the job's output folder.")
    measurementIds: list[str] = Field(description="The measurements read from it.")
    hashes: list[EvidenceHash] = Field(description="Each run's hash, the original first.")
    identical: bool = Field(
        description="Every run's file has the same bytes (the same sha256); a file read in one "
        "run and not in another is a difference."
    )
    firstDifferentRun: int | None = Field(
        description="The first replay whose file differs from the original's; null: none."
    )


class FirstDifference(_Model):
    """What differed first, in the contract's order: each measurement, then its evidence file
    (each file where a measurement first names it)."""

    kind: Literal["measurement", "evidence"] = Field(
        description="A measurement's value, or an evidence file's bytes."
    )
    measurementId: str | None = Field(description="The measurement (kind measurement).")
    path: str | None = Field(description="The evidence file (kind evidence).")
    run: int = Field(description="The first replay in which it differs from the original.")
    jobId: str | None = Field(description="That replay's job id.")
    detail: str = Field(description="A sentence for a person: what it was, what it became.")


class ReplayLink(_Model):
    """``record/replay-of.json`` of a replay's job folder: which job it replays."""

    schemaVersion: Literal["1.0"] = Field(default="1.0", description="This format's version.")
    kind: Literal["runner.replay-of"] = Field(
        default="runner.replay-of", description="What this document is."
    )
    replayOf: str = Field(description="The original job's id.")
    originalJobDir: str = Field(description="The original job's folder.")
    contractDigest: str = Field(description="The contract both ran.")
    run: int = Field(description="Which replay of that `runner replay` this is (1, 2 ...).")
    startedAt: str = Field(description="When that `runner replay` began (UTC, ISO 8601).")


class ReplayReport(_Model):
    """How reproducible a job's result is: its contract run again, each value and each evidence
    file compared with the original's (``record/replays.json`` of the original job)."""

    schemaVersion: Literal["1.0"] = Field(default="1.0", description="This format's version.")
    kind: Literal["runner.replay-report"] = Field(
        default="runner.replay-report", description="What this document is."
    )
    runnerVersion: str = Field(description="The runner that wrote it.")
    jobId: str = Field(description="The original job's id.")
    jobDir: str = Field(description="The original job's folder.")
    contractName: str | None = Field(default=None, description="The contract's `name`.")
    contractDigest: str = Field(description="The contract every run ran (its digest).")
    signed: bool = Field(description="The contract is signed (and verified on each replay).")
    startedAt: str = Field(description="When the replays began (UTC, ISO 8601).")
    finishedAt: str | None = Field(
        description="When the last replay ended; null while they run (the report is rewritten "
        "after each)."
    )
    times: int = Field(description="How many replays were asked for (--times).")
    complete: bool = Field(description="Every replay asked for has run (or failed).")
    replays: list[str] = Field(
        description="The replays' job ids, in order (their folders are in runs)."
    )
    earlierReplays: list[str] = Field(
        default_factory=list,
        description="The job ids of the replays earlier `runner replay` calls ran of this job "
        "(their reports are kept as record/replays-<time>.json).",
    )
    runs: list[ReplayRun] = Field(description="The original (run 0), then each replay.")
    failedReplays: list[int] = Field(
        description="The replays (by run) that failed where the original did not, or left no "
        "envelope, or ran another contract."
    )
    identical: bool = Field(
        description="Every replay ran, and every measurement and every evidence file is "
        "identical to the original's."
    )
    measurements: list[MeasurementComparison] = Field(
        description="Each measurement of the contract, in its order."
    )
    evidence: list[EvidenceComparison] = Field(
        description="Each evidence file the measurements read, in the contract's order."
    )
    firstDifference: FirstDifference | None = Field(
        description="What differed first in the contract's order; null when nothing did."
    )
    summary: str = Field(description="One sentence for a person.")
