"""The values of the container seam that the layers above it plan with: the caps
(:class:`Limits`, with their units), what the engine says of an image (:class:`ImageInfo`),
and the egress a job is granted (:class:`HostPort` pairs, :class:`EgressPlan`).
Nothing here imports any other module of the runner, so every layer may use them; the
container's own values (its spec, its state) live with the protocol in ``base``.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ENGINE_COUNT_MAX",
    "ENGINE_REF_MAX",
    "ENGINE_TEXT_MAX",
    "GIB",
    "HOST_PORT_PATTERN",
    "MIB",
    "DeviceEdits",
    "DeviceNode",
    "EgressPlan",
    "EngineInfo",
    "GpuInjection",
    "HostPort",
    "ImageInfo",
    "Limits",
    "PathStat",
    "engine_count",
    "engine_env",
    "engine_refs",
    "engine_size",
    "engine_text",
    "loopback_registry",
]

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
    cap_add: tuple[str, ...] = ()
    """Never for a job; the egress allowlist's namespace holder gets NET_ADMIN alone."""
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


ENGINE_TEXT_MAX = 128
"""The most characters of an engine's word about itself (its version, API version,
architecture) that the runner keeps."""

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def engine_text(value: object, limit: int = ENGINE_TEXT_MAX) -> str:
    """What an engine said of itself, as the runner records it: a string only (else ""), cut
    to ``limit`` characters (:data:`ENGINE_TEXT_MAX`), each one that is not printable ASCII
    (a control character, a lone surrogate JSON can carry, any non-ASCII) written ``?``. The
    engine's word is never trusted for more than a record, and nothing it says can break the
    record's JSON or a terminal it is shown on."""
    if not isinstance(value, str):
        return ""
    return _UNPRINTABLE.sub("?", value[:limit])


ENGINE_REF_MAX = 1024
"""The longest image reference (a tag, a repo digest) kept from an engine's answer."""


def engine_refs(value: object) -> tuple[str, ...]:
    """The image references an engine lists (``RepoTags``, ``RepoDigests``): those that are
    strings of printable ASCII, at most :data:`ENGINE_REF_MAX` long; any other is dropped (no
    reference holds it, and the runner compares these with a pin and writes them in records)."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(
        v
        for v in value
        if isinstance(v, str) and len(v) <= ENGINE_REF_MAX and _UNPRINTABLE.search(v) is None
    )


ENGINE_COUNT_MAX = 2**62
"""The largest counter kept from an engine's answer (bytes, nanoseconds, tasks): past it, a
figure is taken as not given (no real counter reaches it: 2**62 ns is 146 years)."""


def engine_size(value: object) -> int:
    """A size an engine gives, as :func:`engine_count` reads it; 0 when it gives none (never a
    crash on its word)."""
    return engine_count(value) or 0


def engine_count(value: object, cap: int = ENGINE_COUNT_MAX) -> int | None:
    """A counter an engine gives: a non-negative integer of at most ``cap``, else None (not
    given: a bool, a float, a string, a negative or absurd number is never a figure)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap:
        return value
    return None


def engine_env(value: object) -> tuple[str, ...]:
    """An image's configured environment (``NAME=value`` strings) as an engine lists it: the
    strings UTF-8 can hold (a lone surrogate JSON carries is dropped with its entry)."""
    if not isinstance(value, list | tuple):
        return ()
    kept = []
    for v in value:
        if isinstance(v, str):
            try:
                v.encode()
            except UnicodeEncodeError:
                continue
            kept.append(v)
    return tuple(kept)


@dataclass(frozen=True)
class EngineInfo:
    """Which container engine a backend talks to: ``docker`` or ``podman`` (``fake`` for the
    in-memory one), its version and the API version it answers, as it says them."""

    name: str
    version: str
    api_version: str


@dataclass(frozen=True)
class ImageInfo:
    """What the engine says about a local image."""

    id: str
    repo_digests: tuple[str, ...]
    repo_tags: tuple[str, ...]
    architecture: str
    os: str
    size: int
    env: tuple[str, ...] = ()
    """The image's configured environment (``NAME=value``, its ``ENV`` lines)."""

    def env_value(self, name: str) -> str | None:
        """The value the image's configuration gives ``name``, if any."""
        for item in self.env:
            key, sep, value = item.partition("=")
            if sep and key == name:
                return value
        return None


