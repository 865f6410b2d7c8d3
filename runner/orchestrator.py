"""The one module that sequences the stages:

contract → policy → plan → stage → image → container → parsers → envelope.

Every path out of :func:`run` — success, a refusal, a job failure, an engine failure, Ctrl-C —
ends in a :class:`~runner.envelope.ResultEnvelope`. Once the job directory exists the envelope
is also written there (``result.json``), atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from runner import (
    agent_result,
    attest,
    container,
    errors,
    evidence,
    gpus,
    images,
    plan,
    policy,
    quotas,
    safefs,
    staging,
)
from runner._version import __version__
from runner.backends.base import Backend, ContainerState
from runner.container import Outcome, Progress, Watch
from runner.contract import Trust, VerifiedContract, load_contract
from runner.envelope import (
    AgentResultRecord,
    AppliedLimits,
    BudgetRecord,
    ContainerRecord,
    DiskRecord,
    Failure,
    FileRef,
    GpuRecord,
    ImageRecord,
    MeasurementError,
    MeasurementResult,
    PolicyRecord,
    ResultEnvelope,
    SignatureRecord,
    Stage,
    Timings,
)
from runner.errors import (
    Category,
    ContainerVanished,
    GpuUnavailable,
    JobAlreadyFinished,
    JobBusy,
    PolicyViolation,
    ResourceExhausted,
    RunnerError,
)
from runner.ledger import Ledger, LedgerCorrupt, read_state
from runner.plan import ExecutionPlan
from runner.policy import LoadedPolicy


class _Silent:
    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
        pass

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def _default_policy() -> LoadedPolicy:
    return policy.load(None)


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    job_id: str | None = None
    policy: LoadedPolicy = field(default_factory=_default_policy)
    trust: Trust = field(default_factory=lambda: Trust(keys=[]))
    labels: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, float] = field(default_factory=dict)
    """Operator limits that tighten the contract's (``--limit``)."""
    rerun: bool = False
    """Run a finished job id again as a new attempt under the same budget."""
    stop_grace_seconds: float = 5.0
    tick_seconds: float = 0.2
    """How often the container, the deadline and the quotas are checked."""
    gpu_detector: gpus.Detector | None = None
    """How GPUs are found (NVML, else nvidia-smi); tests of pure logic pass their own."""
    gpu_lock_dir: Path | None = None
    """Where device locks live (default <state dir>/gpu-locks); share it across runners."""
    result_key: Path | None = None
    """The runner's own signing key; when set, result.intoto.json is written beside the
    envelope (the key is made on first use)."""
    bundle: Path | None = None
    """A `docker save` tarball to load the pinned image from when it is not here."""
    heartbeat_seconds: float = 5.0
    """How often the ledger and runtime-budget.json are brought up to date while a job runs."""
    protected: tuple[Path, ...] = ()
    """The runner's own folders besides the state dir (config, keys): never staged."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Run:
    """What is known so far; each stage fills in its part."""

    options: RunOptions
    started_at: str = field(default_factory=_now)
    t0: float = field(default_factory=time.monotonic)
    stage: Stage = "contract"
    contract: VerifiedContract | None = None
    plan: ExecutionPlan | None = None
    job: staging.JobDir | None = None
    image: ImageRecord | None = None
    outcome: Outcome | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    budget: BudgetRecord | None = None
    gpus: list[GpuRecord] = field(default_factory=list)
    gpu_fallback: str | None = None
    logs: list[FileRef] = field(default_factory=list)
    agent_result: AgentResultRecord | None = None
    guards: quotas.Guards | None = None
    disk: DiskRecord | None = None
    written: bool = False
    """The envelope is already in the job directory (or is the finished job's own)."""

    @contextlib.contextmanager
    def timed(self, stage: Stage, key: str | None = None) -> Iterator[None]:
        self.stage = stage
        start = time.monotonic()
        try:
            yield
        finally:
            if key:
                self.seconds[key] = round(time.monotonic() - start, 3)

    def envelope(
        self,
        failure: Failure | None,
        measurements: list[MeasurementResult] | None = None,
        errors: list[MeasurementError] | None = None,
        status: str | None = None,
    ) -> ResultEnvelope:
        p, o, c = self.plan, self.outcome, self.contract
        limits = None
        if p is not None:
            lim = p.limits
            limits = AppliedLimits(
                cpus=lim.cpus,
                memoryBytes=lim.memory_bytes,
                memorySwapBytes=lim.memory_swap_bytes,
                shmBytes=lim.shm_bytes,
                pidsLimit=lim.pids,
                tmpfsBytes=lim.tmpfs_bytes,
                gpus=lim.gpus,
                network=lim.network,
                timeoutSeconds=lim.timeout_seconds,
                readOnlyRootfs=lim.read_only_rootfs,
                capDrop=list(lim.cap_drop),
                securityOpt=list(lim.security_opt),
                init=lim.init,
                user=p.user,
                runtime=lim.runtime,
                diskQuotaBytes=lim.disk_quota_bytes,
                logLimitBytes=lim.log_limit_bytes,
                logLimitAction="stop" if lim.stop_on_log_limit else "truncate",
            )
        exit_code = o.state.exit_code if o else None
        return ResultEnvelope.model_validate(
            {
                "runnerVersion": __version__,
                "jobId": p.job_id if p else None,
                "contractName": c.model.name if c else None,
                "contractDigest": c.digest if c else None,
                "status": status or ("failed" if failure else "succeeded"),
                "failure": failure,
                "exitCode": exit_code,
                "image": self.image,
                "measurements": measurements or [],
                "measurementErrors": errors or [],
                "limits": limits,
                "container": ContainerRecord(
                    id=o.container_id,
                    name=o.name,
                    oomKilled=o.state.oom_killed,
                    stoppedByRunner=o.timed_out or o.cancelled,
                )
                if o
                else None,
                "timings": Timings(
                    startedAt=self.started_at,
                    finishedAt=_now(),
                    totalSeconds=round(time.monotonic() - self.t0, 3),
                    stageSeconds=self.seconds.get("stage"),
                    imageSeconds=self.seconds.get("image"),
                    runSeconds=o.run_seconds if o else None,
                    containerStartedAt=o.state.started_at if o else None,
                    containerFinishedAt=o.state.finished_at if o else None,
                ),
                "signature": _signature_record(c) if c else None,
                "policy": PolicyRecord(
                    source=self.options.policy.source,
                    digest=self.options.policy.digest,
                    maxima=self.options.policy.policy.maxima.model_dump(mode="json"),
                    overrides=self.options.overrides,
                ),
                "warnings": self.warnings,
                "budget": self.budget,
                "gpus": self.gpus,
                "logs": self.logs,
                "disk": self.disk,
                "agentResult": self.agent_result,
                "gpuFallback": self.gpu_fallback,
                "jobDir": str(self.job.root) if self.job else None,
                "stdoutPath": p.stdout_path if p else None,
                "stderrPath": p.stderr_path if p else None,
            }
        )


def _signature_record(c: VerifiedContract) -> SignatureRecord:
    m = c.model
    return SignatureRecord(
        status="verified" if c.signature else "none",
        keyIds=list(c.signature.keyids) if c.signature else [],
        payloadType=c.signature.payload_type if c.signature else None,
        issuedAt=m.issuedAt.isoformat() if m.issuedAt else None,
        expiresAt=m.expiresAt.isoformat() if m.expiresAt else None,
        audience=m.audience,
    )


def _failure(stage: Stage, exc: RunnerError) -> Failure:
    return Failure(
        category=exc.category,
        stage=stage,
        retryable=exc.retryable,
        reason=str(exc),
    )


@contextlib.contextmanager
def job_lock(job: staging.JobDir) -> Iterator[None]:
    """One runner per job directory at a time: a second is refused, never run beside it."""
    handle: IO[str] = (job.record / "lock").open("a+")
    try:
        # Onlookers (runner cleanup, the GPU allocator) probe the lock for an instant: wait
        # out such a probe rather than mistake it for another runner.
        for _ in range(20):
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.1)
        else:
            raise JobBusy(
                f"job {job.root.name} is being run by another runner on this host right now",
                hint="wait for it to finish, or give this run another --job-id",
            )
        yield
    finally:
        handle.close()


