"""The token guard between a JSON evidence file and ijson (see :mod:`runner.parsers._json`).

yajl re-lexes a token from its start each time it spans another read, so one long token costs
time quadratic in its length (a 2 GiB string took over ten minutes), and ijson 3.x hands on a
NULL value for an integer ``int`` refuses (a SystemError at best, a crash at worst).
:class:`TokenGuard` scans each chunk before yajl sees it and refuses as soon as a token is
longer than :data:`MAX_TOKEN_BYTES` or an integer part has more digits than ``int`` takes.
"""

from __future__ import annotations

import re
import sys
from typing import BinaryIO

from runner.core.errors import EvidenceParseError

MAX_TOKEN_BYTES = 1024 * 1024
"""The longest single JSON token the streaming parsers read: a string's bytes between its
quotes (escapes as written), or a number or literal."""

# JSON's structural bytes and whitespace: outside strings, a token (number or literal) is a
# maximal run of any other bytes. In a valid document each such run is exactly one token.
_SCALAR_RUN = re.compile(rb'[^ \t\r\n",:\[\]{}]*+')
_WINDOW = 4096  # how far to look first for the quote that closes a string open at a chunk start
_DIGITS = re.compile(rb"[0-9]*+")
_TWO_DIGITS = re.compile(rb"(?=[0-9]{2})")  # overlapping: each pair
_INTEGER_SO_FAR = re.compile(rb"-?+[0-9]*+")


def _int_digits_limit() -> int:
    """The most digits an integer token may have: ijson converts one with ``int``, which
    refuses more than ``sys.get_int_max_str_digits()`` (4300 unless the host lowered it), and
    ijson 3.x then hands on a NULL value instead of the error (a SystemError, or a crash)."""
    limit = sys.get_int_max_str_digits()
    return min(limit, 4300) if limit > 0 else 4300


def _integer_safe(limit: int) -> re.Pattern[bytes]:
    """From outside a string: the longest stretch holding no integer part of more than
    ``limit`` digits outside a string. Strings are skipped whole; digits after ``.``, ``e`` or
    ``E`` (a fraction or an exponent) are not an integer part and may be any number."""
    return re.compile(
        rb'(?:[^"0-9.eE]++|[.eE][+-]?+[0-9]*+|"[^"\\]*+(?:\\.[^"\\]*+)*+"'
        + rb"|[0-9]{1,%d}+(?![0-9]))*+" % limit,
        re.DOTALL,
    )


def _unescaped_quotes(region: bytes) -> bytes:
    """``region`` (which does not start in the middle of an escape) with its escaped
    backslashes, then its escaped quotes, blanked out by bytes of the same length: the quotes
    left are the unescaped ones, where they were."""
    if b"\\\\" in region:
        region = region.replace(b"\\\\", b"__")
    if b'\\"' in region:
        region = region.replace(b'\\"', b"__")
    return region


def _closing_quote(chunk: bytes, start: int) -> int:
    """Where the string that ``chunk[start:]`` is inside closes (its first unescaped quote),
    or -1. Usually the first quote, after an even run of backslashes; else the escapes are
    blanked out first (a window first: the string usually closes soon)."""
    quote = chunk.find(b'"', start)
    if quote < 0:
        return -1
    before = chunk[max(start, quote - 32) : quote]
    run = len(before) - len(before.rstrip(b"\\"))
    if run % 2 == 0 and (run < len(before) or quote - 32 <= start):
        return quote
    # Escapes blanked out in a first window, then in the whole chunk: a quote found in the
    # window is the first unescaped one (only the bytes before it decide).
    for end in (start + _WINDOW, len(chunk)):
        quote = _unescaped_quotes(chunk[start:end]).find(b'"')
        if quote >= 0:
            return quote + start
        if end >= len(chunk):
            break
    return -1


def _trailing_backslashes(chunk: bytes) -> int:
    return len(chunk) - len(chunk.rstrip(b"\\"))


def _trailing_run(chunk: bytes, start: int) -> int:
    """The length of the run of token bytes that ends ``chunk`` (not reaching before start)."""
    tail = chunk[-64:][::-1]
    run = _SCALAR_RUN.match(tail).end()  # type: ignore[union-attr]  # matches ''
    if run == len(tail) and len(chunk) > len(tail):
        run = _SCALAR_RUN.match(chunk[start:][::-1]).end()  # type: ignore[union-attr]
    return min(run, len(chunk) - start)


def _mib(size: int) -> str:
    mib = 1024 * 1024
    return f"{size // mib} MiB ({size} bytes)" if size % mib == 0 else f"{size} bytes"


