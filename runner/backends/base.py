"""The container seam: the small interface the runner needs from a container engine.

``runner.backends.docker`` is the real one and the only module that imports ``docker``. Every
method raises only :class:`~runner.errors.RunnerError` subclasses: ``EngineUnavailable`` when
the engine cannot be reached or fails, ``ContainerVanished`` when the container is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from runner.backends.types import (
    Backstop,
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    ImageInfo,
    Limits,
    Mount,
)

__all__ = [
    "Backend",
    "Backstop",
    "ContainerSpec",
    "ContainerState",
    "ContainerSummary",
    "ImageInfo",
    "Limits",
    "Mount",
]


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

    def architecture(self) -> str:
        """The engine host's architecture as the engine names it (``x86_64``, ``aarch64``)."""

    def create(self, spec: ContainerSpec) -> str:
        """Create the container (not started); return its id."""

    def start(self, container_id: str) -> None: ...

    def wait(self, container_id: str, timeout: float) -> int | None:
        """Block up to ``timeout`` seconds; the exit code, or None while it still runs."""

    def stop(self, container_id: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""

    def kill(self, container_id: str) -> None: ...

    def state(self, container_id: str) -> ContainerState: ...

    def save_logs(self, container_id: str, dest: Path, max_bytes: int) -> int:
        """Write at most ``max_bytes`` of the engine's log of the container; return the count."""

    def remove(self, container_id: str) -> None:
        """Remove the container, forcibly; a container already gone is not an error."""

    def find(self, labels: dict[str, str]) -> list[ContainerSummary]:
        """Containers (any state) carrying all ``labels``."""
