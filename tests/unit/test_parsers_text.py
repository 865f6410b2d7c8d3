"""regex.scalar, jsonl.scalar, the bounded line reader and typed values from text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import EvidenceParseError
from runner.parsers import registry
from runner.parsers._lines import MAX_LINE_BYTES, iter_lines
from runner.parsers._values import from_text

FIXTURES = Path(__file__).parents[1] / "fixtures" / "parsers"
REGEX = registry.get("regex.scalar", "1")
JSONL = registry.get("jsonl.scalar", "1")


def _write(tmp_path: Path, data: str | bytes, name: str = "evidence.log") -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data, newline="")
    else:
        path.write_bytes(data)
    return path


# --- typed values from text -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value_type", "expected"),
    [
        ("42", "number", 42),
        (" -7 ", "number", -7),
        ("0.819", "number", 0.819),
        (".5", "number", 0.5),
        ("1e-3", "number", 0.001),
        ("5.", "number", 5.0),
        ("42", "integer", 42),
        ("+3", "integer", 3),
        ("ok", "string", "ok"),
        (" spaced ", "string", " spaced "),
        ("True", "boolean", True),
        ("false", "boolean", False),
    ],
)
def test_text_values_keep_their_type(raw: str, value_type: Any, expected: object) -> None:
    """Digits read as int, a fraction or exponent as float, and each type as asked."""
    value = from_text(raw, value_type, "where")
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "value_type"),
    [
        ("nan", "number"),
        ("NaN", "number"),
        ("inf", "number"),
        ("-Infinity", "number"),
        ("1e999", "number"),
        ("", "number"),
        ("n/a", "number"),
        ("1_000", "number"),
        ("0x10", "number"),
        ("1,5", "number"),
        ("42.0", "integer"),
        ("1e3", "integer"),
        ("", "string"),
        ("1", "boolean"),
        ("yes", "boolean"),
    ],
)
def test_text_values_are_never_guessed(raw: str, value_type: Any) -> None:
    """Non-finite, empty or malformed text is a parse error naming what was found."""
    with pytest.raises(EvidenceParseError, match="where: found"):
        from_text(raw, value_type, "where")


# --- the line reader ------------------------------------------------------------------------


def test_line_reader_splits_universal_and_strict_newlines(tmp_path: Path) -> None:
    """Universal mode ends lines at \\n, \\r\\n and \\r; strict mode only at \\n."""
    path = _write(tmp_path, b"a\r\nb\rc\nd")
    assert list(iter_lines(path, universal=True)) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert list(iter_lines(path, universal=False)) == [(1, "a"), (2, "b\rc"), (3, "d")]


def test_line_reader_handles_crlf_split_across_chunks(tmp_path: Path) -> None:
    """A \\r\\n that straddles the 1 MiB chunk boundary is one line end, not two."""
    first = b"x" * (1024 * 1024 - 1) + b"\r"
    path = _write(tmp_path, first + b"\nnext\n")
    lines = list(iter_lines(path, universal=True))
    assert [n for n, _ in lines] == [1, 2]
    assert lines[1] == (2, "next")


def test_line_reader_refuses_an_over_long_line(tmp_path: Path) -> None:
    """A line over 1 MiB is refused with its number, without reading the rest of it."""
    path = _write(tmp_path, b"ok\n" + b"x" * (3 * MAX_LINE_BYTES) + b"\nlater\n")
    with pytest.raises(EvidenceParseError, match=r"evidence\.log line 2 is longer than 1 MiB"):
        list(iter_lines(path, universal=True))
    exact = _write(tmp_path, b"y" * MAX_LINE_BYTES + b"\r\n", "exact.log")
    assert [len(t) for _, t in iter_lines(exact, universal=False)] == [MAX_LINE_BYTES]


def test_line_reader_refuses_invalid_utf8_naming_the_line(tmp_path: Path) -> None:
    """A line that is not UTF-8 is refused with its number; a leading BOM is skipped."""
    path = _write(tmp_path, b"\xef\xbb\xbffirst\nsecond \xff\n")
    with pytest.raises(EvidenceParseError, match=r"line 2 is not valid UTF-8"):
        list(iter_lines(path, universal=True))
    assert next(iter_lines(path, universal=True)) == (1, "first")


# --- regex.scalar ---------------------------------------------------------------------------


def test_regex_reads_a_console_log_with_progress_bars() -> None:
    """A value is read from a captured log whose progress bar is redrawn with \\r."""
    log = FIXTURES / "eval-console.log"
    assert REGEX.parse(log, {"pattern": r"^accuracy: (\S+)"}) == 0.819
    assert REGEX.parse(log, {"pattern": r"^accuracy: \S+ \((\d+)/", "type": "integer"}) == 8190
    assert REGEX.parse(log, {"pattern": r"evaluating: +(\d+)%", "occurrence": "first"}) == 0
    assert REGEX.parse(log, {"pattern": r"evaluating: +(\d+)%"}) == 100


def test_regex_finds_the_last_value_among_thousands_of_lines(tmp_path: Path) -> None:
    """In a 5000-step log the last match wins by default, and `first` finds the first."""
    lines = [f"step {i} loss={1 / (i + 1):.6f} accuracy={i / 10000:.4f}" for i in range(5000)]
    path = _write(tmp_path, "\n".join([*lines, "final accuracy=0.8190", "bye"]) + "\n")
    config: dict[str, Any] = {"pattern": r"accuracy=([0-9.]+)"}
    assert REGEX.parse(path, config) == 0.819
    assert REGEX.parse(path, {**config, "occurrence": "first"}) == 0.0
    assert REGEX.parse(path, {"pattern": r"^final accuracy=(?P<acc>\S+)$", "group": "acc"}) == 0.819
    assert (
        REGEX.parse(path, {"pattern": r"^step 4999\b.*", "group": 0, "type": "string"})
        == (lines[-1])
    )


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (r"final accuracy: ([0-9.]+)", b"final accuracy: "),
        (r"ab*cde", b"cde"),  # the run after a repeat, not the optional b
        (r"x(abc)?yz", None),  # literals in an optional group are not required
        (r"acc|loss=(\S+)", None),  # an alternative at the top: nothing is required
        (r"(?i)final (\S+)", None),  # the text's case may differ
        (r"(?x) fin al \s (\S+)", b"final"),  # verbose: as the engine reads it
        (r"\u00e9t\u00e9=(\d)", "\u00e9t\u00e9=".encode()),  # UTF-8 bytes of the text
        (r"a=(\d)", None),  # too short to be worth a search
    ],
)
def test_regex_required_literal_is_what_every_match_contains(
    pattern: str, literal: bytes | None
) -> None:
    import re

    from runner.parsers.regex_scalar import required_literal

    assert required_literal(re.compile(pattern)) == literal


def test_regex_literal_shortcut_changes_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks skipped for lacking the pattern's literal give the same values, line numbers and
    refusals as reading every line: across 1 MiB chunks, with \\r, \\r\\n and non-ASCII text."""
    from runner.parsers import regex_scalar

    filler = "".join(f"step {i} loss={i % 7}.5 \u00e9t\u00e9\r\n" for i in range(60_000))
    text = filler + "final accuracy: 0.7\r" + filler + "final accuracy: 0.8\n" + filler
    path = _write(tmp_path, text)
    configs: list[dict[str, Any]] = [
        {"pattern": r"final accuracy: (\S+)"},
        {"pattern": r"final accuracy: (\S+)", "occurrence": "first"},
        {"pattern": r"^step 5\d{4} loss=(\S+)"},
    ]
    only = {"pattern": r"final accuracy: (\S+)", "occurrence": "only"}
    with pytest.raises(EvidenceParseError) as shortcut_refusal:
        REGEX.parse(path, only)
    shortcut = [REGEX.parse(path, c) for c in configs]
    monkeypatch.setattr(regex_scalar, "required_literal", lambda pattern: None)
    with pytest.raises(EvidenceParseError) as full_refusal:
        REGEX.parse(path, only)
    assert shortcut == [REGEX.parse(path, c) for c in configs] == [0.8, 0.7, 2.5]
    assert str(shortcut_refusal.value) == str(full_refusal.value)
    assert "lines 60001, 120002" in str(full_refusal.value)


