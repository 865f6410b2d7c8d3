"""What a cluster scheduler allocated to this job, read from the job's environment, and the
refusal of a plan whose caps exceed it.

Under Slurm (``SLURM_JOB_ID`` set) the node's share of the job is in ``SLURM_CPUS_ON_NODE``,
``SLURM_MEM_PER_NODE`` (else ``SLURM_MEM_PER_CPU`` times the CPUs) and
``SLURM_GPUS_ON_NODE``. The plan stage of `runner run` checks its caps against them
(:func:`check_allocation`), so a plan is bounded by the host's grant as it is by the host's
policy. Nothing here talks to Slurm (``runner.scheduling.slurm`` submits the job from above).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runner.backends.types import Limits
from runner.core.errors import PolicyViolation

__all__ = ["check_allocation", "slurm_job"]

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def slurm_job(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Under Slurm, the job this runner runs in, as ``attempt.starting`` records it (``slurm``),
    so that a later takeover can ask Slurm whether it still runs
    (:func:`runner.execution.takeover.fence`): ``jobId`` (``SLURM_JOB_ID``, ASCII digits),
    ``restarts`` (``SLURM_RESTART_COUNT``, 0 when unset) and ``node`` (``SLURMD_NODENAME``,
    when it is a plain host name). None outside Slurm or when the id is not digits."""
    job = env.get("SLURM_JOB_ID", "")
    if not (job.isascii() and job.isdigit() and len(job) <= 20):
        return None
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    found: dict[str, Any] = {
        "jobId": job,
        "restarts": int(restarts)
        if restarts.isascii() and restarts.isdigit() and len(restarts) <= 9
        else 0,
    }
    node = env.get("SLURMD_NODENAME", "")
    if _NODE.fullmatch(node):
        found["node"] = node
    return found


def check_allocation(limits: Limits, env: Mapping[str, str]) -> None:
    """Under Slurm (``SLURM_JOB_ID`` set), refuse a plan whose CPU, memory or GPU cap exceeds
    the job's allocation on this node. Memory is checked when Slurm says it
    (``SLURM_MEM_PER_NODE``, else ``SLURM_MEM_PER_CPU`` times the CPUs)."""
    if not env.get("SLURM_JOB_ID"):
        return
    hint = "submit with `runner submit --to slurm`, which asks Slurm for the plan's caps"
    cpus = _int(env.get("SLURM_CPUS_ON_NODE"))
    if cpus is not None and limits.cpus > cpus:
        raise PolicyViolation(
            f"the plan's CPU cap ({limits.cpus:g}) exceeds the Slurm job's allocation "
            f"(SLURM_CPUS_ON_NODE={cpus})",
            hint=hint,
        )
    mem = _int(env.get("SLURM_MEM_PER_NODE"))
    per_cpu = _int(env.get("SLURM_MEM_PER_CPU"))
    if mem is None and per_cpu is not None and cpus is not None:
        mem = per_cpu * cpus
    cap_mib = limits.memory_bytes / 2**20
    if mem is not None and cap_mib > mem:
        raise PolicyViolation(
            f"the plan's memory cap ({cap_mib:g} MiB) exceeds the Slurm job's allocation "
            f"({mem} MiB)",
            hint=hint,
        )
    if isinstance(limits.gpus, int) and limits.gpus > 0:
        have = _int(env.get("SLURM_GPUS_ON_NODE")) or 0
        if limits.gpus > have:
            raise PolicyViolation(
                f"the plan's GPU count ({limits.gpus}) exceeds the Slurm job's allocation "
                f"(SLURM_GPUS_ON_NODE={have})",
                hint=hint,
            )


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