def _classify(outcome: Outcome, budget_seconds: float) -> Failure | None:
    st = outcome.state
    if outcome.cancelled:
        reason = "the runner was interrupted (Ctrl-C or SIGTERM) and stopped the job"
        return Failure(
            category=Category.CANCELLED, stage="container", retryable=True, reason=reason
        )
    if outcome.stopped_for == "disk_quota_exceeded":
        return Failure(
            category=Category.DISK_QUOTA_EXCEEDED,
            stage="container",
            retryable=False,
            reason="the job wrote more to output/ and workspace/ than its disk quota allows and "
            "was stopped; its files are kept (the envelope's disk record says how much)",
        )
    if outcome.stopped_for == "log_limit_exceeded":
        return Failure(
            category=Category.LOG_LIMIT_EXCEEDED,
            stage="container",
            retryable=False,
            reason="the job wrote more to stdout or stderr than the cap allows and this host "
            "stops such jobs; the first and last parts of the log are kept",
        )
    if outcome.timed_out:
        return Failure(
            category=Category.TIMEOUT,
            stage="container",
            retryable=False,
            reason=f"the job used its whole budget ({budget_seconds:.1f} s over every attempt) "
            "and was stopped",
        )
    if st.oom_killed:
        return Failure(
            category=Category.OOM,
            stage="container",
            retryable=False,
            reason=f"the job (or a process in it) was killed for exceeding its memory cap "
            f"(exit code {st.exit_code})",
        )
    if st.error:
        return Failure(
            category=Category.INFRASTRUCTURE,
            stage="container",
            retryable=True,
            reason=f"the engine reported: {st.error}",
        )
    if st.exit_code != 0:
        return Failure(
            category=Category.NONZERO_EXIT,
            stage="container",
            retryable=False,
            reason=f"the job exited with code {st.exit_code}; see its stderr",
        )
    return None


