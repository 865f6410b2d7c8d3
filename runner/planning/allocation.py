"""What a cluster scheduler allocated to this job, read from the job's environment, and the
refusal of a plan whose caps exceed it.

Under Slurm (``SLURM_JOB_ID`` set) the node's share of the job is in ``SLURM_CPUS_ON_NODE``,
``SLURM_MEM_PER_NODE`` (else ``SLURM_MEM_PER_CPU`` times the CPUs) and
``SLURM_GPUS_ON_NODE``. The plan stage of `runner run` checks its caps against them
(:func:`check_allocation`), so a plan is bounded by the host's grant as it is by the host's
policy. Which GPUs Slurm gave (``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``, or UUIDs in
``CUDA_VISIBLE_DEVICES``) bounds the devices an attempt may be handed (:func:`slurm_gpus`): the
container is made by the engine's daemon, outside the Slurm job's cgroup, so nothing else keeps
it off another job's GPU. Nothing here talks to Slurm (``runner.scheduling.slurm`` submits the
job from above).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from runner.backends.types import Limits
from runner.core.errors import GpuUnavailable, PolicyViolation

if TYPE_CHECKING:
    from runner.gpu.gpus import Gpu

__all__ = ["check_allocation", "slurm_gpus", "slurm_job"]

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


_GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z-]{1,64}")
_MAX_GPU_IDS = 256
_GPU_HINT = (
    "run it in a Slurm job given enough GPUs (`runner cluster submit` asks for --gres=gpu:N); "
    "where Slurm's GPU IDs do not name the device files (/dev/nvidia<ID>), set "
    "CUDA_VISIBLE_DEVICES to the given GPUs' UUIDs (a TaskProlog can)"
)


def slurm_gpus(
    env: Mapping[str, str], host: list[Gpu], want: int | Literal["all"]
) -> list[Gpu] | None:
    """Under Slurm (``SLURM_JOB_ID`` set), those of the detected GPUs ``host`` that Slurm gave
    this job, at least ``want`` of them (``"all"``: every one it gave); None outside Slurm.

    ``CUDA_VISIBLE_DEVICES`` holding UUIDs names them exactly; else Slurm's global GPU IDs
    (``SLURM_STEP_GPUS``, else ``SLURM_JOB_GPUS``; never relative to the job's cgroup) name
    the device files ``/dev/nvidia<ID>``: each must be one detected GPU's minor number (NVML's),
    its index where that is unknown (nvidia-smi's report). Indices in ``CUDA_VISIBLE_DEVICES``
    are not used: with ConstrainDevices they count from 0 within the job's devices. Raises
    GpuUnavailable, naming the variables, when Slurm names no GPU, names them in a form not
    understood, names one that not exactly one detected GPU matches, or names fewer
    than ``want``."""
    if not env.get("SLURM_JOB_ID"):
        return None
    said = (
        ", ".join(
            f"{name}={_shown(env[name])}"
            for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
            if env.get(name)
        )
        or "SLURM_STEP_GPUS, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset"
    )
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if any(v.startswith(("GPU-", "MIG-")) for v in visible):
        if not all(_GPU_UUID.fullmatch(v) for v in visible) or len(visible) > _MAX_GPU_IDS:
            raise _refused(f"CUDA_VISIBLE_DEVICES is not a list of GPU UUIDs ({said})")
        chosen = _matching(host, visible, lambda g: g.uuid, said)
    else:
        step, whole = env.get("SLURM_STEP_GPUS", "").strip(), env.get("SLURM_JOB_GPUS", "").strip()
        name, value = ("SLURM_STEP_GPUS", step) if step else ("SLURM_JOB_GPUS", whole)
        if not value:
            raise _refused(f"the Slurm job was given no GPU on this node ({said})")
        ids = [v.strip() for v in value.split(",")]
        if len(ids) > _MAX_GPU_IDS or not all(
            v.isascii() and v.isdigit() and len(v) <= 4 for v in ids
        ):
            raise _refused(f"{name} is not a list of Slurm GPU IDs ({said})")
        chosen = _matching(host, [int(v) for v in ids], lambda g: g.device_number, said)
    if want != "all" and len(chosen) < want:
        raise _refused(
            f"the contract asks for {want} GPUs and the Slurm job was given {len(chosen)} on "
            f"this node ({said})"
        )
    return chosen


def _matching(
    host: list[Gpu], names: Sequence[object], key: Callable[[Gpu], object], said: str
) -> list[Gpu]:
    """The one detected GPU ``key`` maps each of ``names`` to, in order."""
    if len(set(names)) != len(names):
        raise _refused(f"Slurm names a GPU twice ({said})")
    found: dict[object, list[Gpu]] = {}
    for gpu in host:
        found.setdefault(key(gpu), []).append(gpu)
    out = []
    for name in names:
        match = found.get(name, [])
        if len(match) != 1:
            detected = ", ".join(f"{g.index} (minor {g.minor}, {g.uuid})" for g in host[:16])
            raise _refused(
                f"Slurm gave this job GPU {name}, which {'several' if match else 'none'} of this "
                f"host's detected GPUs match ({said}; detected: {detected or 'none'})"
            )
        out.extend(match)
    return out


def _refused(message: str) -> GpuUnavailable:
    return GpuUnavailable(message, hint=_GPU_HINT)


def _shown(value: str) -> str:
    """An environment value for a message: quoted, at most 80 characters."""
    return repr(value if len(value) <= 80 else value[:80] + "...")
