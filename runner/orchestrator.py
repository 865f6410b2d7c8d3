"""The one module that sequences the stages:

contract → policy → plan → stage → image → container → parsers → envelope.

Every path out of :func:`run` — success, a refusal, a job failure, an engine failure, Ctrl-C —
ends in a :class:`~runner.envelope.ResultEnvelope`. Once the job directory exists the envelope
is also written there (``result.json``), atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

from runner import evidence, plan, policy, staging
from runner.backends.base import Backend, ContainerSpec, ContainerState, Mount
from runner.contract import Trust, VerifiedContract, load_contract
from runner.envelope import (
    AppliedLimits,
    ContainerRecord,
    Failure,
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
    ImageUnavailable,
    JobAlreadyFinished,
    JobBusy,
    ResourceExhausted,
    RunnerError,
)
from runner.images import verify as verify_image
from runner.plan import ExecutionPlan
from runner.policy import LoadedPolicy

__version__ = "0.1.0"


class Progress(Protocol):
    """What the orchestrator tells whoever watches (the CLI draws it for people)."""

    def stage(self, name: str, detail: str) -> None: ...

    def running(self, elapsed: float, budget: float) -> None: ...


class _Silent:
    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
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
    tick_seconds: float = 1.0


@dataclass(frozen=True)
class Outcome:
    """How the container ended."""

    state: ContainerState
    container_id: str
    name: str
    run_seconds: float
    timed_out: bool
    cancelled: bool


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
        category=exc.category,  # type: ignore[arg-type]
        stage=stage,
        retryable=exc.retryable,
        reason=str(exc),
    )


@contextlib.contextmanager
def _job_lock(job: staging.JobDir) -> Iterator[None]:
    """One runner per job directory at a time: a second is refused, never run beside it."""
    handle: IO[str] = (job.record / "lock").open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise JobBusy(
                f"job {job.root.name} is being run by another runner on this host right now",
                hint="wait for it to finish, or give this run another --job-id",
            ) from exc
        yield
    finally:
        handle.close()


def _spec(p: ExecutionPlan, job: staging.JobDir, image_id: str) -> ContainerSpec:
    return ContainerSpec(
        name=f"runner-{p.job_id[:100]}-{secrets.token_hex(3)}",
        image=image_id,
        entrypoint=p.entrypoint,
        command=list(p.argv),
        user=p.user,
        working_dir=p.working_dir,
        environment=p.environment,
        labels=p.labels,
        mounts=[
            Mount(job.input, "/job/input", read_only=True),
            Mount(job.output, "/job/output", read_only=False),
            Mount(job.workspace, "/job/workspace", read_only=False),
            Mount(job.execution, "/job/execution", read_only=True),
        ],
        limits=p.limits,
    )


def supervise(
    backend: Backend,
    spec: ContainerSpec,
    *,
    budget_seconds: float,
    grace_seconds: float,
    tick_seconds: float,
    progress: Progress,
    record_dir: Path | None = None,
) -> Outcome:
    """create → start → watch against the runner's own deadline → stop, then kill → inspect →
    keep the engine's log → remove. The container is removed on every path out."""
    container_id = backend.create(spec)
    timed_out = cancelled = False
    started = time.monotonic()
    try:
        backend.start(container_id)
        started = time.monotonic()
        deadline = started + budget_seconds
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    backend.stop(container_id, grace_seconds)
                    break
                if backend.wait(container_id, min(tick_seconds, remaining)) is not None:
                    break
                progress.running(time.monotonic() - started, budget_seconds)
        except KeyboardInterrupt:
            cancelled = True
            backend.stop(container_id, grace_seconds)
        ended = time.monotonic()
        state = backend.state(container_id)
        if state.running:
            backend.kill(container_id)
            state = backend.state(container_id)
        if record_dir is not None:
            staging.write_json(record_dir / "container-state.json", state.raw)
            backend.save_logs(container_id, record_dir / "engine.log", spec.log_max_bytes)
        return Outcome(
            state=state,
            container_id=container_id,
            name=spec.name,
            run_seconds=round(ended - started, 3),
            timed_out=timed_out,
            cancelled=cancelled,
        )
    finally:
        backend.remove(container_id)