def test_regex_literal_shortcut_still_refuses_invalid_utf8(tmp_path: Path) -> None:
    """A chunk without the literal is skipped only when it is valid UTF-8."""
    path = _write(tmp_path, b"loss=1\n" * 1000 + b"bad \xff byte\n" + b"acc: 0.8\n")
    with pytest.raises(EvidenceParseError, match=r"line 1001 is not valid UTF-8"):
        REGEX.parse(path, {"pattern": r"acc: (\S+)"})


def test_regex_literal_search_sees_what_a_plain_search_sees() -> None:
    """The literal is looked for in the pending line and the new read without joining them:
    across the seam, before the rare byte it is sought by, after a stray one, and never past
    the end of the complete lines; whichever of its bytes is sought first."""
    from runner.parsers._lines import _Needle

    required = b"acc: "
    texts = [b"acc: 1\n", b"xacc: 1\n:", b":: acc:acc: \n", b"ac\nc: \n", b"acc:\n acc: ", b"a"]
    for text in texts:
        for split in range(len(text) + 1):
            pending, chunk = text[:split], text[split:]
            for end in range(len(chunk) + 1):
                expected = (pending + chunk)[: len(pending) + end].find(required) >= 0
                for at in range(len(required)):
                    needle = _Needle(required)
                    needle.at, needle.rare = at, required[at : at + 1]
                    assert needle.held(pending, chunk, end) == expected, (text, split, end, at)
                assert _Needle(required).held(pending, chunk, end) == expected


