"""Container backends. ``docker`` is the real one; tests of pure logic may supply their own."""

from runner.backends.base import Backend, ContainerSpec, ContainerState, Mount

__all__ = ["Backend", "ContainerSpec", "ContainerState", "Mount"]
