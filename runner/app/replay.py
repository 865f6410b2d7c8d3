"""``runner replay JOB --times N``: a finished job's signed contract run again, N times, each as a
job of its own (a fresh folder, ledger and budget, linked to the original), then compared with
the original (:mod:`runner.results.replay`) into the reproducibility report, written to the
original's ``record/replays.json``.

The contract is the one the original ran, from its job folder: ``input/task.dsse.json`` (or,
for an unsigned run, ``input/task.json``), which the runner wrote there from the bytes it
verified and mounted read-only into the job; it is read without following a link, its digest
must be the one the original's envelope and ledger record, and each replay verifies it again
against this host's trusted issuers and policy exactly as ``runner run`` does (the host has the
last word: a contract expired since, or a policy that no longer admits it, fails the replay).
Its inputs are staged from the original's ``input/``, held to the digests the contract binds.

A replay opens a fresh ledger and budget for a signed contract, which is what ``--job-id``
does: the host allows it only with ``allowJobIdOverride`` in its policy. The original is held
under its lock for the whole replay (no rerun of it, no second replay beside it). The report is
rewritten after each replay, so a replay stopped halfway leaves what ran so far (``complete``
false).
"""

from __future__ import annotations

import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from runner import _version
from runner.backends.base import Backend
from runner.contract import VerifiedContract, load_contract
from runner.contract.models import JOB_ID_PATTERN
from runner.core import safefs
from runner.core.errors import Category, PolicyViolation, RefusedError
from runner.execution import orchestrator
from runner.execution.container import Progress
from runner.execution.options import RunOptions
from runner.models.envelope import ResultEnvelope
from runner.models.replay import REPORT_FILE, ReplayLink, ReplayReport, ReplayRun
from runner.results import replay as compare
from runner.state.jobdir import JobDir, atomic_write
from runner.state.ledger import state_of

__all__ = [
    "MAX_TIMES",
    "Original",
    "original",
    "replay",
    "replay_id",
]

MAX_TIMES = 20
"""The most replays one ``runner replay`` runs (``--times``)."""

LINK = "replay-of.json"
"""A replay's link to its original, in the replay's ``record/``."""
MAX_ENVELOPE_BYTES = 64 * 1024 * 1024
MAX_LEDGER_BYTES = 256 * 1024 * 1024
"""The most of the original's ledger read (a heartbeat every 5 s for months fits)."""


@dataclass(frozen=True)
class Original:
    """The job replayed: its folder, its envelope, its contract (verified) and where that is."""

    job: JobDir
    envelope: ResultEnvelope
    contract: VerifiedContract
    contract_path: Path


def _refused(message: str, hint: str) -> RefusedError:
    return RefusedError(message, hint=hint)


