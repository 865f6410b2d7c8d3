"""Hostile evidence: huge tokens, deep nesting, bad bytes, numbers no converter takes, files that
are not regular files. Every outcome is a value or an EvidenceParseError, never another
exception, and the work stays linear in the bytes read. Linearity is checked by what is read
(the JSON token guard refuses before ijson has been handed more than the cap past a token's
start), not by the clock, except for one loose ratio of CPU times on the guard alone."""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

import pytest

import runner.parsers._json as json_stream
import runner.parsers._json_guard as json_guard
from runner.core.errors import EvidenceParseError
from runner.parsers import registry
from runner.parsers._json import MAX_TOKEN_BYTES, TokenGuard, find_in_stream
from runner.parsers.jsonl_scalar import _shown

MIB = 1024 * 1024
CAP = MAX_TOKEN_BYTES
FIXTURES = Path(__file__).parents[1] / "fixtures"
JSON = registry.get("json.scalar", "1")
JSONL = registry.get("jsonl.scalar", "1")
JUNIT = registry.get("junit.summary", "1")
BOM = b"\xef\xbb\xbf"


# --- a reference lexer for the guard ---------------------------------------------------------

_DELIMITERS = b' \t\r\n",:[]{}'
_INTEGER_PART = re.compile(rb"-?([0-9]*)")


def _tokens(doc: bytes) -> Iterator[tuple[int, int, str]]:
    """``(start, length, kind)`` of each token of a valid JSON document, byte by byte: a
    string's length is its bytes between the quotes, a number's or literal's its run."""
    i, n = 0, len(doc)
    while i < n:
        c = doc[i]
        if c == ord('"'):
            j = i + 1
            while doc[j] != ord('"'):
                j += 2 if doc[j] == ord("\\") else 1
            yield i, j - i - 1, "string"
            i = j + 1
        elif c in _DELIMITERS:
            i += 1
        else:
            j = i
            while j < n and doc[j] not in _DELIMITERS:
                j += 1
            yield i, j - i, "number"
            i = j


_PIECES = [
    "a",
    '"',
    "\\",
    "\\\\",
    '\\"',
    "é",
    "\n",
    " ",
    "x" * 7,
    '"\\',
    "\\" * 20,
    "\\" * 33 + '"',
]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(0, 10)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return _text(rng)
    if kind == 1:
        return rng.choice([0, -1, 12345678901234567890, 1.5e-7, 3.25, True, False, None, 1e300])
    if kind == 2:
        return int("9" * rng.randrange(1, 40)) * rng.choice([1, -1])
    if kind == 3:
        return _text(rng) * rng.randrange(1, 4)
    if kind == 4:
        return "1" * rng.randrange(0, 30)
    if kind in (5, 6):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def _document(rng: random.Random) -> bytes:
    doc = json.dumps(
        _value(rng), ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])
    ).encode()
    floats = [
        b"-" * (rng.random() < 0.3)
        + b"1" * rng.randrange(1, 30)
        + b"." * (rng.random() < 0.7)
        + b"2" * rng.randrange(1, 30)
        + b"e-33" * (rng.random() < 0.3)
        for _ in range(rng.randrange(0, 3))
    ]
    return b",".join([b"[" + doc, *floats]) + b"]"


