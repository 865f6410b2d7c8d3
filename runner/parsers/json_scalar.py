"""``json.scalar`` version 1: one number from a JSON document, found by a JSON Pointer.

The evidence file holds one JSON document (a job printing ``{"accuracy": 0.819}`` to a log
is the usual case). ``pointer`` is an RFC 6901 JSON Pointer into it; the value found must be a
finite number. ``metric`` and ``unit`` restate what the number means, for the reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from runner.errors import EvidenceParseError

MAX_BYTES = 64 * 1024 * 1024


def resolve_pointer(document: Any, pointer: str) -> Any:
    """Resolve an RFC 6901 JSON Pointer; KeyError/IndexError/TypeError when it does not exist."""
    if pointer == "":
        return document
    node = document
    for raw in pointer[1:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")  # RFC 6901 escapes
        if isinstance(node, list):
            if not key.isdigit() or (key != "0" and key.startswith("0")):
                raise KeyError(key)
            node = node[int(key)]
        elif isinstance(node, dict):
            node = node[key]
        else:
            raise TypeError(f"cannot descend into {type(node).__name__} with {key!r}")
    return node


class JsonScalar:
    id = "json.scalar"
    version = "1"
    description = "A finite number inside one JSON document, selected by an RFC 6901 pointer."
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["pointer"],
        "properties": {
            "pointer": {"type": "string", "pattern": "^(/.*)?$", "description": "RFC 6901"},
            "metric": {"type": "string"},
            "unit": {"type": "string"},
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        size = evidence.stat().st_size
        if size > MAX_BYTES:
            raise EvidenceParseError(
                f"{evidence.name} is {size} bytes; json.scalar@1 reads documents up to 64 MiB"
            )
        try:
            document = json.loads(evidence.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EvidenceParseError(f"{evidence.name} is not one JSON document: {exc}") from exc
        pointer = config["pointer"]
        try:
            value = resolve_pointer(document, pointer)
        except (KeyError, IndexError, TypeError) as exc:
            raise EvidenceParseError(
                f"pointer {pointer!r} does not exist in {evidence.name}"
            ) from exc
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EvidenceParseError(
                f"pointer {pointer!r} in {evidence.name} holds {json.dumps(value)[:60]}, "
                "not a number"
            )
        if not math.isfinite(value):
            raise EvidenceParseError(f"pointer {pointer!r} in {evidence.name} is not finite")
        return value