_GO_DIR = 1 << 31
_GO_SYMLINK = 1 << 27
_GO_SPECIAL = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
"""Go's os.FileMode type bits, as the engine's archive API reports a path's mode: device,
named pipe, socket, character device, irregular."""


@dataclass(frozen=True)
class PathStat:
    """What the engine's archive API says of one path in a container's filesystem (without
    following its last link; ``link_target`` is where a link leads, resolved in the
    container's root)."""

    path: str
    size: int
    mode: int
    """Go's os.FileMode: permission bits and type bits."""
    link_target: str = ""

    @property
    def is_dir(self) -> bool:
        return bool(self.mode & _GO_DIR)

    @property
    def is_link(self) -> bool:
        return bool(self.mode & _GO_SYMLINK)

    @property
    def is_regular(self) -> bool:
        return not self.mode & (_GO_DIR | _GO_SYMLINK | _GO_SPECIAL)

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o111)


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TOP = r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
HOST_PORT_PATTERN = rf"^(?:{_LABEL}\.)*{_TOP}:{_PORT}$"
"""``host:port``: a DNS name (its last label starts with a letter, so an IP literal never is
one) and a port in 1..65535. Names compare without regard to case."""


@dataclass(frozen=True, order=True)
class HostPort:
    """One pair of an egress allowlist: a host name (lower case) and a TCP port."""

    host: str
    port: int

    @staticmethod
    def parse(text: str) -> HostPort:
        """``api.example:443`` -> HostPort; ValueError for anything else (an IP literal, no
        port, a port out of range, a name longer than 253)."""
        if len(text) > 259 or not re.fullmatch(HOST_PORT_PATTERN, text):
            raise ValueError(f"{text!r} is not host:port (a DNS name and a port in 1..65535)")
        host, _, port = text.rpartition(":")
        if len(host) > 253:
            raise ValueError(f"{text!r}: the host name is longer than 253 characters")
        return HostPort(host.lower(), int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class EgressPlan:
    """What a job may reach, and how: the pairs its contract asked for and the host granted,
    the engine network the proxy reaches them through, the proxy's image, and the non-public
    address ranges an allowed name may resolve to (the policy's; none else is connected to)."""

    allow: tuple[HostPort, ...]
    upstream_network: str
    proxy_image: str
    private_networks: tuple[str, ...] = ()

    PROXY_ALIAS = "egress-proxy"
    PROXY_PORT = 3128

    def environment(self) -> dict[str, str]:
        """What the job is told: the proxy for both schemes, in both spellings, and no
        exceptions (``NO_PROXY`` empty: nothing is reachable without the proxy anyway)."""
        url = f"http://{self.PROXY_ALIAS}:{self.PROXY_PORT}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        return {**dict.fromkeys(names, url), "NO_PROXY": "", "no_proxy": ""}


GpuInjection = Literal["cdi-native", "cdi-applied", "nvidia-runtime"]
"""How a GPU reaches a container: the engine applies a CDI spec itself (``cdi-native``, asked
for by device name), the runner applies the spec's edits through the engine's plain device,
mount and environment settings (``cdi-applied``), or the NVIDIA runtime/toolkit of the engine
hands the device out (``nvidia-runtime``)."""


@dataclass(frozen=True)
class DeviceNode:
    """A host device node given to the container, with its cgroup permissions (``rwm``)."""

    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class DeviceEdits:
    """What the container gets for its devices. ``cdi-native``: only ``cdi_devices`` (the
    engine reads the spec); ``cdi-applied``: ``nodes``, read-only ``mounts`` (host path,
    container path) and ``env``, as the spec says; ``nvidia-runtime``: nothing here (the
    engine's NVIDIA runtime acts on the device ids)."""

    mode: GpuInjection
    cdi_devices: tuple[str, ...] = ()
    nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def loopback_registry(registry: str) -> bool:
    """Whether ``registry`` (``host[:port]``) is this machine: localhost or a loopback IP
    (an engine talks plain HTTP to those)."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