def _reference(data: bytes, pattern: str, occurrence: str, cap: int) -> tuple[str, object]:
    """What regex.scalar must answer, from the whole file at once: ("value", v), or ("error",
    a part of the message: the line and the reason)."""
    import re

    data = data.removeprefix(b"\xef\xbb\xbf")
    found: list[tuple[int, str]] = []
    for number, raw in enumerate(data.splitlines(), 1):  # bytes: \n, \r\n and \r only
        if len(raw) > cap:
            return "error", f"line {number} is longer than"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "error", f"line {number} is not valid UTF-8"
        found += [(number, m.group(1)) for m in re.finditer(pattern, text)]
        if occurrence == "first" and found:
            break
    if not found:
        return "error", "found no match"
    if occurrence == "only" and len(found) != 1:
        lines = ", ".join(str(n) for n, _ in found[:3]) + (", ..." if len(found) > 3 else "")
        return "error", f"found {len(found)} (lines {lines})"
    number, text = found[-1] if occurrence == "last" else found[0]
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        return "error", f"line {number}: group 1"
    return "value", int(text)


_TRICKY = [
    b"final accuracy: 1\n",  # the literal in the first read, the seam at every place
    b"x" * 13 + b"final accuracy: 2\n" + b"y" * 30 + b"\n",  # straddling a read boundary
    b"final\n" + b"z" * 10 + b"\nfinal accuracy: 3\n",  # its rare byte late in the literal
    b"final :\n:::: final accuracy: 4\n",  # stray rare bytes before the literal
    b"a\r\nb" * 9 + b"\r\nfinal accuracy: 5\r\n",  # \r\n split across reads
    b"a\rb\r\r" * 5 + b"final accuracy: 6\r",  # lone \r, at the end of the file too
    b"step 1\nfinal accuracy: 7",  # the last line without a line end
    b"ok\n" + b"x" * 90 + b"\nfinal accuracy: 8\n",  # a line over the cap, no literal in it
    b"ok\n" + b"x" * 90,  # the last line over the cap
    b"x" * 40 + b"final accuracy: 9" + b"x" * 40 + b"\n",  # the literal inside a long line
    b"\xef\xbb\xbf\xc3\xa9t\xc3\xa9\n" * 9 + b"final accuracy: 10\n",  # BOM, non-ASCII skipped
    b"ok\n" * 9 + b"bad \xff\n" + b"final accuracy: 11\n",  # invalid UTF-8 in a skipped read
    b"final accuracy: 12\n" + b"\xc3" + b"\n" * 9,  # invalid UTF-8 after the match
    b"final accuracy: 0.5\n" * 3 + b"final accuracy: 13\n",  # several, one not an integer
    b"\n" * 30,  # no match at all
]


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_regex_reader_agrees_with_reading_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Small reads and a small cap put every seam, \\r\\n split, over-long and unterminated
    line at a read boundary: the value, line numbers and refusals are those of reading the
    whole file at once, with the literal shortcut and without it (then word for word)."""
    import random

    from runner.parsers import _lines, regex_scalar

    monkeypatch.setattr(_lines, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(_lines, "MAX_LINE_BYTES", 64)
    rng = random.Random(chunk)  # noqa: S311 - reproducible test data
    pieces = [b"final accuracy: 3", b"final accuracy: 0.5", b"final ", b"accuracy", b": ", b"x"]
    pieces += [b"x" * 30, b"\r", b"\n", b"\r\n", b"\xc3\xa9", b"\xff", b"\xc3"]
    generated = [b"".join(rng.choices(pieces, k=rng.randrange(40))) for _ in range(60)]
    path = tmp_path / "evidence.log"

    def answer(config: dict[str, Any], shortcut: bool) -> tuple[str, object]:
        with monkeypatch.context() as patch:
            if not shortcut:
                patch.setattr(regex_scalar, "required_literal", lambda pattern: None)
                patch.setattr(regex_scalar, "_prefilter", lambda pattern: None)
            try:
                return "value", REGEX.parse(path, config)
            except EvidenceParseError as exc:
                return "error", str(exc)

    reasons = ("longer", "UTF-8", "no match", "lines", "group")  # in the messages
    kinds: set[str] = set()
    for data in _TRICKY + generated:
        path.write_bytes(data)
        for occurrence in ("first", "last", "only"):
            config = {"pattern": r"final accuracy: (\S+)", "occurrence": occurrence}
            config["type"] = "integer"
            kind, expected = _reference(data, config["pattern"], occurrence, 64)
            got = answer(config, shortcut=True)
            assert got == answer(config, shortcut=False), (data, occurrence)
            assert got[0] == kind, (data, occurrence, got)
            if kind == "value":
                assert got[1] == expected, (data, occurrence, got)
            else:
                assert str(expected) in str(got[1]), (data, occurrence, got)
            kinds.add(next((r for r in reasons if r in str(expected)), kind))
    assert kinds == {"value", *reasons}  # every kind of answer was met


def test_regex_counts_every_match_on_a_line(tmp_path: Path) -> None:
    """Several matches on one line each count, in order."""
    path = _write(tmp_path, "acc=0.1 acc=0.2\nacc=0.3 acc=0.4\n")
    assert REGEX.parse(path, {"pattern": r"acc=(\S+)"}) == 0.4
    assert REGEX.parse(path, {"pattern": r"acc=(\S+)", "occurrence": "first"}) == 0.1


def test_regex_only_needs_exactly_one_match(tmp_path: Path) -> None:
    """`only` returns the single match, and refuses zero or several, saying how many."""
    path = _write(tmp_path, "epoch 1 val=0.7\nepoch 2 val=0.8\ntest=0.819\n")
    assert REGEX.parse(path, {"pattern": r"test=(\S+)", "occurrence": "only"}) == 0.819
    with pytest.raises(EvidenceParseError, match=r"exactly one match .* found 2 \(lines 1, 2\)"):
        REGEX.parse(path, {"pattern": r"val=(\S+)", "occurrence": "only"})
    with pytest.raises(EvidenceParseError, match=r"evidence\.log: looked for pattern .* no match"):
        REGEX.parse(path, {"pattern": r"top5=(\S+)", "occurrence": "only"})


@pytest.mark.parametrize(
    ("text", "config", "message"),
    [
        ("acc=nan\n", {"pattern": r"acc=(\S+)"}, 'line 1: group 1 .* found "nan", expected a fin'),
        ("acc=inf\n", {"pattern": r"acc=(\S+)"}, "expected a finite number"),
        ("acc=n/a\n", {"pattern": r"acc=(\S+)"}, 'found "n/a"'),
        ("acc=\n", {"pattern": r"acc=(\S*)"}, 'found "", expected a finite number'),
        ("acc=0.8\n", {"pattern": r"acc=(\S+)", "type": "integer"}, "expected an integer"),
        ("acc=0.8\n", {"pattern": r"acc=(\S+)|none=(x)", "group": 2}, "took no part"),
        ("acc=0.8\n", {"pattern": r"top5=(\S+)"}, "found no match"),
        ("acc=0.8\n", {"pattern": r"acc=(\S+"}, "not a valid Python regular expression"),
        ("acc=0.8\n", {"pattern": r"acc=\S+"}, "group 1 does not exist"),
    ],
)
def test_regex_refusals(tmp_path: Path, text: str, config: dict[str, Any], message: str) -> None:
    """Non-numbers, missing groups, no match and an invalid pattern are parse errors."""
    with pytest.raises(EvidenceParseError, match=message) as info:
        REGEX.parse(_write(tmp_path, text), config)
    assert "evidence.log" in str(info.value)


def test_regex_refuses_a_file_with_no_newline_over_the_cap(tmp_path: Path) -> None:
    """A log that is one endless line is refused, not loaded."""
    path = _write(tmp_path, b"acc=0.5 " * (MAX_LINE_BYTES // 4))
    with pytest.raises(EvidenceParseError, match="line 1 is longer than 1 MiB"):
        REGEX.parse(path, {"pattern": r"acc=(\S+)"})


# --- jsonl.scalar ---------------------------------------------------------------------------


def test_jsonl_reads_the_last_or_first_record() -> None:
    """By default the last record is read; `first` reads the first."""
    log = FIXTURES / "metrics.jsonl"
    assert JSONL.parse(log, {"pointer": "/ok", "type": "boolean"}) is True
    assert JSONL.parse(log, {"pointer": "/loss", "select": "first"}) == 0.5
    assert JSONL.parse(log, {"pointer": "/step", "select": "first"}) == 100


def test_jsonl_selects_records_by_a_matching_field() -> None:
    """`match` chooses the records whose field equals the value; `occurrence` picks one."""
    log = FIXTURES / "metrics.jsonl"
    test = {"select": "match", "match": {"pointer": "/split", "value": "test"}}
    assert JSONL.parse(log, {"pointer": "/accuracy", **test}) == 0.819
    assert JSONL.parse(log, {"pointer": "/metrics/top5", **test, "occurrence": "only"}) == 0.97
    assert JSONL.parse(log, {"pointer": "/samples", **test, "type": "integer"}) == 10000
    val = {"select": "match", "match": {"pointer": "/split", "value": "val"}}
    assert JSONL.parse(log, {"pointer": "/accuracy", **val}) == 0.81
    assert JSONL.parse(log, {"pointer": "/accuracy", **val, "occurrence": "first"}) == 0.7
    with pytest.raises(EvidenceParseError, match=r"exactly one .* found 3 \(lines 3, 7, 10\)"):
        JSONL.parse(log, {"pointer": "/accuracy", **val, "occurrence": "only"})


def test_jsonl_match_uses_json_equality(tmp_path: Path) -> None:
    """1 matches 1.0, true does not match 1, and records without the field never match."""
    path = _write(
        tmp_path,
        '{"epoch": 1, "v": "a"}\n{"v": "no epoch"}\n{"epoch": true, "v": "b"}\n'
        '{"epoch": 1.0, "v": "c"}\n{"epoch": {"n": [1]}, "v": "d"}\n[1, 2]\n',
    )

    def pick(value: object, occurrence: str = "last") -> object:
        config = {"pointer": "/v", "type": "string", "select": "match", "occurrence": occurrence}
        return JSONL.parse(path, {**config, "match": {"pointer": "/epoch", "value": value}})

    assert pick(1) == "c"
    assert pick(1, "first") == "a"
    assert pick(True) == "b"
    assert pick({"n": [1.0]}) == "d"


@pytest.mark.parametrize(
    ("text", "config", "message"),
    [
        ('{"a": 1}\n{"a": 2\n{"a": 3}\n', {"pointer": "/a"}, r"line 2 is not valid JSON"),
        ('{"a": NaN}\n', {"pointer": "/a"}, r"line 1 is not valid JSON: NaN is not JSON"),
        ('{"a": Infinity}\n', {"pointer": "/a"}, r"line 1 is not valid JSON"),
        ('{"a": 1e999}\n', {"pointer": "/a"}, r"line 1: pointer '/a': .* not a finite number"),
        ('{"a": "0.8"}\n', {"pointer": "/a"}, r'found "0\.8" \(a string\), expected a number'),
        ('{"a": [1]}\n', {"pointer": "/a"}, r"found an array, expected a single value"),
        ('{"a": 1}\n{"b": 2}\n', {"pointer": "/a"}, r"line 2: pointer '/a' does not exist"),
        ('{"a": 1, "a": 2}\n', {"pointer": "/a"}, r"line 1: key 'a' is given twice"),
        ("\n  \n", {"pointer": "/a"}, r"looked for records, found none"),
        (
            '{"split": "val", "a": 1}\n',
            {"pointer": "/a", "select": "match", "match": {"pointer": "/split", "value": "test"}},
            r"looked for records with '/split' equal to \"test\", found none",
        ),
    ],
)
def test_jsonl_refusals(tmp_path: Path, text: str, config: dict[str, Any], message: str) -> None:
    """Malformed lines (never skipped), missing pointers and non-numbers are parse errors."""
    with pytest.raises(EvidenceParseError, match=message) as info:
        JSONL.parse(_write(tmp_path, text, "metrics.jsonl"), config)
    assert "metrics.jsonl" in str(info.value)


def test_jsonl_reads_every_line_even_for_first(tmp_path: Path) -> None:
    """A malformed line after the chosen record still refuses the file."""
    path = _write(tmp_path, '{"a": 1}\nnot json\n', "metrics.jsonl")
    with pytest.raises(EvidenceParseError, match="line 2 is not valid JSON"):
        JSONL.parse(path, {"pointer": "/a", "select": "first"})


def test_jsonl_refuses_an_over_long_line(tmp_path: Path) -> None:
    """A record over 1 MiB is refused with its line number."""
    big = json.dumps({"pad": "x" * MAX_LINE_BYTES, "a": 1})
    path = _write(tmp_path, '{"a": 0}\n' + big + "\n", "metrics.jsonl")
    with pytest.raises(EvidenceParseError, match="line 2 is longer than 1 MiB"):
        JSONL.parse(path, {"pointer": "/a"})


def test_regex_lazy_line_numbers_are_true_ones(tmp_path: Path) -> None:
    """Lines of skipped chunks are counted only when a message needs them, and then exactly:
    also when a \\r\\n straddles two reads of the recount."""
    from runner.parsers._lines import CHUNK_BYTES

    head = "x" * (CHUNK_BYTES - 1) + "\r\n"  # the \r ends the first read, the \n starts the next
    filler = "step loss=0.5\r" * 100_000
    path = _write(tmp_path, head + filler + "final accuracy: n/a\n")
    line = 1 + 100_000 + 1
    with pytest.raises(EvidenceParseError, match=rf"evidence\.log line {line}: group 1 of"):
        REGEX.parse(path, {"pattern": r"final accuracy: (\S+)"})
    assert iter_lines(path, universal=True).__next__()[0] == 1
    assert sum(1 for _ in iter_lines(path, universal=True)) == line