@pytest.mark.parametrize(("big", "window"), [(0, 4096), (60, 4096), (100, 3), (100, 1)])
def test_guard_agrees_with_a_reference_lexer(
    monkeypatch: pytest.MonkeyPatch, big: int, window: int
) -> None:
    """On thousands of random valid documents (escapes, backslash runs, long digit runs), read
    in random pieces with a small cap: every byte is handed on unchanged; the guard refuses
    exactly when some token is longer than the cap or some integer part has more digits than
    allowed, names the first such token, and has handed on no more than the cap past its
    start."""
    monkeypatch.setattr(json_guard, "_WINDOW", window)
    rng = random.Random(big * 100 + window)  # noqa: S311 - reproducible test data
    refused = 0
    for _ in range(3000):
        doc = _document(rng)
        skip = len(BOM) if rng.random() < 0.1 else 0
        doc = BOM * bool(skip) + doc
        cap = rng.randrange(1, 40) + big
        digits = rng.randrange(1, 25) + big // 2
        bad: list[tuple[int, set[str]]] = []
        for start, length, kind in _tokens(doc[skip:]):
            why = {"long"} if length > cap else set()
            match = _INTEGER_PART.match(doc, skip + start)
            if kind == "number" and match is not None and len(match.group(1)) > digits:
                why.add("digits")
            if why:
                bad.append((skip + start, why))
        raw = io.BytesIO(doc)
        raw.read(skip)
        guard = TokenGuard(raw, "d.json", offset=skip, cap=cap, int_digits=digits)
        handed = bytearray()
        try:
            while piece := guard.read(rng.randrange(1, cap + 1)):
                assert len(piece) <= cap
                handed += piece
        except EvidenceParseError as exc:
            assert bad, (doc, cap, digits, str(exc))
            start, why = bad[0]
            said = "digits" if f"more than {digits} digits" in str(exc) else "long"
            assert said in why, (doc, cap, digits, str(exc))
            assert f"starting at byte {start} " in str(exc), (doc, cap, digits, bad, str(exc))
            assert skip + len(handed) <= start + 1 + (cap if said == "long" else digits)
            refused += 1
        else:
            assert not bad, (doc, cap, digits, bad)
            assert bytes(handed) == doc[skip:]
    assert 0 < refused < 3000


# --- json.scalar on huge tokens ----------------------------------------------------------------


