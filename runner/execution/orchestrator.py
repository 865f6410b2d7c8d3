"""The one module that sequences the stages:

contract → policy → plan → stage → image → container → parsers → envelope.

Every path out of :func:`run` — success, a refusal, a job failure, an engine failure, Ctrl-C —
ends in a :class:`~runner.models.envelope.ResultEnvelope`. Once the job directory exists the
envelope
is also written there (``result.json``), atomically.

Stages take values and return values: what the run knows so far is a frozen
:class:`~runner.execution.stages.Known`, and a stage that fails raises
:class:`~runner.execution.stages.Stopped` with its name and what was known, from which the envelope
of
the failed run is built. The attempt itself (resume or new) is :mod:`runner.execution.attempt`, the
classification of its end :mod:`runner.execution.outcome`, the envelope
:func:`runner.results.envelope.build`.

Long on purpose: the whole sequence, with every way out of it ending in an envelope (the
inputs re-hashed after the run, the agent's secrets redacted before anything is hashed),
reads top to bottom in one place; each step is a call into the module that owns it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import backends
from runner.backends.base import Backend, Mount
from runner.caches import inputcache
from runner.contract import VerifiedContract, load_contract
from runner.core import errors, log, redaction, safefs
from runner.core.errors import Category, JobAlreadyFinished, JobBusy, PolicyViolation, RunnerError
from runner.evidence import read as evidence
from runner.evidence import selfreport
from runner.execution import agent_run, attempt, container, records, resources
from runner.execution.container import Progress
from runner.execution.options import RunOptions
from runner.execution.outcome import classify, inputs_changed
from runner.execution.stages import Clock, Known, Logged, Silent, Stopped, log_end, now_iso, stage
from runner.models.envelope import (
    BudgetRecord,
    DiskRecord,
    Failure,
    FileRef,
    InputRecord,
    PolicyRecord,
    ResultEnvelope,
    Stage,
    Status,
)
from runner.planning import plan, policy
from runner.planning.allocation import check_allocation
from runner.planning.plan import ExecutionPlan
from runner.results import attest
from runner.results.envelope import build
from runner.staging import jobdir as staging
from runner.state.jobdir import JobDir, atomic_write
from runner.state.ledger import Ledger, LedgerCorrupt, read_state

if TYPE_CHECKING:  # imported where a job uses it: a job without one never does
    from runner.caches import assets

__all__ = ["RunOptions", "as_json", "ended_early", "failure_exit_family", "refused", "run"]


def run(
    contract_path: Path,
    options: RunOptions,
    *,
    backend: Backend | None = None,
    progress: Progress | None = None,
) -> ResultEnvelope:
    """Run the job the contract at ``contract_path`` describes; always return an envelope.

    A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM turned into one by the CLI) stops the container
    and yields an envelope with the ``cancelled`` category.
    """
    clock = Clock.start()
    try:
        envelope = _run(contract_path, options, backend, progress or Silent(), clock)
        log_end(envelope)
        return envelope
    except Stopped as stopped:
        envelope = _envelope(stopped.known, options, clock, _failure(stopped.stage, stopped.cause))
        plan, job, cause = stopped.known.plan, stopped.known.job, stopped.cause
        redact = redaction.NONE
        if plan is not None:  # checked against what each attempt was given, as at an end
            redact = agent_run.redactor(plan, None, agent_run.ledger_state(job))
        envelope = agent_run.redacted(redact, envelope)  # an agent's secrets: out of it too
        # A busy or finished job's envelope, or a ledger we may not touch, is not ours.
        if (
            job is not None
            and not stopped.known.written
            and not isinstance(cause, JobAlreadyFinished | JobBusy | LedgerCorrupt)
        ):
            agent_run.redact_records(redact, job)
            envelope = agent_run.withhold(redact, job, envelope)
            write_envelope(job, envelope)
        log_end(envelope)
        return envelope


def _run(
    contract_path: Path,
    opts: RunOptions,
    backend: Backend | None,
    progress: Progress,
    clock: Clock,
) -> ResultEnvelope:
    """contract → policy → plan → the job folder, under its lock."""
    progress = Logged(progress)
    known = Known()
    with stage("contract", known):
        contract = load_contract(contract_path, opts.trust)
    known = replace(known, contract=contract)
    signer = (
        "signed by " + ", ".join(k[:19] + "…" for k in contract.signature.keyids)
        if contract.signature
        else "UNSIGNED"
    )
    progress.stage("contract", f"{contract.model.name} ({contract.digest[:19]}…) {signer}")
    with stage("contract", known):
        allow = opts.policy.policy.allowJobIdOverride
        job_id = plan.job_id_for(contract, opts.job_id, allow_override=allow)
    progress = Logged(progress.inner, job_id)
    with stage("policy", known):
        # A job this host already accepted may be resumed (or shown) after its contract
        # expires: validity times are checked when a job is accepted (and before any new
        # attempt), not at every restart.
        ledger_path = opts.state.job(job_id).ledger
        accepted = read_state(ledger_path).accepted if ledger_path.exists() else None
        resuming = accepted is not None and accepted.get("contractDigest") == contract.digest
        plan.check_mode(contract, opts.policy.policy)
        policy.check(contract, opts.policy.policy, datetime.now(UTC), check_times=not resuming)
    if contract.signature is None:
        unsigned = (
            "signature: none. The contract was not signed; it ran only because this host "
            "accepts unsigned contracts (local development)."
        )
        known = replace(known, warnings=(*known.warnings, unsigned))
        progress.stage("policy", "WARNING: unsigned contract accepted (local development)")
    with stage("plan", known):
        p = plan.build(
            contract,
            opts.policy.policy,
            job_id=job_id,
            host_uid=os.getuid(),
            host_gid=os.getgid(),
            labels=opts.labels,
            overrides=opts.overrides,
        )
        check_allocation(p.limits, os.environ)  # under Slurm: caps within the allocation
    known = replace(known, plan=p, gpu_fallback=p.gpu_fallback)
    with stage("plan", known):
        backend = backend or backends.default(opts.policy.policy.engine)
        backend.check_limits(p.limits)  # an engine that would drop a cap: refused, nothing made
    with stage("stage", known):
        job = staging.prepare(opts.state.job(p.job_id).root)
        with job.locked():
            return _locked(
                contract, p, job, backend, opts, progress, clock, replace(known, job=job)
            )


def _locked(
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: JobDir,
    backend: Backend,
    opts: RunOptions,
    progress: Progress,
    clock: Clock,
    known: Known,
) -> ResultEnvelope:
    """The ledger's verdict (accept, replay, rerun), one attempt, its end, the evidence."""
    with stage("stage", known):
        ledger = Ledger.open(job.ledger)
        limit = _admit(ledger, contract, p, job, opts)
        if ledger.state.finished is not None and not opts.rerun:
            progress.stage(
                "job", f"{p.job_id} already finished; this is its envelope (--rerun runs it again)"
            )
            return ResultEnvelope.model_validate_json(job.envelope.read_bytes())
        if ledger.state.finished is not None:
            _rerun(ledger, contract)
        _archive_envelope(job)
        mounts = _assets(contract, job, opts, progress)
    aj = attempt.Job(contract, p, job, backend, opts, ledger, limit, progress, mounts)
    got = attempt.run(aj, known)
    known = replace(got.known, outcome=got.outcome)
    if known.gpu_fallback:
        known = replace(known, warnings=(*known.warnings, f"ran on CPU only: {known.gpu_fallback}"))
    # one step for all it writes and signs; blind when any attempt's secrets are not known
    redact = agent_run.checked(got.redactor, p, ledger.state)
    with stage("container", known):
        failure = _record_end(got, ledger, p, job, limit)
    removal = container.Removal(backend, got.outcome.container_id or got.outcome.name)
    try:
        with stage("container", known):
            # Only now, with its end in the ledger, may the container go (see
            # container.finish); while the evidence is read, waited for before the envelope.
            removal.start()
            budget = _write_budget(ledger, job, limit)
            if attempt.had_egress(ledger, got.number):  # its allowlist goes after it
                removal.wait()
            # The attempt's egress allowlist goes once its container has: the proxy's log is
            # kept.
            eg = attempt.egress_down(backend, ledger, job, got.number, redact)
            known = replace(known, egress=eg)
        agent, usage = agent_run.records(p, ledger.state, got.number, job)  # (None, None): none
        known = replace(known, budget=budget, agent=agent, agent_usage=usage)
        with stage("parsers", known):
            with redaction.quoting(redact):  # what a reason quotes of the job's: redacted whole
                envelope = _read_evidence(got, contract, p, job, opts, clock, known, failure)
            # What the runner keeps of each attempt (an earlier one's too, when a crash ended
            # it), the output manifest just written included, redacted before it is hashed.
            agent_run.redact_records(redact, job)
            kept = records.attempt_records(ledger.state, job, _max_evidence(opts))
            envelope = envelope.model_copy(
                update={"attempts": kept, "resources": resources.totals(kept)}
            )
            envelope = agent_run.withhold(redact, job, envelope)
            ledger.check_owned()  # fenced meanwhile (another host took the job over): not ours
    except BaseException as exc:
        removal.wait_quietly(exc)  # what failed here is what the run says
        raise
    with stage("container", known):
        removal.wait()
    write_envelope(job, envelope)
    known = replace(known, written=True)
    with stage("envelope", known):
        if opts.result_key is not None:
            attest.sign_result(envelope, job.root, opts.result_key)
        final = failure.category if failure and failure.stage == "container" else "succeeded"
        if final in attempt.FINAL:
            digest = hashlib.sha256(job.envelope.read_bytes()).hexdigest()
            ledger.append(
                f"job.finished-{ledger.state.reruns}",
                "job.finished",
                {"status": envelope.status, "envelopeSha256": f"sha256:{digest}"},
            )
    return envelope


