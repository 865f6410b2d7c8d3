"""One attempt of a job: pick up what an earlier runner left, or start a new one.

Long on purpose: an attempt's whole life (resume; or stage, image, GPUs, egress, container)
reads top to bottom in one place, each step a call into the module that owns it.

:func:`run` first looks at the ledger's last attempt (:func:`_resume`): a container still
running is reattached to, one that ended while no runner watched is recorded, one that
vanished or never started is closed in the ledger; an attempt that ended before its envelope
was written is read back. Only when nothing is left to pick up does it start a new attempt
(:func:`_new`): stage the inputs, acquire the image, hand out GPUs, lease the egress
allowlist's slot if the plan has one, create and watch the container. Either way it returns an
:class:`AttemptResult`: values, nothing shared. A stage that fails raises
:class:`~runner.execution.stages.Stopped` naming itself.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.agents import adapters as agents
from runner.backends.base import Backend, ContainerSpec, ContainerState, DeviceEdits, Mount
from runner.backends.types import EgressPlan, engine_text
from runner.caches import inputcache
from runner.contract import VerifiedContract
from runner.core import errors, hostid, log, redaction
from runner.core.errors import ContainerVanished, GpuUnavailable, PolicyViolation, ResourceExhausted
from runner.execution import agent_run, container, layout, quotas, records, resources, takeover
from runner.execution.container import Outcome, Progress, Watch
from runner.execution.options import RunOptions
from runner.execution.stages import Known, Stopped, stage
from runner.images import pins as images
from runner.models.envelope import (
    Allocation,
    EgressRecord,
    EngineRecord,
    GpuRecord,
    ImageRecord,
)
from runner.planning import policy
from runner.planning.allocation import slurm_gpus, slurm_job
from runner.planning.plan import ExecutionPlan
from runner.results import envelope
from runner.staging import jobdir as staging
from runner.state.jobdir import JobDir
from runner.state.ledger import Budget, Ledger, LedgerState

if TYPE_CHECKING:
    from runner.egress import slots as egress  # imported where an attempt has egress
    from runner.execution import agentimage
    from runner.gpu import gpus  # imported where an attempt has GPUs

__all__ = ["FINAL", "NO_NEW_ATTEMPT", "AttemptResult", "Job", "egress_down", "had_egress", "run"]

FINAL = {"succeeded", *errors.FINAL}
"""Attempt classifications that end the job; after the others (cancelled, interrupted,
infrastructure) the same contract may simply be run again and continues the budget."""

NO_NEW_ATTEMPT = (
    "; a job accepted before then may be reattached to or recovered, but no new attempt "
    "starts under an expired contract"
)


@dataclass(frozen=True)
class AttemptResult:
    """How the attempt ended, what it ran with, and the quota guards that watched it."""

    outcome: Outcome
    known: Known
    """The run's record, with this attempt's image, GPUs and stage timings."""
    guards: quotas.Guards
    number: int
    """Which attempt (1, 2 ...)."""
    redactor: redaction.Redactor = redaction.NONE
    """A new attempt's secrets as it was given them (else the run reads them again)."""


@dataclass(frozen=True)
class Job:
    """What every step of an attempt works on."""

    contract: VerifiedContract
    plan: ExecutionPlan
    dir: JobDir
    backend: Backend
    options: RunOptions
    ledger: Ledger
    limit: float
    """The job's budget in seconds (the ledger's, never more than the plan's)."""
    progress: Progress
    assets: tuple[Mount, ...] = ()
    """The contract's assets, cached, as read-only mounts below /job/assets."""


def run(job: Job, known: Known) -> AttemptResult:
    """Resume the last attempt, else run a new one; GPU locks are released at the end."""
    try:
        return _resume(job, known) or _new(job, known)
    finally:
        if job.plan.limits.gpus != "none":
            _gpu_allocator(job).release(str(job.dir.root.resolve()))


def guards_for(
    p: ExecutionPlan,
    job: JobDir,
    state: LedgerState | None = None,
    n: int = 0,
    eg: egress.Egress | None = None,
) -> quotas.Guards:
    """The disk quota on output/ + workspace/, the caps on stdout and stderr, and the limits
    left to attempt ``n``'s agent after the attempts ``state`` records (read from the runner's
    capture of its stdout and the proxy's count of its model requests, ``eg`` its lease)."""
    lim = p.limits
    return quotas.Guards(
        agent=agent_run.guard(p, job, state, n, eg) if state is not None else None,
        disk=quotas.DiskMeter(list(job.writable), lim.disk_quota_bytes),
        logs=[
            quotas.LogCap(job.output / rel, lim.log_limit_bytes, job.output)
            for rel in (p.stdout_path, p.stderr_path)
        ],
        stop_on_log_limit=lim.stop_on_log_limit,
    )


