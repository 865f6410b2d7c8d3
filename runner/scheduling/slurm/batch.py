"""Slurm as a cluster submitter: one ``sbatch`` per contract, whose batch script runs
`runner run` on the node through the step (:mod:`runner.scheduling.slurm.step`; `runner submit
--to slurm`), and what `runner wait`, `runner cancel` and `runner status` read back.

A cluster is not a backend: Slurm decides *where* `runner run` runs, and the runner on the
node keeps every guarantee (ledger, caps, evidence). What this module adds:

- :func:`prepare` verifies a contract and the host policy exactly as `runner run` does and
  turns the plan into a :class:`Request` (CPUs, memory, GPUs, time) for ``sbatch``;
- :func:`batch_script` is the script Slurm runs: it checks that the node sees the state folder
  (a marker written at submit) and the contract bytes that were verified, then ``exec``s the
  step (:mod:`runner.scheduling.slurm.step`), which runs `runner run` and passes Slurm's
  SIGTERM (scancel, time limit) on to it, so the runner stops its container and records the
  attempt ``cancelled`` (the budget continues on requeue); the step stays while a served
  runner (``runner serve`` on the node) still owns the job after its client died;
- under Slurm (``SLURM_JOB_ID`` set) the orchestrator refuses a plan whose caps exceed the
  job's allocation (:func:`runner.planning.allocation.check_allocation`: execution does not
  import scheduling);
- :mod:`runner.scheduling.slurm.cluster` runs the Slurm commands and reads a job's state back.

Submissions are recorded, append-only, in ``<state>/slurm/<job id>/submissions.jsonl``
(:mod:`runner.scheduling.submissions`).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shlex
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runner.contract import Trust, VerifiedContract
from runner.core.errors import (
    InfrastructureError,
    JobNotFound,
    PolicyViolation,
)
from runner.planning.plan import ExecutionPlan
from runner.planning.policy import HostPolicy
from runner.scheduling import submissions
from runner.scheduling.planned import planned
from runner.state.ledger import LedgerState

__all__ = [
    "Request",
    "batch_script",
    "check_grace",
    "check_name",
    "check_state_dir",
    "fs_type",
    "last_submission",
    "offered_gpu_types",
    "prepare",
    "record",
    "record_dir",
    "sbatch_args",
    "submission_of",
    "time_minutes",
    "write_batch",
]

SETUP_ALLOWANCE_SECONDS = 60
"""Added to a job's time limit for what `runner run` does before and after the container's
budget starts: verification, staging, the image check, parsing and the envelope."""
MEMORY_MARGIN_MIB = 512
"""Added to the container's memory cap in ``--mem``: the runner's own process on the node."""
KILLWAIT_MARGIN_SECONDS = 5
"""Slurm's KillWait must exceed the stop grace by this much: after stopping the container the
runner removes it and writes the ledger and the envelope."""
SHARED_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cephfs", "cifs", "smb3",
        "glusterfs", "fuse.glusterfs", "fuse.cephfs", "fuse.juicefs", "fuse.sshfs",
        "orangefs", "pvfs2", "panfs", "wekafs", "virtiofs", "9p",
    }
)  # fmt: skip
"""Filesystem types that several nodes mount as one (read from /proc/self/mountinfo)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Request:
    """One job as ``sbatch`` gets it (and as submissions.jsonl records it)."""

    contract: str
    contractSha256: str
    contractDigest: str
    jobId: str
    cpus: int
    memMiB: int
    gres: str | None
    timeMinutes: int
    budgetSeconds: float


def check_name(option: str, value: str) -> str:
    """A partition or account name: letters, digits, ``_ . -`` (never an option or a path)."""
    if not _NAME.fullmatch(value):
        raise PolicyViolation(
            f"{option} {value!r} is not a Slurm name (letters, digits, '_', '.', '-'; at most "
            "64 characters, not starting with '-')",
            hint=f"pass {option} as `sinfo` or `sacctmgr` lists it",
        )
    return value