def _assets(
    contract: VerifiedContract, job: JobDir, opts: RunOptions, progress: Progress
) -> tuple[Mount, ...]:
    """The contract's assets from the cache (fetched first where the policy allows)."""
    if not contract.model.fetched_assets:
        return ()
    from runner.caches import assets

    def fetched(got: assets.Fetched) -> None:
        how = "cached" if got.cached else f"fetched {got.downloaded:,} bytes"
        progress.stage("assets", f"{got.id} {got.sha256[:19]}… ({how})")

    cache, grant = assets.AssetCache.of_state(opts.state.root), opts.policy.policy.assets
    return tuple(assets.stage(job, contract, cache, grant, on_fetched=fetched))


def _admit(
    ledger: Ledger, contract: VerifiedContract, p: ExecutionPlan, job: JobDir,
    opts: RunOptions,
) -> float:  # fmt: skip
    """Accept the job in its ledger (or check it is this contract's); its budget in seconds."""
    st = ledger.state
    if st.accepted is None:
        data = {
            "jobId": p.job_id,
            "contractDigest": contract.digest,
            "limitSeconds": p.limits.timeout_seconds,
        }
        ledger.append("job.accepted", "job.accepted", data)
    elif st.accepted.get("contractDigest") != contract.digest:
        raise JobAlreadyFinished(
            f"job id {p.job_id} belongs to another contract ({st.accepted.get('contractDigest')})"
            " on this host",
            hint="give this contract its own --job-id",
        )
    if st.finished is not None and not opts.rerun and not job.envelope.exists():
        raise JobAlreadyFinished(
            f"job {p.job_id} finished on this host but its result.json is gone",
            hint="restore it from record/ (earlier envelopes are kept there), or run the job "
            "again on purpose with --rerun",
        )
    return min(ledger.state.limit, p.limits.timeout_seconds)


