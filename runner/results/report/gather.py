"""What a report shows, as plain data, from a job folder or from a bundle.

:func:`from_job` reads a finished job's folder: its envelope (validated), the ledger's attempts,
an excerpt of each measurement's evidence, and whether its signed result verifies
(:func:`runner.results.attest.verify_result`, the check of `runner verify result`).
:func:`from_bundle` has the bundle checked by :func:`runner.results.bundle.verify.verify` (the
check of `runner verify bundle`, which unpacks it once, with its caps) and reads the same from
the unpacked bag meanwhile. Nothing here talks to an engine. Every file of the run is read as
hostile: under a cap, never through a link (:mod:`runner.core.safefs`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runner.core import safefs
from runner.core.errors import BundleInvalid, RefusedError, SignatureInvalid
from runner.core.redaction import NONE, Redactor
from runner.models.envelope import ResultEnvelope
from runner.models.replay import REPORT_FILE, ReplayReport
from runner.models.resources import ResourceRecord
from runner.results.report.excerpt import Excerpt, excerpt
from runner.results.report.markup import ROWS_CAP
from runner.state import ledger
from runner.trust.signing import TrustedKey

__all__ = [
    "ENVELOPE_CAP",
    "EXCERPTS_CAP",
    "REPLAY_CAP",
    "SERIES_CAP",
    "SERIES_POINTS_CAP",
    "Check",
    "ReportData",
    "Verification",
    "from_bundle",
    "from_job",
    "replay_of",
    "resources_of",
]

ENVELOPE_CAP = 64 * 1024 * 1024
"""The most bytes of result.json read (as `runner verify bundle` reads it)."""
LEDGER_CAP = 64 * 1024 * 1024
EXCERPTS_CAP = 200
"""Measurements whose evidence is read for an excerpt, at most (the page shows as many): an
envelope naming a thousand measurements of one big file reads no more than this many times."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """ok, failed, unverified or not run."""
    detail: str


@dataclass(frozen=True)
class Verification:
    """Whether the run's signatures (and files) verify, and by which check."""

    how: str
    """The check that ran: `runner verify result` or `runner verify bundle`."""
    valid: bool
    summary: str
    checks: tuple[Check, ...] = ()
    signed_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportData:
    """Everything a report page shows; each section renders from a part of it."""

    source: str
    """What it was made from: the job folder or the bundle, as given."""
    kind: str
    """``job`` or ``bundle``."""
    envelope: dict[str, Any]
    """The envelope, validated (:class:`ResultEnvelope`), as JSON data."""
    excerpts: dict[str, Excerpt]
    """measurementId -> its evidence's excerpt."""
    verification: Verification
    attempts: list[dict[str, Any]]
    """One per attempt: attempt, seconds, classification, how, host, startedAt (from the
    envelope's attempts, their start time from the ledger when it has it)."""
    resources: list[dict[str, Any]] = field(default_factory=list)
    """Per-attempt resource figures, where the envelope has them (:func:`resources_of`)."""
    replay: dict[str, Any] | None = None
    """A replay's reproducibility summary (`runner replay`), when one is given."""


def _envelope(root: Path, rel: str) -> tuple[ResultEnvelope, dict[str, Any]]:
    try:
        with safefs.open_under(root, rel) as f:
            raw = f.read(ENVELOPE_CAP + 1)
    except safefs.UnsafePath as exc:
        raise RefusedError(
            f"{root / rel} {exc.problem}",
            hint="a report is of a finished job: `runner job status JOB` says where it is",
        ) from None
    if len(raw) > ENVELOPE_CAP:
        raise RefusedError(f"{root / rel} is over {ENVELOPE_CAP:,} bytes: not an envelope")
    try:
        model = ResultEnvelope.model_validate_json(raw)
    except ValidationError as exc:
        raise RefusedError(
            f"{root / rel} is not a result envelope: {str(exc).splitlines()[0]}"
        ) from None
    return model, model.model_dump(mode="json")


def _attempts(envelope: ResultEnvelope, ledger_path: Path) -> list[dict[str, Any]]:
    started: dict[int, str] = {}
    try:  # a regular file, no link followed (not one to /dev/zero, nor a FIFO), capped
        with safefs.open_under(ledger_path.parent, ledger_path.name) as f:
            raw = f.read(LEDGER_CAP + 1)
        if len(raw) <= LEDGER_CAP:
            for a in ledger.state_of(raw).attempts:
                started[a.number] = a.starting_at.isoformat()
    except (safefs.UnsafePath, OSError, ValueError):
        pass
    return [
        {
            "attempt": a.attempt,
            "seconds": a.seconds,
            "classification": a.classification,
            "how": a.how,
            "host": a.host,
            "startedAt": started.get(a.attempt),
        }
        for a in envelope.attempts
    ]


SERIES_CAP = 4 * 1024 * 1024
"""The most of one attempt's ``record/attempts/<n>/resources.json`` read (256 points fit)."""