def remaining_seconds(plan: ExecutionPlan, state: LedgerState | None) -> float:
    """The budget left for the job: its ledger's (when this contract's job was accepted),
    else the contract's whole budget (:meth:`LedgerState.left_to_schedule`)."""
    return (state or LedgerState()).left_to_schedule(
        plan.job_id, plan.contract_digest, plan.limits.timeout_seconds, "Slurm"
    )


def time_minutes(remaining: float, stop_grace: float, ceiling: int | None) -> int:
    """``--time``: the budget left + the stop grace + :data:`SETUP_ALLOWANCE_SECONDS`, rounded
    up to whole minutes, and never more than the user's ``--time`` (``ceiling``)."""
    minutes = math.ceil((remaining + stop_grace + SETUP_ALLOWANCE_SECONDS) / 60)
    return max(1, min(minutes, ceiling) if ceiling is not None else minutes)


def offered_gpu_types(gres_column: str) -> list[str]:
    """GPU types a partition offers, from ``sinfo -h -o %G`` lines (``gpu:h100:4(S:0-1)``,
    ``gpu:4``, ``(null)``), in order, without repeats."""
    types: list[str] = []
    for line in gres_column.splitlines():
        for item in line.split(","):
            parts = item.strip().split("(")[0].split(":")
            if len(parts) == 3 and parts[0] == "gpu" and parts[1] not in types:
                types.append(parts[1])
    return types


def gpu_gres(plan: ExecutionPlan, preferred: list[str], offered: list[str]) -> str | None:
    """``--gres``: ``gpu:<type>:N`` with the first preferred type the partition offers, else
    ``gpu:N``; None without GPUs. A plan with ``gpu: "all"`` is refused (Slurm needs a count)."""
    gpus = plan.limits.gpus
    if gpus == "all":
        raise PolicyViolation(
            '$.environment.gpu: "all" cannot be submitted to Slurm, which allocates a count',
            hint="ask for a number of GPUs in the contract",
        )
    if gpus == "none" or gpus == 0:
        return None
    chosen = next((t for t in preferred if t in offered and _NAME.fullmatch(t)), None)
    return f"gpu:{chosen}:{gpus}" if chosen else f"gpu:{gpus}"


def request_for(
    path: Path,
    raw: bytes,
    contract: VerifiedContract,
    plan: ExecutionPlan,
    state: LedgerState | None,
    *,
    stop_grace: float,
    ceiling: int | None,
    offered: list[str],
) -> Request:
    """The plan as ``sbatch`` resources (see :func:`sbatch_args`)."""
    import hashlib

    if any(c in str(path) for c in "\n\r\\"):
        raise PolicyViolation(
            f"the contract path {str(path)!r} has a line break or backslash, which the batch "
            "script's checksum line cannot carry",
            hint="move the contract to a plain path",
        )
    remaining = remaining_seconds(plan, state)
    compute = contract.model.computeRequirement
    preferred = list(compute.preferredGpuTypes) if compute is not None else []
    return Request(
        contract=str(path),
        contractSha256=hashlib.sha256(raw).hexdigest(),
        contractDigest=contract.digest,
        jobId=plan.job_id,
        cpus=max(1, math.ceil(plan.limits.cpus)),
        memMiB=math.ceil(plan.limits.memory_bytes / 2**20) + MEMORY_MARGIN_MIB,
        gres=gpu_gres(plan, preferred, offered),
        timeMinutes=time_minutes(remaining, stop_grace, ceiling),
        budgetSeconds=remaining,
    )


