"""The one grammar of durations and sizes (:mod:`runner.core.units`): every spelling
``--expires-in``, ``--older-than`` and ``--max-bytes`` took before it had one owner is
accepted, and anything else is refused naming the value and the forms accepted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runner.core import units


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("0", 0),
        ("90s", 90),
        ("30m", 1800),
        ("24h", 86400),
        ("12h", 43200),
        ("7d", 7 * 86400),
        ("2w", 14 * 86400),
        ("1.5h", 5400),
        ("5.", 5),
        (".5m", 30),
        ("1e3s", 1000),
        ("+5m", 300),
        ("24H", 86400),
        (" 7 d ", 7 * 86400),
        ("4s", 4),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert units.parse_seconds(text) == seconds
    assert units.parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text", ["", "s", "soon", "1x", "-1h", "-5", "infh", "inf", "nanh", "1e400s", "5 5m", "7dd"]
)
def test_what_is_no_duration_is_refused_naming_it_and_the_forms(text: str) -> None:
    with pytest.raises(units.BadDuration) as exc:
        units.parse_seconds(text)
    assert repr(text) in str(exc.value)
    assert "90s, 30m, 24h or 7d" in str(exc.value)


def test_a_duration_past_what_a_timedelta_holds_is_refused() -> None:
    with pytest.raises(units.BadDuration, match="too long"):
        units.parse_duration("1e300s")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        ("0", 0),
        ("512M", 512 * 1024**2),
        ("50G", 50 * 1024**3),
        ("2G", 2 * 1024**3),
        ("2gb", 2 * 1024**3),
        ("1.5MiB", 1536 * 1024),
        ("1T", 1024**4),
        ("4k", 4096),
        ("1000b", 1000),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert units.parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "1x", "-1", "G", "1P", "1e3", "lots"])
def test_what_is_no_size_is_refused_naming_it_and_the_forms(text: str) -> None:
    with pytest.raises(units.BadSize) as exc:
        units.parse_bytes(text)
    assert repr(text) in str(exc.value)
    assert "512M" in str(exc.value)