def _execute(
    r: _Run, contract_path: Path, backend: Backend | None, progress: Progress
) -> ResultEnvelope:
    opts = r.options
    with r.timed("contract"):
        r.contract = contract = load_contract(contract_path, opts.trust)
    signer = (
        "signed by " + ", ".join(k[:19] + "…" for k in contract.signature.keyids)
        if contract.signature
        else "UNSIGNED"
    )
    progress.stage("contract", f"{contract.model.name} ({contract.digest[:19]}…) {signer}")
    job_id = plan.job_id_for(
        contract, opts.job_id, allow_override=opts.policy.policy.allowJobIdOverride
    )
    with r.timed("policy"):
        # A job this host already accepted may be resumed (or shown) after its contract
        # expires: validity times are checked when a job is accepted, not at every restart.
        known = opts.state_dir / "jobs" / job_id / "record" / "ledger.jsonl"
        accepted = read_state(known).accepted if known.exists() else None
        resuming = accepted is not None and accepted.get("contractDigest") == contract.digest
        policy.check(contract, opts.policy.policy, datetime.now(UTC), check_times=not resuming)
    if contract.signature is None:
        r.warnings.append(
            "signature: none. The contract was not signed; it ran only because this host "
            "accepts unsigned contracts (local development)."
        )
        progress.stage("policy", "WARNING: unsigned contract accepted (local development)")
    with r.timed("plan"):
        uid, gid = os.getuid(), os.getgid()
        r.plan = p = plan.build(
            contract,
            opts.policy.policy,
            job_id=job_id,
            host_uid=uid,
            host_gid=gid,
            labels=opts.labels,
            overrides=opts.overrides,
        )
    r.stage = "stage"
    job = staging.prepare(opts.state_dir / "jobs" / p.job_id)
    with job_lock(job):
        r.job = job
        if backend is None:
            from runner import backends

            backend = backends.default()
        return _execute_locked(r, contract, p, job, backend, progress)


