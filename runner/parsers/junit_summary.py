"""``junit.summary`` version 1: a test count from a JUnit XML report.

``field`` is ``tests``, ``failures``, ``errors``, ``skipped`` or ``passed`` (tests - failures -
errors - skipped). The root is ``<testsuites>`` or a bare ``<testsuite>``. The count is the sum
over the ``<testsuite>`` elements that hold no other ``<testsuite>`` (a suite of suites is a
grouping, its children are counted instead, so nothing counts twice):

- a suite's attribute (``tests="11"``) is used when present, and must be a whole number;
- when it is absent, it is counted from the suite's own ``<testcase>`` children: each one is
  a test, and an *error* if it holds ``<error>``, else a *failure* if it holds ``<failure>``,
  else *skipped* if it holds ``<skipped>`` (so a testcase counts once);
- ``<testcase>`` elements directly inside a grouping suite are counted that way too.

Every total the root ``<testsuites>`` states (``tests``, ``failures``, ``errors``,
``skipped``) must equal that sum, else the report contradicts itself and is refused. A report
without any ``<testsuite>``, or whose ``passed`` would be negative, is refused.

Safety: the file is fed in 1 MiB chunks to the standard library's expat parser directly, with
handlers only for element starts and ends: no tree is built and no text is kept, so memory does
not grow with the file (a 1 GB ``<system-out>`` costs nothing). Any ``<!DOCTYPE>`` is refused as
soon as it starts, so no entity can be declared (no "billion laughs", no external entity, no
external DTD: parameter entity parsing is off and nothing is ever fetched). Nesting deeper than
256 elements is refused. Text and CDATA of any length stream through, but expat holds a piece of
markup (a start tag with its attributes, a comment, a processing instruction) until it is
complete, and scans it again from its start on every chunk: one longer than 1 MiB is refused
as soon as expat holds more than that, so time stays linear and memory bounded. A file that is
not a regular file (a link, a FIFO, a device), an encoding declaration expat cannot use, and a
count of more digits than ``int`` converts are parse errors too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from xml.parsers import expat

from runner.core import safefs
from runner.core.errors import EvidenceParseError
from runner.core.redaction import quote

__all__ = ["JunitSummary", "summarize"]

FIELDS = ("tests", "failures", "errors", "skipped")
MAX_DEPTH = 256
MAX_TOKEN_BYTES = 1024 * 1024
_CHUNK = 1024 * 1024
_COUNT = re.compile(r"\s*[0-9]+\s*")


def _short(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message (attributes may be 1 MiB long)."""
    return quote(text, limit)


def _clip(text: str) -> str:
    return repr(_short(text))


class _Refused(Exception):
    """Raised from an expat handler; the message says why."""


class _Suite:
    def __init__(self, name: str, attrs: dict[str, int]) -> None:
        self.name = name
        self.attrs = attrs
        self.counted = dict.fromkeys(FIELDS, 0)  # from its own <testcase> children
        self.grouping = False  # holds another <testsuite>