def _classify(outcome: Outcome, budget_seconds: float) -> Failure | None:
    st = outcome.state
    if outcome.cancelled:
        reason = "the runner was interrupted (Ctrl-C or SIGTERM) and stopped the job"
        return Failure(category="cancelled", stage="container", retryable=True, reason=reason)
    if outcome.timed_out:
        return Failure(
            category="timeout",
            stage="container",
            retryable=False,
            reason=f"the job used its whole budget ({budget_seconds:.1f} s over every attempt) "
            "and was stopped",
        )
    if st.oom_killed:
        return Failure(
            category="oom",
            stage="container",
            retryable=False,
            reason=f"the job (or a process in it) was killed for exceeding its memory cap "
            f"(exit code {st.exit_code})",
        )
    if st.error:
        return Failure(
            category="infrastructure",
            stage="container",
            retryable=True,
            reason=f"the engine reported: {st.error}",
        )
    if st.exit_code != 0:
        return Failure(
            category="nonzero_exit",
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
    with r.timed("policy"):
        policy.check(contract, opts.policy.policy, datetime.now(UTC))
    if contract.signature is None:
        r.warnings.append(
            "signature: none. The contract was not signed; it ran only because this host "
            "accepts unsigned contracts (local development)."
        )
        progress.stage("policy", "WARNING: unsigned contract accepted (local development)")
    with r.timed("plan"):
        job_id = opts.job_id or plan.default_job_id(contract)
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
    with _job_lock(job):
        consumed = _previous_attempts(job, contract.digest, rerun=opts.rerun)
        r.job = job
        return _execute_locked(r, contract, p, job, backend, progress, consumed)


RERUNNABLE = {"cancelled", "infrastructure", "image_unavailable"}
"""Categories after which the same job id may simply be run again."""


def _previous_attempts(job: staging.JobDir, digest: str, *, rerun: bool) -> float:
    """Seconds the job's earlier attempts ran. Refuses a job id that belongs to another
    contract, and one that already ran to an end unless ``rerun``; the previous envelope is
    kept under record/ so nothing is lost."""
    earlier = sorted(job.record.glob("result-*.json"))
    if job.envelope.exists():
        previous = json.loads(job.envelope.read_bytes())
        if previous.get("contractDigest") not in (None, digest):
            raise JobAlreadyFinished(
                f"job id {job.root.name} belongs to another contract "
                f"({previous.get('contractDigest')}) on this host",
                hint="give this contract its own --job-id",
            )
        failure = previous.get("failure") or {}
        finished = previous.get("container") is not None and (
            failure.get("category") not in RERUNNABLE
        )
        if finished and not rerun:
            raise JobAlreadyFinished(
                f"job {job.root.name} already ran on this host (status "
                f"{previous.get('status')}); its envelope is {job.envelope}",
                hint="read that envelope; to run it again as a new attempt under the same "
                "budget pass --rerun, or use a new --job-id",
            )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        archived = job.record / f"result-{stamp}.json"
        os.replace(job.envelope, archived)
        earlier.append(archived)
    consumed = 0.0
    for path in earlier:
        data = json.loads(path.read_bytes())
        if data.get("contractDigest") == digest:
            consumed += float((data.get("timings") or {}).get("runSeconds") or 0.0)
    return consumed


def _execute_locked(
    r: _Run,
    contract: VerifiedContract,
    p: ExecutionPlan,
    job: staging.JobDir,
    backend: Backend | None,
    progress: Progress,
    consumed: float,
) -> ResultEnvelope:
    opts = r.options
    limit = p.limits.timeout_seconds
    if consumed >= limit:
        raise ResourceExhausted(
            f"job {p.job_id} has used {consumed:.1f} s of its {limit:.1f} s budget in earlier "
            "attempts; nothing is left to run it again",
            hint="the budget spans every attempt; a larger budget needs a new contract",
        )
    with r.timed("stage", "stage"):
        files = staging.stage_inputs(job, contract)
        uid, gid = (int(x) for x in p.user.split(":"))
        staging.prepare_writable(job, uid, gid, [p.stdout_path, p.stderr_path])
        staging.write_budget(job, limit, consumed)
    size = sum(f.size for f in files)
    progress.stage("stage", f"{len(files)} input files ({size:,} bytes) in {job.root}")
    with r.timed("image", "image"):
        if backend is None:
            from runner.backends.docker import DockerBackend

            backend = DockerBackend()
        info = backend.inspect_image(p.image.lookup)
        if info is None:
            raise ImageUnavailable(
                f"the image {p.image.reference} is not present on this host",
                hint="build or load it first (`scripts/setup.sh` builds runner-cpu:local)",
            )
        repo_digest = verify_image(p.image, info)
        r.image = ImageRecord(reference=p.image.reference, id=info.id, repoDigest=repo_digest)
    progress.stage("image", f"{info.id[:19]}… ({', '.join(info.repo_tags) or 'untagged'})")
    with r.timed("container"):
        r.outcome = outcome = supervise(
            backend,
            _spec(p, job, info.id),
            budget_seconds=limit - consumed,
            grace_seconds=opts.stop_grace_seconds,
            tick_seconds=opts.tick_seconds,
            progress=progress,
            record_dir=job.record,
        )
        staging.write_budget(job, limit, consumed + outcome.run_seconds)
    failure = _classify(outcome, limit)
    with r.timed("parsers"):
        results, errors = evidence.read_measurements(job.output, contract)
    status = "failed" if failure else "succeeded"
    if failure is None and errors:
        first = errors[0]
        failure = Failure(
            category=first.category, stage="parsers", retryable=False, reason=first.reason
        )
        status = "partial" if results else "failed"
    return r.envelope(failure, results, errors, status)


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
        if isinstance(exc, JobAlreadyFinished | JobBusy):
            return envelope  # that job's own envelope is not ours to overwrite
    except KeyboardInterrupt:
        reason = f"the runner was interrupted during the {r.stage} stage"
        envelope = r.envelope(
            Failure(category="cancelled", stage=r.stage, retryable=True, reason=reason)
        )
    if r.job is not None:
        write_envelope(r.job, envelope)
    return envelope


def write_envelope(job: staging.JobDir, envelope: ResultEnvelope) -> None:
    staging.atomic_write(job.envelope, (envelope.model_dump_json(indent=2) + "\n").encode())


REFUSALS = {
    "invalid_contract",
    "signature_invalid",
    "policy_violation",
    "protocol_ambiguous",
    "image_digest_mismatch",
}
"""Categories meaning nothing ran because the contract or the host said no (exit 3)."""


def failure_exit_family(envelope: ResultEnvelope) -> str:
    """``succeeded`` | ``job_failed`` | ``refused`` | ``infrastructure`` | ``cancelled``."""
    if envelope.failure is None:
        return "succeeded"
    category = envelope.failure.category
    if category in REFUSALS:
        return "refused"
    if category in {"infrastructure", "image_unavailable"}:
        return "infrastructure"
    if category == "cancelled":
        return "cancelled"
    return "job_failed"


def as_json(envelope: ResultEnvelope) -> dict[str, Any]:
    return envelope.model_dump(mode="json")