_NO_NEW_ATTEMPT = (
    "; a job accepted before then may be reattached to or recovered, but no new attempt "
    "starts under an expired contract"
)

FINAL = {"succeeded", *errors.FINAL}
"""Attempt classifications that end the job; after the others (cancelled, interrupted,
infrastructure) the same contract may simply be run again and continues the budget."""


def _execute_locked(
    r: _Run,
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: staging.JobDir,
    backend: Backend,
    progress: Progress,
) -> ResultEnvelope:
    opts = r.options
    ledger = Ledger.open(job.record / "ledger.jsonl")
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
    limit = min(st.limit, p.limits.timeout_seconds)
    if st.finished is not None and not opts.rerun and not job.envelope.exists():
        raise JobAlreadyFinished(
            f"job {p.job_id} finished on this host but its result.json is gone",
            hint="restore it from record/ (earlier envelopes are kept there), or run the job "
            "again on purpose with --rerun",
        )
    if st.finished is not None:
        if not opts.rerun:
            r.written = True
            progress.stage(
                "job", f"{p.job_id} already finished; this is its envelope (--rerun runs it again)"
            )
            return ResultEnvelope.model_validate_json(job.envelope.read_bytes())
        try:
            policy.refuse_expired(contract, datetime.now(UTC), what=_NO_NEW_ATTEMPT)
        except PolicyViolation as exc:  # refused; the finished job's envelope stays as it is
            raise JobAlreadyFinished(exc.message, hint=exc.hint) from None
        n = st.reruns + 1
        ledger.append(f"job.rerun-{n}", "job.rerun", {"rerun": n})
    _archive_envelope(job)
    try:
        outcome = _resume(r, ledger, job, backend, limit, progress)
        if outcome is None:
            outcome = _new_attempt(r, ledger, contract, p, job, backend, limit, progress)
    finally:
        if r.gpus:
            _gpu_allocator(r, backend).release(str(job.root.resolve()))
    r.outcome = outcome
    if r.gpu_fallback:
        r.warnings.append(f"ran on CPU only: {r.gpu_fallback}")
    attempt = len(st.attempts)
    failure = _classify(outcome, limit)
    if failure is not None and failure.category in {"nonzero_exit", "oom"}:
        tail = _tail(job.output, p.stderr_path)
        where = f"{job.output / p.stderr_path}"
        failure = failure.model_copy(
            update={
                "reason": f"{failure.reason} ({where}" + (f"; it ends: {tail})" if tail else ")")
            }
        )
    if outcome.how != "ledger":
        ledger.append(
            f"attempt-{attempt}.finished",
            "attempt.finished",
            {
                "attempt": attempt,
                "exitCode": outcome.state.exit_code,
                "oomKilled": outcome.state.oom_killed,
                "classification": failure.category if failure else "succeeded",
                "seconds": outcome.run_seconds,
                "how": outcome.how,
            },
        )
    if outcome.timed_out or st.consumed >= limit:
        ledger.append(
            f"budget.exhausted-{attempt}",
            "budget.exhausted",
            {"consumedSeconds": round(st.consumed, 3), "limitSeconds": limit},
        )
    # Only now, with its end in the ledger, may the container go (see container.finish).
    backend.remove(outcome.container_id or outcome.name)
    staging.write_budget(job, limit, st.consumed)
    r.budget = BudgetRecord(
        limitSeconds=limit,
        consumedSeconds=round(st.consumed, 3),
        remainingSeconds=round(max(limit - st.consumed, 0.0), 3),
        attempts=attempt,
    )
    pol = opts.policy.policy
    max_bytes = int(pol.maxEvidenceMb * 1024 * 1024)
    guards = r.guards or _guards(r, job)
    dropped = {str(cap.path.relative_to(job.output)): cap.compact() for cap in guards.logs}
    used = guards.disk.measure()
    r.disk = DiskRecord(
        quotaBytes=guards.disk.quota,
        usedBytes=used,
        peakBytes=guards.disk.peak,
        measurements=guards.disk.measurements,
    )
    with r.timed("parsers"):
        results, errors = evidence.read_measurements(job.output, contract, max_bytes)
        r.logs = [
            log.model_copy(update={"droppedBytes": dropped.get(log.path, 0)})
            for log in evidence.hash_logs(job.output, [p.stdout_path, p.stderr_path], max_bytes)
        ]
        if any(dropped.values()):
            r.warnings.append(
                "logs past their cap kept their first and last parts: "
                + ", ".join(f"{k} dropped {v:,} bytes" for k, v in dropped.items() if v)
            )
        r.agent_result = agent_result.read(job.output, max_bytes, int(pol.maxResultKb * 1024))
    if r.agent_result is not None and not r.agent_result.valid:
        r.warnings.append(
            "the job's result.json is not trustworthy: " + "; ".join(r.agent_result.problems)
        )
    status = "failed" if failure else "succeeded"
    if failure is None and errors:
        first = errors[0]
        failure = Failure(
            category=first.category, stage="parsers", retryable=False, reason=first.reason
        )
        status = "partial" if results else "failed"
    envelope = r.envelope(failure, results, errors, status)
    write_envelope(job, envelope)
    r.written = True
    if opts.result_key is not None:
        attest.sign_result(envelope, job.root, opts.result_key)
    final = failure.category if failure and failure.stage == "container" else "succeeded"
    if final in FINAL:
        digest = hashlib.sha256(job.envelope.read_bytes()).hexdigest()
        ledger.append(
            f"job.finished-{st.reruns}",
            "job.finished",
            {"status": envelope.status, "envelopeSha256": f"sha256:{digest}"},
        )
    return envelope


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


