"""csv.cell: one cell by column name and row, from a streamed CSV table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import EvidenceParseError
from runner.parsers import registry

FIXTURES = Path(__file__).parents[1] / "fixtures" / "parsers"
CSV = registry.get("csv.cell", "1")
RESULTS = FIXTURES / "results.csv"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "table.csv"
    path.write_text(text, newline="")
    return path


def test_reads_a_cell_by_key_column() -> None:
    """The row whose key cell equals the value is chosen; the value keeps its type."""

    def accuracy(model: str) -> object:
        return CSV.parse(
            RESULTS, {"column": "accuracy", "row": {"column": "model", "value": model}}
        )

    assert accuracy("toy") == 0.819
    huge = accuracy("huge")
    assert huge == 42
    assert type(huge) is int


def test_quoted_fields_with_commas_quotes_and_newlines() -> None:
    """Quoted fields keep their commas, doubled quotes and line breaks, and rows stay aligned."""

    def notes(model: str) -> object:
        row = {"column": "model", "value": model}
        return CSV.parse(RESULTS, {"column": "notes", "row": row, "type": "string"})

    assert notes("toy") == 'baseline, as in "Table 1"'
    assert notes("big") == "two-line note:\r\ntrained longer"
    assert notes("huge") == 'says "42", an int'
    row = {"column": "dataset", "value": "cifar-10, test split"}
    with pytest.raises(EvidenceParseError, match=r"exactly one .* found 2 \(lines 2, 4\)"):
        CSV.parse(RESULTS, {"column": "accuracy", "row": row})
    by_note = {"column": "notes", "value": "two-line note:\r\ntrained longer"}
    assert CSV.parse(RESULTS, {"column": "accuracy", "row": by_note}) == 0.9125


def test_reads_a_cell_by_index_from_either_end() -> None:
    """`index` counts data rows from 0; a negative index counts from the end."""

    def accuracy(index: int) -> object:
        return CSV.parse(RESULTS, {"column": "accuracy", "row": {"index": index}})

    assert [accuracy(i) for i in range(4)] == [0.819, 0.9125, 0.5, 42]
    assert [accuracy(i) for i in range(-4, 0)] == [0.819, 0.9125, 0.5, 42]
    with pytest.raises(EvidenceParseError, match="looked for data row 4, found 4 data rows"):
        accuracy(4)
    with pytest.raises(EvidenceParseError, match="looked for data row -5, found 4 data rows"):
        accuracy(-5)


def test_delimiter_and_blank_lines(tmp_path: Path) -> None:
    """Another delimiter works, and blank lines are not rows."""
    path = _write(tmp_path, "\nmodel\tacc\n\ntoy\t0.8\n\nbig\t0.9\n\n")
    config: dict[str, Any] = {"column": "acc", "delimiter": "\t"}
    assert CSV.parse(path, {**config, "row": {"index": 1}}) == 0.9
    assert CSV.parse(path, {**config, "row": {"index": -2}}) == 0.8


def test_utf8_bom_is_not_part_of_the_first_header(tmp_path: Path) -> None:
    """A spreadsheet's byte order mark does not hide the first column's name."""
    path = tmp_path / "table.csv"
    path.write_bytes(b"\xef\xbb\xbfmodel,acc\r\ntoy,0.5\r\n")
    assert CSV.parse(path, {"column": "model", "row": {"index": 0}, "type": "string"}) == "toy"


@pytest.mark.parametrize(
    ("text", "config", "message"),
    [
        (
            None,
            {"column": "f1", "row": {"column": "model", "value": "tiny"}},
            r'line 5: .* column \'f1\': found "n/a", expected a finite number',
        ),
        (
            None,
            {"column": "notes", "row": {"column": "model", "value": "tiny"}, "type": "string"},
            "found empty text",
        ),
        (
            None,
            {"column": "top5", "row": {"index": 0}},
            r"looked for column 'top5' in the header \(line 1\), found \"model\", \"dataset\"",
        ),
        (
            None,
            {"column": "accuracy", "row": {"column": "model", "value": "gpt"}},
            r"exactly one of the row whose 'model' is 'gpt', found 0$",
        ),
        (
            None,
            {"column": "accuracy", "row": {"column": "size", "value": "1"}},
            "looked for column 'size'",
        ),
        ("a,b\n1,nan\n", {"column": "b", "row": {"index": 0}}, "expected a finite number"),
        ("a,b\n1,inf\n", {"column": "b", "row": {"index": 0}}, "expected a finite number"),
        ("a,a\n1,2\n", {"column": "a", "row": {"index": 0}}, "column 'a' appears 2 times"),
        (
            "a,b\n1,2\n3\n",
            {"column": "b", "row": {"index": 0}},
            r"line 3: data row 1 has 1 fields, the header \(line 1\) has 2",
        ),
        (
            'a,b\n1,"2\n',
            {"column": "b", "row": {"index": 0}},
            r"line 2 is not valid CSV: unexpected end of data",
        ),
        ('a,b\n1,"2"x\n', {"column": "b", "row": {"index": 0}}, r"not valid CSV"),
        ("", {"column": "b", "row": {"index": 0}}, "looked for a header row, found an empty file"),
        ("a,b\n", {"column": "b", "row": {"index": -1}}, "found 0 data rows"),
    ],
)
def test_refusals(tmp_path: Path, text: str | None, config: dict[str, Any], message: str) -> None:
    """Missing columns or rows, duplicates, ragged rows, bad quoting and non-numbers are refused."""
    path = RESULTS if text is None else _write(tmp_path, text)
    with pytest.raises(EvidenceParseError, match=message) as info:
        CSV.parse(path, config)
    assert path.name in str(info.value)


def test_refuses_an_unclosed_quote_that_swallows_the_file(tmp_path: Path) -> None:
    """An unclosed quote is refused at the csv field limit, not read into memory."""
    lines = "".join(f"row {i},{i}\n" for i in range(200_000))
    path = _write(tmp_path, 'a,b\n1,"' + lines)
    with pytest.raises(
        EvidenceParseError, match=r"table\.csv line \d+ is not valid CSV: field larger"
    ):
        CSV.parse(path, {"column": "b", "row": {"index": -1}})


def test_refuses_over_long_lines_and_records(tmp_path: Path) -> None:
    """A line over 1 MiB, or a record of many quoted multi-line fields over 1 MiB, is refused."""
    path = _write(tmp_path, "a,b\n" + "x" * (2 * 1024 * 1024) + ",1\n")
    with pytest.raises(EvidenceParseError, match=r"table\.csv line 2 is longer than 1 MiB"):
        CSV.parse(path, {"column": "b", "row": {"index": 0}})
    path = _write(tmp_path, "a,b\n" + ",".join(['"x\ny"'] * 300_000) + "\n")
    with pytest.raises(EvidenceParseError, match=r"the record reaching line \d+ is longer than"):
        CSV.parse(path, {"column": "b", "row": {"index": 0}})