def engine_record(backend: Backend) -> EngineRecord:
    """The engine, as the envelope records it (asked with the image's platform, once); what
    any backend says is made printable and short here (``engine_text``), so that no engine's
    answer can break the envelope's JSON."""
    info = backend.engine()
    return EngineRecord(
        name=engine_text(info.name),
        version=engine_text(info.version),
        apiVersion=engine_text(info.api_version),
    )


def _engine_of(starting: dict[str, Any], backend: Backend) -> EngineRecord:
    """The engine an earlier runner recorded for its attempt; for an attempt recorded before
    engines were, or one whose record is not what a runner writes (not printable ASCII, too
    long), the one this runner reattaches through (the same socket, or it would not find the
    container)."""
    recorded = starting.get("engine")
    if isinstance(recorded, dict):
        try:
            return EngineRecord.model_validate(recorded)
        except ValueError:
            pass
    return engine_record(backend)


def _resume(job: Job, known: Known) -> AttemptResult | None:
    """Pick up what an earlier runner left: reattach to a running container, record one that
    ended meanwhile, or read back a finished attempt whose envelope was never written. None
    when a new attempt is needed."""
    ledger, progress = job.ledger, job.progress
    st = ledger.state
    last = st.attempts[-1] if st.attempts else None
    if last is None:
        return None
    n = last.number
    known = replace(
        known,
        image=ImageRecord.model_validate(last.starting["image"]),
        engine=_engine_of(last.starting, job.backend),
        gpus=tuple(GpuRecord.model_validate(g) for g in last.starting.get("gpus", [])),
        allocation=_decided(job.dir, n),
    )
    started = last.starting.get("egress")
    eg = None
    if started and "slot" in started:
        from runner.egress import slots as egress

        eg = egress.Egress.from_json(started)
    guards = guards_for(job.plan, job.dir, st, n, eg)
    if last.finished is not None:
        if ledger.events[-1].type == "job.rerun" or last.finished["classification"] not in FINAL:
            if n not in st.agent_usage:  # ended by `runner cleanup --orphans`: usage not read yet
                agent_run.lost(ledger, job.plan, job.dir, n, None)
            return None
        progress.stage("recover", f"attempt {n} ended before its envelope was written")
        fin = last.finished
        state = ContainerState("exited", False, fin["exitCode"], fin["oomKilled"], "", None, None)
        timed_out = fin["classification"] == "timeout"
        outcome = Outcome(
            state, last.container_id or "", last.container_name, last.seconds, timed_out, False,
            "ledger",
        )  # fmt: skip
        return AttemptResult(outcome, known, guards, n)
    with stage("container", known):
        if (other := hostid.elsewhere(last.starting)) is not None:
            takeover.close(
                ledger, last, other, job.options.lease_seconds, job.plan.job_id, progress,
                scheduler=job.options.scheduler, own=slurm_job(os.environ),
            )  # fmt: skip
            agent_run.lost(ledger, job.plan, job.dir, n, guards.agent)
            return None
        found = container.recover(job.backend, last)
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
            agent_run.lost(ledger, job.plan, job.dir, n, guards.agent)
            return None
        if found.state.status == "created":
            job.backend.remove(last.container_name)
            data = {**lost, "how": "never-started"}
            ledger.append(f"attempt-{n}.finished", "attempt.finished", data)
            agent_run.lost(ledger, job.plan, job.dir, n, guards.agent)
            return None
        cid = found.state.id or last.container_id or last.container_name
        if last.container_id is None:
            data = {"attempt": n, "containerId": cid}
            ledger.append(f"attempt-{n}.started", "attempt.started", data)
        before = st.consumed - last.seconds
        if not found.state.running:
            progress.stage("recover", f"attempt {n} ended while no runner watched it")
            # What happened first: a quota broken while no runner watched (the job's files
            # say so now), then the budget (the engine's backstop killed it past its end).
            timed_out = found.seconds >= job.limit - before
            seconds = round(found.seconds, 3)
            if guards.agent is not None:  # its stdout as the engine kept it
                guards.agent.attach(job.backend, cid)
                guards.agent.final()
            watched = container.Watched(timed_out, False, seconds, guards.breached())
            outcome = container.finish(
                job.backend, cid, last.container_name, job.dir.attempt_record(n), watched=watched,
                how="recovered",
            )  # fmt: skip
            agent_run.settle(job.plan, job.dir, n, state=job.ledger.state)
            return AttemptResult(outcome, known, guards, n)
        progress.stage("recover", f"reattaching to attempt {n} (ran {found.seconds:.1f} s so far)")
        uuids = tuple(g.uuid for g in known.gpus)
        w = _watch(job, n, before, found.seconds, guards, as_of=found.at, gpu_uuids=uuids)
        w = replace(w, engine_clock_agrees=found.engine_clock_agrees)
        watched = container.watch(job.backend, cid, w, progress)
        outcome = container.finish(
            job.backend, cid, last.container_name, job.dir.attempt_record(n), watched=watched,
            how="reattached",
        )  # fmt: skip
        outcome = agent_run.ended(_disk_at_end(outcome, guards), guards.agent)
        agent_run.settle(job.plan, job.dir, n, state=job.ledger.state)
        return AttemptResult(outcome, known, guards, n)


