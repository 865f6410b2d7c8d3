"""Contract + policy → ExecutionPlan: everything the container stage needs, decided up front.

Pure: no I/O. The plan is frozen and recorded (its limits) in the envelope, so what was applied
is what is reported.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

from runner.contract import VerifiedContract
from runner.contract.models import JOB_ID_PATTERN
from runner.errors import PolicyViolation, ProtocolAmbiguous
from runner.images import ImagePin, parse_pin
from runner.policy import HostPolicy, gpus_over_policy, isolation

OVERRIDABLE = ("cpus", "memoryGb", "shmGb", "pidsLimit", "timeoutMinutes", "tmpfsMb")
"""Limits the host operator may tighten from the command line (``--limit KEY=VALUE``)."""

GIB = 1024**3
MIB = 1024**2
JOB_UID = 10001
"""The uid jobs run as when the runner itself runs as root (the image's ``job`` user)."""

# The job's stdout and stderr go straight to files under /job/output: no bytes pass through the
# daemon or the runner, so capture costs nothing and memory stays bounded whatever the size.
STREAM_WRAPPER = 'exec "$@" >"$RUNNER_STDOUT" 2>"$RUNNER_STDERR"'


@dataclass(frozen=True)
class Limits:
    """Caps applied to the container, exactly as passed to the engine."""

    cpus: float
    memory_bytes: int
    memory_swap_bytes: int
    shm_bytes: int
    pids: int | None
    """None under runsc: gVisor's processes are tasks inside its sandbox, not host processes,
    and a host pids cap there kills the sandbox instead of failing forks; the memory cap
    bounds them."""
    tmpfs_bytes: int
    gpus: int | Literal["none", "all"]
    network: str
    timeout_seconds: float
    runtime: Literal["runc", "runsc"] = "runc"
    disk_quota_bytes: int = 100 * GIB
    log_limit_bytes: int = GIB
    stop_on_log_limit: bool = False
    read_only_rootfs: bool = True
    cap_drop: tuple[str, ...] = ("ALL",)
    security_opt: tuple[str, ...] = ("no-new-privileges",)
    init: bool = True


@dataclass(frozen=True)
class ExecutionPlan:
    job_id: str
    contract_digest: str
    image: ImagePin
    argv: tuple[str, ...]
    """The contract's command, as the job sees it."""
    working_dir: str
    stdout_path: str
    stderr_path: str
    """Relative to the job's output folder."""
    user: str
    limits: Limits
    labels: dict[str, str] = field(default_factory=dict)
    gpu_fallback: str | None = None
    """Why a contract asking for GPUs will run on CPU only (its policy allows fewer GPUs and
    the contract allows a CPU fallback); None otherwise."""
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def entrypoint(self) -> list[str]:
        return ["/bin/sh", "-c", STREAM_WRAPPER, "runner-job"]


def default_job_id(contract: VerifiedContract) -> str:
    """The contract's ``jobId``, else ``<name>-<first 12 hex of the digest>``."""
    if contract.model.jobId:
        return contract.model.jobId
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", contract.model.name).strip("-.") or "job"
    return f"{name[:100]}-{contract.digest.removeprefix('sha256:')[:12]}"


def job_id_for(contract: VerifiedContract, requested: str | None) -> str:
    """The job id: ``--job-id`` if given (a valid id, and not another than the one the issuer
    signed, which would give the signed contract a fresh ledger and budget), else the
    default."""
    if requested is None:
        return default_job_id(contract)
    if not re.fullmatch(JOB_ID_PATTERN, requested):
        raise PolicyViolation(
            f"--job-id {requested!r} is not a job id: letters, digits, '_', '.', '-' "
            "(starting with a letter or digit), at most 128",
            hint="pick an id such as toy-eval-2",
        )
    signed = contract.model.jobId
    if signed and signed != requested and contract.signature is not None:
        raise PolicyViolation(
            f"--job-id {requested!r} differs from the signed $.jobId {signed!r}; the issuer "
            "fixed this contract's job (and so its budget)",
            hint=f"drop --job-id, or pass --job-id {signed}",
        )
    return requested


def check_command(contract: VerifiedContract) -> tuple[str, ...]:
    """The argv to run; refuse when there is none or a required fragment is missing."""
    protocol = contract.model.protocol
    if not protocol.command:
        raise ProtocolAmbiguous(
            "$.protocol.command: the contract names no command to run",
            hint='add "command": ["python3", "/job/input/repository/evaluate.py", ...] to protocol',
        )
    joined = shlex.join(protocol.command)
    missing = [f for f in protocol.requiredCommandFragments if f not in joined]
    if missing:
        raise ProtocolAmbiguous(
            f"$.protocol.command: {joined!r} lacks the required fragment(s) "
            + ", ".join(repr(f) for f in missing),
            hint="the command must contain every entry of $.protocol.requiredCommandFragments",
        )
    return tuple(protocol.command)


def tightened(contract: VerifiedContract, overrides: dict[str, float]) -> dict[str, float]:
    """The contract's limits with the operator's overrides applied; an override may only
    lower a limit, never raise the signed value."""
    env = contract.model.environment
    values: dict[str, float] = {k: float(getattr(env, k)) for k in OVERRIDABLE}
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise PolicyViolation(
                f"--limit {key}: not a limit that can be overridden",
                hint=f"use one of {', '.join(OVERRIDABLE)}",
            )
        if not math.isfinite(value) or value > values[key] or value <= 0:
            raise PolicyViolation(
                f"--limit {key}={value:g} would loosen the contract's {values[key]:g}; "
                "an override can only tighten a limit",
                hint=f"pass a value in (0, {values[key]:g}], or drop the override",
            )
        values[key] = value
    return values


def build(
    contract: VerifiedContract,
    policy: HostPolicy,
    *,
    job_id: str,
    host_uid: int,
    host_gid: int,
    labels: dict[str, str] | None = None,
    overrides: dict[str, float] | None = None,
) -> ExecutionPlan:
    """Decide everything about the run. Raises the refusals of the protocol and image pin."""
    argv = check_command(contract)
    env = contract.model.environment
    pin = parse_pin(env.image, env.imageId, allow_unpinned=policy.allowUnpinnedImages)
    lim = tightened(contract, overrides or {})
    gpus: int | Literal["none", "all"] = env.gpu
    fallback = None
    if gpus_over_policy(contract, policy):
        gpus = "none"
        fallback = (
            f"this host's policy grants at most {policy.maxima.gpus} GPU(s) and the contract "
            "allows a CPU fallback"
        )
    memory = int(lim["memoryGb"] * GIB)
    limits = Limits(
        cpus=lim["cpus"],
        memory_bytes=memory,
        memory_swap_bytes=memory,
        shm_bytes=int(lim["shmGb"] * GIB),
        pids=None if isolation(contract, policy) == "runsc" else int(lim["pidsLimit"]),
        tmpfs_bytes=int(lim["tmpfsMb"]) * MIB,
        gpus=gpus,
        network="bridge" if env.networkAccess else "none",
        timeout_seconds=lim["timeoutMinutes"] * 60,
        runtime=isolation(contract, policy),
        disk_quota_bytes=int((env.diskGb or policy.maxima.diskGb) * GIB),
        log_limit_bytes=int(min(env.logLimitMb or policy.logLimitMb, policy.logLimitMb) * MIB),
        stop_on_log_limit=policy.logLimitAction == "stop",
    )
    if limits.runtime == "runsc" and env.networkAccess:
        raise PolicyViolation(
            "$.environment.networkAccess: runsc (gVisor) runs jobs with no network here; a job "
            "that needs network runs under runc",
            hint="ask for isolation runc, or drop networkAccess",
        )
    user = f"{JOB_UID}:{JOB_UID}" if host_uid == 0 else f"{host_uid}:{host_gid}"
    protocol = contract.model.protocol
    all_labels = {
        "org.runner.managed": "true",
        "org.runner.job-id": job_id,
        "org.runner.contract-digest": contract.digest,
        **(labels or {}),
    }
    return ExecutionPlan(
        job_id=job_id,
        contract_digest=contract.digest,
        image=pin,
        argv=argv,
        working_dir=protocol.workingDirectory,
        stdout_path=protocol.stdoutPath,
        stderr_path=protocol.stderrPath,
        user=user,
        limits=limits,
        gpu_fallback=fallback,
        labels=all_labels,
        environment={
            "HOME": "/tmp",  # noqa: S108 - the job's own tmpfs
            "RUNNER_JOB_ID": job_id,
            "RUNNER_STDOUT": f"/job/output/{protocol.stdoutPath}",
            "RUNNER_STDERR": f"/job/output/{protocol.stderrPath}",
            "RUNNER_BUDGET_FILE": "/job/execution/runtime-budget.json",
        },
    )
