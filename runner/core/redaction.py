"""Secrets out of what the runner keeps: the one redaction step.

An agent's secrets (its adapter's, :func:`runner.agents.adapters.secret_values`) reach its
container as
environment variables and nothing else; the agent, its prompt or its job may still put them
into what the runner keeps of the attempt (a request target the proxy logs, a transcript, a
file the job lists as evidence). A :class:`Redactor` holds the attempt's values and finds each
of them as it is, and in its usual encodings:

* percent-encoding (URL-encoding): each byte as itself or as ``%hh`` (either case), a space
  also as ``+``; so the plain value too (and each character of the forms below, likewise);
* in any case: each letter of the value and of the forms below as either case (the egress
  proxy lower-cases the host of a request it logs, and the case of a base64 form's letters
  is no protection: a key of printable ASCII comes back from its lower-cased base64, but for
  a few ambiguous groups, by trying both cases of each group of four);
* hexadecimal, with line breaks (``\\n``, ``\\r\\n`` or a bare ``\\r``) anywhere among its digits
  (``xxd -p`` wraps at 60);
* base64 (standard and URL-safe alphabets) at each of the three alignments a value can have
  inside a longer encoded string: the characters that depend on the value alone, with line
  breaks anywhere among them (wrapped output). At most one character at each end, which mixes
  a few bits of the value with its neighbours' (or padding), stays.

It replaces each occurrence with ``[redacted: NAME]`` (:data:`REDACTED`): the same marker
whatever the value's length or encoding, so that nothing of the value's shape is left. An
encoded form shorter than :data:`MIN_ENCODED` characters (a value of a few bytes) is not
looked for: it would match ordinary text.

What it does not find: a value split across lines or otherwise transformed (gzip, base32, a
double encoding, JSON ``\\u`` escapes of a non-ASCII value), and a part of a value.

A piece of a value is not found, so job-written text is redacted *before* anything cuts it
short: a message the runner builds from what a job wrote (a parser's reason quoting a line, a
self-report's flag quoting a path) quotes it through :func:`quote`, which redacts the whole
text with the step :func:`quoting` made active (the run's and the re-grade's, while they read
the job's evidence) and only then cuts it. A piece that something else cut (yajl's window
around a JSON error) is not quoted while a step with secrets is active.

The proxy (``images/proxy/egress-proxy``) cannot be given the values: it gets salted digests of
the same forms (:meth:`Redactor.proxy_rules`) and blanks a whole logged field that holds one,
so that its engine log, which the engine keeps for the life of the slot, never holds a value.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import hashlib
import os
import re
import secrets as _random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from runner.core import safefs

__all__ = ["NONE", "REDACTED", "Redactor", "base64_cores", "quote", "quoting"]

REDACTED = "[redacted: {name}]"
"""What a secret's value, in any of its forms, becomes."""
MIN_ENCODED = 8
"""Encoded forms shorter than this are not looked for (they would match ordinary text)."""
CHUNK = 1024 * 1024
BLOCKS = (16 * 1024, 1024)
"""The expression runs only on blocks of these sizes that may hold a match."""
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_WRAP = rb"(?:\r\n|\n|\r)?"
_SWAP = bytes.maketrans(b"%=", b"=%")


def _units(form: bytes, *, join: bytes = b"") -> bytes:
    """``form`` with each byte as itself or percent-encoded (a space also as ``+``), ``join``
    between them; compiled case-insensitive (:data:`re.IGNORECASE`: a letter, and a percent
    escape's hex digits, in either case), which compiles in half the time of spelling each
    letter's two cases out (33 ms against 14 for an 80-character key)."""
    parts = []
    for b in form:
        chars = {b, b ^ 0x20} if 0x41 <= (b & ~0x20) <= 0x5A else {b}
        alts = [re.escape(bytes([b])), *sorted(b"%%%02x" % c for c in chars)]
        if b == 0x20:
            alts.append(rb"\+")
        parts.append(b"(?:" + b"|".join(alts) + b")")
    return join.join(parts)