class _Counted:
    """A file that counts the bytes read from it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.end = raw.tell()  # how far into the file it has been read

    def read(self, size: int) -> bytes:
        data = self.raw.read(size)
        self.end += len(data)
        return data


class _Recorder(TokenGuard):
    """The guard find_in_stream makes, kept for the test to look at."""

    made: list[_Recorder] = []  # noqa: RUF012 - reset by the fixture

    def __init__(self, raw: BinaryIO, name: str, **kwargs: Any) -> None:
        self.file = _Counted(raw)
        super().__init__(self.file, name, **kwargs)  # type: ignore[arg-type]
        _Recorder.made.append(self)


@pytest.fixture
def guards(monkeypatch: pytest.MonkeyPatch) -> list[_Recorder]:
    _Recorder.made = []
    monkeypatch.setattr(json_stream, "TokenGuard", _Recorder)
    return _Recorder.made


def _sparse(path: Path, head: bytes, unit: bytes, tail: bytes, size: int = 64 * MIB) -> Path:
    """``head``, then ``unit`` repeated for 3 MiB, then a hole up to ``size``, then ``tail``:
    a 64 MiB file written in a few milliseconds. The hole reads as NUL bytes, which ijson would
    refuse with its own message, so a refusal from the guard shows it stopped before them."""
    with path.open("wb") as fh:
        fh.write(head + unit * (3 * MIB // len(unit)))
        fh.seek(size)
        fh.write(tail)
    return path


_HUGE = [
    pytest.param(b'{"pad": "', b"x", b'", "a": 0.5}', 8, "string", id="string-of-x"),
    pytest.param(b'{"pad": "', b'\\"', b'", "a": 0.5}', 8, "string", id="string-of-escaped-quotes"),
    pytest.param(
        b'{"pad": "', b"\\" * 1000 + b'\\"', b'", "a": 0.5}', 8, "string", id="backslash-runs"
    ),
    pytest.param(BOM + b'{"pad": "', b"x", b'", "a": 0.5}', 11, "string", id="string-after-bom"),
    pytest.param(b'{"a": 0.5, "pad": [0.', b"1", b"]}", 19, "number", id="long-fraction"),
    pytest.param(b'{"a": 0.5, "pad": [tru', b"e", b"]}", 19, "yajl", id="long-literal-run"),
    pytest.param(b'{"pad": ', b"1", b', "a": 0.5}', 8, "digits", id="long-integer"),
]


@pytest.mark.parametrize(("head", "unit", "tail", "start", "what"), _HUGE)
def test_a_64_mib_token_is_refused_before_ijson_sees_past_the_cap(
    tmp_path: Path,
    guards: list[_Recorder],
    head: bytes,
    unit: bytes,
    tail: bytes,
    start: int,
    what: str,
) -> None:
    """A 64 MiB string or number is refused as a parse error naming the file, the
    token's first byte and the cap; ijson was handed at most the cap past the token's start
    (an integer: at most 4300 digits of it), and the file was read at most one chunk further."""
    path = _sparse(tmp_path / "huge.json", head, unit, tail)
    assert path.stat().st_size > 64 * MIB
    with pytest.raises(EvidenceParseError) as info:
        JSON.parse(path, {"pointer": "/a"})
    message = str(info.value)
    (guard,) = guards
    if what == "yajl":  # invalid at its 6th byte: yajl refuses it within the first chunk
        assert message.startswith("huge.json is not one JSON document: lexical error")
        assert guard.file.end <= MIB
        return
    assert message.startswith("huge.json: ")
    assert f"starting at byte {start} " in message
    if what == "digits":
        assert "has more than 4300 digits before its fraction or exponent" in message
        limit = 4300
    else:
        assert f"the JSON {what}" in message
        assert "longer than 1 MiB (1048576 bytes)" in message
        limit = CAP
    assert guard.offset <= start + 1 + limit  # handed to ijson
    assert guard.file.end <= start + 1 + limit + MIB  # read from the file


def _write(path: Path, *parts: bytes, times: int = 1) -> Path:
    with path.open("wb") as fh:
        for _ in range(times):
            for part in parts:
                fh.write(part)
    return path


def test_escaped_quotes_across_many_chunks_parse(tmp_path: Path, guards: list[_Recorder]) -> None:
    """Strings of one real quote then 500,000 escaped ones (1 MB each, under the cap), three
    of them: most of the 46 chunks of 64 KiB start inside a string whose next quote is
    escaped. Every byte is handed on once, in reads of at most the cap."""
    unit = b'"' + b'\\"' * 500_000 + b'"'
    path = _write(tmp_path / "q.json", b'{"a": [', b", ".join([unit] * 3), b'], "b": 0.5}')
    assert JSON.parse(path, {"pointer": "/b"}) == 0.5
    assert JSON.parse(path, {"pointer": "/a/2", "type": "string"}) == '"' * 500_000
    assert [g.offset for g in guards] == [path.stat().st_size] * 2


def test_half_a_million_tiny_strings_parse(tmp_path: Path) -> None:
    """Half a million one-letter strings, 2 MB in 31 chunks of 64 KiB (an odd quote count in
    every chunk half the time)."""
    path = _write(tmp_path / "tiny.json", b'{"a": [', b'"a","b",' * 250_000, b'"c"], "n": 3}')
    assert JSON.parse(path, {"pointer": "/n"}) == 3
    assert JSON.parse(path, {"pointer": "/a/500000", "type": "string"}) == "c"


def test_long_backslash_runs_under_the_cap_parse(tmp_path: Path) -> None:
    """Strings of 999 escaped backslashes then an escaped quote, many of them across chunks."""
    text = "\\" * 999 + '"'
    unit = json.dumps(text).encode()
    path = _write(tmp_path / "bs.json", b"[", (unit + b",") * 4000, b"7]")
    assert len(unit) > 2000
    assert JSON.parse(path, {"pointer": "/3999", "type": "string"}) == text
    assert JSON.parse(path, {"pointer": "/4000"}) == 7


@pytest.mark.parametrize(("length", "ok"), [(CAP - 1, True), (CAP, True), (CAP + 1, False)])
@pytest.mark.parametrize("where", [10, MIB - 5, MIB + 3])
def test_a_string_up_to_the_cap_parses(tmp_path: Path, length: int, ok: bool, where: int) -> None:
    """A string of 1 MiB - 1 or exactly 1 MiB parses wherever it falls across chunks; one byte
    more is refused. The escapes count as written (here a 2-byte escape every 100 bytes)."""
    body = (b"x" * 98 + b"\\n") * (length // 100) + b"y" * (length % 100)
    assert len(body) == length
    head = b'{"pad": "' + b" " * (where - 9) + b'", "s": "'
    assert len(head) == where + 9
    path = _write(tmp_path / "edge.json", head, body, b'", "a": 1}')
    if ok:
        value = JSON.parse(path, {"pointer": "/s", "type": "string"})
        assert isinstance(value, str)
        assert len(value) == length - length // 100
        assert JSON.parse(path, {"pointer": "/a"}) == 1
    else:
        with pytest.raises(EvidenceParseError, match=f"string starting at byte {where + 8} "):
            JSON.parse(path, {"pointer": "/a"})


def test_long_numbers_under_the_limits_parse(tmp_path: Path) -> None:
    """A fraction of nearly 1 MiB of digits and an integer of 4300 digits parse (also across a
    chunk boundary); an integer of 4301 digits, which ijson cannot convert (it crashes or
    raises SystemError), is refused, here at the very end of a 4 MiB document."""
    fraction = b"0." + b"1" * (CAP - 3)
    integers = (b"7" * 4300 + b",") * 1000
    path = _write(tmp_path / "n.json", b"[", fraction, b",", integers, fraction, b",1]")
    assert JSON.parse(path, {"pointer": "/1001"}) == pytest.approx(1 / 9)
    assert JSON.parse(path, {"pointer": "/1", "type": "integer"}) == int("7" * 4300)
    bad = _write(tmp_path / "bad.json", b"[", integers, b"-", b"7" * 4301, b"]")
    with pytest.raises(EvidenceParseError, match=f"byte {1 + len(integers)} has more than 4300"):
        JSON.parse(bad, {"pointer": "/0"})


_LINEAR = {
    "quote-then-escapes": lambda n: b"[" + (b'"' + b'\\"' * 400_000 + b'",') * (n // 800_003),
    "tiny-escaped": lambda n: b"[" + b'"\\"","\\\\",' * (n // 11),
    "backslashes-then-quotes": lambda n: (
        b"[" + (b'"' + b"\\" * 300_000 + b'",' + b'"",' * 200_000) * (n // 900_003)
    ),
    "4300-digit-integers": lambda n: b"[" + (b"1" * 4300 + b",") * (n // 4301),
    "digit-strings": lambda n: b"[" + (b'"' + b"1" * 5000 + b'",') * (n // 5003),
    "near-cap-fractions": lambda n: b"[" + (b"0." + b"1" * (CAP - 3) + b",") * (n // CAP),
}


@pytest.mark.parametrize("make", _LINEAR.values(), ids=list(_LINEAR))
def test_guard_time_grows_linearly(make: Callable[[int], bytes]) -> None:
    """The guard alone, on 4x the bytes of the inputs that cost its primitives most, takes
    well under 16x the CPU time (linear is 4x; the bound is loose for a busy machine). Every
    one of these documents is valid up to its last element, so nothing is refused early."""

    def cpu(data: bytes) -> float:
        best = float("inf")
        for _ in range(2):
            guard = TokenGuard(io.BytesIO(data + b"1]"), "t.json")
            start = time.process_time()
            while guard.read(MIB):
                pass
            best = min(best, time.process_time() - start)
        return max(best, 1e-3)

    assert cpu(make(16 * MIB)) / cpu(make(4 * MIB)) < 10


def test_integers_ijson_cannot_convert_never_reach_it(tmp_path: Path) -> None:
    """Without the guard, eight integers of 1 MiB of digits crash ijson 3.x (it hands on the
    NULL that int() returned: the process dies with SIGSEGV). Run in a child process, so that
    a regression fails this test instead of killing the test session."""
    path = _write(tmp_path / "ints.json", b"[", (b"1" * (CAP - 1) + b",") * 8, b"1]")
    code = (
        "import sys; from pathlib import Path; from runner.parsers import registry\n"
        "try:\n"
        "    registry.get('json.scalar', '1').parse(Path(sys.argv[1]), {'pointer': '/8'})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(
        "EvidenceParseError ints.json: the JSON number starting at byte 1 has more than 4300"
    )


# --- the guard changes no value ----------------------------------------------------------------


def _leaves(value: Any, at: str = "") -> Iterator[str]:
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, at + "/" + key.replace("~", "~0").replace("/", "~1"))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{at}/{i}")


class _Plain:
    """No guard: ijson reads the file as it is (as before the guard)."""

    def __init__(self, raw: BinaryIO, name: str, **_: Any) -> None:
        self.read = raw.read
        self.refusal = None


@pytest.mark.parametrize(
    "path",
    [FIXTURES / "parsers" / "agent-result.json", FIXTURES / "seed-task.json"],
    ids=lambda p: p.name,
)
@pytest.mark.parametrize("read_bytes", [MIB, 7, 1])
def test_the_guard_changes_no_value_on_the_fixtures(
    monkeypatch: pytest.MonkeyPatch, path: Path, read_bytes: int
) -> None:
    """Every pointer in the JSON fixtures finds the same thing with the guard as without,
    also when ijson reads them 7 bytes or 1 byte at a time (a chunk boundary everywhere)."""
    pointers = list(_leaves(json.loads(path.read_text())))
    assert len(pointers) > 10
    monkeypatch.setattr(json_stream, "_READ_BYTES", read_bytes)
    guarded = find_in_stream(path, pointers)
    monkeypatch.setattr(json_stream, "TokenGuard", _Plain)
    plain = find_in_stream(path, pointers)
    assert guarded == plain
    assert all(f.exists for f in guarded)


# --- whatever ijson raises is a parse error ----------------------------------------------------


def test_nesting_is_capped_at_max_depth(tmp_path: Path) -> None:
    """1000 levels are read (the pointer is looked for); 1001 are refused, after one 64 KiB
    buffer of ijson events at most, whatever the document's size."""
    from runner.parsers._json import MAX_DEPTH

    path = tmp_path / "deep.json"
    path.write_bytes(b'{"a": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}")
    with pytest.raises(EvidenceParseError, match="found an array, expected a single value"):
        JSON.parse(path, {"pointer": "/a"})
    path.write_bytes(b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")
    with pytest.raises(EvidenceParseError, match=f"more than {MAX_DEPTH} deep"):
        JSON.parse(path, {"pointer": "/a"})
    path.write_bytes(b'{"b": 1, "a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")
    with pytest.raises(EvidenceParseError, match=f"more than {MAX_DEPTH} deep"):
        JSON.parse(path, {"pointer": "/b"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"a": 1e99999999999999999999}', "exponent is out of the range"),
        (b'{"a": 1e-99999999999999999999}', "exponent is out of the range"),
        (b"[" * 100_000, "nests objects and arrays more than 1000 deep"),
        (b'{"a": [' * 50_000, "nests objects and arrays more than 1000 deep"),
        (b'{"a": "\xff\xfe"}', "is not one JSON document"),
        (b'{"a": "x\x00y"}', "is not one JSON document"),
        (b'{"a": 1}\x00', "is not one JSON document"),
        (b'{"a": "\\ud800"} x', "is not one JSON document"),
        (b"", "is not one JSON document"),
        (BOM, "is not one JSON document"),
    ],
)
def test_hostile_documents_are_parse_errors(tmp_path: Path, text: bytes, message: str) -> None:
    path = tmp_path / "h.json"
    path.write_bytes(text)
    with pytest.raises(EvidenceParseError, match=message) as info:
        JSON.parse(path, {"pointer": "/a"})
    assert str(info.value).startswith("h.json")


def _failing_parse(exc: BaseException) -> Callable[..., Iterator[tuple[str, Any]]]:
    def basic_parse(*_: Any, **__: Any) -> Iterator[tuple[str, Any]]:
        yield ("start_map", None)
        raise exc

    return basic_parse


def _system_error(cause: BaseException) -> SystemError:
    error = SystemError("<method 'read'> returned a result with an exception set")
    error.__context__ = cause
    return error


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            _system_error(
                ValueError("Exceeds the limit (4300 digits) for integer string conversion")
            ),
            "more digits than Python converts",
        ),
        (_system_error(ValueError("something else")), "ValueError: something else"),
        (SystemError("bare"), "SystemError: bare"),
        (RecursionError("deep"), "nested too deeply"),
        (OverflowError("big"), "out of the range"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "UnicodeDecodeError"),
    ],
)
def test_every_ijson_failure_is_a_parse_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, message: str
) -> None:
    """SystemError (how ijson reports an error inside its callbacks), ValueError,
    UnicodeDecodeError, RecursionError, OverflowError: a parse error naming the file."""
    import ijson  # type: ignore[import-untyped]

    path = tmp_path / "x.json"
    path.write_bytes(b"{}")
    monkeypatch.setattr(ijson, "basic_parse", _failing_parse(exc))
    with pytest.raises(EvidenceParseError, match=message) as info:
        find_in_stream(path, ["/a"])
    assert str(info.value).startswith("x.json is not one JSON document")