def _decided(job: JobDir, n: int) -> Allocation | None:
    """Attempt ``n``'s compute decision, read back from input/ (written before it started)."""
    try:
        decided = Allocation.model_validate_json((job.input / "compute-decision.json").read_bytes())
    except (OSError, ValueError):
        return None
    return decided if decided.attempt == n else None


def _new(job: Job, known: Known) -> AttemptResult:
    """Check the budget, acquire the image (and an agent's runtime), stage, hand out GPUs,
    then create, start and watch a container."""
    p = job.plan
    st = job.ledger.state
    n = len(st.attempts) + 1
    # An earlier attempt's image and GPUs are not this one's; an agent's usage so far is.
    known = replace(known, image=None, gpus=(), agent_usage=agent_run.usage_record(p, st))
    secrets = _may_start(job, known, n)
    known, got, brought = _image(job, known)
    try:
        return _run_new(job, known, n, secrets, got, brought)
    finally:  # its container (if any) is over: the runtime's entry is no longer held for it
        if brought is not None:
            from runner.execution import agentimage

            agentimage.release(brought.runtime)


def _run_new(
    job: Job,
    known: Known,
    n: int,
    secrets: dict[str, str],
    got: tuple[images.Acquired, ImageRecord],
    brought: agentimage.Brought | None,
) -> AttemptResult:
    """The new attempt once its image (and runtime) are in hand: stage, decide, start."""
    p, opts = job.plan, job.options
    st = job.ledger.state
    consumed = st.consumed
    known, files, prompt = _stage(job, known, n, consumed)
    size = sum(f.size for f in files)
    job.progress.stage("stage", f"{len(files)} input files ({size:,} bytes) in {job.dir.root}")
    name = container.container_name(job.dir.root, p.job_id, n)
    with stage("image", known):
        _check_runtime(job)
        gpu_ids, given, fallback, devices = _allocate_gpus(job, name)
    known = replace(known, gpus=given, gpu_fallback=fallback or known.gpu_fallback)
    known = _decide(job, known, n, consumed)
    deadline = container.backstop(job.limit - consumed, opts.stop_grace_seconds)
    argv = (
        p.agent.argv(*agent_run.left(p.agent, st)) if p.agent is not None else p.argv
    )  # an agent's: with what is left of its turns and budget
    with stage("container", known):
        redactor = agent_run.redactor(p, secrets)  # the proxy never logs them either
        eg = _egress_lease(job, p.egress, name, redactor) if p.egress else None
    try:
        spec = container.spec(
            p, job.dir, got[0].info.id, n, gpu_ids, deadline,
            network=eg.network_mode if eg else None, argv=argv, secrets=secrets,
            assets=job.assets, devices=devices,
        )  # fmt: skip
        if eg is not None:  # the slot is busy while the job's container exists
            spec = replace(spec, labels={**spec.labels, **eg.job_labels()})
        if brought is not None and p.agent is not None:
            spec = brought.apply(spec, p.agent.adapter.env)
        starting = {
            "attempt": n,
            "containerName": spec.name,
            "host": hostid.identity(),
            "leaseSeconds": opts.lease_seconds,
            # Under Slurm, the job this attempt runs in: a takeover asks Slurm about it.
            **({"slurm": under} if (under := slurm_job(os.environ)) is not None else {}),
            "engineDeadlineSeconds": deadline.after_seconds,
            "image": got[1].model_dump(mode="json"),
            "engine": engine_record(job.backend).model_dump(mode="json"),
            "gpus": [g.model_dump(mode="json") for g in given],
            **({"egress": eg.as_json()} if eg else {}),
            **({"agentArgv": list(argv)} if p.agent is not None else {}),
            # salted digests, never a value: a reattach knows whether it can still redact
            **({"secretDigests": redactor.digests()} if secrets else {}),
            **({"agentRuntime": brought.record()} if brought is not None else {}),
            **(
                {"agentPrompt": agents.prompt_record(p.agent, prompt)} if p.agent and prompt else {}
            ),
        }
        job.ledger.append(f"attempt-{n}.starting", "attempt.starting", starting)
    except BaseException:
        if eg is not None:  # not recorded: nothing will end its lease but this
            from runner.egress import slots as egress

            egress.release(eg)
        raise
    guards = guards_for(p, job.dir, st, n, eg)
    outcome = _start(job, known, spec, n, consumed, guards, eg, redactor)
    outcome = agent_run.ended(_disk_at_end(outcome, guards), guards.agent)
    agent_run.settle(p, job.dir, n, secrets)
    return AttemptResult(outcome, known, guards, n, redactor)