def _archive_envelope(job: staging.JobDir) -> None:
    """Keep an earlier attempt's envelope under record/ before a new one is written."""
    if job.envelope.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        os.replace(job.envelope, job.record / f"result-{stamp}.json")


def _resume(
    r: _Run,
    ledger: Ledger,
    job: staging.JobDir,
    backend: Backend,
    limit: float,
    progress: Progress,
) -> Outcome | None:
    """Pick up what an earlier runner left: reattach to a running container, record one that
    ended meanwhile, or report a finished attempt whose envelope was never written. None when
    a new attempt is needed."""
    st = ledger.state
    last = st.attempts[-1] if st.attempts else None
    if last is None:
        return None
    n = last.number
    r.image = ImageRecord.model_validate(last.starting["image"])
    r.gpus = [GpuRecord.model_validate(g) for g in last.starting.get("gpus", [])]
    if last.finished is not None:
        if ledger.events[-1].type == "job.rerun" or last.finished["classification"] not in FINAL:
            return None
        progress.stage("recover", f"attempt {n} ended before its envelope was written")
        fin = last.finished
        state = ContainerState("exited", False, fin["exitCode"], fin["oomKilled"], "", None, None)
        return Outcome(
            state,
            last.container_id or "",
            last.container_name,
            last.seconds,
            fin["classification"] == "timeout",
            False,
            "ledger",
        )
    found = container.recover(backend, last)
    lost = {
        "attempt": n,
        "exitCode": None,
        "oomKilled": False,
        "classification": "interrupted",
        "seconds": round(found.seconds, 3),
    }
    if found.state is None:
        progress.stage("recover", f"attempt {n}'s container is gone; starting a new attempt")
        ledger.append(f"attempt-{n}.finished", "attempt.finished", {**lost, "how": "vanished"})
        return None
    if found.state.status == "created":
        backend.remove(last.container_name)
        ledger.append(f"attempt-{n}.finished", "attempt.finished", {**lost, "how": "never-started"})
        return None
    cid = found.state.id or last.container_id or last.container_name
    if last.container_id is None:
        ledger.append(f"attempt-{n}.started", "attempt.started", {"attempt": n, "containerId": cid})
    if not found.state.running:
        progress.stage("recover", f"attempt {n} ended while no runner watched it")
        # What happened first: a quota broken while no runner watched (the job's files
        # say so now), then the budget (the engine's backstop killed it past its end).
        r.guards = _guards(r, job)
        left = limit - (st.consumed - last.seconds)
        watched = container.Watched(
            found.seconds >= left, False, round(found.seconds, 3), r.guards.breached()
        )
        return container.finish(
            backend, cid, last.container_name, job.record, watched=watched, how="recovered"
        )
    progress.stage("recover", f"reattaching to attempt {n} (ran {found.seconds:.1f} s so far)")
    before = st.consumed - last.seconds
    w = _watch(r, ledger, job, n, limit, before, already=found.seconds)
    with r.timed("container"):
        watched = container.watch(backend, cid, w, progress)
        return container.finish(
            backend, cid, last.container_name, job.record, watched=watched, how="reattached"
        )


