"""Typed values for the parsers: what ``type`` means, for text and for JSON.

A parser never guesses. From **text** (a regex group, a CSV cell), surrounding whitespace is
ignored for ``number``, ``integer`` and ``boolean`` (kept for ``string``), and:

- ``number``: decimal digits with an optional sign are an ``int`` (``"42"`` -> 42); a decimal
  fraction or exponent is a ``float`` (``"0.819"``, ``".5"``, ``"1e-3"``). Nothing else: no
  ``nan``, ``inf``, ``1_000``, ``0x10``, ``1,5``, empty text. A float that overflows is refused.
- ``integer``: decimal digits with an optional sign only (``"42.0"`` is refused).
- ``string``: the text as it is; empty text is refused.
- ``boolean``: ``true`` or ``false``, in any letter case; not ``1``/``0``/``yes``/``no``.

From **JSON** the value already has a type, and it must be the one asked for: ``number`` is a
JSON number (an int stays an int, a fraction is a float, never a boolean); ``integer`` a JSON
number without fraction or exponent; ``string`` a non-empty JSON string; ``boolean`` ``true``
or ``false``. A non-finite number (``1e999``) is refused. Nothing is converted between types.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal

from runner.core.errors import EvidenceParseError
from runner.core.redaction import quote

ValueType = Literal["number", "integer", "string", "boolean"]
Value = bool | int | float | str

# Possessive (no backtracking): a job's text is matched in time linear in its length. With
# ``[0-9]+\.?[0-9]*`` one line of 40,000 digits and an x took 25 s (every split tried).
_INT = re.compile(r"[+-]?+[0-9]++")
_FLOAT = re.compile(r"[+-]?+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][+-]?+[0-9]++)?+")


def type_schema(default: ValueType, *, source: Literal["text", "json"]) -> dict[str, Any]:
    """The ``type`` config field, with its default, described for ``source``."""
    if source == "text":
        what = (
            "How the matched text becomes a value: `number` (digits -> int, a decimal fraction "
            "or exponent -> float, finite only), `integer` (digits only), `string` (as is, "
            "non-empty), `boolean` (true/false, any case). Anything else is a parse error."
        )
    else:
        what = (
            "The JSON type the value must have: `number` (an int stays an int, a fraction is "
            "a float, finite only), `integer` (a number without fraction or exponent), "
            "`string` (non-empty), `boolean`. No conversion between types: a mismatch is a "
            "parse error."
        )
    return {
        "enum": ["number", "integer", "string", "boolean"],
        "default": default,
        "description": f"{what} Default `{default}`.",
    }


def show(raw: object, limit: int = 60) -> str:
    """A short, safe rendering of what was found, for error messages (redacted whole, then
    cut: :func:`runner.core.redaction.quote`)."""
    if isinstance(raw, Decimal):
        text = str(raw)
    elif isinstance(raw, str | int | float | bool) or raw is None:
        text = json.dumps(raw)
    else:
        text = repr(raw)
    return quote(text, limit)


def from_text(raw: str, value_type: ValueType, where: str | Callable[[], str]) -> Value:
    """``raw`` text as a value of ``value_type``; EvidenceParseError naming ``where`` otherwise
    (a callable ``where`` is called only for the message)."""
    try:
        return _from_text(raw, value_type)
    except _Unfit as exc:
        place = where() if callable(where) else where
        raise EvidenceParseError(f"{place}: {exc}") from exc.__cause__


class _Unfit(Exception):
    """The text is not a value of the type asked for (the message lacks the place)."""


def _from_text(raw: str, value_type: ValueType) -> Value:
    if value_type == "string":
        if raw == "":
            raise _Unfit("found empty text, expected a non-empty string")
        return raw
    text = raw.strip()
    if value_type == "boolean":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _Unfit(f"found {show(raw)}, expected true or false")
    if _INT.fullmatch(text):
        try:
            return int(text)
        except ValueError as exc:  # more digits than Python converts
            raise _Unfit(f"found an integer of {len(text)} digits") from exc
    if value_type == "integer":
        raise _Unfit(f"found {show(raw)}, expected an integer")
    if not _FLOAT.fullmatch(text):
        raise _Unfit(f"found {show(raw)}, expected a finite number")
    value = float(text)
    if not math.isfinite(value):
        raise _Unfit(f"found {show(raw)}, which overflows a float")
    return value


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def from_json(value: object, value_type: ValueType, where: str) -> Value:
    """A JSON value (from ``json`` or ``ijson``) checked against ``value_type``.

    ``Decimal`` (how ijson gives fractions) becomes a float; ints stay ints.
    """
    found = f"found {show(value)} ({_json_kind(value)})"
    if value_type == "boolean":
        if isinstance(value, bool):
            return value
        raise EvidenceParseError(f"{where}: {found}, expected a boolean")
    if value_type == "string":
        if isinstance(value, str) and value != "":
            return value
        raise EvidenceParseError(f"{where}: {found}, expected a non-empty string")
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        expected = "an integer" if value_type == "integer" else "a number"
        raise EvidenceParseError(f"{where}: {found}, expected {expected}")
    if isinstance(value, int):
        return value
    if value_type == "integer":
        raise EvidenceParseError(f"{where}: {found}, expected an integer (no fraction)")
    number = float(value)
    if not math.isfinite(number):
        raise EvidenceParseError(f"{where}: {found}, which is not a finite number")
    return number