def prepare(
    path: Path,
    rules: HostPolicy,
    trust: Trust,
    state: Path,
    *,
    job_id: str | None,
    stop_grace: float,
    ceiling: int | None,
    offered: list[str],
) -> Request:
    """Verify the contract at ``path`` and this host's policy exactly as `runner run` does
    (signature, digest, schema, mode, policy; validity times unless the job was accepted
    already), plan it, and read the budget left from its ledger: the job's :class:`Request`."""
    from runner.contract.load import MAX_CONTRACT_BYTES
    from runner.core.safefs import read_named

    got = planned(
        path, rules, trust, state, job_id=job_id, host_uid=os.getuid(), host_gid=os.getgid()
    )
    raw = read_named(path, MAX_CONTRACT_BYTES)
    return request_for(
        path, raw, got.contract, got.plan, got.state,
        stop_grace=stop_grace, ceiling=ceiling, offered=offered,
    )  # fmt: skip


def check_grace(stop_grace: float, kill_wait: int) -> None:
    """Refuse a stop grace that Slurm's KillWait would cut short (SIGKILL to the runner
    before it stopped its container and recorded the attempt)."""
    if not 0 < stop_grace < 3600:
        raise PolicyViolation(
            f"--stop-grace {stop_grace:g}: wants seconds between 0 and 3600",
            hint="the default is 5",
        )
    if stop_grace + KILLWAIT_MARGIN_SECONDS > kill_wait:
        raise PolicyViolation(
            f"--stop-grace {stop_grace:g} s does not fit Slurm's KillWait of {kill_wait} s: "
            f"KillWait must exceed the grace by {KILLWAIT_MARGIN_SECONDS} s, or Slurm kills the "
            "runner before it has stopped its container",
            hint=f"lower --stop-grace to at most {kill_wait - KILLWAIT_MARGIN_SECONDS} s, or "
            "raise KillWait in slurm.conf",
        )


def fs_type(path: Path, mountinfo: str) -> str:
    """The filesystem type of the mount holding ``path`` (resolved), from mountinfo text."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount = fields[4].encode().decode("unicode_escape")  # \040 for spaces
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def check_state_dir(state: Path, nodes: int, kind: str) -> str | None:
    """Refuse a state folder the nodes cannot share; a note when it is local and allowed
    (a partition of one node)."""
    if "%" in str(state):  # sbatch would read it as a pattern in --output (%j, %u ...)
        raise PolicyViolation(
            f"--state-dir {state} has a '%' in it, which sbatch expands in the job's log path",
            hint="use a state folder whose path has no '%'",
        )
    if kind in SHARED_FILESYSTEMS:
        return None
    if nodes <= 1:
        return (
            f"the state folder {state} is on a local filesystem ({kind}); fine for a partition "
            "of one node"
        )
    raise PolicyViolation(
        f"--state-dir {state} is on a local filesystem ({kind}), but the partition has {nodes} "
        "nodes: the node that runs the job must see the same ledger and job folder",
        hint="pass a --state-dir on storage every node mounts (NFS, Lustre, GPFS, BeeGFS, "
        "CephFS ...)",
    )


# --------------------------------------------------------------------------- the batch job


def record_dir(state: Path, job_id: str) -> Path:
    """``<state>/slurm/<job id>``: the job's submissions, batch scripts, logs, envelopes."""
    return submissions.folder(state, "slurm", job_id)


