"""The values that cross the container seam, at the bottom of the runner: what a backend is
asked to run (:class:`ContainerSpec` with its :class:`Limits` and :class:`Mount` s) and what it
reports (:class:`ContainerState`, :class:`ImageInfo`). Nothing here imports any other module of
the runner, so every layer above may use them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

GIB = 1024**3
MIB = 1024**2


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

    def __post_init__(self) -> None:
        """The last line: no cap reaches the engine as 0 (which it reads as "no cap")."""
        caps = ("cpus", "memory_bytes", "memory_swap_bytes", "shm_bytes", "tmpfs_bytes")
        for name in (*caps, "disk_quota_bytes", "log_limit_bytes", "timeout_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.pids is not None and self.pids < 1:
            raise ValueError(f"Limits.pids must be at least 1 or None, got {self.pids!r}")


@dataclass(frozen=True)
class ImageInfo:
    """What the engine says about a local image."""

    id: str
    repo_digests: tuple[str, ...]
    repo_tags: tuple[str, ...]
    architecture: str
    os: str
    size: int


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to create the job's container."""

    name: str
    image: str
    """Image id: the verified bytes, never a name that could move."""
    entrypoint: list[str]
    command: list[str]
    user: str
    working_dir: str
    environment: dict[str, str]
    labels: dict[str, str]
    mounts: list[Mount]
    limits: Limits
    gpu_ids: tuple[str, ...] = ()
    """Device ids (UUIDs) handed to the container; empty: no GPU at all."""
    log_max_bytes: int = 1024 * 1024
    backstop: Backstop | None = None
    """A deadline the engine enforces on its own, should the runner be down at the end."""


@dataclass(frozen=True)
class Backstop:
    """Kill every process of the job once it has run ``after_seconds`` (counted from its
    container's start), checked by the engine every ``interval_seconds``: the deadline that
    holds while no runner watches. The engine runs :data:`BACKSTOP_SCRIPT` in the container
    as its health check, as the job's user: it reads the container's age from
    ``/proc/uptime`` and ``/proc/1/stat`` (the init process's start) and, past the deadline,
    sends SIGKILL to every process but init, which then ends the container. The job cannot
    stop the engine from running it; it needs only ``/bin/sh``, as the job's own wrapper does."""

    after_seconds: int
    interval_seconds: int

    @property
    def script(self) -> str:
        return BACKSTOP_SCRIPT.replace("DEADLINE", str(self.after_seconds))


BACKSTOP_SCRIPT = (
    "read -r up _ </proc/uptime; read -r st </proc/1/stat; set -- ${st##*) }; "
    "[ $(( ${up%.*} - ${20} / 100 )) -lt DEADLINE ] || kill -s KILL -- -1"
)
"""Field 22 of /proc/1/stat is init's start in clock ticks since boot (100 a second on Linux
and under gVisor); ``set --`` after the command name leaves it in ``$20``."""


@dataclass(frozen=True)
class ContainerState:
    """The container's final (or current) state as the engine reports it."""

    status: str
    running: bool
    exit_code: int | None
    oom_killed: bool
    error: str
    started_at: str | None
    finished_at: str | None
    raw: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    """The container's id (empty when the state was read back from the ledger)."""

    @staticmethod
    def from_engine(raw: dict[str, Any], container_id: str = "") -> ContainerState:
        """From the engine's ``State`` object (``docker inspect``'s ``.State``)."""
        running = bool(raw.get("Running"))
        return ContainerState(
            status=str(raw.get("Status", "")),
            running=running,
            exit_code=None if running else int(raw.get("ExitCode", -1)),
            oom_killed=bool(raw.get("OOMKilled")),
            error=str(raw.get("Error") or ""),
            started_at=raw.get("StartedAt"),
            finished_at=raw.get("FinishedAt"),
            raw=raw,
            id=container_id,
        )


@dataclass(frozen=True)
class ContainerSummary:
    id: str
    name: str
    status: str
    labels: dict[str, str]