def _may_start(job: Job, known: Known, n: int) -> dict[str, str]:
    """Refuse a new attempt the contract's expiry, the budget or an agent's limits forbid
    (after closing the egress a crashed attempt left); an agent's secrets, read now."""
    p, ledger, st = job.plan, job.ledger, job.ledger.state
    consumed = st.consumed
    with stage("stage", known):
        if st.attempts and st.attempts[-1].starting.get("egress"):  # what a crash left
            last = st.attempts[-1].number
            egress_down(job.backend, job.ledger, job.dir, last, agent_run.redactor(p))
        policy.refuse_expired(job.contract, datetime.now(UTC), what=NO_NEW_ATTEMPT)
        if consumed >= job.limit:
            data = {"consumedSeconds": round(consumed, 3), "limitSeconds": job.limit}
            ledger.append(f"budget.exhausted-{n - 1}", "budget.exhausted", data)
            raise ResourceExhausted(
                f"job {p.job_id} has used {consumed:.1f} s of its {job.limit:.1f} s budget in "
                "earlier attempts; nothing is left to run it again",
                hint="the budget spans every attempt; a larger budget needs a new contract",
            )
        agent_run.refuse_spent(p, st)
        if p.agent is not None:  # read now, handed to the engine only
            return agents.secret_values(p.agent.adapter)
    return {}


def _image(
    job: Job, known: Known
) -> tuple[Known, tuple[images.Acquired, ImageRecord], agentimage.Brought | None]:
    """The image before the inputs: a pin this host cannot resolve (an agent's runtime image
    too) is refused before anything is staged. Then an agent's runtime, brought in."""
    p, opts, progress = job.plan, job.options, job.progress
    since = time.monotonic()
    with stage("image", known):
        got = _acquire(job)
    known = replace(known, image=got[1], engine=engine_record(job.backend))
    known = known.timed("image", since)
    info = got[0].info
    names = ", ".join(info.repo_tags) or "untagged"
    progress.stage("image", f"{info.id[:19]}… ({names}; {got[0].source}; {info.size:,} bytes)")
    if p.agent is None or p.agent_image is None:
        if p.agent is not None:
            progress.stage("agent", f"commands run in {info.id[:19]}… (the {p.agent.runtime} "
                           "adapter's image, runIn adapter-image)")  # fmt: skip
        return known, got, None
    # Imported here: only an agent's runtime is brought in (the module is about 20 ms of
    # every other run's start-up).
    from runner.execution import agentimage

    with stage("image", known):  # an agent's runtime, brought into the contract's image
        # Labelled with the job's folder, so `runner cleanup` finds a copying container a
        # killed runner left (it is never started; removed once no runner watches the job).
        own = {**opts.labels, "org.runner.job-dir": str(job.dir.root.resolve())}
        brought = agentimage.bring(
            job.backend, p, info, lambda pin: _acquire(job, pin), opts.state.root, own
        )
    if brought is not None:
        progress.stage("agent", f"commands run in {info.id[:19]}… (the contract's image); "
                       + agentimage.describe(brought))  # fmt: skip
    return known, got, brought


