"""Container backends: the seam at the bottom of the runner.

``types`` holds the values the layers above plan with (limits, image info), ``base`` the
:class:`Backend` protocol and the container's values (spec, state), and each engine is one
module behind it (``docker``, the only one that talks to Docker; ``fake``, in memory, for
tests). Nothing in this package imports a module above it, and importing the package imports
none of its modules: ``runner verify`` plans with ``types`` and never needs the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.backends.base import Backend


def default() -> Backend:
    """The engine this host runs jobs on: Docker, at ``DOCKER_HOST`` or the local socket."""
    from runner.backends.docker import DockerBackend

    return DockerBackend()
