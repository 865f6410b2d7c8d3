"""A short excerpt of a measurement's evidence around its value, read as hostile bytes.

The evidence lies in a job's ``output/`` (which the job wrote) or in a bundle (which anyone
wrote): it is opened with :mod:`runner.core.safefs` (no link followed anywhere on the way, a
regular file only, a FIFO refused without blocking), at most :data:`READ_CAP` bytes of its
head and as many of its tail are read, and what is kept is a few lines around the value's
first appearance, each line cut to :data:`LINE_CAP` characters and the whole to
:data:`EXCERPT_CAP`. With an agent's secrets to redact (the job's step), what was read is
redacted whole before anything of it is cut (a piece of a value is not found), the partial
line where a read stops short of the file's end or starts past its beginning dropped first.
Control characters are shown as U+FFFD. What comes back is plain text: the page escapes it
(:mod:`runner.results.report.page`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from runner.core import safefs
from runner.core.redaction import NONE, Redactor

__all__ = ["EXCERPT_CAP", "LINE_CAP", "READ_CAP", "Excerpt", "excerpt", "needles"]

READ_CAP = 1024 * 1024
"""Bytes read from the head of an evidence file, and as many from its tail."""
LINE_CAP = 240
"""Characters kept of one line (the value's line is cut around the value)."""
EXCERPT_CAP = 2048
"""Characters of one excerpt, at most."""
CONTEXT_LINES = 2
"""Lines kept before and after the value's line."""


@dataclass(frozen=True)
class Excerpt:
    """What the page shows of one evidence file: ``lines`` (text, each already capped), the
    index in it of the line holding the value and the value's span in that line, or the
    ``problem`` that kept it from being read (``None`` when read)."""

    path: str
    lines: tuple[str, ...] = ()
    hit: int | None = None
    """Index in ``lines`` of the line holding the value (None: the value was not found)."""
    span: tuple[int, int] | None = None
    """``(start, end)`` of the value in ``lines[hit]``."""
    line_number: int | None = None
    """1-based line number in the file of ``lines[hit]`` (None when found in the tail of a
    file too long to count)."""
    problem: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "lines": list(self.lines),
            "hit": self.hit,
            "span": list(self.span) if self.span else None,
            "lineNumber": self.line_number,
            "problem": self.problem,
        }


def needles(value: object) -> list[str]:
    """The spellings of ``value`` that evidence may hold, most precise first."""
    if isinstance(value, bool):
        return ["true", "True"] if value else ["false", "False"]
    if isinstance(value, float):
        out = [repr(value), json.dumps(value), f"{value:g}"]
        if value.is_integer():
            out.append(str(int(value)))
        return list(dict.fromkeys(s for s in out if s))
    text = str(value)
    return [text] if text else []


def _clean(text: str) -> str:
    return "".join(
        c if c == "\t" or (c.isprintable() and c != "\ufeff") else "\ufffd" for c in text
    )


