"""The result envelope built: a pure function of what a run produced, and the parts of it
that are computed rather than recorded (the compute decision, the applied limits, the
signature, the materials). The models are :mod:`runner.models.envelope`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.models.envelope import (
    AgentLimits,
    AgentRecord,
    AgentResultRecord,
    AgentUsageRecord,
    Allocation,
    AppliedLimits,
    AttemptRecord,
    BudgetRecord,
    ContainerRecord,
    DiskRecord,
    EgressRecord,
    EngineRecord,
    Failure,
    FileRef,
    GpuRecord,
    ImageRecord,
    InputRecord,
    Material,
    MeasurementError,
    MeasurementResult,
    PolicyRecord,
    ResultEnvelope,
    SignatureRecord,
    Status,
    Timings,
)

if TYPE_CHECKING:
    from runner.contract import VerifiedContract
    from runner.execution.container import Outcome
    from runner.planning.plan import ExecutionPlan

__all__ = ["allocation", "build"]


def allocation(
    p: ExecutionPlan,
    attempt: int,
    gpus: Sequence[GpuRecord],
    fallback: str | None,
    budget: Mapping[str, float],
    agent: AgentLimits | None = None,
) -> Allocation:
    """The compute decision for attempt ``attempt`` of plan ``p``."""
    lim = p.limits
    return Allocation(
        jobId=p.job_id,
        attempt=attempt,
        accelerator="gpu" if gpus else "cpu",
        cpus=lim.cpus,
        memoryBytes=lim.memory_bytes,
        shmBytes=lim.shm_bytes,
        pidsLimit=lim.pids,
        tmpfsBytes=lim.tmpfs_bytes,
        diskQuotaBytes=lim.disk_quota_bytes,
        gpus=list(gpus),
        cpuFallback=fallback,
        runtime=lim.runtime,
        network=lim.network,
        budgetLimitSeconds=budget["limitSeconds"],
        budgetRemainingSeconds=budget["remainingSeconds"],
        agent=agent,
    )


def materials(
    contract: VerifiedContract | None,
    inputs: Sequence[InputRecord],
    image: ImageRecord | None,
    agent: AgentRecord | None = None,
) -> list[Material]:
    """The contract, every input, the image that ran and an agent's runtime image (and its
    files) and host prompt, by digest; the signed statement carries them in its predicate."""
    out = []
    if contract is not None:
        out.append(
            Material(
                name=f"contract:{contract.model.name}",
                digest={"sha256": contract.digest.removeprefix("sha256:")},
                annotations={"digestOf": "RFC 8785 canonical JSON without contractDigest"},
            )
        )
    for i in inputs:
        form = "sha256 of a file's bytes, or of a folder's runner-tree-v1 listing"
        out.append(
            Material(
                name=f"input/{i.path}",
                digest={"sha256": i.digest.removeprefix("sha256:")},
                annotations={"field": i.field, "digestOf": form},
            )
        )
    if image is not None and image.id:
        notes = {"reference": image.reference}
        if image.repoDigest:
            notes["repoDigest"] = image.repoDigest
        out.append(
            Material(
                name=f"image:{image.reference}",
                digest={"sha256": image.id.removeprefix("sha256:")},
                annotations={**notes, "digestOf": "image id (config digest)"},
            )
        )
        brought = agent.agentRuntime if agent is not None else None
        if brought is not None and brought.image.id:
            out.append(
                Material(
                    name=f"agent-runtime:{brought.image.reference}",
                    digest={"sha256": brought.image.id.removeprefix("sha256:")},
                    annotations={
                        "reference": brought.image.reference,
                        **(
                            {"repoDigest": brought.image.repoDigest}
                            if brought.image.repoDigest
                            else {}
                        ),
                        "digestOf": "image id (config digest) of the agent runtime's image; "
                        "its files, mounted in the image above, have filesDigest",
                        "filesDigest": brought.filesDigest,
                        "mountedAt": brought.mountedAt,
                    },
                )
            )
        # With an image, the run got past staging: its assets were verified and mounted.
        for a in contract.model.fetched_assets if contract is not None else []:
            out.append(
                Material(
                    name=f"asset:{a.id}",
                    digest={"sha256": a.sha256.removeprefix("sha256:")},
                    annotations={
                        "path": f"/job/assets/{a.path}",
                        "digestOf": "sha256 of the asset's bytes (the archive's, when unpacked "
                        f"as {a.unpack})"
                        if a.unpack
                        else "sha256 of the asset's bytes",
                    },
                )
            )
    return out


def applied_limits(p: ExecutionPlan) -> AppliedLimits:
    """The plan's caps as the envelope records them."""
    lim = p.limits
    return AppliedLimits(
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


def signature_record(c: VerifiedContract) -> SignatureRecord:
    m = c.model
    return SignatureRecord(
        status="verified" if c.signature else "none",
        keyIds=list(c.signature.keyids) if c.signature else [],
        payloadType=c.signature.payload_type if c.signature else None,
        issuedAt=m.issuedAt.isoformat() if m.issuedAt else None,
        expiresAt=m.expiresAt.isoformat() if m.expiresAt else None,
        audience=m.audience,
    )


def build(
    *,
    started_at: str,
    finished_at: str,
    total_seconds: float,
    policy: PolicyRecord | None,
    failure: Failure | None,
    status: Status | None = None,
    contract: VerifiedContract | None = None,
    plan: ExecutionPlan | None = None,
    job_dir: Path | None = None,
    image: ImageRecord | None = None,
    engine: EngineRecord | None = None,
    outcome: Outcome | None = None,
    gpus: Sequence[GpuRecord] = (),
    gpu_fallback: str | None = None,
    seconds: Mapping[str, float] | None = None,
    warnings: Sequence[str] = (),
    budget: BudgetRecord | None = None,
    logs: Sequence[FileRef] = (),
    disk: DiskRecord | None = None,
    agent_result: AgentResultRecord | None = None,
    measurements: Sequence[MeasurementResult] = (),
    errors: Sequence[MeasurementError] = (),
    attempt: int | None = None,
    allocation: Allocation | None = None,
    attempts: Sequence[AttemptRecord] = (),
    inputs: Sequence[InputRecord] = (),
    inputs_unchanged: bool | None = None,
    egress: EgressRecord | None = None,
    agent: AgentRecord | None = None,
    agent_usage: AgentUsageRecord | None = None,
) -> ResultEnvelope:
    """The envelope of a run, a pure function of what the run produced (any of it may be
    missing: a run refused at the contract has no plan, no job folder, no container)."""
    from runner._version import __version__

    o, p, c = outcome, plan, contract
    seconds = seconds or {}
    return ResultEnvelope(
        runnerVersion=__version__,
        jobId=p.job_id if p else None,
        contractName=c.model.name if c else None,
        contractDigest=c.digest if c else None,
        status=status or ("failed" if failure else "succeeded"),
        failure=failure,
        exitCode=o.state.exit_code if o else None,
        image=image,
        engine=engine,
        measurements=list(measurements),
        measurementErrors=list(errors),
        limits=applied_limits(p) if p else None,
        container=ContainerRecord(
            id=o.container_id,
            name=o.name,
            oomKilled=o.state.oom_killed,
            stoppedByRunner=o.timed_out or o.cancelled,
        )
        if o
        else None,
        timings=Timings(
            startedAt=started_at,
            finishedAt=finished_at,
            totalSeconds=total_seconds,
            stageSeconds=seconds.get("stage"),
            imageSeconds=seconds.get("image"),
            runSeconds=o.run_seconds if o else None,
            containerStartedAt=o.state.started_at if o else None,
            containerFinishedAt=o.state.finished_at if o else None,
        ),
        signature=signature_record(c) if c else None,
        policy=policy,
        warnings=list(warnings),
        budget=budget,
        gpus=list(gpus),
        logs=list(logs),
        disk=disk,
        agentResult=agent_result,
        gpuFallback=gpu_fallback,
        inputs=[*inputs, *_host_prompt(agent)],
        inputsUnchanged=inputs_unchanged,
        materials=materials(c, [*inputs, *_host_prompt(agent)], image, agent),
        jobDir=str(job_dir) if job_dir else None,
        research=c.data.get("research") if c and isinstance(c.data.get("research"), dict) else None,
        attempt=attempt,
        allocation=allocation,
        attempts=list(attempts),
        stdoutPath=p.stdout_path if p else None,
        stderrPath=p.stderr_path if p else None,
        egress=egress,
        agent=agent,
        agentUsage=agent_usage,
    )


def _host_prompt(agent: AgentRecord | None) -> list[InputRecord]:
    """The host's prompt an agent got (the contract named none), as an input of the run."""
    hp = agent.hostPrompt if agent is not None else None
    if hp is None:
        return []
    field = f"host:agents.{agent.runtime}.prompts" if agent else "host"
    return [InputRecord(field=field if hp.source == "host" else "runner:default-prompt",
                        path=hp.path, digest=hp.sha256)]  # fmt: skip
