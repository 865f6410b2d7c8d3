"""The values of the container seam that the layers above it plan with: the caps
(:class:`Limits`, with their units) and what the engine says of an image (:class:`ImageInfo`).
Nothing here imports any other module of the runner, so every layer may use them; the
container's own values (its spec, its state) live with the protocol in ``base``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

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