def _stage(
    job: Job, known: Known, n: int, consumed: float
) -> tuple[Known, list[staging.StagedFile], bytes | None]:
    """Stage the inputs (the self-report's schema and the host's prompt among them), the
    working copy and the writable folders; the last attempt's streams move to its record."""
    p, opts = job.plan, job.options
    since = time.monotonic()
    with stage("stage", known):
        via = inputcache.stager(inputcache.InputCache.of_state(opts.state.root), job.dir)
        own = layout.own_inputs(p)
        prompt = dict(own).get(agents.HOST_PROMPT_NAME)  # the host's, when the contract has none
        files = staging.stage_inputs(job.dir, job.contract, opts.input_rules(), via=via, extra=own)
        layout.working_copy(job.dir, job.contract, p.limits.disk_quota_bytes)
        streams = [p.stdout_path, p.stderr_path]
        if n > 1:  # the last attempt's stdout and stderr move to its record, never truncated
            if not (job.dir.attempt_record(n - 1) / "output-manifest.json").exists():
                records.output_manifest(job.dir, n - 1)  # it ended unread: as it left output/
            records.rotate_streams(job.dir, n - 1, streams)
        uid, gid = (int(x) for x in p.user.split(":"))
        staging.prepare_writable(job.dir, uid, gid, streams)
        job.dir.write_budget(Budget(job.limit, consumed), durable=False)
    return known.timed("stage", since), files, prompt


def _decide(job: Job, known: Known, n: int, consumed: float) -> Known:
    """The compute decision (GPUs given, limits, budget, an agent's limits left), staged as
    an input the job reads."""
    p, st = job.plan, job.ledger.state
    agent_limits = agent_run.limits(p.agent, st) if p.agent is not None else None
    budget = Budget(job.limit, consumed).as_json()
    decided = envelope.allocation(p, n, known.gpus, known.gpu_fallback, budget, agent_limits)
    with stage("stage", known):
        decision = (decided.model_dump_json(indent=2) + "\n").encode()
        layout.add_input(job.dir, "compute-decision.json", decision)
    return replace(known, allocation=decided)


def _start(
    job: Job,
    known: Known,
    spec: ContainerSpec,
    n: int,
    consumed: float,
    guards: quotas.Guards,
    eg: egress.Egress | None,
    redactor: redaction.Redactor,
) -> Outcome:
    """Create, start and watch the attempt's container; one that never started is recorded
    as finished (its egress taken down) and its cause raised."""
    p, ledger = job.plan, job.ledger

    def created(container_id: str) -> None:
        data = {"attempt": n, "containerId": container_id}
        ledger.append(f"attempt-{n}.started", "attempt.started", data)
        log.event(
            logging.INFO,
            f"attempt {n} started: container {spec.name}",
            jobId=p.job_id,
            stage="container",
            attempt=n,
        )

    job.progress.stage("container", f"attempt {n}: {spec.name}")
    with stage("container", known):
        w = _watch(job, n, consumed, 0.0, guards, gpu_uuids=tuple(g.uuid for g in known.gpus))
        try:
            return container.run_attempt(
                job.backend, spec, w, job.dir.attempt_record(n), job.progress, created
            )
        except BaseException as exc:
            if guards.agent is not None:  # its followers end with the attempt
                guards.agent.close()
            if not isinstance(exc, container.NotStarted):
                raise
            cause = exc.cause
            category = (
                errors.Category.CANCELLED
                if isinstance(cause, KeyboardInterrupt)
                else getattr(cause, "category", errors.Category.INFRASTRUCTURE)
            )
            ledger.append(
                f"attempt-{n}.finished",
                "attempt.finished",
                {
                    "attempt": n,
                    "exitCode": None,
                    "oomKilled": False,
                    "classification": str(category),
                    "seconds": 0.0,
                    "how": "not-started",
                },
            )
            if eg is not None:  # its egress goes with it, its log kept
                down = egress_down(job.backend, job.ledger, job.dir, n, redactor)
                gone = replace(known, egress=down)
                raise Stopped("container", cause, gone) from None
            raise cause from None


