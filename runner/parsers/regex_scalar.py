"""``regex.scalar`` version 1: a value captured by a regular expression in a text log.

``pattern`` is a Python regular expression (``re``), applied to each line on its own (without
its line end; ``^`` and ``$`` are the line's start and end). Lines end at ``\\n``, ``\\r\\n`` or
a lone ``\\r`` (a progress bar redrawn with ``\\r`` is many lines), and are read one at a time,
up to 1 MiB each, as UTF-8. Every non-overlapping match on every line counts, in file order;
``occurrence`` picks the ``last`` (default), the ``first`` (reading stops there), or the
``only`` one (the file must match exactly once). ``group`` (default 1; 0 is the whole match; or
a group name) is the text taken, then read as ``type``.

A pattern that does not compile, or a group it does not have, is refused when the contract is
checked, before anything runs.

Matching runs within the CPU time its caller allows (:class:`runner.evidence.read.ParseBudget`,
through :func:`runner.core.cpulimit.cpu_limit`): a pattern that backtracks (``(\\d+)\\.(\\d+)``
over a long run of digits takes time that grows with the square of the run) would otherwise
let a job's log hold the runner for hours. When the time runs out the parse fails, naming the
line it was on and how to write the pattern instead.

Which lines are matched is decided per 1 MiB chunk first, where that is exact and cheap: a chunk
without the pattern's required literal is skipped; one that the pattern cannot match anywhere
(searched as one text) too, unless the pattern can match a line end (``\\s``, ``\\D``,
``[^x]`` ...), where a search of the chunk could backtrack across its lines (``^\\s*step`` over
100,000 blank lines took 10 s as one text, 0.04 s line by line).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.core import cpulimit
from runner.core.cpulimit import OverCpu
from runner.core.errors import EvidenceParseError
from runner.parsers._lines import iter_line_batches, line_numbers
from runner.parsers._values import from_text, show, type_schema
from runner.parsers.registry import ConfigError

__all__ = ["MAX_PATTERN", "RegexScalar", "required_literal"]

MAX_PATTERN = 4096
"""The longest pattern a contract may give (compiling costs up to 0.6 ms a character)."""

_BACKTRACKS = (
    "make the pattern unambiguous: anchor it with ^ or begin it with fixed text "
    "(`accuracy: (\\S+)`, not `(\\S+) accuracy`), and let no repeat match what the next one "
    "may (`(\\d+)\\.(\\d+)` tries every split of a long run of digits)"
)


def compile_config(config: dict[str, Any]) -> tuple[re.Pattern[str], int | str]:
    """The compiled pattern and the group, or ConfigError naming the field that is wrong."""
    try:
        pattern = re.compile(config["pattern"])
    except (re.error, OverflowError) as exc:  # OverflowError: a repeat count past 4294967295
        raise ConfigError(
            "pattern", f"{config['pattern']!r} is not a valid Python regular expression: {exc}"
        ) from exc
    except RecursionError:  # re's parser recurses into each group: about 490 deep
        raise ConfigError(
            "pattern",
            f"{show(config['pattern'], 120)} nests groups deeper than Python's regular "
            "expression parser can read; nest fewer groups",
        ) from None
    group: int | str = config.get("group", 1)
    if isinstance(group, int):
        if group > pattern.groups:
            raise ConfigError(
                "group",
                f"group {group} does not exist: {config['pattern']!r} has "
                f"{pattern.groups} capturing group{'s' if pattern.groups != 1 else ''}",
            )
    elif group not in pattern.groupindex:
        names = ", ".join(pattern.groupindex) or "none"
        raise ConfigError(
            "group", f"group {group!r} is not named in {config['pattern']!r} (names: {names})"
        )
    return pattern, group


_CONTEXT_SENSITIVE = ("(?<", "(?=", "(?!", "\\A", "\\Z", "\\z", "(?s")


def _prefilter(pattern: re.Pattern[str]) -> Callable[[str], bool] | None:
    """A C-speed "could any line here match?" test over a whole chunk, or None when the
    pattern looks beyond its line (lookarounds, \\A, \\Z, DOTALL) and only per-line matching
    is exact. Every per-line match is also a match in the chunk (with ^ and $ at line ends),
    so a chunk without one is skipped safely; a chunk with one is matched line by line."""
    if (
        pattern.flags & re.DOTALL
        or any(s in pattern.pattern for s in _CONTEXT_SENSITIVE)
        or _may_match_a_line_end(pattern)
    ):
        return None
    chunk = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
    return lambda text: chunk.search(text) is not None


def _may_match_a_line_end(pattern: re.Pattern[str]) -> bool:
    """Whether some part of ``pattern`` can match ``\\n`` (``\\s``, ``\\D``, ``\\W``,
    ``[^x]``, a range or literal holding it, ``.`` under ``(?s:``) or holds a ``(?-m:``
    group, read from CPython's parse of it; True when that cannot be told. Line by line no
    match holds a line end, but a search of a whole chunk lets such a part run on across
    lines, and backtrack over all of them."""
    try:
        parser: Any = importlib.import_module("re._parser")
        c: Any = importlib.import_module("re._constants")
        tree = parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - an internal parser that changed: no shortcut
        return True
    ten = ord("\n")
    crossing = {
        c.CATEGORY_SPACE, c.CATEGORY_UNI_SPACE, c.CATEGORY_NOT_DIGIT, c.CATEGORY_UNI_NOT_DIGIT,
        c.CATEGORY_NOT_WORD, c.CATEGORY_UNI_NOT_WORD, c.CATEGORY_LOC_NOT_WORD,
        c.CATEGORY_LINEBREAK, c.CATEGORY_UNI_LINEBREAK,
    }  # fmt: skip

    def in_set(items: Any) -> bool:
        negated = held = False
        for op, arg in items:
            if op is c.NEGATE:
                negated = True
            elif op is c.LITERAL:
                held = held or arg == ten
            elif op in (c.RANGE, c.RANGE_UNI_IGNORE):
                held = held or arg[0] <= ten <= arg[1]
            elif op is c.CATEGORY:
                held = held or arg in crossing
            else:
                return True
        return held != negated

    def may(items: Any, dotall: bool) -> bool:
        for op, arg in items:
            if op is c.LITERAL:
                found = arg == ten
            elif op is c.NOT_LITERAL:
                found = arg != ten
            elif op is c.ANY:
                found = dotall
            elif op is c.IN:
                found = in_set(arg)
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                found = may(arg[2], dotall)
            elif op is c.SUBPATTERN:
                _, on, off, inner = arg
                # (?-m:...) turns off what the chunk's search turns on: ^ and $ would be the
                # chunk's ends there, not its lines'.
                found = bool(off & re.MULTILINE) or may(
                    inner, bool((dotall or on & re.DOTALL) and not off & re.DOTALL)
                )
            elif op is c.BRANCH:
                found = any(may(branch, dotall) for branch in arg[1])
            elif op is c.ATOMIC_GROUP:
                found = may(arg, dotall)
            elif op is c.GROUPREF_EXISTS:
                found = may(arg[1], dotall) or (arg[2] is not None and may(arg[2], dotall))
            elif op in (c.AT, c.GROUPREF):  # a reference matches what its group did
                found = False
            else:
                found = True  # not known here: no shortcut
            if found:
                return True
        return False

    try:
        return may(tree, bool(pattern.flags & re.DOTALL))
    except RecursionError:  # nested deeper than this walk goes: no shortcut
        return True


def required_literal(pattern: re.Pattern[str]) -> bytes | None:
    """The longest run of plain characters that every match contains, as UTF-8; or None.

    Read from CPython's own parse of the pattern (``re._parser``, the tree its engine
    compiles), at the top level only, where each literal is a required part of any match;
    literals inside groups, alternatives or repeats may be absent. None under IGNORECASE (the
    text's case may differ), for runs shorter than 3 characters (too common to skip anything),
    or when the parser is unavailable. A chunk of the log without these bytes has no match."""
    if pattern.flags & re.IGNORECASE:
        return None
    try:
        parser: Any = importlib.import_module("re._parser")
        literal_op: Any = importlib.import_module("re._constants").LITERAL
        tree = parser.parse(pattern.pattern, pattern.flags)
        runs, run = [], ""
        for op, arg in tree:
            if op == literal_op:
                run += chr(arg)
            else:
                runs.append(run)
                run = ""
        runs.append(run)
    except Exception:  # noqa: BLE001 - an internal parser that changed: no shortcut, same result
        return None
    best = max(runs, key=len)
    return best.encode() if len(best) >= 3 else None


class RegexScalar:
    id = "regex.scalar"
    version = "1"
    description = (
        "A value captured by a Python regular expression, matched line by line in a text log "
        "(first, last or only match)."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["pattern"],
        "properties": {
            "pattern": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_PATTERN,
                "format": "regex",
                "description": "A Python `re` regular expression, matched against each line "
                "separately (no line end; ^ and $ are the line's ends). Checked when the "
                f"contract is loaded. At most {MAX_PATTERN} characters. A pattern that "
                "backtracks until the CPU time for parsing the job's evidence is spent fails "
                "the parse, naming the line.",
            },
            "group": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "minLength": 1},
                ],
                "default": 1,
                "description": "The capturing group whose text is the value: a number (0 is "
                "the whole match) or a name from (?P<name>...). Default 1.",
            },
            "occurrence": {
                "enum": ["first", "last", "only"],
                "default": "last",
                "description": "Which match, counting every non-overlapping match on every "
                "line in file order: `first`, `last` (default), or `only` (the file must "
                "match exactly once).",
            },
            "type": type_schema("number", source="text"),
        },
    }

    def check_config(self, config: dict[str, Any]) -> None:
        """Refuse a pattern that does not compile or a group it lacks, before the job runs."""
        compile_config(config)

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        name = evidence.name
        try:
            pattern, group = compile_config(config)
        except ConfigError as exc:
            raise EvidenceParseError(f"{name}: config {exc.field}: {exc}") from exc
        occurrence: str = config.get("occurrence", "last")
        # Line numbers are lazy (see iter_line_batches): (number yielded, skips before it).
        chosen: tuple[tuple[int, int], str | None] | None = None  # (line mark, group text)
        count = 0
        marks: list[tuple[int, int]] = []  # the first few lines that matched, for messages
        search = pattern.search
        skipped: list[tuple[int, int]] = []
        batches = iter_line_batches(
            evidence,
            universal=True,
            prefilter=_prefilter(pattern),
            required=required_literal(pattern),
            skipped=skipped,
        )
        lineno = 0  # the line being matched; 0 while the next chunk is read and prefiltered
        done = (0, 0)  # the last line of the batches matched so far, as a mark
        try:
            for first, batch in batches:
                for lineno, line in enumerate(batch, first):
                    if search(line) is None:  # the common case, and cheaper than finditer
                        continue
                    for m in pattern.finditer(line):
                        count += 1
                        if len(marks) < 3:
                            marks.append((lineno, len(skipped)))
                        if occurrence == "last" or count == 1:
                            chosen = ((lineno, len(skipped)), m.group(group))
                    if occurrence == "first":
                        break
                if occurrence == "first" and chosen is not None:
                    break
                done, lineno = (first + len(batch) - 1, len(skipped)), 0
        except OverCpu as exc:  # the caller's bound on this parse (ParseBudget)
            cpulimit.caught()  # the next one would cut the line's number short
            if lineno:
                (stop,) = line_numbers(evidence, True, skipped, [(lineno, len(skipped))])
                place = f"line {stop}"
            else:
                (stop,) = line_numbers(evidence, True, skipped, [done])
                place = f"the lines after line {stop}" if done[0] else "its first lines"
            raise EvidenceParseError(
                f"{name}: matching pattern {pattern.pattern!r} was stopped in {place} after "
                f"{exc.seconds:.1f} s of CPU time, all the time this parse had",
                hint=_BACKTRACKS,
            ) from None
        looked = f"pattern {pattern.pattern!r}"
        if chosen is None:
            raise EvidenceParseError(f"{name}: looked for {looked}, found no match")
        if occurrence == "only" and count != 1:
            lines = line_numbers(evidence, True, skipped, marks)
            at = ", ".join(map(str, lines)) + (", ..." if count > 3 else "")
            raise EvidenceParseError(
                f"{name}: looked for exactly one match of {looked}, found {count} (lines {at})"
            )
        mark, text = chosen

        def where() -> str:
            (lineno,) = line_numbers(evidence, True, skipped, [mark])
            return f"{name} line {lineno}: group {group!r} of {looked}"

        if text is None:
            raise EvidenceParseError(f"{where()}: the group took no part in the match")
        return from_text(text, config.get("type", "number"), where)
