"""The one grammar of durations and sizes a person types (``runner sign --expires-in``,
``runner cache prune --older-than`` and ``--max-bytes``).

A duration is a number of seconds, or a number and a unit: ``s``, ``m`` (minutes), ``h``,
``d`` or ``w`` (weeks), in either case, spaces around them allowed: ``90``, ``90s``,
``1.5h``, ``7d``, ``2w``, ``1e3s``. It is finite and not negative (a caller wanting more
than 0, or at most so long, checks that itself).

A size is a number of bytes, or a number and a binary multiple ``K``, ``M``, ``G`` or ``T``
(1024-based), optionally followed by ``B`` or ``iB``, in either case: ``1000``, ``512M``,
``1.5MiB``, ``2GB``."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from fractions import Fraction

__all__ = [
    "DURATION_FORMS",
    "BadDuration",
    "BadSize",
    "parse_bytes",
    "parse_duration",
    "parse_seconds",
]

DURATION_FORMS = "a number of seconds, or a number and s, m, h, d or w (e.g. 90s, 30m, 24h or 7d)"
SIZE_FORMS = "a number of bytes, or a number and K, M, G or T (1024-based; e.g. 1000, 512M, 2G)"

# Possessive (no backtracking): matched in time linear in the text. With plain repeats a run
# of spaces on each side of an optional unit was tried at every split (a size with 16,000
# on each side took 0.9 s).
_DURATION = re.compile(r"\s*+(\+?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:e[+-]?+\d++)?+)\s*+([smhdw]?+)\s*+")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"\s*+(\d++(?:\.\d++)?+)\s*+([kmgt]?+)(?:i?+b)?+\s*+")


class BadDuration(ValueError):
    """Not a duration of :data:`DURATION_FORMS`."""


class BadSize(ValueError):
    """Not a size of :data:`SIZE_FORMS`."""


def parse_seconds(text: str) -> float:
    """The duration ``text`` as seconds (see the module's grammar)."""
    match = _DURATION.fullmatch(text.lower())
    seconds = float(match.group(1)) * _SECONDS[match.group(2)] if match else math.nan
    if not math.isfinite(seconds):
        raise BadDuration(f"not a duration: {text!r}; a duration is {DURATION_FORMS}")
    return seconds


def parse_duration(text: str) -> timedelta:
    """The duration ``text`` as a :class:`timedelta` (see the module's grammar)."""
    seconds = parse_seconds(text)
    try:
        return timedelta(seconds=seconds)
    except OverflowError as exc:
        raise BadDuration(f"not a duration: {text!r} is too long") from exc


def parse_bytes(text: str) -> int:
    """The size ``text`` as bytes (see the module's grammar)."""
    match = _SIZE.fullmatch(text.lower())
    if match is None:
        raise BadSize(f"not a size: {text!r}; a size is {SIZE_FORMS}")
    scale = 1024 ** " kmgt".index(match.group(2) or " ")
    # Exact (a Fraction, not a float): a long number of digits is that many bytes, never a
    # float's infinity (an OverflowError) or a neighbour of it rounded.
    return int(Fraction(match.group(1)) * scale)
