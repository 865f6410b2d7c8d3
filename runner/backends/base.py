"""The container seam: the small interface the runner needs from a container engine.

``runner.backends.docker`` is the real one (``podman`` sends its requests to Podman). The docker
SDK is imported there, for image transfers, and in two places outside this package: the
credential lookup of ``runner.images.registry`` (the SDK's reading of the docker config) and
``runner --version`` in ``runner.cli`` (the SDK's version and the engine's). Every
method raises only :class:`~runner.core.errors.RunnerError` subclasses: ``EngineUnavailable`` when
the engine cannot be reached or fails, ``ContainerVanished`` when the container is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runner.backends.stats import StatsSample
from runner.backends.types import (
    DeviceEdits,
    DeviceNode,
    EngineInfo,
    ImageInfo,
    Limits,
    PathStat,
    engine_text,
)

__all__ = [
    "BACKSTOP_SCRIPT",
    "Backend",
    "Backstop",
    "ContainerSpec",
    "ContainerState",
    "ContainerSummary",
    "DeviceEdits",
    "DeviceNode",
    "ImageFiles",
    "ImageInfo",
    "Limits",
    "LogFollow",
    "Mount",
    "NetworkInfo",
    "NetworkSummary",
    "PathStat",
    "StatsSample",
]


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
    """Device ids (UUIDs) the engine's NVIDIA runtime hands to the container; empty: none
    that way."""
    devices: DeviceEdits | None = None
    """CDI devices: asked of the engine by name (``cdi-native``), or their nodes given with
    their cgroup rules (``cdi-applied``; their mounts and environment are already in
    ``mounts`` and ``environment``). None: no GPU, or the NVIDIA runtime's ``gpu_ids``."""
    log_max_bytes: int = 1024 * 1024
    log_files: int = 1
    """The engine keeps this many files of ``log_max_bytes`` (the oldest dropped first)."""
    backstop: Backstop | None = None
    """A deadline the engine enforces on its own, should the runner be down at the end."""
    network: str | None = None
    """The network it joins, by name, or ``container:<name>`` to share another container's
    network namespace; None: ``limits.network`` (``none``, or ``bridge``)."""
    aliases: tuple[str, ...] = ()
    """Names other containers on ``network`` reach it by."""
    extra_networks: tuple[str, ...] = ()
    """Further networks it joins before it starts (the egress proxy's way out)."""
    dns: tuple[str, ...] = ()
    """Resolvers the engine's embedded DNS forwards unknown names to; ``("127.0.0.1",)`` in a
    namespace where nothing listens on port 53 leaves it none."""
    dns_options: tuple[str, ...] = ()
    """resolv.conf options (``timeout:1``: a name that cannot resolve fails within a second)."""


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

    def healthcheck(self) -> dict[str, object]:
        """As the engine API's ``Healthcheck`` (Docker's create; Podman's ``healthconfig``)."""
        return {
            "Test": ["CMD-SHELL", self.script],
            "Interval": self.interval_seconds * 1_000_000_000,
            "Timeout": 10 * 1_000_000_000,
            "Retries": 1,
            "StartPeriod": 0,
        }


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
        code = raw.get("ExitCode", -1)

        def time_of(key: str) -> str | None:  # a string only: it reaches the envelope's times
            return engine_text(raw.get(key)) or None

        return ContainerState(
            status=str(raw.get("Status", "")),
            running=running,
            exit_code=None if running else code if type(code) is int else -1,
            oom_killed=bool(raw.get("OOMKilled")),
            error=str(raw.get("Error") or ""),
            started_at=time_of("StartedAt"),
            finished_at=time_of("FinishedAt"),
            raw=raw,
            id=container_id,
        )


@dataclass(frozen=True)
class ContainerSummary:
    id: str
    name: str
    status: str
    labels: dict[str, str]


@dataclass(frozen=True)
class NetworkInfo:
    """A network the runner created: its IPv4 subnet and the address the engine's host holds
    on it (the gateway)."""

    id: str
    name: str
    subnet: str
    gateway: str


@dataclass(frozen=True)
class NetworkSummary:
    id: str
    name: str
    labels: dict[str, str]


