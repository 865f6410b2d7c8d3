"""Fields read out of parsed JSON whose shape nobody vouches for: an API server's answer, an
engine's ``info``, a manifest a user may have edited. Each accessor answers the weaker value
(None, an empty object, an empty array) where the shape is not the one expected, and never
raises, so that a reader checks values, not shapes, and a hostile shape reads as absent.

(:mod:`runner.core.jsondepth` bounds the text before it is parsed; this reads what it parsed.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["array", "at", "mapping"]


def at(data: Any, *keys: str | int) -> Any:
    """``data[k1][k2]...``: a ``str`` key steps into an object, an ``int`` into an array (from
    0); None as soon as a step is missing or the value there is not of that kind."""
    for key in keys:
        if isinstance(key, int):
            if not isinstance(data, list) or not 0 <= key < len(data):
                return None
            data = data[key]
        elif isinstance(data, dict):
            data = data.get(key)
        else:
            return None
    return data


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def array(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []
