"""JSON Pointers (RFC 6901), over parsed values and over a streamed document.

:func:`find_in_stream` walks the events of ``ijson`` (its C backend, ``yajl2_c``) and keeps
only the path from the root to the current value: subtrees off the pointer's path are skipped
without being built, so memory stays bounded by the pointer's depth and the largest single
token (one string or number), whatever the document's size. The whole document is always read,
so a file that is not exactly one well-formed JSON document is refused even when the value was
found early.

A key given twice is tolerated where it does not matter, and refused where it does: on the way
to a pointer's target (``{"a": 1, "a": 2}`` with pointer ``/a``) there is no single answer, and
a parser does not guess which one was meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from runner.errors import EvidenceParseError

POINTER_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": "^(/.*)?$",
    "description": (
        "An RFC 6901 JSON Pointer: '' is the whole document, '/a/b~1c/0' is key 'a', then key "
        "'b/c' (~1 is '/', ~0 is '~'), then array element 0 (no leading zeros)."
    ),
}

_BOM = b"\xef\xbb\xbf"
_READ_BYTES = 1024 * 1024


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
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


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


def resolve_pointer(document: Any, pointer: str) -> Any:
    """Resolve an RFC 6901 JSON Pointer in a parsed document.

    KeyError/IndexError/TypeError when the target does not exist; :class:`DuplicateKey` when
    an object on the way (parsed with :func:`object_pairs`) has the next key twice.
    """
    node = document
    done: list[str] = []
    for key in split_pointer(pointer):
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

    def matches(self, steps: list[Any], is_array: list[bool], depth: int) -> bool:
        """Whether the first ``depth`` steps taken are the first steps of this pointer."""
        for i in range(depth):
            if is_array[i]:
                if steps[i] != self.indices[i]:
                    return False
            elif steps[i] != self.tokens[i]:
                return False
        return True


def _detail(exc: Exception) -> str:
    """The first line of an ijson error (yajl sometimes reports it as bytes)."""
    raw = exc.args[0] if exc.args else ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines:
        return type(exc).__name__
    if len(lines) > 1 and lines[1] and "right here" not in lines[1]:
        return f"{lines[0]} near: {lines[1][:60]}"
    return lines[0]


def open_json(path: Path) -> BinaryIO:
    """``path`` opened for ijson, past a UTF-8 byte order mark if there is one."""
    fh = path.open("rb")
    if fh.read(len(_BOM)) != _BOM:
        fh.seek(0)
    return fh


def find_in_stream(path: Path, pointers: Sequence[str]) -> list[Found]:
    """Stream the JSON document in ``path`` once and find each of ``pointers`` in it.

    A target that is an object or an array comes back as :class:`Container`, never built.
    Numbers with a fraction or exponent come back as ``Decimal`` (exact), integers as ``int``.
    Raises EvidenceParseError when the file is not one well-formed JSON document, or when a
    key on the way to a target is given twice.
    """
    import ijson  # type: ignore[import-untyped]  # ~15 ms: only when a document is read

    name = path.name
    targets = [_Target(p) for p in pointers]
    # For each open container on some target's path: the key (object) or index (array) at.
    steps: list[Any] = []
    is_array: list[bool] = []
    seen: set[tuple[Any, ...]] = set()
    skip = 0  # nesting depth inside a subtree that holds no target
    try:
        with open_json(path) as fh:
            for event, value in ijson.basic_parse(fh, buf_size=_READ_BYTES):
                if skip:
                    if event == "start_map" or event == "start_array":
                        skip += 1
                    elif event == "end_map" or event == "end_array":
                        skip -= 1
                    continue
                if event == "map_key":
                    steps[-1] = value
                    continue
                if event == "end_map" or event == "end_array":
                    steps.pop()
                    is_array.pop()
                    continue
                # A value starts here: a scalar, an object or an array.
                if steps and is_array[-1]:
                    steps[-1] += 1
                depth = len(steps)
                descend = on_path = False
                for t in targets:
                    if len(t.tokens) < depth or not t.matches(steps, is_array, depth):
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
                        steps.append(-1 if event == "start_array" else None)
                        is_array.append(event == "start_array")
                    else:
                        skip = 1
    except DuplicateKey as exc:
        raise EvidenceParseError(f"{name}: {exc}, so the pointer has no single answer") from exc
    except ijson.JSONError as exc:
        raise EvidenceParseError(f"{name} is not one JSON document: {_detail(exc)}") from exc
    return [t.found for t in targets]