class TokenGuard:
    """A read-only file for ijson that refuses any token longer than ``cap`` bytes, and any
    integer of more digits than ijson can convert.

    ``read(n)`` hands back the file's next bytes unchanged (at most ``cap`` of them) after
    scanning them with C-speed primitives only (``bytes.find``/``rfind``/``count``/``rstrip``/
    ``replace``, slices, anchored regex matches), never a Python step per token or per quote.
    A token wholly inside one chunk is shorter than a chunk, so at most ``cap``: only the token
    still open at the end of a chunk is followed into the next one. What carries over is
    whether the chunk ended inside a string (and after an odd run of backslashes, which escapes
    the next byte), how long the open string or number is so far, and how many integer digits
    the open number has. Only an unescaped quote (after an even run of backslashes) opens or
    closes a string: with the escaped backslashes, then the escaped quotes, blanked out by
    same-length bytes (two ``replace`` calls, only when the chunk has backslashes), the parity
    of the quotes left says whether the chunk ends inside a string, and the last one where it
    opened. A run of more than ``int_digits`` digits is looked for in a sample of the chunk
    (two sampled bytes in a row that are digits, and the bytes between them) and, only where
    there is one, one more regex pass over the chunk says whether it is outside a string.

    The refusal comes from the ``read`` that would hand ijson the first byte past the cap, so
    yajl never holds more than ``cap`` bytes of one token. The state assumes a valid document;
    on an invalid one it may be wrong, and then yajl refuses the document anyway (the guard
    may refuse first, which is still a parse error).
    """

    def __init__(
        self,
        raw: BinaryIO,
        name: str,
        *,
        offset: int = 0,
        cap: int = MAX_TOKEN_BYTES,
        int_digits: int | None = None,
    ) -> None:
        self._raw = raw
        self._name = name
        self._cap = cap
        self._int_digits = _int_digits_limit() if int_digits is None else int_digits
        self._step = max(1, self._int_digits // 2)
        self._int_safe = _integer_safe(self._int_digits)
        self.offset = offset  # where the next chunk starts in the file
        self._in_string = False  # the last chunk ended inside a string
        self._escaped = False  # ... and the next byte is escaped (an odd run of backslashes)
        self._open = 0  # bytes of the token open at the end of the last chunk (0: none)
        self._open_at = 0  # where it starts in the file (a string: its opening quote)
        self._open_int = -1  # the open number's integer digits so far (-1: past them)
        self.refusal: EvidenceParseError | None = None

    def read(self, size: int = -1) -> bytes:
        """The next at most ``min(size, cap)`` bytes of the file (``size`` < 0: ``cap``)."""
        if size == 0:
            return b""
        chunk = self._raw.read(self._cap if size < 0 else min(size, self._cap))
        if chunk:
            self._scan(chunk)
            self.offset += len(chunk)
        return chunk

    def _refuse(self, why: str) -> None:
        self.refusal = EvidenceParseError(f"{self._name}: {why}")
        raise self.refusal

    def _too_long(self, more: int) -> None:
        self._open += more
        if self._open > self._cap:
            what = "string" if self._in_string else "number (or literal)"
            self._refuse(
                f"the JSON {what} starting at byte {self._open_at} is longer than "
                f"{_mib(self._cap)}; JSON evidence is read with single strings, numbers and "
                "literals up to that length"
            )

    def _too_many_digits(self, at: int) -> None:
        self._refuse(
            f"the JSON number starting at byte {at} has more than {self._int_digits} digits "
            "before its fraction or exponent, more than Python converts"
        )

    def _long_digit_run(self, chunk: bytes, at: int) -> bool:
        """Whether ``chunk[at:]`` has a run of more than ``int_digits`` digits (anywhere).

        Such a run holds two bytes in a row of the sample taken every ``step`` bytes, and all
        the bytes between them are digits: a Python step per such pair (two sampled digits in
        a row are a few per MiB in number-heavy documents, at most ``size / step``)."""
        step = self._step
        sample = chunk[at::step]
        for pair in _TWO_DIGITS.finditer(sample):
            first = at + pair.start() * step
            if chunk[first : first + step + 1].isdigit():
                return True
        return False

    def _scan(self, chunk: bytes) -> None:
        size = len(chunk)
        at = 0  # where this chunk's own tokens start (past the end of a carried-over one)
        if self._in_string:
            start = 1 if self._escaped else 0
            close = _closing_quote(chunk, start)
            if close < 0:  # the whole chunk is inside the string
                self._too_long(size)
                self._escaped = min(_trailing_backslashes(chunk), size - start) % 2 == 1
                return
            self._too_long(close)
            self._in_string = False
            at = close + 1
        elif self._open:
            run = _SCALAR_RUN.match(chunk).end()  # type: ignore[union-attr]  # matches ''
            self._too_long(run)
            if self._open_int >= 0:
                digits = _DIGITS.match(chunk).end()  # type: ignore[union-attr]
                self._open_int += digits
                if self._open_int > self._int_digits:
                    self._too_many_digits(self._open_at)
                if digits < run or run < size:
                    self._open_int = -1
            if run == size:
                return
            at = run
        self._open = 0
        self._open_int = -1
        if self._long_digit_run(chunk, at):  # rare: then find out whether it is in a string
            safe = self._int_safe.match(chunk, at).end()  # type: ignore[union-attr]
            if safe < size and chunk[safe] in b"0123456789":
                minus = safe > 0 and chunk[safe - 1] == ord("-")
                self._too_many_digits(self.offset + safe - minus)
        # From ``at`` the chunk is outside any string: does it end inside one (an odd number
        # of unescaped quotes), and where did that one open?
        if chunk.find(b"\\", at) < 0:
            quotes, base = chunk, at
        else:
            quotes, base = _unescaped_quotes(chunk[at:]), 0
        opened = -1
        if quotes.count(b'"', base) % 2:
            opened = quotes.rfind(b'"', base) + at - base
        if opened >= 0:
            self._in_string = True
            self._open = size - opened - 1
            self._open_at = self.offset + opened
            self._escaped = min(_trailing_backslashes(chunk), self._open) % 2 == 1
            return
        run = _trailing_run(chunk, at)
        if run:
            self._open = run
            self._open_at = self.offset + size - run
            if _INTEGER_SO_FAR.fullmatch(chunk, size - run):
                self._open_int = run - (chunk[size - run] == ord("-"))