def _watch(
    r: _Run,
    ledger: Ledger,
    job: staging.JobDir,
    n: int,
    limit: float,
    before: float,
    already: float,
) -> Watch:
    """How to watch attempt ``n``: deadline from the remaining budget, heartbeats to the
    ledger and runtime-budget.json."""

    def beat(seconds: float) -> None:
        total = before + seconds
        ledger.append(
            f"attempt-{n}.beat-{len(ledger.events)}",
            "heartbeat",
            {"attempt": n, "attemptSeconds": round(seconds, 3), "consumedSeconds": round(total, 3)},
        )
        staging.write_budget(job, limit, total)

    opts = r.options
    r.guards = _guards(r, job)
    return Watch(
        budget_left=limit - before - already,
        already=already,
        consumed_before=before,
        limit=limit,
        grace=opts.stop_grace_seconds,
        tick=opts.tick_seconds,
        heartbeat=opts.heartbeat_seconds,
        on_beat=beat,
        guard=r.guards.check,
        breached=r.guards.breached,
    )


def _guards(r: _Run, job: staging.JobDir) -> quotas.Guards:
    """The disk quota on output/ + workspace/ and the caps on stdout and stderr."""
    p = r.plan
    if p is None:
        raise RuntimeError("the plan is made before any attempt is watched")
    lim = p.limits
    return quotas.Guards(
        disk=quotas.DiskMeter([job.output, job.workspace], lim.disk_quota_bytes),
        logs=[
            quotas.LogCap(job.output / rel, lim.log_limit_bytes, job.output)
            for rel in (p.stdout_path, p.stderr_path)
        ],
        stop_on_log_limit=lim.stop_on_log_limit,
    )


def _gpu_allocator(r: _Run, backend: Backend) -> gpus.Allocator:
    def alive(holder: dict[str, Any]) -> bool:
        from runner.sweeper import runner_alive

        if runner_alive(Path(str(holder.get("jobDir")))):
            return True
        try:
            return backend.state(str(holder.get("containerName"))).running
        except ContainerVanished:
            return False

    lock_dir = r.options.gpu_lock_dir or r.options.state_dir / "gpu-locks"
    return gpus.Allocator(lock_dir, alive)


def _allocate_gpus(
    r: _Run,
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: staging.JobDir,
    backend: Backend,
    name: str,
    progress: Progress,
) -> tuple[str, ...]:
    """Device ids for this attempt: specific GPUs, locked for this job; none for CPU jobs.
    Without enough GPUs, a contract that allows it falls back to CPU (and says so)."""
    if p.gpu_fallback:
        r.gpu_fallback = p.gpu_fallback
    want = p.limits.gpus
    if want == "none":
        return ()
    detector = r.options.gpu_detector or gpus.HostDetector()
    owner = {"jobDir": str(job.root.resolve()), "containerName": name}
    try:
        host = detector.detect()
        if host and not backend.gpu_capable():
            raise GpuUnavailable(
                f"this host has {len(host)} GPU(s) but the engine cannot hand them to "
                "containers (no nvidia runtime, no NVIDIA container toolkit)",
                hint="install the NVIDIA container toolkit and restart the engine",
            )
        chosen = _gpu_allocator(r, backend).allocate(want, host, owner)
    except GpuUnavailable as exc:
        if not policy.cpu_fallback_allowed(contract):
            raise
        r.gpu_fallback = f"{exc.message}; the contract allows a CPU fallback"
        progress.stage("gpu", f"no GPU: running on CPU only ({exc.message})")
        return ()
    r.gpus = [
        GpuRecord(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memoryBytes=g.memory_bytes,
            driverVersion=g.driver_version,
        )
        for g in chosen
    ]
    progress.stage("gpu", ", ".join(f"{g.index}: {g.model} ({g.uuid})" for g in chosen))
    return tuple(g.uuid for g in chosen)


