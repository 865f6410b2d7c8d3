"""JSON Pointers (RFC 6901), over parsed values and over a streamed document.

:func:`find_in_stream` walks the events of ``ijson`` (its C backend, ``yajl2_c``) and keeps
only the path from the root to the current value: subtrees off the pointer's path are skipped
without being built, so memory stays bounded by the pointer's depth and the largest single
token (one string or number), whatever the document's size. The whole document is always read,
so a file that is not exactly one well-formed JSON document is refused even when the value was
found early.

Single tokens are capped at :data:`MAX_TOKEN_BYTES` (1 MiB): a string (its bytes between the
quotes, escapes as written) or a number or literal longer than that is refused. yajl re-lexes a
token from its start each time it spans another read, so one long token costs time quadratic in
its length (a 2 GiB string took over ten minutes). An integer part of more than 4300 digits is
refused too: ijson converts integers with ``int``, which refuses them, and ijson 3.x then hands
on a NULL value (a SystemError at best, a crash at worst). :class:`TokenGuard` sits between the
file and ijson, scans each chunk before yajl sees it, and refuses as soon as a token passes
either limit: yajl never holds more of one token than the cap. Anything else ijson or yajl
raises on a hostile document (a malformed one, an exponent ``Decimal`` cannot hold) becomes an
:class:`~runner.core.errors.EvidenceParseError` naming the file; MemoryError is not caught.

A key given twice is tolerated where it does not matter, and refused where it does: on the way
to a pointer's target (``{"a": 1, "a": 2}`` with pointer ``/a``) there is no single answer, and
a parser does not guess which one was meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from runner.core import safefs
from runner.core.errors import EvidenceParseError
from runner.core.redaction import quote
from runner.parsers._json_guard import MAX_TOKEN_BYTES, TokenGuard

__all__ = ["MAX_TOKEN_BYTES", "TokenGuard"]  # with the names defined below

POINTER_SCHEMA: dict[str, Any] = {
    "type": "string",
    # RFC 6901: '~' only as '~0' or '~1' ('/a~2' and '/a~' are not pointers).
    "pattern": "^(/([^/~]|~[01])*)*$",
    "description": (
        "An RFC 6901 JSON Pointer: '' is the whole document, '/a/b~1c/0' is key 'a', then key "
        "'b/c' (~1 is '/', ~0 is '~'), then array element 0 (no leading zeros)."
    ),
}

_BOM = b"\xef\xbb\xbf"
_READ_BYTES = 64 * 1024
"""What ijson is handed at a time: its events for one buffer are held at once (a buffer of
brackets is 64k events), and smaller buffers measured faster here than 1 MiB ones."""


class DuplicateKey(Exception):
    """A key on the way to a pointer's target is given twice in one object."""

    def __init__(self, key: str, parent: str) -> None:
        where = f"the object at {parent!r}" if parent else "the root object"
        super().__init__(f"key {key!r} is given twice in {where}")
        self.key = key
        self.parent = parent


def split_pointer(pointer: str) -> tuple[str, ...]:
    """The unescaped reference tokens of an RFC 6901 pointer (``""`` -> ``()``)."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"a JSON Pointer is empty or starts with '/': {pointer!r}")
    tokens = pointer[1:].split("/")
    for t in tokens:
        if "~" in t.replace("~0", "").replace("~1", ""):
            raise ValueError(
                f"{pointer!r} is not an RFC 6901 JSON Pointer: '~' must be written '~0', "
                "and '/' inside a key '~1'"
            )
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


def join_pointer(tokens: Iterable[str | int]) -> str:
    """The RFC 6901 pointer for ``tokens``."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def _array_index(token: str) -> int | None:
    """The array index ``token`` names, or None (``-``, leading zeros, non-digits)."""
    if not (token.isdigit() and token.isascii()):
        return None
    return int(token) if len(token) == 1 or not token.startswith("0") else None


class JsonObject(dict[str, Any]):
    """A parsed JSON object that remembers which keys were given more than once."""

    duplicates: frozenset[str] = frozenset()


