"""``csv.cell`` version 1: one cell of a CSV table, by column name and row.

The first record is the header; ``column`` names a column in it (exactly: spaces count). The
row is ``{"column": C, "value": V}``, the one data row whose cell in column ``C`` is exactly the
text ``V`` (there must be exactly one), or ``{"index": N}``, the N-th data row counted from 0
(negative counts from the end: -1 is the last). The cell's text is read as ``type``.

The file is read with the ``csv`` module (the Excel dialect: ``"`` quotes, ``""`` escapes a
quote, quoted fields may hold the delimiter and line ends; ``strict`` quoting) from a bounded
line reader: UTF-8 (a byte order mark is skipped), lines up to 1 MiB, records up to 1 MiB,
fields up to the ``csv`` module's limit (131072 characters). Blank lines are skipped. Every
record is read (a negative index reads the file twice), and a record whose number of fields
differs from the header's is refused, naming its line: a ragged table is not trusted.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.core.errors import EvidenceParseError
from runner.parsers._lines import MAX_LINE_BYTES, iter_raw_lines
from runner.parsers._values import from_text, show, type_schema

__all__ = ["CsvCell"]

MAX_RECORD_CHARS = MAX_LINE_BYTES


class _Source:
    """The lines ``csv.reader`` pulls, refusing a record that grows past the record cap."""

    def __init__(self, path: Path) -> None:
        self.name = path.name
        self.lines = iter_raw_lines(path)
        self.lineno = 0  # the last line handed out
        self.record_chars = 0  # characters of the record being read so far

    def __iter__(self) -> Iterator[str]:
        for lineno, line in self.lines:
            self.lineno = lineno
            self.record_chars += len(line)
            if self.record_chars > MAX_RECORD_CHARS:
                raise EvidenceParseError(
                    f"{self.name}: the record reaching line {lineno} is longer than "
                    f"{MAX_RECORD_CHARS} characters (an unclosed quote?)"
                )
            yield line


def _records(path: Path, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number where it ends, fields)`` for each non-blank record."""
    source = _Source(path)
    reader = csv.reader(source, delimiter=delimiter, strict=True)
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise EvidenceParseError(
                f"{source.name} line {source.lineno} is not valid CSV: {exc}"
            ) from exc
        source.record_chars = 0
        if record:
            yield source.lineno, record


class CsvCell:
    id = "csv.cell"
    version = "1"
    description = (
        "One cell of a CSV table with a header row: a column by name, a row by a key "
        "column's value or by index."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["column", "row"],
        "properties": {
            "column": {
                "type": "string",
                "minLength": 1,
                "description": "The header name of the column holding the value (exact text).",
            },
            "row": {
                "description": "Which data row: the one whose `column` cell is exactly "
                "`value` (exactly one row must be), or the `index`-th (0-based; negative "
                "counts from the end, -1 is the last).",
                "oneOf": [
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["column", "value"],
                        "properties": {
                            "column": {
                                "type": "string",
                                "minLength": 1,
                                "description": "The header name of the key column.",
                            },
                            "value": {
                                "type": "string",
                                "description": "The exact text of the key cell.",
                            },
                        },
                    },
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["index"],
                        "properties": {
                            "index": {
                                "type": "integer",
                                "description": "0-based data row; negative from the end.",
                            }
                        },
                    },
                ],
            },
            "delimiter": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1,
                "not": {"enum": ['"', "\n", "\r"]},
                "default": ",",
                "description": "The one-character field separator. Default ','.",
            },
            "type": type_schema("number", source="text"),
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        name = evidence.name
        delimiter: str = config.get("delimiter", ",")
        column: str = config["column"]
        row: dict[str, Any] = config["row"]
        header_line, header, data = _open_table(evidence, delimiter)
        at = _position(name, header_line, header, column)
        chosen: tuple[int, str] | None = None  # (line number, cell)
        if "index" in row:
            index: int = row["index"]
            looked = f"data row {index}"
            total = 0
            for i, lineno, fields in data:
                total += 1
                if i == index:
                    chosen = (lineno, fields[at])
            if index < 0 and total + index >= 0:
                _, _, again = _open_table(evidence, delimiter)
                for i, lineno, fields in again:
                    if i == total + index:
                        chosen = (lineno, fields[at])
                        break
            if chosen is None:
                raise EvidenceParseError(
                    f"{name}: looked for {looked}, found {total} data row"
                    f"{'s' if total != 1 else ''}"
                )
        else:
            key_at = _position(name, header_line, header, row["column"])
            looked = f"the row whose {row['column']!r} is {row['value']!r}"
            count = 0
            lines: list[int] = []
            for _, lineno, fields in data:
                if fields[key_at] == row["value"]:
                    count += 1
                    if len(lines) < 3:
                        lines.append(lineno)
                    chosen = (lineno, fields[at])
            if chosen is None or count != 1:
                at_lines = f" (lines {', '.join(map(str, lines))}{', ...' if count > 3 else ''})"
                raise EvidenceParseError(
                    f"{name}: looked for exactly one of {looked}, found {count}"
                    f"{at_lines if count else ''}"
                )
        lineno, cell = chosen
        where = f"{name} line {lineno}: {looked}, column {column!r}"
        return from_text(cell, config.get("type", "number"), where)


def _open_table(
    path: Path, delimiter: str
) -> tuple[int, list[str], Iterator[tuple[int, int, list[str]]]]:
    """The header's line and fields, and ``(index, line, fields)`` for each data row after it.

    A data row whose number of fields differs from the header's is refused when reached.
    """
    name = path.name
    records = _records(path, delimiter)
    first = next(records, None)
    if first is None:
        raise EvidenceParseError(f"{name}: looked for a header row, found an empty file")
    header_line, header = first

    def data() -> Iterator[tuple[int, int, list[str]]]:
        for i, (lineno, fields) in enumerate(records):
            if len(fields) != len(header):
                raise EvidenceParseError(
                    f"{name} line {lineno}: data row {i} has {len(fields)} fields, "
                    f"the header (line {header_line}) has {len(header)}"
                )
            yield i, lineno, fields

    return header_line, header, data()


def _position(name: str, header_line: int, header: list[str], column: str) -> int:
    """Where ``column`` is in the header; it must be there exactly once."""
    hits = [i for i, h in enumerate(header) if h == column]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise EvidenceParseError(
            f"{name}: column {column!r} appears {len(hits)} times in the header "
            f"(line {header_line})"
        )
    shown = ", ".join(show(h, 30) for h in header[:20]) + (", ..." if len(header) > 20 else "")
    raise EvidenceParseError(
        f"{name}: looked for column {column!r} in the header (line {header_line}), found {shown}"
    )