def _disk_at_end(outcome: container.Outcome, guards: quotas.Guards) -> container.Outcome:
    """The disk quota measured once more as a container that ended by itself: a job that
    wrote past it and exited within one tick of the watch is stopped for it all the same."""
    ended_itself = not (outcome.stopped_for or outcome.cancelled or outcome.timed_out)
    if ended_itself and guards.disk.measure() > guards.disk.quota:
        return replace(outcome, stopped_for="disk_quota_exceeded")
    return outcome


def _egress_lease(
    job: Job, plan: EgressPlan, name: str, redactor: redaction.Redactor
) -> egress.Egress:
    """Lease a slot of the state folder's egress pool for the attempt named ``name`` (making
    one when none is free: the first attempt of a pool, or more at once than before)."""
    from runner.egress import slots as egress

    job.progress.stage("egress", f"proxy for {', '.join(map(str, plan.allow))} via "
                       f"{plan.upstream_network}")  # fmt: skip
    opts = job.options
    return egress.lease(
        job.backend, plan, name, opts.state_dir, labels=opts.labels, redactor=redactor
    )


def had_egress(ledger: Ledger, n: int) -> bool:
    """Whether attempt ``n``'s ``attempt.starting`` event recorded an egress lease (whose
    allowlist :func:`egress_down` ends, after the attempt's container is gone)."""
    mine = ledger.state.attempt(n)
    return bool(mine is not None and mine.starting.get("egress"))


def egress_down(
    backend: Backend,
    ledger: Ledger,
    job: JobDir,
    n: int,
    redactor: redaction.Redactor = redaction.NONE,
) -> EgressRecord | None:
    """End attempt ``n``'s egress lease, as its ``attempt.starting`` event recorded it,
    keeping its lines of the proxy's log, redacted, in its record; None when it had none.
    Safe to repeat."""
    mine = ledger.state.attempt(n)
    started = mine.starting.get("egress") if mine is not None else None
    if not started or "slot" not in started:  # none, or an earlier runner's (the sweeper's)
        return None
    if mine is not None and hostid.elsewhere(mine.starting):  # that host's slot, its to reap
        return None
    from runner.egress import slots as egress

    eg = egress.Egress.from_json(started)
    return egress.down(backend, eg, job.attempt_record(n), job.root, redactor)


def _acquire(job: Job, pin: images.ImagePin | None = None) -> tuple[images.Acquired, ImageRecord]:
    """The plan's image (or ``pin``: an agent runtime's), acquired and verified."""
    pin = job.plan.image if pin is None else pin
    pol = job.options.policy.policy
    settings = images.PullSettings(
        docker_config=Path(pol.dockerConfig) if pol.dockerConfig else None,
        insecure_registries=tuple(pol.insecureRegistries),
        retry_seconds=pol.registryRetrySeconds,
    )
    got = images.acquire(
        job.backend,
        pin,
        bundle=job.options.bundle if pin is job.plan.image else None,
        settings=settings,
        progress=job.progress,
    )
    info = got.info
    record = ImageRecord(
        reference=pin.reference,
        id=info.id,
        repoDigest=got.repo_digest,
        architecture=info.architecture or None,
        os=info.os or None,
        sizeBytes=info.size,
        source=got.source,
    )
    return got, record


def _check_runtime(job: Job) -> None:
    wanted = job.plan.limits.runtime
    if wanted == "runc":
        return
    runtimes = job.backend.runtimes()
    if wanted not in runtimes:
        raise PolicyViolation(
            f"this host's policy demands the {wanted} runtime (gVisor) and the engine has "
            f"only {', '.join(runtimes)}",
            hint="install and register it (scripts/setup.sh does), or change the policy",
        )


