"""``agent.result`` version 1: a value from the agent's own result file.

The file has the seed's shape::

    {"schemaVersion": "2.0", "status": "completed" | "partial" | "failed", "summary": "...",
     "limitations": [...], "evidence": [{"path": "relative/file", "description": "..."}]}

``pointer`` (default ``/status``) selects the value, ``type`` (default ``string``) the type it
must have. The document is streamed like ``json.scalar`` (any size, one well-formed JSON
document, single strings and numbers up to 1 MiB, a key given twice on the way refused). It
must say ``schemaVersion`` ``2.<minor>`` (a string), and a ``/status`` read must be one of
``completed``, ``partial``, ``failed``: another file, or another version of the shape, is a
parse error rather than a guess.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from runner.core.errors import EvidenceParseError
from runner.core.redaction import quote
from runner.parsers._json import POINTER_SCHEMA, Container, find_in_stream
from runner.parsers._values import from_json, show, type_schema

__all__ = ["AgentResult"]

STATUSES = ("completed", "partial", "failed")
_VERSION = re.compile(r"2\.[0-9]+")


class AgentResult:
    id = "agent.result"
    version = "1"
    description = (
        "A value from the agent's result file (schemaVersion 2.x: status, summary, "
        "limitations, evidence), by RFC 6901 pointer; by default the status string."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "pointer": {
                **POINTER_SCHEMA,
                "default": "/status",
                "description": POINTER_SCHEMA["description"]
                + " Default '/status' (completed, partial or failed).",
            },
            "type": type_schema("string", source="json"),
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        pointer = config.get("pointer", "/status")
        version, found = find_in_stream(evidence, ["/schemaVersion", pointer])
        name = evidence.name
        if not version.exists or not isinstance(version.value, str):
            got = "none" if not version.exists else show(version.value)
            raise EvidenceParseError(
                f"{name} is not an agent result: expected a string schemaVersion 2.x, found {got}"
            )
        if not _VERSION.fullmatch(version.value):
            said = quote(version.value, 60)
            raise EvidenceParseError(f"{name} has schemaVersion {said!r}; agent.result@1 reads 2.x")
        if not found.exists:
            raise EvidenceParseError(found.missing(name))
        where = f"{name}: pointer {pointer!r}"
        if isinstance(found.value, Container):
            raise EvidenceParseError(f"{where}: found {found.value.kind}, expected a single value")
        value = from_json(found.value, config.get("type", "string"), where)
        if pointer == "/status" and value not in STATUSES:
            raise EvidenceParseError(
                f"{where}: found {show(value)}, expected one of {', '.join(STATUSES)}"
            )
        return value
