"""Container backends: the seam at the bottom of the runner.

``types`` holds the values that cross the seam, ``base`` the :class:`Backend` protocol, and
each engine is one module behind it (``docker``, the only one that talks to Docker). Nothing
in this package imports a module above it.
"""

from runner.backends.base import Backend
from runner.backends.types import ContainerSpec, ContainerState, Mount

__all__ = ["Backend", "ContainerSpec", "ContainerState", "Mount", "default"]


def default() -> Backend:
    """The engine this host runs jobs on: Docker, at ``DOCKER_HOST`` or the local socket."""
    from runner.backends.docker import DockerBackend

    return DockerBackend()