def _cut(line: str, start: int, end: int) -> tuple[str, tuple[int, int]]:
    """``line`` cut to :data:`LINE_CAP` characters around ``[start, end)``."""
    if len(line) <= LINE_CAP:
        return line, (start, end)
    width = min(end - start, LINE_CAP - 2)
    room = max(0, (LINE_CAP - 2 - width) // 2)
    lo = max(0, start - room)
    hi = min(len(line), lo + LINE_CAP - 2)
    lo = max(0, hi - (LINE_CAP - 2))
    head = "…" if lo > 0 else ""
    tail = "…" if hi < len(line) else ""
    s = len(head) + start - lo
    return head + line[lo:hi] + tail, (s, s + min(end, hi) - start)


def _short(line: str) -> str:
    return line if len(line) <= LINE_CAP else line[: LINE_CAP - 1] + "…"


def _find(text: str, value: object) -> tuple[int, int] | None:
    for needle in needles(value):
        at = text.find(needle)
        if at >= 0:
            return at, at + len(needle)
    return None


def _window(text: str, at: tuple[int, int], first_line: int | None) -> Excerpt:
    lines = text.split("\n")
    pos, index = 0, 0
    for index, line in enumerate(lines):  # noqa: B007 - index is the line the value is on
        if pos + len(line) >= at[0]:
            break
        pos += len(line) + 1
    start, end = at[0] - pos, min(at[1] - pos, len(lines[index]))
    lo, hi = max(0, index - CONTEXT_LINES), min(len(lines), index + CONTEXT_LINES + 1)
    hit_line, span = _cut(_clean(lines[index]), start, end)
    kept = [_short(_clean(x)) for x in lines[lo:index]]
    kept.append(hit_line)
    kept += [_short(_clean(x)) for x in lines[index + 1 : hi]]
    while sum(len(x) for x in kept) > EXCERPT_CAP and len(kept) > 1:  # drop context, keep hit
        if index - lo > 0:
            kept.pop(0)
            lo += 1
        else:
            kept.pop()
    number = None if first_line is None else first_line + index
    return Excerpt("", tuple(kept), index - lo, span, number)


def _read(f: object, size: int) -> tuple[bytes, bytes | None]:
    """The head of the open file and, when it is longer than both reads, its tail."""
    fd = f.fileno()  # type: ignore[attr-defined]
    head = os.pread(fd, READ_CAP, 0)
    if size <= READ_CAP:
        return head, None
    start = max(READ_CAP, size - READ_CAP)
    return head, os.pread(fd, READ_CAP, start)


def _redacted(redact: Redactor, data: bytes, head: bool, cut: bool) -> bytes:
    """``data`` (the ``head`` of a file, else its tail; ``cut``: the file goes on past it, or
    began before it) redacted whole, less the partial line where the read cut it (a value there
    may be cut too, which no redaction finds)."""
    if cut and head:
        data = data[: data.rfind(b"\n") + 1]
    elif cut:  # no line break at all: the whole tail is the end of a line begun before it
        first = data.find(b"\n")
        data = data[first + 1 :] if first >= 0 else b""
    return redact.bytes(data)


def excerpt(
    base: Path,
    rel: str,
    value: object,
    *,
    beside: Path | None = None,
    redact: Redactor = NONE,
) -> Excerpt:
    """A few lines of ``base/rel`` (the evidence at ``rel`` under an output folder) around
    ``value``; ``beside`` names the file instead when a bundle stored it beside its archive
    (a blob already checked, opened without following a link all the same); what is read
    redacted whole by ``redact`` before it is cut."""
    try:
        opened = safefs.open_regular(beside) if beside else safefs.open_under(base, rel)
    except safefs.UnsafePath as exc:
        return Excerpt(rel, problem=exc.problem)
    except OSError as exc:
        return Excerpt(rel, problem=f"cannot be read: {exc.strerror or exc}")
    with opened as f:
        size = os.fstat(f.fileno()).st_size
        head, tail = _read(f, size)
    if redact:
        head = _redacted(redact, head, True, size > READ_CAP)
        tail = None if tail is None else _redacted(redact, tail, False, True)
    text = head.decode("utf-8", errors="replace")
    if tail is None and text.endswith("\n"):
        text = text[:-1]
    at = _find(text, value)
    if at is not None:
        found = _window(text, at, 1)
        return Excerpt(rel, found.lines, found.hit, found.span, found.line_number)
    if tail is not None:
        text = tail.decode("utf-8", errors="replace")
        at = _find(text, value)
        if at is not None:
            found = _window(text, at, None)
            return Excerpt(rel, found.lines, found.hit, found.span, None)
    first = [_short(_clean(x)) for x in head[:EXCERPT_CAP].decode("utf-8", "replace").split("\n")]
    where = f"its first {READ_CAP:,} and last {READ_CAP:,} bytes" if tail else "it"
    return Excerpt(
        rel,
        tuple(first[: 2 * CONTEXT_LINES + 1]),
        problem=f"the value is not spelled out in {where} (the file's first lines are shown)",
    )