def object_pairs(pairs: list[tuple[str, Any]]) -> JsonObject:
    """``object_pairs_hook`` for :func:`json.loads`: the last value wins, duplicates are noted."""
    obj = JsonObject(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice: set[str] = set()
        for key, _ in pairs:
            (twice if key in seen else seen).add(key)
        obj.duplicates = frozenset(twice)
    return obj


def resolve_pointer(document: Any, pointer: str | Sequence[str]) -> Any:
    """Resolve an RFC 6901 JSON Pointer in a parsed document; or its tokens, already split
    (:func:`split_pointer`: once for a pointer resolved in every record of a log).

    KeyError/IndexError/TypeError when the target does not exist; :class:`DuplicateKey` when
    an object on the way (parsed with :func:`object_pairs`) has the next key twice.
    """
    node = document
    done: list[str] = []
    for key in split_pointer(pointer) if isinstance(pointer, str) else pointer:
        if isinstance(node, list):
            index = _array_index(key)
            if index is None:
                raise KeyError(key)
            node = node[index]
        elif isinstance(node, dict):
            if key in getattr(node, "duplicates", ()):
                raise DuplicateKey(key, join_pointer(done))
            node = node[key]
        else:
            raise TypeError(f"cannot descend into {type(node).__name__} with {key!r}")
        done.append(key)
    return node


@dataclass(frozen=True)
class Container:
    """What a pointer found when its target is an object or an array (never built)."""

    kind: str  # "an object" | "an array"


_KINDS = {
    "start_map": "an object",
    "start_array": "an array",
    "null": "null",
    "boolean": "a boolean",
    "string": "a string",
    "number": "a number",
    "integer": "a number",
    "double": "a number",
}


@dataclass
class Found:
    """The outcome of one pointer: its value, or how far along its path the document went."""

    pointer: str
    exists: bool = False
    value: Any = None
    reached_depth: int = -1  # how many of the pointer's tokens exist (-1: not even the root)
    reached_kind: str = ""  # what is at that prefix

    def missing(self, name: str) -> str:
        """Why the pointer does not exist in the file ``name``, for an error message."""
        tokens = split_pointer(self.pointer)
        if self.reached_depth < 0:
            return f"pointer {self.pointer!r} does not exist in {name}"
        reached = join_pointer(tokens[: self.reached_depth])
        where = "the document" if reached == "" else repr(reached)
        nxt = tokens[self.reached_depth]
        if self.reached_kind == "an object":
            why = f"{where} is an object without key {nxt!r}"
        elif self.reached_kind == "an array":
            why = f"{where} is an array without element {nxt!r}"
        else:
            why = f"{where} is {self.reached_kind}, which has no {nxt!r}"
        return f"pointer {self.pointer!r} does not exist in {name}: {why}"


class _Target:
    def __init__(self, pointer: str) -> None:
        self.tokens = split_pointer(pointer)
        self.indices = tuple(_array_index(t) for t in self.tokens)
        self.found = Found(pointer)
        self.upto: list[bool] = []
        """For each open container: whether the steps taken down to it and within it (its
        current key or index) are this pointer's first steps. Kept as the steps change, one
        step at a time: comparing every step again at every value made a deep pointer cost
        its depth for each value read (a pointer 990 deep: 17 s a MiB)."""

    def step(self, at: int, key: Any, in_array: bool) -> None:
        """The step at depth ``at`` (the innermost) is now ``key``."""
        fits = at < len(self.tokens) and (at == 0 or self.upto[at - 1])
        if fits:
            fits = key == (self.indices[at] if in_array else self.tokens[at])
        self.upto[at] = fits

    def matches(self, depth: int) -> bool:
        """Whether the first ``depth`` steps taken are the first steps of this pointer."""
        return depth == 0 or self.upto[depth - 1]


def _detail(exc: BaseException) -> str:
    """The first line of an ijson error (yajl sometimes reports it as bytes), and the window of
    the text that yajl quotes around the error: a piece yajl cut, so not while an agent's
    secrets are redacted (:func:`runner.core.redaction.quote`)."""
    raw = exc.args[0] if exc.args else ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines:
        return type(exc).__name__
    if len(lines) > 1 and lines[1] and "right here" not in lines[1]:
        near = quote(lines[1], 60, "", piece=True)
        return f"{lines[0]} near: {near}" if near else lines[0]
    return lines[0]


def _unreadable(exc: BaseException) -> str:
    """Why ijson failed on a value, from an exception outside its JSONError family.

    A MemoryError behind it (ijson may wrap one in SystemError) is raised again, not hidden.
    """
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, MemoryError):
            raise cause
        text = str(cause)
        if "integer string conversion" in text:
            return "an integer has more digits than Python converts (4300)"
        if isinstance(cause, ArithmeticError):
            return "a number's exponent is out of the range a decimal can hold"
        if isinstance(cause, RecursionError):
            return "it is nested too deeply"
        if not isinstance(cause, SystemError):
            return f"{type(cause).__name__}: {_detail(cause)}"
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {_detail(exc)}"


