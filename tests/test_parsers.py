"""The json.scalar parser and the measurement reader: pure logic over files."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import EvidenceParseError
from runner.parsers import registry
from runner.parsers.json_scalar import resolve_pointer

PARSER = registry.get("json.scalar", "1")


def _parse(tmp_path: Path, text: str, pointer: str) -> object:
    path = tmp_path / "evidence.json"
    path.write_text(text)
    return PARSER.parse(path, {"pointer": pointer})


def test_reads_a_number_by_pointer(tmp_path: Path) -> None:
    assert _parse(tmp_path, '{"accuracy": 0.819, "n": 1000}', "/accuracy") == 0.819
    assert _parse(tmp_path, '{"a": {"b/c": [1, 2.5]}}', "/a/b~1c/1") == 2.5


def test_rfc6901_escapes_and_array_indices() -> None:
    doc = {"a~b": {"x/y": [10, 20]}}
    assert resolve_pointer(doc, "/a~0b/x~1y/0") == 10
    with pytest.raises(KeyError):
        resolve_pointer([1, 2], "/01")


@pytest.mark.parametrize(
    ("text", "pointer", "message"),
    [
        ("accuracy=0.8", "/accuracy", "not one JSON document"),
        ('{"accuracy": "0.8"}', "/accuracy", "not a number"),
        ('{"accuracy": true}', "/accuracy", "not a number"),
        ('{"accuracy": NaN}', "/accuracy", "not finite"),
        ('{"other": 1}', "/accuracy", "does not exist"),
        ("", "/accuracy", "not one JSON document"),
    ],
)
def test_refuses_to_guess(tmp_path: Path, text: str, pointer: str, message: str) -> None:
    """Anything but a finite number at the pointer is a parse_error, never a guess."""
    with pytest.raises(EvidenceParseError, match=message):
        _parse(tmp_path, text, pointer)


def test_registry_refuses_a_second_registration() -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(PARSER)
