"""Which caps a Podman engine can enforce: the pure decision behind the Podman backend's
refusals, from what ``/libpod/info`` says (rootless or rootful, cgroup v1 or v2, the cgroup
controllers it may use). Rootless Podman on cgroup v1 accepts memory, CPU and pids caps and
silently ignores them; on cgroup v2 it applies only the controllers delegated to its user.
Nothing here talks to an engine (``runner.backends.podman`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.backends.types import GIB, Limits
from runner.core import untrusted
from runner.core.errors import PolicyViolation

__all__ = ["PodmanHost", "refusal", "unenforceable"]


@dataclass(frozen=True)
class PodmanHost:
    """What the engine says about how it can cap a container (``podman info``'s host)."""

    rootless: bool
    cgroup_version: Literal["v1", "v2"]
    controllers: frozenset[str]
    """The cgroup controllers the engine may use: on cgroup v2 for a rootless engine, those
    delegated to its user (the controllers of its own cgroup)."""
    runtime: str
    """The OCI runtime containers get (the engine's default; the backend asks for no other)."""

    @staticmethod
    def from_info(info: dict[str, Any]) -> PodmanHost:
        """From ``/libpod/info``; a missing or odd field is read as the weaker answer."""
        host = untrusted.mapping(info.get("host"))
        security, runtime = (
            untrusted.mapping(host.get("security")),
            untrusted.mapping(host.get("ociRuntime")),
        )
        controllers = host.get("cgroupControllers")
        v2 = str(host.get("cgroupVersion", "")) in ("v2", "2")
        return PodmanHost(
            rootless=security.get("rootless") is not False,  # rootful only when it says so
            cgroup_version="v2" if v2 else "v1",
            controllers=frozenset(str(c) for c in controllers)
            if isinstance(controllers, list)
            else frozenset(),
            runtime=str(runtime.get("name", "")),
        )

    def describe(self) -> str:
        mode = "rootless" if self.rootless else "rootful"
        return f"{mode} Podman on cgroup {self.cgroup_version}"


def _size(n: int) -> str:
    return f"{n / GIB:g} GiB" if n >= GIB else f"{n / 1024**2:g} MiB"


def unenforceable(limits: Limits, host: PodmanHost) -> list[tuple[str, str]]:
    """Each cap of ``limits`` the engine on ``host`` would not enforce, as (the cap with its
    value, why). Empty: every cap holds. Pure: the decision, apart from asking the engine."""
    caps = [
        ("memory", f"memory: {_size(limits.memory_bytes)}", "memory"),
        ("cpu", f"cpus: {limits.cpus:g}", "CPU"),
    ]
    if limits.pids is not None:
        caps.append(("pids", f"pidsLimit: {limits.pids}", "pids"))
    dropped: list[tuple[str, str]] = []
    for controller, cap, what in caps:
        if host.rootless and host.cgroup_version == "v1":
            why = (
                "there it accepts memory, CPU and pids caps and silently ignores them (it has "
                "no cgroup of its own to set them in)"
            )
        elif controller not in host.controllers:
            why = (
                f"the {controller} cgroup controller is not delegated to this user, and "
                f"Podman ignores a {what} cap without it"
                if host.rootless
                else f"the engine has no {controller} cgroup controller for the {what} cap"
            )
        else:
            continue
        dropped.append((cap, why))
    if limits.runtime != "runc" or host.runtime not in ("runc", "crun"):
        dropped.append(
            (
                f"runtime: {limits.runtime}",
                f"containers get Podman's default runtime ({host.runtime or 'unknown'}); "
                "runc or crun is offered, another (runsc) has not been verified under Podman",
            )
        )
    if limits.gpus != "none":
        dropped.append(
            (
                f"gpus: {limits.gpus}",
                "GPUs under Podman (CDI devices on its own API, or their nodes through the "
                "compatible one) have not been verified, so they are not offered on it",
            )
        )
    if limits.network not in ("none", "bridge"):
        dropped.append(
            (
                f"network: {limits.network}",
                "the egress allowlist (its proxy and internal networks) and named networks "
                "have not been verified under Podman, so they are not offered on it",
            )
        )
    return dropped


def refusal(limits: Limits, host: PodmanHost) -> PolicyViolation | None:
    """The refusal for caps ``host`` cannot enforce, naming each; None when all hold."""
    dropped = unenforceable(limits, host)
    if not dropped:
        return None
    first, why = dropped[0]
    name = first.split(":")[0]
    alike = [c for c, w in dropped[1:] if w == why]
    others = [f"{c} ({w})" for c, w in dropped[1:] if w != why]
    also = f" (nor {', '.join(alike)})" if alike else ""
    more = f"; also {'; '.join(others)}" if others else ""
    return PolicyViolation(
        f"{host.describe()} cannot enforce the {name} cap ({first}){also}: {why}{more}. The "
        "job is refused rather than run with a cap dropped",
        hint="run it with rootful Podman or Docker (host policy engine), or on a cgroup v2 host "
        "that delegates the memory, cpu and pids controllers to this user (systemd: a user "
        "session, Delegate=yes)"
        if host.rootless
        else "run it on a host whose engine enforces the cap (host policy engine), or change "
        "the policy",
    )