class _Report:
    """The expat handlers and what they add up."""

    def __init__(self) -> None:
        self.elements: list[str] = []
        self.suites: list[_Suite] = []
        self.totals: dict[str, int] | None = None  # the root <testsuites> attributes
        self.sums = dict.fromkeys(FIELDS, 0)
        self.suite_count = 0
        self.outcome: set[str] | None = None  # inside a <testcase>: what it holds

    def _counts(self, attrs: dict[str, str], what: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for f in FIELDS:
            if f in attrs:
                if not _COUNT.fullmatch(attrs[f]):
                    raise _Refused(f"{what} has {f}={_clip(attrs[f])}, not a whole number")
                try:
                    found[f] = int(attrs[f])
                except ValueError:  # more digits than int() converts (4300)
                    digits = len(attrs[f].strip())
                    raise _Refused(f"{what} has a {f} count of {digits} digits") from None
        return found

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        parent = self.elements[-1] if self.elements else None
        if len(self.elements) >= MAX_DEPTH:
            raise _Refused(f"elements are nested more than {MAX_DEPTH} deep")
        self.elements.append(tag)
        if parent is None:
            if tag not in ("testsuites", "testsuite"):
                raise _Refused(
                    f"the root element is <{_short(tag)}>, not <testsuites> or <testsuite>"
                )
            if tag == "testsuites":
                self.totals = self._counts(attrs, "the root <testsuites>")
        if tag == "testsuite":
            name = attrs.get("name", "")
            what = f"<testsuite name={_clip(name)}>" if name else "a <testsuite>"
            if self.suites:
                self.suites[-1].grouping = True
            self.suites.append(_Suite(what, self._counts(attrs, what)))
        elif tag == "testcase" and parent == "testsuite":
            self.outcome = set()
        elif parent == "testcase" and self.outcome is not None:
            self.outcome.add(tag)

    def end(self, tag: str) -> None:
        self.elements.pop()
        if tag == "testcase" and self.outcome is not None and self.elements[-1] == "testsuite":
            counted = self.suites[-1].counted
            counted["tests"] += 1
            for kind, f in (("error", "errors"), ("failure", "failures"), ("skipped", "skipped")):
                if kind in self.outcome:
                    counted[f] += 1
                    break
            self.outcome = None
        elif tag == "testsuite":
            suite = self.suites.pop()
            self.suite_count += 1
            for f in FIELDS:
                if suite.grouping:
                    self.sums[f] += suite.counted[f]
                else:
                    self.sums[f] += suite.attrs.get(f, suite.counted[f])

    def refuse(self, *_: Any) -> Any:
        raise _Refused("it has a <!DOCTYPE> (refused: no DTDs, entities or external references)")


def summarize(evidence: Path) -> dict[str, int]:
    """``tests``, ``failures``, ``errors``, ``skipped``, ``passed`` of the report ``evidence``."""
    name = evidence.name
    report = _Report()
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = report.refuse
    parser.EntityDeclHandler = report.refuse
    parser.UnparsedEntityDeclHandler = report.refuse
    parser.ExternalEntityRefHandler = report.refuse
    parser.StartElementHandler = report.start
    parser.EndElementHandler = report.end
    try:
        fh = safefs.open_regular(evidence)
    except safefs.UnsafePath as exc:
        raise EvidenceParseError(f"{name} {exc.problem}") from exc
    try:
        with fh:
            fed = 0
            while chunk := fh.read(_CHUNK):
                parser.Parse(chunk, False)
                fed += len(chunk)
                # What expat holds unparsed is one unfinished piece of markup: past the cap,
                # refuse it rather than re-scan it from its start on every chunk.
                if fed - parser.CurrentByteIndex > MAX_TOKEN_BYTES:
                    raise _Refused(
                        f"one piece of markup (a tag with its attributes, a comment, a "
                        f"processing instruction) starting at byte {parser.CurrentByteIndex} "
                        f"is longer than {MAX_TOKEN_BYTES // (1024 * 1024)} MiB "
                        f"({MAX_TOKEN_BYTES} bytes), the most this parser reads"
                    )
            parser.Parse(b"", True)
    except _Refused as exc:
        raise EvidenceParseError(
            f"{name} is not a usable JUnit report: {exc} (line {parser.CurrentLineNumber})"
        ) from exc
    except expat.ExpatError as exc:
        raise EvidenceParseError(f"{name} is not well-formed XML: {exc}") from exc
    except (LookupError, ValueError) as exc:  # UnicodeError is a ValueError
        # The XML declaration names an encoding expat cannot use: unknown to Python
        # (LookupError), not a text encoding, or a multi-byte one (ValueError).
        raise EvidenceParseError(
            f"{name} declares an encoding that cannot be read: {quote(str(exc), 120, '')}"
        ) from exc
    if report.suite_count == 0:
        raise EvidenceParseError(f"{name}: looked for <testsuite> elements, found none")
    for f, total in (report.totals or {}).items():
        if total != report.sums[f]:
            raise EvidenceParseError(
                f"{name}: the root <testsuites> says {f}={total}, but its suites add up to "
                f"{report.sums[f]}; the report contradicts itself"
            )
    counts = dict(report.sums)
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    if counts["passed"] < 0:
        raise EvidenceParseError(
            f"{name}: tests={counts['tests']} is less than failures+errors+skipped="
            f"{counts['tests'] - counts['passed']}; passed would be negative"
        )
    return counts


class JunitSummary:
    id = "junit.summary"
    version = "1"
    description = (
        "A test count (tests, failures, errors, skipped or passed) summed over the suites "
        "of a JUnit XML report; streamed, DTDs refused."
    )
    config_schema: dict[str, Any] = {  # noqa: RUF012 - read-only by convention
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["field"],
        "properties": {
            "field": {
                "enum": ["tests", "failures", "errors", "skipped", "passed"],
                "description": "The count to read, summed over the innermost <testsuite> "
                "elements: their attribute, or else their <testcase> children counted; "
                "`passed` is tests - failures - errors - skipped.",
            },
        },
    }

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        return summarize(evidence)[config["field"]]