class LogFollow:
    """Ends a :meth:`Backend.follow_logs` call from another thread: the backend binds how to
    close its stream (:meth:`bind`), :meth:`cancel` calls it (now, or once bound)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._close: Callable[[], None] | None = None
        self.cancelled = False

    def bind(self, close: Callable[[], None]) -> None:
        with self._lock:
            self._close = close
            cancelled = self.cancelled
        if cancelled:
            close()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            close = self._close
        if close is not None:
            close()


class ImageFiles(Protocol):
    """An image's filesystem, read through the engine's archive API from a container made
    of it and never started (nothing of the image runs)."""

    def stat(self, path: str) -> PathStat | None:
        """The absolute ``path`` (its last link not followed); None when nothing is there."""

    def archive(self, path: str, dest: Path, max_bytes: int) -> None:
        """Write the tar archive the engine makes of ``path`` (a file: one member, its base
        name; a folder: its tree under its base name) to the new file ``dest``; more than
        ``max_bytes`` of it is InfrastructureError, and ``dest`` is then removed."""


class Backend(Protocol):
    def ping(self) -> None:
        """Check the engine answers; raise EngineUnavailable when not."""

    def inspect_image(self, reference: str) -> ImageInfo | None:
        """The local image for ``reference``, or None when it is not present."""

    def pull(
        self,
        reference: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        """Pull ``reference``, streaming; every chunk is checked for an error (ImageUnavailable)."""

    def load(self, bundle: Path) -> None:
        """``docker load`` a ``docker save`` tarball, streaming; errors are ImageUnavailable."""

    def runtimes(self) -> list[str]:
        """The container runtimes the engine knows (runc, runsc ...)."""

    def gpu_capable(self) -> bool:
        """Whether the engine can hand GPUs to containers at all."""

    def cdi_native(self) -> bool:
        """Whether the engine applies CDI specs itself (asked for devices by CDI name)."""

    def architecture(self) -> str:
        """The engine host's architecture as the engine names it (``x86_64``, ``aarch64``)."""

    def engine(self) -> EngineInfo:
        """Which engine this is and its version (asked with :meth:`architecture`, once)."""

    def check_limits(self, limits: Limits) -> None:
        """Refuse (PolicyViolation, naming the cap and why) any cap in ``limits`` the engine
        would not enforce. Called before anything of the job exists; ``create`` must refuse
        the same caps, so that no container ever runs with a cap dropped."""

    def create(self, spec: ContainerSpec) -> str:
        """Create the container (not started); return its id."""

    def start(self, container_id: str) -> None: ...

    def wait(self, container_id: str, timeout: float) -> int | None:
        """Block up to ``timeout`` seconds; the exit code, or None while it still runs."""

    def stop(self, container_id: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""

    def kill(self, container_id: str) -> None: ...

    def state(self, container_id: str) -> ContainerState: ...

    def oom_logged(self, container_id: str, since: float) -> bool:
        """Whether the engine logged an ``oom`` event of the container since ``since`` (a Unix
        time): the kernel's OOM killer killed a process in it. Docker sets ``OOMKilled`` only
        when that event reaches it before the exit's, and logs the event either way."""

    def save_logs(
        self, container_id: str, dest: Path, max_bytes: int, since: float | None = None
    ) -> int:
        """Write at most ``max_bytes`` of the engine's log of the container (only its lines
        logged at or after ``since``, seconds since the epoch, when given); return the count."""

    def follow_logs(
        self,
        container_id: str,
        sink: Callable[[bytes], None],
        *,
        stdout: bool = True,
        stderr: bool = False,
        since: float | None = None,
        follow: bool = True,
        handle: LogFollow | None = None,
    ) -> None:
        """Hand the container's log, as the engine keeps it (raw bytes, no timestamps), to
        ``sink`` in order, from its start (or ``since``); with ``follow``, what it logs next
        too, until the container ends or ``handle`` is cancelled."""

    def follow_stats(
        self,
        container_id: str,
        sink: Callable[[StatsSample], None],
        handle: LogFollow | None = None,
    ) -> None:
        """Hand each answer of the engine's stats stream of the running container to ``sink``
        as figures (:func:`runner.backends.stats.parse_stats`), the first at once, then about
        one a second, until the container is no longer running (the engine's zero answer),
        the stream ends, or ``handle`` is cancelled. One connection for the whole run."""

    def remove(self, container_id: str) -> None:
        """Remove the container, forcibly; a container already gone is not an error."""

    def find(self, labels: dict[str, str]) -> list[ContainerSummary]:
        """Containers (any state) carrying all ``labels``."""

    def create_network(self, name: str, labels: dict[str, str], *, internal: bool) -> NetworkInfo:
        """Create a bridge network (``internal``: the engine gives it no way out, and this host
        no address on it); a name in use is InfrastructureError."""

    def remove_network(self, name: str) -> None:
        """Remove the network; one already gone is not an error, one a running container is
        still on is InfrastructureError."""

    def find_networks(self, labels: dict[str, str]) -> list[NetworkSummary]:
        """Networks carrying all ``labels``."""

    def image_files(
        self, image_id: str, labels: dict[str, str]
    ) -> AbstractContextManager[ImageFiles]:
        """The image's files (:class:`ImageFiles`), through a container made of it (never
        started, no network, carrying ``labels``) that is removed on leaving."""