def _input_rules(opts: RunOptions) -> staging.InputRules:
    """The policy's caps on inputs; the runner's own folders (its state, its key's folder and
    the folders the caller names) are never staged."""
    pol = opts.policy.policy
    own = [opts.state_dir, *opts.protected]
    if opts.result_key is not None:
        own.append(opts.result_key.parent)
    return staging.InputRules.protecting(
        own, max_bytes=int(pol.maxInputMb * 1024 * 1024), max_files=pol.maxInputFiles
    )


def _new_attempt(
    r: _Run,
    ledger: Ledger,
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: staging.JobDir,
    backend: Backend,
    limit: float,
    progress: Progress,
) -> Outcome:
    st = ledger.state
    consumed = st.consumed
    n = len(st.attempts) + 1
    r.gpus, r.image = [], None  # whatever an earlier attempt had is not this one's
    policy.refuse_expired(contract, datetime.now(UTC), what=_NO_NEW_ATTEMPT)
    if consumed >= limit:
        ledger.append(
            f"budget.exhausted-{n - 1}",
            "budget.exhausted",
            {"consumedSeconds": round(consumed, 3), "limitSeconds": limit},
        )
        raise ResourceExhausted(
            f"job {p.job_id} has used {consumed:.1f} s of its {limit:.1f} s budget in earlier "
            "attempts; nothing is left to run it again",
            hint="the budget spans every attempt; a larger budget needs a new contract",
        )
    with r.timed("stage", "stage"):
        files = staging.stage_inputs(job, contract, _input_rules(r.options))
        uid, gid = (int(x) for x in p.user.split(":"))
        staging.prepare_writable(job, uid, gid, [p.stdout_path, p.stderr_path])
        staging.write_budget(job, limit, consumed)
    size = sum(f.size for f in files)
    progress.stage("stage", f"{len(files)} input files ({size:,} bytes) in {job.root}")
    with r.timed("image", "image"):
        pol = r.options.policy.policy
        settings = images.PullSettings(
            docker_config=Path(pol.dockerConfig) if pol.dockerConfig else None,
            insecure_registries=tuple(pol.insecureRegistries),
            retry_seconds=pol.registryRetrySeconds,
        )
        got = images.acquire(
            backend, p.image, bundle=r.options.bundle, settings=settings, progress=progress
        )
        info, repo_digest = got.info, got.repo_digest
        r.image = ImageRecord(
            reference=p.image.reference,
            id=info.id,
            repoDigest=repo_digest,
            architecture=info.architecture or None,
            os=info.os or None,
            sizeBytes=info.size,
            source=got.source,
        )
    names = ", ".join(info.repo_tags) or "untagged"
    progress.stage("image", f"{info.id[:19]}… ({names}; {got.source}; {info.size:,} bytes)")
    runtimes = backend.runtimes() if p.limits.runtime != "runc" else []
    if p.limits.runtime != "runc" and p.limits.runtime not in runtimes:
        raise PolicyViolation(
            f"this host's policy demands the {p.limits.runtime} runtime (gVisor) and the engine "
            f"has only {', '.join(runtimes)}",
            hint="install and register it (scripts/setup.sh does), or change the policy",
        )
    name = container.container_name(job.root, p.job_id, n)
    gpu_ids = _allocate_gpus(r, contract, p, job, backend, name, progress)
    deadline = container.backstop(limit - consumed, r.options.stop_grace_seconds)
    spec = container.spec(p, job, info.id, n, gpu_ids, deadline)
    ledger.append(
        f"attempt-{n}.starting",
        "attempt.starting",
        {
            "attempt": n,
            "containerName": spec.name,
            "engineDeadlineSeconds": deadline.after_seconds,
            "image": r.image.model_dump(mode="json"),
            "gpus": [g.model_dump(mode="json") for g in r.gpus],
        },
    )

    def created(container_id: str) -> None:
        data = {"attempt": n, "containerId": container_id}
        ledger.append(f"attempt-{n}.started", "attempt.started", data)

    progress.stage("container", f"attempt {n}: {spec.name}")
    w = _watch(r, ledger, job, n, limit, consumed, already=0.0)
    with r.timed("container"):
        try:
            return container.run_attempt(backend, spec, w, job.record, progress, created)
        except container.NotStarted as failed:
            cause = failed.cause
            category = (
                "cancelled"
                if isinstance(cause, KeyboardInterrupt)
                else getattr(cause, "category", "infrastructure")
            )
            ledger.append(
                f"attempt-{n}.finished",
                "attempt.finished",
                {
                    "attempt": n,
                    "exitCode": None,
                    "oomKilled": False,
                    "classification": category,
                    "seconds": 0.0,
                    "how": "not-started",
                },
            )
            raise cause from None


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
    r = _Run(options)
    try:
        envelope = _execute(r, contract_path, backend, progress or _Silent())
    except RunnerError as exc:
        envelope = r.envelope(_failure(r.stage, exc))
        if isinstance(exc, JobAlreadyFinished | JobBusy | LedgerCorrupt):
            return envelope  # that job's own envelope is not ours to overwrite
    except Exception as exc:  # noqa: BLE001 - a bug must still end in an honest envelope
        reason = (
            f"the runner failed unexpectedly during the {r.stage} stage: "
            f"{type(exc).__name__}: {exc} (a runner bug; the job is not to blame)"
        )
        envelope = r.envelope(
            Failure(category=Category.INFRASTRUCTURE, stage=r.stage, retryable=False, reason=reason)
        )
    except KeyboardInterrupt:
        reason = f"the runner was interrupted during the {r.stage} stage"
        envelope = r.envelope(
            Failure(category=Category.CANCELLED, stage=r.stage, retryable=True, reason=reason)
        )
    if r.job is not None and not r.written:
        write_envelope(r.job, envelope)
    return envelope