SERIES_POINTS_CAP = 2000
"""The most points of one series kept (and drawn); the series of at most
:data:`~runner.results.report.markup.ROWS_CAP` attempts are read (the page draws as many):
an envelope naming one big record for a thousand attempts reads it no more often."""

_SERIES_PATH = re.compile(r"record/attempts/[0-9]{1,6}/resources\.json")
_CAPS = {"memoryBytes": "memoryLimitBytes", "pids": "pidsLimit"}
"""A curve of the series -> the figure that is its cap."""


def _series(job: Path, rel: object) -> list[dict[str, Any]] | None:
    """An attempt's series (``record/attempts/<n>/resources.json`` below ``job``, as the
    envelope names it) as samples ``{t, cpuSeconds, memoryBytes, ...}``: read without following
    a link, capped, and only when it is a resource record; None otherwise."""
    if not isinstance(rel, str) or not _SERIES_PATH.fullmatch(rel):
        return None
    folder, _, name = rel.rpartition("/")
    try:
        with safefs.open_under(job / folder, name) as f:
            raw = f.read(SERIES_CAP + 1)
        if len(raw) > SERIES_CAP:
            return None
        series = ResourceRecord.model_validate_json(raw).series
    except (safefs.UnsafePath, OSError, ValidationError):
        return None
    curves: dict[str, list[float | None] | list[int | None]] = {
        "cpuSeconds": series.cpuSeconds,
        "memoryBytes": series.memoryBytes,
        "ioReadBytes": series.ioReadBytes,
        "ioWriteBytes": series.ioWriteBytes,
        "pids": series.pids,
    }
    return [
        {"t": t, **{k: v[i] for k, v in curves.items() if i < len(v) and v[i] is not None}}
        for i, t in enumerate(series.t[:SERIES_POINTS_CAP])
    ]


def resources_of(envelope: Mapping[str, Any], job: Path | None = None) -> list[dict[str, Any]]:
    """Per-attempt resource figures the envelope carries (``attempts[].resources``), with the
    attempt's number, its caps (``caps``: each curve's, from the figures) and, when ``job`` is
    the folder beside the envelope, its time series (``series``: samples with a time ``t``).
    Empty when the envelope records none (the page then leaves the section out)."""
    out: list[dict[str, Any]] = []
    for a in envelope.get("attempts") or []:
        res = a.get("resources") if isinstance(a, Mapping) else None
        if not isinstance(res, Mapping):
            continue
        figures = {k: v for k, v in res.items() if k != "series"}
        caps = {curve: res.get(cap) for curve, cap in _CAPS.items() if res.get(cap) is not None}
        shown: dict[str, Any] = {"attempt": a.get("attempt"), **figures, "caps": caps}
        read = job is not None and len(out) < ROWS_CAP
        samples = _series(job, res.get("series")) if read and job is not None else None
        if samples:
            shown["series"] = samples
        out.append(shown)
    return out


_WITHHELD = " is withheld from export: "
"""How the envelope's warnings name a file the run withheld (``output/<path> is withheld
from export: <why>``: :func:`runner.execution.agent_run.withhold`)."""


def _withheld(envelope: ResultEnvelope, listed: Mapping[str, str]) -> dict[str, str]:
    """``{output/<path>: why}`` of the files the run withheld from export: those its
    ``record/withheld.json`` lists (``listed``) and those its envelope's warnings name."""
    held = {
        posixpath.normpath(path): why.removeprefix("is withheld: ") for path, why in listed.items()
    }
    for w in envelope.warnings:
        path, sep, why = w.partition(_WITHHELD)
        if sep and path.startswith("output/"):
            held.setdefault(posixpath.normpath(path), why)
    return held


def _excerpts(
    envelope: ResultEnvelope,
    output: Path,
    beside: Mapping[str, Path] | None = None,
    *,
    withheld: Mapping[str, str] | None = None,
    redact: Redactor = NONE,
) -> dict[str, Excerpt]:
    """An excerpt of each measurement's evidence, none of a file the run withheld from export
    (it holds an agent's secret: the page says so and why), each redacted whole by the job's
    step ``redact`` before it is cut; none at all when that step is blind."""
    held = _withheld(envelope, withheld or {})
    out: dict[str, Excerpt] = {}
    for m in envelope.measurements[:EXCERPTS_CAP]:
        rel = m.evidence.path
        blob = (beside or {}).get("data/output/" + rel)
        # a contract may spell the path another way than the run listed it (./x, a//b)
        why = held.get(posixpath.normpath("output/" + rel)) or held.get(
            posixpath.normpath("output/" + redact.text(rel))
        )
        if redact.blind is not None:
            problem = f"not shown: {redact.blind}"
            out[m.measurementId] = Excerpt(rel, problem=problem)
        elif why is not None:
            problem = f"withheld from export, so not shown: {why}"
            out[m.measurementId] = Excerpt(rel, problem=problem)
        elif output.is_dir() or blob is not None:
            out[m.measurementId] = excerpt(output, rel, m.value, beside=blob, redact=redact)
        else:
            out[m.measurementId] = Excerpt(rel, problem="no output folder beside the envelope")
    return out


