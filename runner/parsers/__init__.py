"""Evidence parsers, registered by ``(id, version)``."""

from runner.parsers import registry
from runner.parsers.json_scalar import JsonScalar

registry.register(JsonScalar())

__all__ = ["registry"]