def original(root: Path, options: RunOptions) -> Original:
    """The finished job at ``root`` and the contract it ran, checked: its envelope, its ledger's
    contract, and its staged contract verified against this host's trusted issuers."""
    job = JobDir(root)
    try:
        with safefs.open_under(job.root, "result.json") as f:
            raw = f.read(MAX_ENVELOPE_BYTES + 1)
    except (safefs.UnsafePath, OSError) as exc:
        why = exc.problem if isinstance(exc, safefs.UnsafePath) else exc.strerror
        raise _refused(
            f"{job.envelope} cannot be read ({why}): the job has no result to replay",
            "replay a job that ran to an end (`runner job status JOB` shows where it stands)",
        ) from None
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _refused(f"{job.envelope} is over {MAX_ENVELOPE_BYTES:,} bytes", "check the job")
    envelope = ResultEnvelope.model_validate_json(raw)
    digest = envelope.contractDigest
    if digest is None or envelope.jobId is None:
        raise _refused(
            f"{job.envelope} records no contract: the run was refused before it had a job",
            "replay a job that ran (its envelope names its contract and job id)",
        )
    try:  # as hostile as the rest of the folder: a regular file, no link followed, capped
        with safefs.open_under(job.record, job.ledger.name) as f:
            data = f.read(MAX_LEDGER_BYTES + 1)
        state = state_of(data) if len(data) <= MAX_LEDGER_BYTES else None
    except (safefs.UnsafePath, OSError):
        state = None
    accepted = (state.accepted or {}).get("contractDigest") if state else None
    if accepted != digest:
        raise _refused(
            f"{job.ledger} accepted contract {accepted}, the envelope names {digest}",
            "replay a job folder the runner made and ran (its ledger and envelope agree)",
        )
    signed = envelope.signature is not None and envelope.signature.status == "verified"
    name = "task.dsse.json" if signed else "task.json"
    rel = f"input/{name}"
    try:
        st = safefs.lstat_under(job.root, rel)  # no link on the way, nor the file itself
    except safefs.UnsafePath as exc:
        raise _refused(
            f"{job.root / rel} {exc.problem}: the contract the job ran is not in its folder",
            "replay a job folder as `runner run` left it",
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise _refused(
            f"{job.root / rel} is {safefs.kind(st.st_mode)}, not a regular file: not the "
            "contract the runner staged",
            "replay a job folder as `runner run` left it",
        )
    contract = load_contract(job.root / rel, options.trust)
    if contract.digest != digest:
        raise _refused(
            f"{job.root / rel} is contract {contract.digest}; the job ran {digest}",
            "the staged contract was changed; a replay needs the contract that ran",
        )
    if signed and contract.signature is None:  # a signed run is never replayed unsigned
        raise _refused(f"{job.root / rel} is not signed", "check the job folder")
    return Original(job, envelope, contract, job.root / rel)


def replay_id(original_id: str, n: int) -> str:
    """The id of replay ``n`` of ``original_id``: ``<original>-replay-<n>``, the original's
    part cut so the id stays within a job id's 128 characters."""
    suffix = f"-replay-{n}"
    return original_id[: 128 - len(suffix)] + suffix


def _check_policy(orig: Original, options: RunOptions) -> None:
    """A signed contract's replay runs under a job id (and a budget) of its own: only on a host
    whose policy allows job id overrides, as ``--job-id`` would be."""
    if orig.contract.signature is not None and not options.policy.policy.allowJobIdOverride:
        raise PolicyViolation(
            "a replay runs the signed contract again as a job of its own, with a fresh ledger "
            "and budget; this host's policy does not let a signed contract run under another "
            f"job id than {orig.envelope.jobId!r} (allowJobIdOverride is false"
            f" in {options.policy.source})",
            hint="set allowJobIdOverride: true in the host policy to allow replays, or run the "
            "job again under its own budget with `runner run CONTRACT --rerun`",
        )


def _reserve(options: RunOptions, original_id: str) -> tuple[str, JobDir]:
    """A fresh job folder for the next replay: made here (``mkdir``, so never one another run
    made or makes at the same moment)."""
    jobs = options.state.jobs
    jobs.mkdir(parents=True, exist_ok=True)
    for n in range(1, 100_000):
        job_id = replay_id(original_id, n)
        if not _valid_id(job_id):
            break
        try:
            (jobs / job_id).mkdir()
        except FileExistsError:
            continue
        return job_id, options.state.job(job_id)
    raise _refused(
        f"no free replay job id for {original_id!r} under {jobs}",
        "remove earlier replays' job folders",
    )


def _valid_id(job_id: str) -> bool:
    return re.fullmatch(JOB_ID_PATTERN, job_id) is not None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _earlier(job: JobDir) -> list[str]:
    """The replays of earlier reports (the last one's, which names those before it), and that
    report kept under ``record/replays-<time>.json`` for the new one to take its place."""
    path = job.record / REPORT_FILE
    try:
        with safefs.open_under(job.record, REPORT_FILE) as f:
            raw = f.read(MAX_ENVELOPE_BYTES + 1)
    except (safefs.UnsafePath, OSError):
        return []
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path.replace(job.record / f"replays-{stamp}.json")
    try:
        last = ReplayReport.model_validate_json(raw)
    except ValueError:  # not one the runner wrote (or a newer format): named by nothing
        return []
    return [*last.earlierReplays, *last.replays]


def _write(job: JobDir, report: ReplayReport) -> None:
    atomic_write(job.record / REPORT_FILE, (report.model_dump_json(indent=2) + "\n").encode())


def _report(
    orig: Original,
    runs: list[ReplayRun],
    envelopes: list[ResultEnvelope | None],
    *,
    times: int,
    started: str,
    complete: bool,
    earlier: list[str],
) -> ReplayReport:
    compared = compare.compare(
        compare.bindings(orig.contract.model),
        [compare.usable(r, e) for r, e in zip(runs, envelopes, strict=True)],
        [r.jobId for r in runs],
    )
    identical, failed, summary = compare.summary(compared, runs, times, complete=complete)
    return ReplayReport(
        runnerVersion=_version.__version__,
        jobId=orig.envelope.jobId or orig.job.root.name,
        jobDir=str(orig.job.root),
        contractName=orig.contract.model.name,
        contractDigest=orig.contract.digest,
        signed=orig.contract.signature is not None,
        startedAt=started,
        finishedAt=_now() if complete else None,
        times=times,
        complete=complete,
        replays=[r.jobId for r in runs[1:] if r.jobId is not None],
        earlierReplays=earlier,
        runs=runs,
        failedReplays=failed,
        identical=identical,
        measurements=compared.measurements,
        evidence=compared.evidence,
        firstDifference=compared.first,
        summary=summary,
    )


OnStart = Callable[[int, str], Progress]
"""Called as replay ``n`` (of job id ...) starts; the progress its run reports to."""
OnDone = Callable[[ReplayRun], None]


def replay(
    orig: Original,
    options: RunOptions,
    times: int,
    *,
    backend: Backend | None = None,
    on_start: OnStart | None = None,
    on_done: OnDone | None = None,
) -> ReplayReport:
    """Run ``orig``'s contract ``times`` more times, one job each, one after another, under the
    original's lock; the report (also written to the original's ``record/replays.json``)."""
    if not 1 <= times <= MAX_TIMES:
        raise ValueError(f"times must be 1..{MAX_TIMES}, got {times}")
    _check_policy(orig, options)
    digest = orig.contract.digest
    # The original's own limits (--limit), so each replay runs under the same caps.
    overrides = dict(orig.envelope.policy.overrides) if orig.envelope.policy else {}
    base = replace(options, replayed=orig.job.input, overrides=overrides, rerun=False)
    with orig.job.locked():
        started = _now()
        runs = [
            compare.run_record(
                0,
                orig.envelope,
                job_id=orig.envelope.jobId,
                job_dir=str(orig.job.root),
                contract_digest=digest,
            )
        ]
        envelopes: list[ResultEnvelope | None] = [orig.envelope]
        earlier = _earlier(orig.job)

        def written(complete: bool) -> ReplayReport:
            report = _report(
                orig,
                runs,
                envelopes,
                times=times,
                started=started,
                complete=complete,
                earlier=earlier,
            )
            _write(orig.job, report)
            return report

        report = written(False)  # the earlier replays stay named while these run
        try:
            for n in range(1, times + 1):
                job_id, job = _reserve(options, runs[0].jobId or orig.job.root.name)
                link = ReplayLink(
                    replayOf=runs[0].jobId or orig.job.root.name,
                    originalJobDir=str(orig.job.root),
                    contractDigest=digest,
                    run=n,
                    startedAt=started,
                )
                job.record.mkdir(parents=True, exist_ok=True)
                atomic_write(job.record / LINK, (link.model_dump_json(indent=2) + "\n").encode())
                progress = on_start(n, job_id) if on_start else None
                env = orchestrator.run(
                    orig.contract_path,
                    replace(base, job_id=job_id),
                    backend=backend,
                    progress=progress,
                )
                made = job.ledger.exists()
                if not made:  # refused before it was a job: no folder left to point at
                    shutil.rmtree(job.root, ignore_errors=True)
                run = compare.run_record(
                    n,
                    env,
                    job_id=job_id,
                    job_dir=str(job.root) if made else None,
                    contract_digest=digest,
                )
                runs.append(run)
                envelopes.append(env)
                if on_done:
                    on_done(run)
                report = written(n == times)
                if env.failure is not None and env.failure.category == Category.CANCELLED:
                    break  # Ctrl-C (or SIGTERM): the rest are not run
        except BaseException:
            written(False)  # a runner error between runs (or Ctrl-C outside one): kept so far
            raise
        return report