def _rerun(ledger: Ledger, contract: VerifiedContract) -> None:
    """Reopen a finished job for a new attempt under the same budget (never after expiry)."""
    try:
        policy.refuse_expired(contract, datetime.now(UTC), what=attempt.NO_NEW_ATTEMPT)
    except PolicyViolation as exc:  # refused; the finished job's envelope stays as it is
        raise JobAlreadyFinished(exc.message, hint=exc.hint) from None
    n = ledger.state.reruns + 1
    ledger.append(f"job.rerun-{n}", "job.rerun", {"rerun": n})


def _record_end(
    got: attempt.AttemptResult,
    ledger: Ledger,
    p: ExecutionPlan,
    job: JobDir,
    limit: float,
) -> Failure | None:
    """Classify the attempt's end and put it in the ledger (its container may go after)."""
    outcome = got.outcome
    st = ledger.state
    n = len(st.attempts)
    failure = classify(outcome, limit)
    if p.agent is not None:  # decided before the ledger says how the attempt ended
        failure = agent_run.no_model_use(p, job, n, got.guards.agent, failure)
    if failure is not None and failure.category in {Category.NONZERO_EXIT, Category.OOM}:
        tail = _tail(job.output, p.stderr_path)
        where = f"{job.output / p.stderr_path}"
        reason = f"{failure.reason} ({where}" + (f"; it ends: {tail})" if tail else ")")
        failure = failure.model_copy(update={"reason": reason})
    if outcome.how != "ledger":
        ledger.append(
            f"attempt-{n}.finished",
            "attempt.finished",
            {
                "attempt": n,
                "exitCode": outcome.state.exit_code,
                "oomKilled": outcome.state.oom_killed,
                "classification": failure.category if failure else "succeeded",
                "seconds": outcome.run_seconds,
                "how": outcome.how,
                **({"stop": outcome.stop.as_json()} if outcome.stop else {}),
            },
        )
    if p.agent is not None:  # its turns and cost, cumulative like the wall time
        failure = agent_run.recorded(ledger, p, job, got.guards.agent, outcome, failure)
    if outcome.timed_out or st.consumed >= limit:
        ledger.append(
            f"budget.exhausted-{n}",
            "budget.exhausted",
            {"consumedSeconds": round(st.consumed, 3), "limitSeconds": limit},
        )
    log.event(
        logging.INFO,
        f"attempt {n} ended: {failure.category if failure else 'succeeded'}",
        jobId=p.job_id,
        stage="container",
        attempt=n,
        category=failure.category if failure else None,
        seconds=outcome.run_seconds,
    )
    return failure