def _watch(
    job: Job,
    n: int,
    before: float,
    already: float,
    guards: quotas.Guards,
    as_of: float | None = None,
    gpu_uuids: tuple[str, ...] = (),
) -> Watch:
    """How to watch attempt ``n``: deadline from the remaining budget as of ``as_of`` (a
    reattach: when it was charged), heartbeats to the ledger and runtime-budget.json."""
    ledger, limit = job.ledger, job.limit

    def beat(seconds: float, reattached: bool) -> None:
        total = before + seconds
        data: dict[str, Any] = {
            "attempt": n,
            "attemptSeconds": round(seconds, 3),
            "consumedSeconds": round(total, 3),
        }
        if reattached:  # what this runner charged for the time no runner watched
            data["reattached"] = True
        ledger.append(f"attempt-{n}.beat-{len(ledger.events)}", "heartbeat", data)
        job.dir.write_budget(Budget(limit, total), durable=False)

    opts = job.options
    agent = guards.agent

    def started(container_id: str) -> None:
        if agent is not None:
            agent.attach(job.backend, container_id)

    sampling = None
    if opts.resource_sampling:
        lim = job.plan.limits
        reader = None
        if gpu_uuids:
            from runner.gpu import usage

            reader = (opts.gpu_usage or usage.NvmlReader)()
        sampling = resources.Sampling(
            _engine_name(job.backend), lim.runtime, lim.pids, gpus=gpu_uuids, gpu_reader=reader
        )
    return Watch(
        on_start=started,
        sampling=sampling,
        budget_left=limit - before - already,
        already=already,
        consumed_before=before,
        limit=limit,
        grace=opts.stop_grace_seconds,
        tick=opts.tick_seconds,
        heartbeat=opts.heartbeat_seconds,
        on_beat=beat,
        guard=guards.check,
        breached=guards.breached,
        lease=opts.lease_seconds,
        as_of=as_of,
    )


def _engine_name(backend: Backend) -> str:
    """The engine's name for the figures (asked once a process; "" when it cannot say)."""
    try:
        return engine_text(backend.engine().name)
    except errors.RunnerError:
        return ""


def _gpu_allocator(job: Job) -> gpus.Allocator:
    from runner.gpu import gpus

    backend = job.backend

    def alive(holder: dict[str, Any]) -> bool:
        from runner.execution.sweeper import runner_alive

        if runner_alive(Path(str(holder.get("jobDir")))):
            return True
        try:
            return backend.state(str(holder.get("containerName"))).running
        except ContainerVanished:
            return False

    lock_dir = job.options.gpu_lock_dir or gpus.HOST_LOCK_DIR
    return gpus.Allocator(lock_dir, alive)


def _allocate_gpus(
    job: Job, name: str
) -> tuple[tuple[str, ...], tuple[GpuRecord, ...], str | None, DeviceEdits | None]:
    """Device ids for the NVIDIA runtime or CDI edits (``runner.gpu.cdi``), their records, and why
    it runs on CPU only (if it does): specific GPUs, locked for this job (under Slurm, of those
    Slurm gave it: :func:`runner.planning.allocation.slurm_gpus`); none for CPU jobs. Without
    enough GPUs, or a way to hand them over, a contract may fall back to CPU."""
    p, progress = job.plan, job.progress
    want = p.limits.gpus
    if want == "none":
        return (), (), p.gpu_fallback, None
    from runner.gpu import cdi, gpus

    detector = job.options.gpu_detector or gpus.HostDetector()
    owner = {"jobDir": (job_dir := str(job.dir.root.resolve())), "containerName": name}
    try:
        host = detector.detect()
        # Under Slurm, only the GPUs Slurm gave the job: the engine's daemon makes the
        # container outside the job's cgroup, so nothing else keeps it off another job's.
        given = slurm_gpus(os.environ, host, want)
        chosen = _gpu_allocator(job).allocate(want, host if given is None else given, owner)
        try:
            edits = cdi.inject(job.backend, chosen, job.options.cdi_dirs or cdi.SPEC_DIRS)
        except GpuUnavailable:
            _gpu_allocator(job).release(job_dir)
            raise
    except GpuUnavailable as exc:
        if not policy.cpu_fallback_allowed(job.contract):
            raise
        progress.stage("gpu", f"no GPU: running on CPU only ({exc.message})")
        return (), (), f"{exc.message}; the contract allows a CPU fallback", None
    names: list[str | None] = [*edits.cdi_devices] or [None] * len(chosen)
    records = tuple(
        GpuRecord(index=g.index, uuid=g.uuid, model=g.model, memoryBytes=g.memory_bytes,
                  driverVersion=g.driver_version, injection=edits.mode, cdiDevice=cdi_name)
        for g, cdi_name in zip(chosen, names, strict=True)
    )  # fmt: skip
    progress.stage(
        "gpu", ", ".join(f"{g.index}: {g.model} ({g.uuid}, {edits.mode})" for g in chosen)
    )
    if edits.mode == "nvidia-runtime":
        return tuple(g.uuid for g in chosen), records, None, None
    return (), records, None, edits