def base64_cores(value: bytes) -> list[bytes]:
    """The base64 characters that depend on ``value`` alone, at each of the three alignments
    it can have in a longer string (0, 1 or 2 bytes before it in its group of three), in the
    standard and the URL-safe alphabets."""
    found: list[bytes] = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + value)
        start, end = -(-8 * k // 6), 8 * (k + len(value)) // 6
        core = encoded[start:end]
        for form in (core, core.translate(_URLSAFE)):
            if form not in found:
                found.append(form)
    return found


def encoded_forms(value: bytes) -> list[bytes]:
    """The literal encoded forms looked for (hex in lower case; base64's cores), at least
    :data:`MIN_ENCODED` characters long."""
    forms = [value.hex().encode(), *base64_cores(value)]
    return [f for f in forms if len(f) >= MIN_ENCODED]


class Redactor:
    """An attempt's secrets (``{NAME: value}``), found and replaced in bytes, text, JSON
    values and files."""

    def __init__(self, secrets: Mapping[str, str], blind: str | None = None) -> None:
        self.names = sorted(k for k, v in secrets.items() if v)
        self.blind = blind
        """Why this step cannot redact what an attempt wrote (its secrets are no longer the
        ones it was given: unreadable now, or rotated); None when it can."""
        self._values = {k: secrets[k].encode() for k in self.names}
        groups: list[bytes] = []
        self._marks: dict[str, bytes] = {}
        self._marks_by_name: dict[str, bytes] = {}
        self._literals: list[tuple[str, list[bytes]]] = []
        self._checks: list[tuple[bytes, bytes, list[bytes]]] = []
        self._always = False
        longest = 1
        # The longest value first: where one secret begins another, the longer is found whole
        # (the shorter first had left the longer's tail).
        for i, name in enumerate(sorted(self.names, key=lambda n: -len(self._values[n]))):
            value = self._values[name]
            hexed = value.hex().encode()
            # what _maybe looks for: each form lower-cased, less the first two characters (a
            # stray "%" before it may eat them when percent-decoded)
            self._checks.append(
                (value.lower()[2:], hexed[2:], [c.lower()[2:] for c in base64_cores(value)])
            )
            self._always |= any(c in value for c in b"%= \r\n") or len(value) < 4
            alts = [_units(value)]
            for form in encoded_forms(value):
                # hex wrapped at any width (xxd -p's 60), base64 too (the base64 tool's 76,
                # PEM's 64)
                alts.append(_units(form, join=_WRAP))
            # a hex digit as %hh with a line break after it: 5 bytes, two digits a byte
            longest = max(longest, 10 * len(value) + 8)
            groups.append(b"(?P<s%d>" % i + b"|".join(alts) + b")")
            self._marks[f"s{i}"] = self._marks_by_name[name] = REDACTED.format(name=name).encode()
            literal = [value, value.lower(), hexed, hexed.upper(), *encoded_forms(value)]
            self._literals.append((name, list(dict.fromkeys(literal))))
        self._pattern = re.compile(b"|".join(groups), re.IGNORECASE) if groups else None
        self.longest = longest
        """The longest a match can be (bytes): what a stream keeps back between chunks."""

    def __bool__(self) -> bool:
        return self._pattern is not None or self.blind is not None

    def values(self) -> dict[str, bytes]:
        """The secrets this step redacts (``{NAME: value}``)."""
        return dict(self._values)

    def blinded(self, why: str) -> Redactor:
        """This step, marked unable to redact what an attempt wrote (``why``)."""
        return Redactor({k: v.decode() for k, v in self._values.items()}, blind=why)

    def digests(self) -> dict[str, Any]:
        """What the runner records at an attempt's start to know its secrets again later: a
        random salt and each value's salted SHA-256 (never a value)."""
        salt = _random.token_hex(16)
        return {"salt": salt, "sha256": {n: _salted(salt, v) for n, v in self._values.items()}}

    def differs(self, recorded: Mapping[str, Any]) -> list[str]:
        """The names in ``recorded`` (:meth:`digests` of an attempt's secrets) whose value
        this step does not hold; every name when ``recorded`` is not such a record."""
        salt, sums = recorded.get("salt"), recorded.get("sha256")
        if not isinstance(salt, str) or not isinstance(sums, dict):
            return ["(unreadable record)"]
        return sorted(
            str(n)
            for n, digest in sums.items()
            if n not in self._values or _salted(salt, self._values[n]) != digest
        )

    def _maybe(self, data: bytes) -> bool:
        """Whether ``data`` may hold a match: a necessary condition, checked with the
        C-speed searches of bytes (a regular expression of every form is some 4 MB/s; this,
        hundreds). Percent-decoded (a stray ``%`` before a value may eat at most its first two
        bytes), lower-cased (every form is looked for in any case), line breaks removed for
        hex and base64. A value holding ``%``, ``=``, a space or a line break, or a tiny one,
        always goes to the expression."""
        if self._always:
            return True
        # Percent-decoded in C: quoted-printable's decoder with "%" and "=" swapped, on the
        # bytes without their line breaks (a decoder reads "=" then CR as a soft line break,
        # and drops everything after a lone one: a stray "%\r" would hide what follows).
        unwrapped = data.replace(b"\r", b"").replace(b"\n", b"")
        if b"%" in unwrapped:
            unwrapped = binascii.a2b_qp(unwrapped.translate(_SWAP))
        lowered = unwrapped.lower()
        for value, hexed, cores in self._checks:
            if value in lowered or hexed in lowered or any(core in lowered for core in cores):
                return True
        return False

    def _mark(self, m: re.Match[bytes]) -> bytes:
        return self._marks[m.lastgroup or ""]

    def _name(self, m: re.Match[bytes]) -> str:
        return self.names[int((m.lastgroup or "s0")[1:])]

    def _matches(self, data: bytes, stop: int | None = None) -> Iterator[re.Match[bytes]]:
        """The matches in ``data`` that start before ``stop``, in order, none overlapping.
        The expression runs only where :meth:`_maybe` lets it: the whole, then blocks of each
        of :data:`BLOCKS` bytes in turn (each with the longest a match can be after it)."""
        if self._pattern is None:
            return
        stop = len(data) if stop is None else stop
        if not self._maybe(data):
            return
        pos = 0
        for start, end in self._windows(data, 0, stop, BLOCKS):
            for m in self._pattern.finditer(data, max(pos, start), end + self.longest):
                if m.start() >= end:
                    break
                pos = m.end()
                yield m

    def _windows(
        self, data: bytes, start: int, stop: int, sizes: Sequence[int]
    ) -> Iterator[tuple[int, int]]:
        """``[start, stop)`` cut into the smallest blocks that may hold a match's start."""
        if not sizes:
            yield start, stop
            return
        size = sizes[0]
        for at in range(start, stop, size):
            end = min(at + size, stop)
            if self._maybe(data[at : end + self.longest]):
                yield from self._windows(data, at, end, sizes[1:])

    def _literal(self, data: bytes, found: set[str]) -> bytes:
        """``data`` with the forms as they usually come (the value, its hex in either case,
        its base64 cores) replaced at C speed; the names replaced added to ``found``."""
        for name, forms in self._literals:
            for form in forms:
                if form in data:
                    found.add(name)
                    data = data.replace(form, self._marks_by_name[name])
        return data

    def found(self, data: bytes) -> list[str]:
        """The names whose values occur in ``data``."""
        names: set[str] = set()
        rest = self._literal(data, names)
        return sorted(names | {self._name(m) for m in self._matches(rest)})

    def bytes(self, data: bytes) -> bytes:
        data = self._literal(data, set())
        pieces: list[bytes] = []
        pos = 0
        for m in self._matches(data):
            pieces += [data[pos : m.start()], self._mark(m)]
            pos = m.end()
        return data if not pieces else b"".join([*pieces, data[pos:]])

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        raw = text.encode("utf-8", "surrogatepass")
        out = self.bytes(raw)
        return text if out == raw else out.decode("utf-8", "replace")

    def value(self, data: Any) -> Any:
        """A JSON value with every string in it (keys too) redacted."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, list):
            return [self.value(x) for x in data]
        if isinstance(data, dict):
            return {self.text(str(k)): self.value(v) for k, v in data.items()}
        return data

    def stream(
        self, f: BinaryIO, out: BinaryIO | None, limit: int | None = None, first: bool = False
    ) -> list[str]:
        """Read ``f`` in chunks (at most ``limit`` bytes), writing it redacted to ``out``
        when given; the names found (``first``: stop reading at the first, without ``out``)."""
        found: set[str] = set()
        if self._pattern is None:
            return []
        keep = self.longest - 1
        tail = b""
        left = limit
        while True:
            size = CHUNK if left is None else min(CHUNK, left)
            chunk = f.read(size) if size > 0 else b""
            if left is not None:
                left -= len(chunk)
            data = self._literal(tail + chunk, found)
            last = not chunk
            cut = len(data) if last else max(len(data) - keep, 0)
            pieces: list[bytes] = []
            pos = 0
            for m in self._matches(data, cut):
                found.add(self._name(m))
                pieces += [data[pos : m.start()], self._mark(m)]
                pos = m.end()
            emit_to = max(cut, pos)
            pieces.append(data[pos:emit_to])
            if out is not None:
                out.write(b"".join(pieces))
            tail = data[emit_to:]
            if last or (first and found and out is None):
                return sorted(found)

    def scan(self, root: Path, rel: str, limit: int | None = None) -> list[str]:
        """The names whose values occur in the file ``root/rel`` (reached without following a
        link; a regular file), read until the first chunk that holds one (at most ``limit``
        bytes): those of that chunk."""
        with safefs.open_under(root, rel) as f:
            return self.stream(f, None, limit, first=True)

    def files(self, root: Path, rels: Sequence[str]) -> list[str]:
        """Redact the files ``root/rel`` in place (each reached without following a link, a
        regular file; rewritten beside itself, then renamed, only when a value occurs in it);
        the files changed. A file that cannot be read is left as it is."""
        if self._pattern is None:
            return []
        changed = []
        for rel in rels:
            with contextlib.suppress(safefs.UnsafePath, OSError):
                if self._file(root, rel):
                    changed.append(rel)
        return changed

    def _file(self, root: Path, rel: str) -> bool:
        if not self.scan(root, rel):
            return False
        with safefs.parent_fd(root, rel) as (parent, name):
            src_fd = safefs.open_at(parent, name, rel)
            tmp = f".{name}.redact.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            try:
                with os.fdopen(src_fd, "rb") as src:
                    st = os.fstat(src.fileno())
                    with os.fdopen(os.open(tmp, flags, 0o600, dir_fd=parent), "wb") as dst:
                        self.stream(src, dst)
                        os.fchmod(dst.fileno(), st.st_mode & 0o777)
                        with contextlib.suppress(PermissionError):
                            os.fchown(dst.fileno(), st.st_uid, st.st_gid)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=parent)
        return True

    def proxy_rules(self) -> dict[str, Any] | None:
        """What the egress proxy gets to blank its log lines with (the ``redact`` of its
        rules): a random salt and, per secret, the salted SHA-256 digests of the value and of
        its encoded forms, each as it is and lower-cased (the proxy matches the lower-cased
        field too, so in any case) and less its first two characters, with their lengths;
        never a value. None without secrets."""
        if self._pattern is None:
            return None
        salt = _random.token_hex(16)
        entries = []
        for name in self.names:
            value = self._values[name]
            forms = {f for form in (value, *encoded_forms(value)) for f in (form, form.lower())}
            # Each less its first two characters, which a percent-decoding eats when a stray
            # "%" stands before it (form[1:], when it eats one, holds that): the proxy matches
            # every slice of a field, so a field holding the whole form is found by it too.
            # A short form whole: its slice would match ordinary text.
            forms = {f[2:] if len(f) > 12 else f for f in forms}
            entries.append(
                {
                    "name": name,
                    "forms": sorted(
                        {(len(f), hashlib.sha256(salt.encode() + f).hexdigest()) for f in forms}
                    ),
                }
            )
        return {"salt": salt, "secrets": entries}


def _salted(salt: str, value: bytes) -> str:
    return hashlib.sha256(salt.encode() + value).hexdigest()


NONE = Redactor({})
"""A redactor with nothing to redact."""


_QUOTING: contextvars.ContextVar[Redactor] = contextvars.ContextVar("quoting", default=NONE)
NOT_SHOWN = "[not shown: the agent's secrets cannot be checked]"
"""What :func:`quote` gives for job-written text while a blind step is active."""


@contextlib.contextmanager
def quoting(redact: Redactor) -> Iterator[None]:
    """While in it, :func:`quote` redacts what it quotes with ``redact``."""
    token = _QUOTING.set(redact)
    try:
        yield
    finally:
        _QUOTING.reset(token)


def quote(text: str, limit: int, more: str = "...", *, piece: bool = False) -> str:
    """``text`` (written by a job, or holding what it wrote) as a message may quote it: redacted
    whole by the step :func:`quoting` made active, then cut to ``limit`` characters (``more``
    ending a cut one). A blind step shows none of it (:data:`NOT_SHOWN`). ``piece``: ``text``
    is already a piece that something else cut (a secret in it may be cut too, which no
    redaction finds), so while a step with secrets is active it is not quoted ("")."""
    redact = _QUOTING.get()
    if redact.blind is not None:
        return NOT_SHOWN
    if piece and redact:
        return ""
    text = redact.text(text)
    return text if len(text) <= limit else text[: max(0, limit - len(more))] + more
