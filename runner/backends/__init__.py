"""Container backends: the seam at the bottom of the runner.

``types`` holds the values the layers above plan with (limits, image info), ``base`` the
:class:`Backend` protocol and the container's values (spec, state), and each engine is one
module behind it (``docker``, through which every run talks to Docker; ``podman``, Docker's requests
sent to Podman's API socket, refusing the caps it would drop, which ``podmancaps`` decides;
``fake``, in memory, for tests). Nothing in this package imports a module above it, and
importing the package imports none of its modules: ``runner verify`` plans with ``types`` and
never needs the rest.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from runner.backends.base import Backend

__all__ = ["default", "detect"]

Engine = Literal["docker", "podman", "auto"]
_DOCKER_SOCKET = "/var/run/docker.sock"


def detect() -> Literal["docker", "podman"]:
    """The engine ``auto`` means on this host: Docker when ``DOCKER_HOST`` is set or its socket
    exists; else Podman when ``CONTAINER_HOST`` is set or its socket for this user exists;
    else Docker (whose error then says it cannot be reached)."""
    if os.environ.get("DOCKER_HOST") or os.path.exists(_DOCKER_SOCKET):
        return "docker"
    if os.environ.get("CONTAINER_HOST"):
        return "podman"
    from runner.backends.podman import default_url, socket_path

    podman_socket = socket_path(default_url())
    return "podman" if podman_socket is not None and podman_socket.exists() else "docker"


def default(engine: Engine | None = None) -> Backend:
    """The engine this host runs jobs on: ``engine`` (the host policy's), else
    ``RUNNER_ENGINE``, else ``auto`` (:func:`detect`). Docker is reached at ``DOCKER_HOST`` or
    its local socket, Podman at ``CONTAINER_HOST`` or its socket for this user."""
    chosen = engine if engine not in (None, "auto") else os.environ.get("RUNNER_ENGINE") or "auto"
    if chosen == "auto":
        chosen = detect()
    if chosen == "podman":
        from runner.backends.podman import PodmanBackend

        return PodmanBackend()
    if chosen != "docker":
        from runner.core.errors import HostConfigError

        raise HostConfigError(
            f"RUNNER_ENGINE is {chosen!r}; the engines are docker, podman and auto",
            hint="set RUNNER_ENGINE to one of them, or unset it (the policy's engine applies)",
        )
    from runner.backends.docker import DockerBackend

    return DockerBackend()