@pytest.mark.parametrize("exc", [MemoryError(), _system_error(MemoryError())])
def test_memory_errors_are_not_swallowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    import ijson

    path = tmp_path / "x.json"
    path.write_bytes(b"{}")
    monkeypatch.setattr(ijson, "basic_parse", _failing_parse(exc))
    with pytest.raises(MemoryError):
        find_in_stream(path, ["/a"])


# --- jsonl.scalar ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"[" * 100_000, "line 2 is not valid JSON: it is nested too deeply"),
        (b'{"a": ' * 100_000, "line 2 is not valid JSON: it is nested too deeply"),
        (b'{"a": ' + b"1" * 5000 + b"}", "line 2 is not valid JSON: an integer has more digits"),
        (b'{"a": "\xff"}', "line 2 is not valid UTF-8"),
        (b'{"a": 1}\x00', "line 2 is not valid JSON"),
    ],
)
def test_jsonl_hostile_lines_are_parse_errors(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n' + line + b'\n{"a": 2}\n')
    with pytest.raises(EvidenceParseError, match=message):
        JSONL.parse(path, {"pointer": "/a", "select": "first"})


def test_jsonl_shows_a_record_too_deep_to_dump() -> None:
    record: list[Any] = []
    for _ in range(10_000):
        record = [record]
    assert _shown(record) == "a record nested too deeply to show"
    assert _shown({"a": 1}) == "'{\"a\": 1}'"


# --- junit.summary -----------------------------------------------------------------------------


def _report(tmp_path: Path, body: bytes, head: bytes = b"") -> Path:
    path = tmp_path / "junit.xml"
    path.write_bytes(head + b"<testsuites>" + body + b"</testsuites>")
    return path


@pytest.mark.parametrize(
    ("body", "start"),
    [
        (b'<testsuite tests="1" name="' + b"x" * (64 * MIB) + b'"/>', 12),
        (b"<!--" + b"x" * (64 * MIB) + b"-->", 12),
        (b"<testsuite" + b" " * (64 * MIB) + b'tests="1"/>', 12),
        (b'<testsuite tests="1"/><' + b"t" * (64 * MIB) + b"/>", 34),
    ],
    ids=["attribute", "comment", "spaces-in-tag", "tag-name"],
)
def test_junit_refuses_a_huge_piece_of_markup(tmp_path: Path, body: bytes, start: int) -> None:
    """expat re-scans an unfinished tag, comment or processing instruction on every chunk (time
    quadratic in its length) and holds all of it: past 1 MiB it is refused."""
    path = _report(tmp_path, body)
    with pytest.raises(EvidenceParseError, match=f"markup .* starting at byte {start} is longer"):
        JUNIT.parse(path, {"field": "tests"})


def test_junit_streams_huge_text(tmp_path: Path) -> None:
    """Text and CDATA are not markup: 64 MiB of them stream through."""
    text = b"<system-out>" + b"log line\n" * (4 * MIB) + b"</system-out>"
    cdata = b"<system-err><![CDATA[" + b"x" * (16 * MIB) + b"]]></system-err>"
    path = _report(tmp_path, b'<testsuite tests="3">' + text + cdata + b"</testsuite>")
    assert JUNIT.parse(path, {"field": "tests"}) == 3


@pytest.mark.parametrize(
    ("head", "body", "message"),
    [
        (b'<?xml version="1.0" encoding="hex"?>', b"", "declares an encoding"),
        (b'<?xml version="1.0" encoding="utf-7"?>', b"", "declares an encoding"),
        (b'<?xml version="1.0" encoding="idna"?>', b"", "declares an encoding"),
        (b'<?xml version="1.0" encoding="no-such"?>', b"", "declares an encoding"),
        (b"", b'<testsuite tests="' + b"1" * 5000 + b'"/>', "a tests count of 5000 digits"),
        (b"", b'<testsuite tests="' + b"x" * 5000 + b'"/>', "tests='xxx.*', not a whole"),
        (b"", b"<testsuite>\x00</testsuite>", "not well-formed"),
        (b"", b'<testsuite name="\xff"/>', "not well-formed"),
        (b"", b"<a>" * 1000, "nested more than 256 deep"),
    ],
)
def test_junit_hostile_reports_are_parse_errors(
    tmp_path: Path, head: bytes, body: bytes, message: str
) -> None:
    path = _report(tmp_path, body, head)
    with pytest.raises(EvidenceParseError, match=message) as info:
        JUNIT.parse(path, {"field": "tests"})
    assert len(str(info.value)) < 400


# --- every parser, every hostile input ---------------------------------------------------------

_CONFIGS = [
    ("json.scalar", {"pointer": "/a"}),
    ("agent.result", {}),
    ("jsonl.scalar", {"pointer": "/a"}),
    ("csv.cell", {"column": "b", "row": {"index": -1}, "type": "string"}),
    ("junit.summary", {"field": "tests"}),
    ("regex.scalar", {"pattern": r"(.*)", "type": "string"}),
    ("regex.scalar", {"pattern": r"a=(\S+)"}),
]
_INPUTS = {
    "deep-arrays": b"[" * 100_000,
    "nul": b'{"a": 1}\x00\na,b\n1,\x002\n',
    "invalid-utf8": b'{"a": "\xff\xfe"}\na=\xff\n',
    "long-integer": b'{"a": ' + b"1" * 5000 + b"}\na=" + b"9" * 100_000 + b"\n",
    "huge-exponent": b'{"a": 1e99999999999999999999}\na=1e999\n',
    "csv-quotes": b'a,b\n1,"2\n3,4"5\n',
    "empty": b"",
    "utf16": '{"a": 1}\n'.encode("utf-16"),
}


@pytest.mark.parametrize("data", _INPUTS.values(), ids=list(_INPUTS))
@pytest.mark.parametrize(("parser_id", "config"), _CONFIGS, ids=[c[0] for c in _CONFIGS])
def test_hostile_input_is_a_value_or_a_parse_error(
    tmp_path: Path, parser_id: str, config: dict[str, Any], data: bytes
) -> None:
    path = tmp_path / "evidence"
    path.write_bytes(data)
    try:
        registry.get(parser_id, "1").parse(path, config)
    except EvidenceParseError as exc:
        assert len(str(exc)) < 600  # a clipped message, not the hostile bytes


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link(path: Path) -> None:
    target = path.parent / "target"
    target.write_text('{"a": 1}\n')
    path.symlink_to(target)


def _folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make", "problem"),
    [(_fifo, "is a FIFO"), (_link, "is a symbolic link"), (_folder, "is a folder")],
    ids=["fifo", "link", "folder"],
)
@pytest.mark.parametrize(("parser_id", "config"), _CONFIGS, ids=[c[0] for c in _CONFIGS])
def test_only_a_regular_file_is_read(
    tmp_path: Path,
    parser_id: str,
    config: dict[str, Any],
    make: Callable[[Path], None],
    problem: str,
) -> None:
    """A FIFO (which would block a reader), a link or a folder is refused without reading."""
    path = tmp_path / "evidence"
    make(path)
    with pytest.raises(EvidenceParseError, match=f"^evidence {problem}"):
        registry.get(parser_id, "1").parse(path, config)


def test_decimal_values_are_unchanged_by_the_guard(tmp_path: Path) -> None:
    """Numbers keep ijson's exact types through the guard."""
    path = tmp_path / "n.json"
    path.write_bytes(b'{"i": -12345678901234567890, "f": 0.125, "e": 1E+2}')
    found = find_in_stream(path, ["/i", "/f", "/e"])
    assert [f.value for f in found] == [-12345678901234567890, Decimal("0.125"), Decimal("1E+2")]
