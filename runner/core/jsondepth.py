"""How deeply JSON text nests, found without recursion, before anything parses it.

Python's ``json`` recurses once per level and raises ``RecursionError`` near 1000 levels; what
then walks the parsed value (pydantic, the JSON Schema validator, RFC 8785 canonicalization,
``json.dumps``) recurses too, some of it several frames a level, and fails far earlier (a
parser config 300 levels deep stopped the schema validator). :func:`too_deep` checks the text
without recursion (at C speed, and token by token only when that check fails) and names the
JSON path of the first array or object nested deeper than the cap, so that a reader refuses
such a document, naming where, before any of those run;
:func:`loads` is ``json.loads`` behind that check, for every reader of JSON that a contract
author, a job or a bundle's sender wrote.
"""

from __future__ import annotations

import json
import operator
import re
from itertools import accumulate, count
from typing import Any

__all__ = ["CONTRACT_DEPTH", "MAX_DEPTH", "TooDeep", "loads", "too_deep"]

CONTRACT_DEPTH = 64
"""How deeply a contract or a host policy may nest arrays and objects, the outermost counted
as 1: far more than any needs (a parser config included), far under any recursion limit."""

MAX_DEPTH = 2 * CONTRACT_DEPTH
"""How deeply any other JSON the runner reads may nest (a bundle's metadata, a signed result,
an input listing): the runner's own documents hold a contract's values a few levels down,
and this is still far under any recursion limit."""

_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{},:]', re.DOTALL)
"""A whole string (its brackets are not structure), a quote that opens no complete string
(the text is not JSON: the scan stops there), or one structural character."""

_QUOTED = re.compile(r'"[^"]*"')
_WEIGHT = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_PASSES = 4
_OPEN, _CLOSE = frozenset("[{"), frozenset("]}")
_KEY_SHOWN = 40


def _key(token: str) -> str:
    """An object key, decoded, as a path step (clipped: a key may be hostile and long)."""
    try:
        key = str(json.loads(token))
    except ValueError:
        key = token[1:-1]
    if len(key) > _KEY_SHOWN:
        key = key[: _KEY_SHOWN - 3] + "..."
    simple = key.replace("_", "a").replace("-", "a").isalnum() and key.isascii()
    return f".{key}" if simple else f"[{json.dumps(key)}]"


def _shown(steps: list[str]) -> str:
    """The path of ``steps``, its middle cut out when long (``...(40 levels)...``)."""
    if len(steps) <= 16:
        return "$" + "".join(steps)
    cut = len(steps) - 12
    return "$" + "".join(steps[:8]) + f"...({cut} levels)..." + "".join(steps[-4:])


def _within(text: str, cap: int) -> bool:
    """Whether ``text`` surely nests at most ``cap`` deep, decided at C speed: escapes and
    strings out, then only brackets, weighed 2 (opening) and 0 (closing), innermost empty
    pairs removed a few times (each time one level less); after ``i`` of those left the depth
    is their running sum less ``i``, plus the levels removed. False: deeper somewhere, or
    closed more than opened before that (not JSON); the token scan then tells which, where."""
    bare = text.replace("\\\\", "").replace('\\"', "")  # no quote left is escaped
    bare = _QUOTED.sub("", bare)
    quote = bare.find('"')
    if quote >= 0:  # a string that never ends: json.loads reads no structure past it
        bare = bare[:quote]
    weights = bare.encode("utf-8", "replace").translate(_WEIGHT, _NOT_BRACKET)
    removed = 0  # each pass takes one level off the deepest spot
    while removed < _PASSES:  # empty pairs out first: wide, flat documents go at once
        fewer = weights.replace(b"\x02\x00", b"")
        if fewer == weights:
            break
        weights, removed = fewer, removed + 1
    if not weights:
        return removed <= cap
    deepest: int = max(map(operator.sub, accumulate(weights), count(1)))
    return deepest + removed <= cap


def too_deep(text: str | bytes, cap: int = MAX_DEPTH) -> str | None:
    """The JSON path (``$.a[0].b``) of the first array or object in ``text`` that sits more
    than ``cap`` levels deep, or None when none does. Text that is not JSON is scanned as far
    as it goes; the parser that follows says what is wrong with it."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if text.count("[") + text.count("{") <= cap or _within(text, cap):
        return None
    steps: list[str] = []
    """One step a level: the key or index the scan is at inside each open container."""
    kinds: list[str] = []
    index: list[int] = []
    want_key = False
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if tok in _OPEN:
            if len(kinds) >= cap:
                return _shown(steps)
            kinds.append(tok)
            index.append(0)
            steps.append("" if tok == "{" else "[0]")
            want_key = tok == "{"
        elif tok in _CLOSE:
            if not kinds:
                return None  # unbalanced: not JSON
            kinds.pop()
            index.pop()
            steps.pop()
            want_key = False
        elif tok == ",":
            if not kinds:
                return None
            index[-1] += 1
            if kinds[-1] == "[":
                steps[-1] = f"[{index[-1]}]"
            else:
                want_key = True
        elif tok == ":":
            want_key = False
        elif tok == '"':
            return None  # a string that never ends: not JSON
        elif want_key and kinds and kinds[-1] == "{":
            steps[-1] = _key(tok)
    return None


class TooDeep(ValueError):
    """JSON nested deeper than the cap; ``path`` is the first spot too deep."""

    def __init__(self, path: str, cap: int) -> None:
        super().__init__(f"arrays and objects nest more than {cap} levels deep at {path}")
        self.path = path
        self.cap = cap


def loads(text: str | bytes, cap: int = MAX_DEPTH, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``, refusing text nested more than ``cap`` levels deep
    (:class:`TooDeep`, a ValueError, as every other refusal of ``json.loads`` is)."""
    where = too_deep(text, cap)
    if where is not None:
        raise TooDeep(where, cap)
    return json.loads(text, **kwargs)