def batch_script(
    request: Request, *, python: str, state: Path, marker: Path, token: str, run_args: list[str]
) -> str:
    """The batch script: the node must see the marker and the verified contract bytes; then
    the step (:mod:`runner.scheduling.slurm.step`) replaces the shell (``exec``) and runs
    `runner run`, its envelope going to ``envelope-<Slurm job id>.json`` beside the marker;
    the step passes Slurm's signals on and stays while a served runner still owns the job."""
    q = shlex.quote
    folder = q(str(marker.parent))
    # -P: the step starts in the job's record folder, which -m would put first on sys.path
    # (as autostart's server, nothing is imported from a working folder).
    argv = [
        python, "-P", "-m", "runner", "run", request.contract, "--state-dir", str(state),
        "--job-id", request.jobId, "--json", *run_args,
    ]  # fmt: skip
    step = [
        python, "-P", "-m", "runner.scheduling.slurm.step", "--state-dir", str(state),
        "--job-id", request.jobId,
    ]  # fmt: skip
    return "\n".join(
        [
            "#!/bin/sh",
            f"# runner submit: job {request.jobId}, contract sha256:{request.contractSha256}",
            f'if [ "$(cat {q(str(marker))} 2>/dev/null)" != {q(token)} ]; then',
            # printf with the paths as arguments: nothing of a path is ever read as shell.
            "  printf 'runner: this node (%s) does not see the state folder %s written at "
            "submit: --state-dir must be on storage every node mounts\\n'"
            f' "$(hostname)" {q(str(state))} >&2',
            "  exit 97",
            "fi",
            f"if ! printf '%s\\n' {q(request.contractSha256 + '  ' + request.contract)}"
            " | sha256sum -c --status; then",
            "  printf 'runner: the contract %s on this node is not the one verified at submit "
            f"(missing or changed)\\n' {q(request.contract)} >&2",
            "  exit 98",
            "fi",
            # The label is the Epilog's (scripts/slurm-epilog.sh) way to this job's container;
            # the step (runner.scheduling.slurm.step) outlives a client whose served runner
            # runs on.
            f"exec {' '.join(q(a) for a in step)} -- {' '.join(q(a) for a in argv)}"
            f' --label slurm.job-id="$SLURM_JOB_ID" > {folder}/envelope-$SLURM_JOB_ID.json',
            "",
        ]
    )


def sbatch_args(
    request: Request, *, folder: Path, partition: str | None, account: str | None
) -> list[str]:
    """The ``sbatch`` options of one job (the script's path comes last)."""
    args = [
        f"--job-name=runner-{request.jobId}"[:128],
        f"--comment=runner-job={request.jobId},contract={request.contractDigest}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={request.cpus}",
        f"--mem={request.memMiB}M",
        f"--time={request.timeMinutes}",
        "--requeue",
        "--open-mode=append",
        f"--output={folder}/slurm-%j.out",
        f"--chdir={folder}",
        "--parsable",
    ]
    if request.gres:
        args.append(f"--gres={request.gres}")
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    return args


def write_batch(request: Request, state: Path, python: str, run_args: list[str]) -> Path:
    """Write the marker and the batch script into the job's record folder; the script."""
    folder = record_dir(state, request.jobId)
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    marker = folder / f"marker-{token}"
    marker.write_text(token)
    script = folder / f"batch-{token}.sh"
    text = batch_script(
        request, python=python, state=state, marker=marker, token=token, run_args=run_args
    )
    script.write_text(text)
    return script


def record(state: Path, request: Request, slurm_job: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Append one submission to the job's ``submissions.jsonl``; the line's data."""
    entry = {
        "slurmJobId": slurm_job,
        **asdict(request),
        "submittedAt": datetime.now(UTC).isoformat(timespec="seconds"),
        **extra,
    }
    return submissions.append(state, "slurm", request.jobId, entry)


def last_submission(state: Path, job_id: str) -> dict[str, Any] | None:
    """The job's latest submission, or None when it was never submitted."""
    data = submissions.latest(state, "slurm", job_id)
    slurm_job = str(data.get("slurmJobId", "")) if data is not None else ""
    if data is not None and not (slurm_job.isascii() and slurm_job.isdigit()):
        path = record_dir(state, job_id) / submissions.FILE
        raise InfrastructureError(f"{path}: its last line names no Slurm job id")
    return data


def submission_of(state: Path, job_id: str) -> dict[str, Any]:
    """:func:`last_submission`, or a job_not_found refusal."""
    found = last_submission(state, job_id)
    if found is None:
        raise JobNotFound(
            f"job {job_id!r} was never submitted to Slurm from {state}",
            hint="pass the job id `runner submit` printed and the same --state-dir",
        )
    return found