def _write_budget(ledger: Ledger, job: JobDir, limit: float) -> BudgetRecord:
    """The budget as the ledger has it after the attempt, in ``execution/`` (fsynced: the one
    left after the job, which a bundle exports) and as the envelope records it."""
    st = ledger.state
    budget = st.budget(limit)
    job.write_budget(budget)
    return BudgetRecord(**budget.as_json(), attempts=len(st.attempts))


def _read_evidence(
    got: attempt.AttemptResult,
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: JobDir,
    opts: RunOptions,
    clock: Clock,
    known: Known,
    failure: Failure | None,
) -> ResultEnvelope:
    """Trim the logs, measure the disk, read every measurement and the job's result.json:
    the run's envelope."""
    pol = opts.policy.policy
    max_bytes = int(pol.maxEvidenceMb * 1024 * 1024)
    guards = got.guards
    dropped = {str(cap.path.relative_to(job.output)): cap.compact() for cap in guards.logs}
    records.output_manifest(job, got.number)  # what output/ holds as it is read
    writer = records.writers(job, got.number)
    used = guards.disk.measure()
    disk = DiskRecord(
        quotaBytes=guards.disk.quota,
        usedBytes=used,
        peakBytes=guards.disk.peak,
        measurements=guards.disk.measurements,
    )
    warnings = list(known.warnings)
    if guards.disk.unmeasured is not None:  # the disk record's figures are then the quota + 1
        warnings.append(
            f"disk: {guards.disk.unmeasured}; what output/ and workspace/ hold is taken to be "
            "over the quota"
        )
    results, errs = evidence.read_measurements(job.output, contract, max_bytes)
    results = [
        r.model_copy(
            update={"evidence": r.evidence.model_copy(update={"attempt": writer(r.evidence.path)})}
        )
        for r in results
    ]
    logs: list[FileRef] = [
        ref.model_copy(
            update={"droppedBytes": dropped.get(ref.path, 0), "attempt": writer(ref.path)}
        )
        for ref in evidence.hash_logs(job.output, [p.stdout_path, p.stderr_path], max_bytes)
    ]
    if any(dropped.values()):
        warnings.append(
            "logs past their cap kept their first and last parts: "
            + ", ".join(f"{k} dropped {v:,} bytes" for k, v in dropped.items() if v)
        )
    checked = staging.recheck_inputs(job)
    status: Status = "failed" if failure else "succeeded"
    if failure is None and errs:
        first = errs[0]
        failure = Failure(
            category=first.category, stage="parsers", retryable=False, reason=first.reason
        )
        status = "partial" if results else "failed"
    if checked.unchanged is False:  # what ran is not what the contract binds: no result
        removed = inputcache.verify_used(inputcache.InputCache.of_state(opts.state.root), job)
        failure, status = inputs_changed(str(checked.problem), removed, failure), "failed"
    claim = selfreport.read(
        job.output,
        max_bytes,
        int(pol.maxResultKb * 1024),
        contract=contract.data,
        verdict=status,
    )
    if claim is not None and (said := selfreport.warning(claim)):
        warnings.append(said)
    return _envelope(
        replace(known, warnings=tuple(warnings)),
        opts,
        clock,
        failure,
        status=status,
        measurements=results,
        errors=errs,
        logs=logs,
        disk=disk,
        agent_result=claim,
        attempt=got.number,
        allocation=known.allocation,
        inputs=[InputRecord.model_validate(i) for i in checked.inputs],
        inputs_unchanged=checked.unchanged,
    )