def refused(exc: RunnerError, stage: Stage) -> ResultEnvelope:
    """The envelope of a run that could not even begin (the host's own set-up failed)."""
    return _Run(RunOptions(state_dir=Path("."))).envelope(_failure(stage, exc))


def ended_early(failure: Failure) -> ResultEnvelope:
    """The envelope of a job whose runner ended before it could say more (a batch's child
    that died, or a contract a stopped batch never started)."""
    return _Run(RunOptions(state_dir=Path("."))).envelope(failure)


def write_envelope(job: staging.JobDir, envelope: ResultEnvelope) -> None:
    staging.atomic_write(job.envelope, (envelope.model_dump_json(indent=2) + "\n").encode())


REFUSALS = errors.REFUSALS


def failure_exit_family(envelope: ResultEnvelope) -> str:
    """``succeeded`` | ``job_failed`` | ``refused`` | ``infrastructure`` | ``cancelled``."""
    return errors.exit_family(envelope.failure.category if envelope.failure else None)


def failure_exit_family_of(data: dict[str, Any]) -> str:
    """The same, for an envelope already turned into JSON data (a batch's)."""
    failure = data.get("failure")
    return errors.exit_family(str(failure["category"]) if failure else None)


def as_json(envelope: ResultEnvelope) -> dict[str, Any]:
    return envelope.model_dump(mode="json")