REPLAY_CAP = 16 * 1024 * 1024
"""The most of a job's ``record/replays.json`` read (20 replays of 1,000 measurements fit)."""


def replay_of(root: Path) -> dict[str, Any] | None:
    """The job's last ``runner replay`` report (``record/replays.json``), as JSON data; None
    when it has none, a ``{"problem": ...}`` when the file is not one (read without following
    a link, capped)."""
    try:
        with safefs.open_under(root / "record", REPORT_FILE) as f:
            raw = f.read(REPLAY_CAP + 1)
    except (safefs.UnsafePath, OSError):
        return None
    if len(raw) > REPLAY_CAP:
        return {"problem": f"record/{REPORT_FILE} is over {REPLAY_CAP:,} bytes: not shown"}
    try:
        return ReplayReport.model_validate_json(raw).model_dump(mode="json")
    except ValidationError as exc:
        first = str(exc).splitlines()[0]
        return {"problem": f"record/{REPORT_FILE} is not a replay report: {first}"}


def from_job(
    root: Path,
    keys: list[TrustedKey],
    *,
    replay: dict[str, Any] | None = None,
    redaction: Callable[[str | None], Redactor] | None = None,
) -> ReportData:
    """The report of the finished job in the folder ``root``; its signed result checked
    against the runner ``keys``; its replays' report (``runner replay``) when it has one and
    ``replay`` gives none. ``redaction``: the job's redaction step, given the agent runtime
    its envelope names (its secrets, checked against what its attempts were given:
    :func:`runner.app.regrade.redaction`), which every excerpt of its evidence goes through;
    blind, no excerpt is shown. No excerpt is shown of a file the run withheld from export,
    nor any when its list of them cannot be read."""
    from runner.results import attest
    from runner.results.bundle.export import withheld
    from runner.state.jobdir import JobDir

    model, data = _envelope(root, attest.ENVELOPE_FILE)
    try:
        verified = attest.verify_result(root, keys)
        verification = Verification(
            "runner verify result",
            True,
            f"the signed result verifies ({len(verified.statements)} statements, "
            f"{verified.checked} of {verified.signed} signed output files match)",
            tuple(Check("note", "ok", n) for n in verified.notes),
            verified.keyids,
        )
    except SignatureInvalid as exc:
        verification = Verification(
            "runner verify result", False, f"the signed result does not verify: {exc.message}"
        )
    redact = NONE if redaction is None else redaction(model.agent.runtime if model.agent else None)
    try:
        listed = withheld(JobDir(root))
    except BundleInvalid as exc:  # what the run could not redact, or no readable list
        redact = redact.blinded(exc.message) if redact.blind is None else redact
        listed = {}
    return ReportData(
        source=str(root),
        kind="job",
        envelope=data,
        excerpts=_excerpts(model, root / "output", withheld=listed, redact=redact),
        verification=verification,
        attempts=_attempts(model, root / "record" / "ledger.jsonl"),
        resources=resources_of(data, root),
        replay=replay if replay is not None else replay_of(root),
    )


def from_bundle(
    archive: Path,
    keys: Any,
    *,
    blobs: Path | None = None,
    max_total: int = 64 * 1024 * 1024 * 1024,
    allow_untrusted: bool = False,
    replay: dict[str, Any] | None = None,
) -> ReportData:
    """The report of the run in the bundle ``archive``, checked as `runner verify bundle`
    checks it with ``keys`` (:class:`runner.results.bundle.verify.Keys`; ``allow_untrusted``
    as there). Raises
    :class:`BundleInvalid` when it holds no envelope to show."""
    from runner.results.bundle.verify import verify

    found: dict[str, Any] = {}

    def inspect(top: Path, beside: Mapping[str, Path]) -> None:
        job = top / "data"
        try:
            model, data = _envelope(top, "data/result.json")
        except RefusedError as exc:
            found["problem"] = exc.message
            return
        found["envelope"] = data
        found["excerpts"] = _excerpts(model, job / "output", beside)
        found["attempts"] = _attempts(model, job / "record" / "ledger.jsonl")
        found["resources"] = resources_of(data, job)

    report = verify(
        archive,
        keys=keys,
        blobs=blobs,
        allow_untrusted=allow_untrusted,
        max_total=max_total,
        inspect=inspect,
    )
    if "envelope" not in found:
        first = report.problems[0] if report.problems else found.get("problem", "no envelope")
        raise BundleInvalid(
            f"{archive}: no run to show: {first}",
            hint=f"`runner verify bundle {archive}` lists every check",
        )
    verification = Verification(
        "runner verify bundle",
        report.valid,
        "the bundle verifies: every file, signature, the ledger and every value"
        if report.valid
        else f"the bundle does not verify: {report.problems[0]}",
        tuple(Check(c.name, c.status, c.detail) for c in report.checks),
    )
    return ReportData(
        source=str(archive),
        kind="bundle",
        envelope=found["envelope"],
        excerpts=found["excerpts"],
        verification=verification,
        attempts=found["attempts"],
        resources=found["resources"],
        replay=replay,
    )
