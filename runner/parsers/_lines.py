"""Reading a text evidence file line by line, with bounded memory.

The file is read in 1 MiB chunks; no line longer than :data:`MAX_LINE_BYTES` is ever held, so
a 1 GB file with no newline is refused (``line N is longer than 1 MiB``) instead of loaded.
Text is UTF-8 (a leading byte order mark is skipped); a line that is not valid UTF-8 is a parse
error naming its number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from runner.errors import EvidenceParseError

MAX_LINE_BYTES = 1024 * 1024
CHUNK_BYTES = 1024 * 1024
_BOM = b"\xef\xbb\xbf"


def _too_long(name: str, lineno: int) -> EvidenceParseError:
    return EvidenceParseError(
        f"{name} line {lineno} is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB "
        f"({MAX_LINE_BYTES} bytes); the parsers read lines up to that length"
    )


def _decode(name: str, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EvidenceParseError(
            f"{name} line {lineno} is not valid UTF-8 (byte {exc.start + 1}: "
            f"{raw[exc.start : exc.start + 4]!r})"
        ) from exc


def _batch(name: str, first: int, raw: list[bytes]) -> tuple[list[str], Exception | None]:
    """Decode the complete lines ``raw`` (the first is line ``first``): the lines before the
    first bad one (over-long or not UTF-8), and the error for that one, if any."""
    bad: Exception | None = None
    if raw and max(map(len, raw)) > MAX_LINE_BYTES:
        at = next(i for i, line in enumerate(raw) if len(line) > MAX_LINE_BYTES)
        raw, bad = raw[:at], _too_long(name, first + at)
    try:
        return [line.decode("utf-8") for line in raw], bad
    except UnicodeDecodeError:
        lines: list[str] = []
        for i, line in enumerate(raw):
            try:
                lines.append(_decode(name, first + i, line))
            except EvidenceParseError as exc:
                return lines, exc
        return lines, None


def _chunks(path: Path) -> Iterator[bytes]:
    """The file in CHUNK_BYTES pieces, a leading UTF-8 byte-order mark dropped."""
    with path.open("rb") as fh:
        first = True
        while chunk := fh.read(CHUNK_BYTES):
            if first:
                first = False
                if chunk.startswith(_BOM):
                    chunk = chunk[len(_BOM) :]
            yield chunk


def iter_line_batches(
    path: Path, *, universal: bool, prefilter: Callable[[str], bool] | None = None
) -> Iterator[tuple[int, list[str]]]:
    """``(number of the first line, lines)`` for each chunk's complete lines, without ends.

    With ``universal`` a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (so that a progress
    bar redrawn with ``\\r`` is many short lines, not one endless one); without it only at
    ``\\n`` (a ``\\r`` just before it is dropped), as JSON lines and CSV define them. Lines are
    numbered from 1. Batches keep the per-line cost low on files of millions of lines.

    ``prefilter``, when given, sees each chunk's complete lines as one text (line ends as
    ``\n``); a chunk it rejects is skipped without being split into lines, so a caller that
    can tell "nothing here" in one C-level search pays nothing per line there.
    """
    name = path.name
    lineno = 1  # the number of the next line
    pending = b""
    for chunk in _chunks(path):
        data = pending + chunk if pending else chunk
        if universal:
            # A \r at the very end may be half of a \r\n: keep it for the next chunk.
            limit = len(data) - 1 if data.endswith(b"\r") else len(data)
            cut = max(data.rfind(b"\n", 0, limit), data.rfind(b"\r", 0, limit)) + 1
        else:
            cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        if prefilter is not None and cut and _rejected(data[:cut], universal, prefilter):
            lineno += _count_lines(data[:cut], universal)
            if len(pending) > MAX_LINE_BYTES + 1:
                raise _too_long(name, lineno)
            continue
        if universal:
            raw = data[:cut].splitlines()
        else:
            raw = (
                [
                    line[:-1] if line.endswith(b"\r") else line
                    for line in data[: cut - 1].split(b"\n")
                ]
                if cut
                else []
            )
        if raw:
            lines, bad = _batch(name, lineno, raw)
            yield lineno, lines
            if bad is not None:
                raise bad
            lineno += len(raw)
        if len(pending) > MAX_LINE_BYTES + 1:
            raise _too_long(name, lineno)
    if pending:
        if universal:
            line = pending.rstrip(b"\r")
        else:
            line = pending[:-1] if pending.endswith(b"\r") else pending
        lines, bad = _batch(name, lineno, [line])
        yield lineno, lines
        if bad is not None:
            raise bad


def _rejected(region: bytes, universal: bool, prefilter: Callable[[str], bool]) -> bool:
    """Whether ``prefilter`` rules out every line of ``region`` (False when it is not UTF-8:
    the line-by-line path then says where)."""
    try:
        text = region.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if universal and "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return not prefilter(text)


def _count_lines(region: bytes, universal: bool) -> int:
    """Lines in ``region``, which ends with a line end."""
    if not universal or b"\r" not in region:
        return region.count(b"\n")
    return region.count(b"\n") + region.count(b"\r") - region.count(b"\r\n")


def iter_lines(path: Path, *, universal: bool) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of ``path``; see :func:`iter_line_batches`."""
    for first, lines in iter_line_batches(path, universal=universal):
        yield from enumerate(lines, first)


def iter_raw_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Like :func:`iter_lines` (``\\n``-separated) but each line keeps its ending, for ``csv``."""
    name = path.name
    lineno = 0
    pending = b""
    for chunk in _chunks(path):
        data = pending + chunk if pending else chunk
        parts = data.split(b"\n")
        pending = parts.pop()
        for part in parts:
            lineno += 1
            if len(part) > MAX_LINE_BYTES + 1:
                raise _too_long(name, lineno)
            yield lineno, _decode(name, lineno, part + b"\n")
        if len(pending) > MAX_LINE_BYTES + 1:
            raise _too_long(name, lineno + 1)
    if pending:
        lineno += 1
        yield lineno, _decode(name, lineno, pending)