def open_json(path: Path) -> BinaryIO:
    """``path`` opened for ijson, past a UTF-8 byte order mark if there is one.

    Only a regular file is opened (no link, FIFO or device:
    :func:`runner.core.safefs.open_regular`);
    anything else is an EvidenceParseError saying what it is.
    """
    try:
        fh = safefs.open_regular(path)
    except safefs.UnsafePath as exc:
        raise EvidenceParseError(f"{path.name} {exc.problem}") from exc
    if fh.read(len(_BOM)) != _BOM:
        fh.seek(0)
    return fh


MAX_DEPTH = 1000
"""Objects and arrays nested deeper than this are refused (a pointer is never that deep; a
document that is holds nothing a measurement needs, and would make yajl keep one byte per
level)."""


def _too_deep(name: str) -> EvidenceParseError:
    return EvidenceParseError(
        f"{name} nests objects and arrays more than {MAX_DEPTH} deep; the parsers read "
        "documents up to that depth"
    )


def find_in_stream(path: Path, pointers: Sequence[str]) -> list[Found]:
    """Stream the JSON document in ``path`` once and find each of ``pointers`` in it.

    A target that is an object or an array comes back as :class:`Container`, never built.
    Numbers with a fraction or exponent come back as ``Decimal`` (exact), integers as ``int``.
    Raises EvidenceParseError when the file is not a regular file or not one well-formed JSON
    document, when a token is longer than :data:`MAX_TOKEN_BYTES` or an integer has more digits
    than Python converts (:class:`TokenGuard`), or when a key on the way to a target is given
    twice. MemoryError is not caught.
    """
    import ijson  # type: ignore[import-untyped]  # ~15 ms: only when a document is read

    name = path.name
    targets = [_Target(p) for p in pointers]
    # For each open container on some target's path: the key (object) or index (array) at.
    steps: list[Any] = []
    is_array: list[bool] = []
    seen: set[tuple[Any, ...]] = set()
    skip = 0  # nesting depth inside a subtree that holds no target
    guard: TokenGuard | None = None
    try:
        with open_json(path) as fh:
            guard = TokenGuard(fh, name, offset=fh.tell())
            for event, value in ijson.basic_parse(guard, buf_size=_READ_BYTES):
                if skip:
                    if event == "start_map" or event == "start_array":
                        skip += 1
                        if skip + len(steps) > MAX_DEPTH:
                            raise _too_deep(name)
                    elif event == "end_map" or event == "end_array":
                        skip -= 1
                    continue
                if event == "map_key":
                    steps[-1] = value
                    for t in targets:
                        t.step(len(steps) - 1, value, False)
                    continue
                if event == "end_map" or event == "end_array":
                    steps.pop()
                    is_array.pop()
                    for t in targets:
                        t.upto.pop()
                    continue
                # A value starts here: a scalar, an object or an array.
                if steps and is_array[-1]:
                    steps[-1] += 1
                    for t in targets:
                        t.step(len(steps) - 1, steps[-1], True)
                depth = len(steps)
                descend = on_path = False
                for t in targets:
                    if len(t.tokens) < depth or not t.matches(depth):
                        continue
                    on_path = True
                    if len(t.tokens) == depth:
                        t.found.exists = True
                        t.found.value = (
                            Container(_KINDS[event])
                            if event == "start_map" or event == "start_array"
                            else value
                        )
                    else:
                        descend = True
                        t.found.reached_depth = depth
                        t.found.reached_kind = _KINDS[event]
                if on_path:
                    where = tuple(steps)
                    if where in seen:
                        raise DuplicateKey(str(steps[-1]), join_pointer(steps[:-1]))
                    seen.add(where)
                if event == "start_map" or event == "start_array":
                    if descend:
                        if len(steps) >= MAX_DEPTH:
                            raise _too_deep(name)
                        steps.append(-1 if event == "start_array" else None)
                        is_array.append(event == "start_array")
                        for t in targets:
                            t.upto.append(False)  # no key or index yet
                    else:
                        skip = 1
    except DuplicateKey as exc:
        raise EvidenceParseError(f"{name}: {exc}, so the pointer has no single answer") from exc
    except ijson.JSONError as exc:
        raise EvidenceParseError(f"{name} is not one JSON document: {_detail(exc)}") from exc
    except EvidenceParseError:
        raise
    except (SystemError, ValueError, ArithmeticError, RecursionError) as exc:
        # A refusal from the guard, or a value yajl or ijson could not convert (an integer
        # of more digits than int() takes, an exponent Decimal cannot hold); ijson sometimes
        # reports an error in its callbacks as SystemError, with the cause as its context.
        if guard is not None and guard.refusal is not None:
            raise guard.refusal from exc
        raise EvidenceParseError(f"{name} is not one JSON document: {_unreadable(exc)}") from exc
    return [t.found for t in targets]
