"""``jsonl.scalar`` version 1: one value from a JSON-lines log.

Each non-blank line is one JSON value (a *record*); blank lines are skipped. Every line is
read and must be valid JSON (``NaN``/``Infinity`` are not), else the file is refused naming
the line: a log that is malformed anywhere is not trusted anywhere (that includes a line nested
deeper than ``json`` reads, about 1000 levels, and an integer of more than 4300 digits). Lines
are read one at a time, up to 1 MiB each.

Which record: ``select`` is ``last`` (default) or ``first`` of all records, or ``match``: the
records whose value at ``match.pointer`` equals ``match.value`` (JSON equality: ``1`` equals
``1.0``, ``true`` does not equal ``1``; a record without that pointer does not match), and
among them ``occurrence``: ``last`` (default), ``first`` or ``only`` (exactly one must match).
Then ``pointer`` is resolved in that record and the value checked against ``type``. A key
given twice on the way to either pointer is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.core.errors import EvidenceParseError
from runner.core.redaction import quote
from runner.parsers._json import (
    POINTER_SCHEMA,
    DuplicateKey,
    object_pairs,
    resolve_pointer,
    split_pointer,
)
from runner.parsers._lines import iter_lines
from runner.parsers._values import from_json, type_schema

__all__ = ["JsonlScalar"]


def _clip(text: str, limit: int = 80) -> str:
    return repr(quote(text, limit))


def _why(exc: Exception) -> str:
    """Why ``json.loads`` refused a line, in words that fit a parse error."""
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if "integer string conversion" in str(exc):
        return "an integer has more digits than Python converts (4300)"
    return str(exc)


def _shown(record: Any) -> str:
    """``record`` as short JSON text for a message (a record nested near the limit that
    ``json.loads`` took may be too deep for ``json.dumps`` here)."""
    try:
        return _clip(json.dumps(record))
    except (ValueError, RecursionError):
        return "a record nested too deeply to show"


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value, booleans only equal booleans, deep for containers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return False


class JsonlScalar:
    id = "jsonl.scalar"
    version = "1"
    description = (
        "A value from one record of a JSON-lines log (first, last, or the record matching a "
        "field), by RFC 6901 pointer; every line must be valid JSON."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["pointer"],
        "properties": {
            "pointer": {
                **POINTER_SCHEMA,
                "description": "Where the value is inside the chosen record. "
                + POINTER_SCHEMA["description"],
            },
            "select": {
                "enum": ["first", "last", "match"],
                "default": "last",
                "description": "Which record: the `first` or `last` (default) non-blank line, "
                "or `match`: among the records `match` selects, the one `occurrence` names.",
            },
            "match": {
                "type": "object",
                "additionalProperties": False,
                "required": ["pointer", "value"],
                "description": "With select `match` (and only then): the records whose value "
                "at `pointer` equals `value`.",
                "properties": {
                    "pointer": {
                        **POINTER_SCHEMA,
                        "description": "Where the field compared is inside each record; a "
                        "record without it does not match. " + POINTER_SCHEMA["description"],
                    },
                    "value": {
                        "description": "Any JSON value; compared by JSON equality (1 equals "
                        "1.0, true does not equal 1, objects and arrays deeply).",
                    },
                },
            },
            "occurrence": {
                "enum": ["first", "last", "only"],
                "default": "last",
                "description": "With select `match` (and only then): the `first`, the `last` "
                "(default), or the `only` matching record (exactly one must match).",
            },
            "type": type_schema("number", source="json"),
        },
        # select "match" needs `match`; `match` and `occurrence` need select "match".
        "if": {"properties": {"select": {"const": "match"}}, "required": ["select"]},
        "then": {"required": ["match"]},
        "dependentSchemas": {
            "match": {"required": ["select"], "properties": {"select": {"const": "match"}}},
            "occurrence": {"required": ["select"], "properties": {"select": {"const": "match"}}},
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        name = evidence.name
        pointer: str = config["pointer"]
        select: str = config.get("select", "last")
        match: dict[str, Any] | None = config.get("match") if select == "match" else None
        occurrence: str = config.get("occurrence", "last") if match else select
        chosen: tuple[int, Any] | None = None  # (line number, record)
        count = 0
        matching_lines: list[int] = []  # the first few, for messages
        match_tokens = split_pointer(match["pointer"]) if match is not None else []
        for lineno, line in iter_lines(evidence, universal=False):
            if not line.strip():
                continue
            try:
                record = json.loads(line, object_pairs_hook=object_pairs, parse_constant=_not_json)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise EvidenceParseError(
                    f"{name} line {lineno} is not valid JSON: {_why(exc)}; found {_clip(line)}"
                ) from exc
            if match is not None:
                try:
                    field = resolve_pointer(record, match_tokens)
                except (KeyError, IndexError, TypeError):
                    continue
                except DuplicateKey as exc:
                    raise EvidenceParseError(f"{name} line {lineno}: {exc}") from exc
                if not json_equal(field, match["value"]):
                    continue
            count += 1
            if len(matching_lines) < 3:
                matching_lines.append(lineno)
            if occurrence == "last" or count == 1:
                chosen = (lineno, record)
        what = "records"
        if match is not None:
            equal = quote(json.dumps(match["value"]), 60, "")
            what = f"records with {match['pointer']!r} equal to {equal}"
        if chosen is None:
            raise EvidenceParseError(f"{name}: looked for {what}, found none")
        if occurrence == "only" and count != 1:
            lines = ", ".join(map(str, matching_lines)) + (", ..." if count > 3 else "")
            raise EvidenceParseError(
                f"{name}: looked for exactly one of the {what}, found {count} (lines {lines})"
            )
        lineno, record = chosen
        where = f"{name} line {lineno}: pointer {pointer!r}"
        try:
            value = resolve_pointer(record, pointer)
        except (KeyError, IndexError, TypeError) as exc:
            raise EvidenceParseError(
                f"{where} does not exist in the {occurrence} of the {what} (found {_shown(record)})"
            ) from exc
        except DuplicateKey as exc:
            raise EvidenceParseError(f"{name} line {lineno}: {exc}") from exc
        if isinstance(value, dict | list):
            kind = "an object" if isinstance(value, dict) else "an array"
            raise EvidenceParseError(f"{where}: found {kind}, expected a single value")
        return from_json(value, config.get("type", "number"), where)
