"""``json.scalar`` version 1: one value from a JSON document, found by a JSON Pointer.

The evidence file holds one JSON document (a job printing ``{"accuracy": 0.819}`` to a log
is the usual case). ``pointer`` is an RFC 6901 JSON Pointer into it; by default the value found
must be a finite number (``type`` may ask for an integer, a string or a boolean instead).
``metric`` and ``unit`` restate what the number means, for the reader.

The document is streamed (``ijson``): a pointer into a 1 GB document does not load it, and
the document has no size cap. Single tokens do: a string longer than 1 MiB (its bytes between
the quotes, escapes as written) or a number or literal longer than 1 MiB is refused, and so is
an integer part of more than 4300 digits (more than Python converts), wherever they are in the
document (see :class:`runner.parsers._json.TokenGuard`; a long token would cost yajl time
quadratic in its length). The whole document is still read, so it must be exactly one
well-formed JSON document (UTF-8; ``NaN`` and ``Infinity`` are not JSON). A key given twice on
the way to the target is refused. Whatever goes wrong reading it is a parse error naming the
file; only a regular file is read (not a link, a FIFO or a device).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.core.errors import EvidenceParseError
from runner.parsers._json import POINTER_SCHEMA, Container, find_in_stream, resolve_pointer
from runner.parsers._values import Value, ValueType, from_json, type_schema

__all__ = ["JsonScalar", "read_pointer", "resolve_pointer"]


def read_pointer(evidence: Path, pointer: str, value_type: ValueType) -> Value:
    """The value at ``pointer`` in the streamed JSON document ``evidence``, of ``value_type``."""
    found = find_in_stream(evidence, [pointer])[0]
    if not found.exists:
        raise EvidenceParseError(found.missing(evidence.name))
    where = f"{evidence.name}: pointer {pointer!r}"
    if isinstance(found.value, Container):
        raise EvidenceParseError(f"{where}: found {found.value.kind}, expected a single value")
    return from_json(found.value, value_type, where)


class JsonScalar:
    id = "json.scalar"
    version = "1"
    description = (
        "A value inside one JSON document (streamed, any size), selected by an RFC 6901 "
        "pointer; a finite number unless `type` says otherwise."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["pointer"],
        "properties": {
            "pointer": POINTER_SCHEMA,
            "metric": {"type": "string", "description": "What the value measures, for readers."},
            "unit": {"type": "string", "description": "The value's unit, for readers."},
            "type": type_schema("number", source="json"),
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        return read_pointer(evidence, config["pointer"], config.get("type", "number"))