def _max_evidence(opts: RunOptions) -> int:
    return int(opts.policy.policy.maxEvidenceMb * 1024 * 1024)


def _tail(output: Path, rel: str, limit: int = 300) -> str:
    """The last line or so of a log, for a failure's reason; only a regular file reached
    without following a link (never a FIFO, never through a link the job planted)."""
    try:
        with safefs.open_under(output, rel) as f:
            f.seek(max(os.fstat(f.fileno()).st_size - limit, 0))
            text = f.read(limit).decode("utf-8", "replace").strip()
    except (safefs.UnsafePath, OSError):
        return ""
    return " | ".join(text.splitlines()[-3:])[-limit:]


def _archive_envelope(job: JobDir) -> None:
    """Keep an earlier attempt's envelope under record/ before a new one is written."""
    if job.envelope.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        os.replace(job.envelope, job.record / f"result-{stamp}.json")


def _failure(at: Stage, cause: BaseException) -> Failure:
    """The failure a stage's error amounts to."""
    if isinstance(cause, RunnerError):
        return Failure(
            category=cause.category, stage=at, retryable=cause.retryable, reason=str(cause)
        )
    if isinstance(cause, KeyboardInterrupt):
        reason = f"the runner was interrupted during the {at} stage"
        return Failure(category=Category.CANCELLED, stage=at, retryable=True, reason=reason)
    reason = (
        f"the runner failed unexpectedly during the {at} stage: "
        f"{type(cause).__name__}: {cause} (a runner bug; the job is not to blame)"
    )
    return Failure(category=Category.INFRASTRUCTURE, stage=at, retryable=False, reason=reason)


def _envelope(
    known: Known, opts: RunOptions, clock: Clock, failure: Failure | None, **rest: Any
) -> ResultEnvelope:
    loaded = opts.policy
    return build(
        started_at=clock.started_at,
        finished_at=now_iso(),
        total_seconds=clock.elapsed(),
        policy=PolicyRecord(
            source=loaded.source,
            digest=loaded.digest,
            maxima=loaded.policy.maxima.model_dump(mode="json"),
            overrides=opts.overrides,
        ),
        failure=failure,
        contract=known.contract,
        plan=known.plan,
        job_dir=known.job.root if known.job else None,
        image=known.image,
        engine=known.engine,
        outcome=known.outcome,
        gpus=known.gpus,
        gpu_fallback=known.gpu_fallback,
        seconds=known.seconds,
        warnings=known.warnings,
        budget=known.budget,
        egress=known.egress,
        agent=known.agent,
        agent_usage=known.agent_usage,
        **rest,
    )


def refused(exc: RunnerError, stage: Stage) -> ResultEnvelope:
    """The envelope of a run that could not even begin (the host's own set-up failed)."""
    failure = _failure(stage, exc)
    return _envelope(Known(), RunOptions(state_dir=Path(".")), Clock.start(), failure)


def ended_early(failure: Failure) -> ResultEnvelope:
    """The envelope of a job whose runner ended before it could say more (a batch's child
    that died, or a contract a stopped batch never started)."""
    return _envelope(Known(), RunOptions(state_dir=Path(".")), Clock.start(), failure)


def write_envelope(job: JobDir, envelope: ResultEnvelope) -> None:
    atomic_write(job.envelope, (envelope.model_dump_json(indent=2) + "\n").encode())


def failure_exit_family(envelope: ResultEnvelope) -> str:
    """``succeeded`` | ``job_failed`` | ``refused`` | ``infrastructure`` | ``cancelled``."""
    return errors.exit_family(envelope.failure.category if envelope.failure else None)


def as_json(envelope: ResultEnvelope) -> dict[str, Any]:
    return envelope.model_dump(mode="json")
