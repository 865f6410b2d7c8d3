"""Reading a text evidence file line by line, with bounded memory.

The file is read in 1 MiB chunks; no line longer than :data:`MAX_LINE_BYTES` is ever held, so
a 1 GB file with no newline is refused (``line N is longer than 1 MiB``) instead of loaded.
Text is UTF-8 (a leading byte order mark is skipped); a line that is not valid UTF-8 is a parse
error naming its number. Only a regular file is opened (:func:`runner.core.safefs.open_regular`: no
link, FIFO or device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from runner.core import safefs
from runner.core.errors import EvidenceParseError

MAX_LINE_BYTES = 1024 * 1024
CHUNK_BYTES = 1024 * 1024
_SAMPLE_BYTES = 64 * 1024  # of the first chunk, to choose the byte a literal is sought by
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
    """The file in CHUNK_BYTES pieces, a leading UTF-8 byte-order mark dropped. Only a regular
    file is read: a link, a FIFO or a device is an EvidenceParseError saying what it is."""
    try:
        opened = safefs.open_regular(path)
    except safefs.UnsafePath as exc:
        raise EvidenceParseError(f"{path.name} {exc.problem}") from exc
    with opened as fh:
        first = True
        while chunk := fh.read(CHUNK_BYTES):
            if first:
                first = False
                if chunk.startswith(_BOM):
                    chunk = chunk[len(_BOM) :]
            yield chunk


def iter_line_batches(
    path: Path,
    *,
    universal: bool,
    prefilter: Callable[[str], bool] | None = None,
    required: bytes | None = None,
    skipped: list[tuple[int, int]] | None = None,
) -> Iterator[tuple[int, list[str]]]:
    """``(number of the first line, lines)`` for each chunk's complete lines, without ends.

    With ``universal`` a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (so that a progress
    bar redrawn with ``\\r`` is many short lines, not one endless one); without it only at
    ``\\n`` (a ``\\r`` just before it is dropped), as JSON lines and CSV define them. Lines are
    numbered from 1. Batches keep the per-line cost low on files of millions of lines.

    ``prefilter``, when given, sees each chunk's complete lines as one text (line ends as
    ``\n``); a chunk it rejects is skipped without being split into lines, so a caller that
    can tell "nothing here" in one C-level search pays nothing per line there.

    ``required``, when given, is bytes that any line the caller wants must contain: a chunk
    whose complete lines hold none of it is skipped before it is even decoded, or copied (a
    ``memchr`` for the literal's rarest byte, then a ``bytes.find`` only where that byte is;
    UTF-8 is still checked, by ``isascii`` where it can be, so a bad line is reported
    wherever it is).

    ``skipped``, when given, makes line numbers lazy: the lines of skipped chunks are not
    counted (counting newlines costs more than finding the literal); each skipped stretch is
    appended to ``skipped`` as ``(start, end)`` offsets instead, and the numbers yielded leave
    those lines out. :func:`line_numbers` turns such numbers into true ones, when a message
    needs them.
    """
    name = path.name
    lineno = 1  # the number of the next line (leaving out skipped ones, when lazy)
    offset = 0  # where ``pending`` starts in the file (after a byte-order mark)
    pending = b""  # the incomplete line after the last line end (a \r at its end, at most)
    needle = _Needle(required) if required else None
    for chunk in _chunks(path):
        # ``data`` is ``pending + chunk`` and ``cut`` the end of its complete lines; ``data``
        # is built only for a chunk read line by line. A skipped chunk is searched where it
        # lies: a fresh 1 MiB copy for every read costs more than the search itself.
        if universal:
            # A \r at the very end may be half of a \r\n: keep it for the next chunk.
            limit = len(chunk) - 1 if chunk.endswith(b"\r") else len(chunk)
            newline = chunk.rfind(b"\n", 0, limit)
            end = max(newline, chunk.rfind(b"\r", newline + 1, limit)) + 1
        else:
            end = chunk.rfind(b"\n") + 1
        if end:
            cut, rest = len(pending) + end, chunk[end:]
        elif universal and pending.endswith(b"\r"):  # a lone \r, now that more follows it
            cut, rest = len(pending), chunk
        else:
            cut, rest = 0, pending + chunk
        start, offset = offset, offset + cut
        data: bytes | None = None if cut else rest
        skip = False
        if cut and needle is not None:
            skip = not needle.held(pending, chunk, end) and _valid(pending, chunk, cut)
        if cut and not skip and prefilter is not None:
            data = pending + chunk
            skip = _rejected(data[:cut], universal, prefilter)
        if skip:
            if skipped is None:
                lineno += _count_lines(pending + chunk if data is None else data, cut, universal)
            elif skipped and skipped[-1][1] == start:
                skipped[-1] = (skipped[-1][0], start + cut)
            else:
                skipped.append((start, start + cut))
            pending = rest
            if len(pending) > MAX_LINE_BYTES + 1:
                raise _too_long(name, _true_number(path, universal, skipped, lineno))
            continue
        if data is None:
            data = pending + chunk if pending else chunk
        pending = rest
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
            if bad is not None and skipped:
                lines, bad = _batch(name, _true_number(path, universal, skipped, lineno), raw)
            yield lineno, lines
            if bad is not None:
                raise bad
            lineno += len(raw)
        if len(pending) > MAX_LINE_BYTES + 1:
            raise _too_long(name, _true_number(path, universal, skipped, lineno))
    if pending:
        if universal:
            line = pending.rstrip(b"\r")
        else:
            line = pending[:-1] if pending.endswith(b"\r") else pending
        lines, bad = _batch(name, lineno, [line])
        if bad is not None and skipped:
            lines, bad = _batch(name, _true_number(path, universal, skipped, lineno), [line])
        yield lineno, lines
        if bad is not None:
            raise bad


def line_numbers(
    path: Path, universal: bool, skipped: list[tuple[int, int]], marks: list[tuple[int, int]]
) -> list[int]:
    """True line numbers for ``marks`` from a lazy :func:`iter_line_batches`: each mark is
    ``(number yielded, len(skipped) when it was yielded)``. One more read of the skipped
    stretches counts their lines (only they, and only up to the last one needed)."""
    needed = max((n for _, n in marks), default=0)
    counts = _lines_in(path, universal, skipped[:needed])
    before = [0]
    for count in counts:
        before.append(before[-1] + count)
    return [number + before[n] for number, n in marks]


def _true_number(
    path: Path, universal: bool, skipped: list[tuple[int, int]] | None, lineno: int
) -> int:
    if not skipped:
        return lineno
    return line_numbers(path, universal, skipped, [(lineno, len(skipped))])[0]


def _lines_in(path: Path, universal: bool, stretches: list[tuple[int, int]]) -> list[int]:
    """Lines in each ``(start, end)`` stretch of the file (offsets after a byte-order mark);
    each stretch starts a line and ends with a line end, as the skipped ones do."""
    counts = [0] * len(stretches)
    offset = 0
    chunk_ends_cr = False
    first = 0  # the first stretch not ended before this chunk (they are in file order)
    for chunk in _chunks(path):
        end = offset + len(chunk)
        while first < len(stretches) and stretches[first][1] <= offset:
            first += 1
        for i in range(first, len(stretches)):
            lo, hi = stretches[i]
            if lo >= end:
                break
            a, b = max(lo, offset), min(hi, end)
            if a < b:
                piece = chunk[a - offset : b - offset]
                counts[i] += _count_lines(piece, len(piece), universal)
                if universal and a > lo and piece.startswith(b"\n") and chunk_ends_cr:
                    counts[i] -= 1  # a \r\n split between two reads is one line end
        chunk_ends_cr = chunk.endswith(b"\r")
        offset = end
        if stretches and offset >= stretches[-1][1]:
            break
    return counts


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


class _Needle:
    """Whether the complete lines of ``pending + chunk`` hold ``required``, told without
    building that text. The byte of ``required`` rarest at the start of the file is looked
    for first (one ``memchr``, several times faster than the search for the whole); a chunk
    without it cannot hold ``required``, and in one with it the search starts just before the
    first. Which byte it is changes the speed only, never the answer."""

    def __init__(self, required: bytes) -> None:
        self.required = required
        self.rare = b""  # chosen from the first chunk
        self.at = 0  # where ``rare`` first is in ``required``

    def held(self, pending: bytes, chunk: bytes, end: int) -> bool:
        """Whether ``(pending + chunk)[:len(pending) + end]`` holds ``required``: in
        ``pending``, in ``chunk[:end]``, or across the seam between them."""
        required = self.required
        if not self.rare:
            sample = min(end, _SAMPLE_BYTES)
            # Each distinct byte's first place: at most 256 searches, so the cost is linear in
            # the literal's length (a contract's pattern may hold a literal of megabytes).
            self.at = min(
                (required.index(byte) for byte in set(required)),
                key=lambda i: (chunk.count(required[i : i + 1], 0, sample), i),
            )
            self.rare = required[self.at : self.at + 1]
        first = chunk.find(self.rare, 0, end)
        if first >= 0 and chunk.find(required, max(0, first - self.at), end) >= 0:
            return True
        if pending.find(required) >= 0:
            return True
        seam = len(required) - 1
        return seam > 0 and (pending[-seam:] + chunk[: min(end, seam)]).find(required) >= 0


def _valid(pending: bytes, chunk: bytes, cut: int) -> bool:
    """Whether ``(pending + chunk)[:cut]`` is UTF-8 (ASCII where it can tell, without a copy)."""
    return (pending.isascii() and chunk.isascii()) or _is_utf8((pending + chunk)[:cut])


def _is_utf8(region: bytes) -> bool:
    try:
        region.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _count_lines(data: bytes, end: int, universal: bool) -> int:
    """Lines in ``data[:end]``, which ends with a line end (counted in place, no copy)."""
    newlines = data.count(b"\n", 0, end)
    if not universal or data.find(b"\r", 0, end) < 0:
        return newlines
    return newlines + data.count(b"\r", 0, end) - data.count(b"\r\n", 0, end)


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
