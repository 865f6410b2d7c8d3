"""junit.summary: test counts from JUnit XML, streamed, with DTDs and entities refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.core.errors import EvidenceParseError
from runner.parsers import registry
from runner.parsers.junit_summary import summarize

FIXTURES = Path(__file__).parents[1] / "fixtures" / "parsers"
JUNIT = registry.get("junit.summary", "1")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(text)
    return path


def _case(outcome: str = "") -> str:
    return f'<testcase name="t">{outcome}</testcase>'


def test_real_pytest_report() -> None:
    """A report pytest wrote: 11 tests, 2 failures, 1 error, 3 skipped, so 5 passed."""
    path = FIXTURES / "junit-pytest.xml"
    got = {f: JUNIT.parse(path, {"field": f}) for f in ("tests", "failures", "errors", "skipped")}
    assert got == {"tests": 11, "failures": 2, "errors": 1, "skipped": 3}
    assert JUNIT.parse(path, {"field": "passed"}) == 5


def test_counts_testcases_when_attributes_are_missing(tmp_path: Path) -> None:
    """Without attributes, each <testcase> counts once: error, else failure, else skipped."""
    body = (
        _case()
        + _case()
        + _case("<failure/>")
        + _case("<error/><failure/>")
        + _case("<skipped/>")
        + _case("<system-out>lots of text</system-out>")
    )
    path = _write(tmp_path, f"<testsuite>{body}</testsuite>")
    assert summarize(path) == {"tests": 6, "failures": 1, "errors": 1, "skipped": 1, "passed": 3}


def test_sums_suites_under_testsuites_with_or_without_totals(tmp_path: Path) -> None:
    """Suites under a root <testsuites> add up, whether or not the root states totals."""
    suites = (
        '<testsuite name="a" tests="3" failures="1" errors="0" skipped="1"/>'
        '<testsuite name="b" tests="2" failures="0" errors="1" skipped="0"/>'
    )
    bare = _write(tmp_path, f"<testsuites>{suites}</testsuites>")
    assert summarize(bare) == {"tests": 5, "failures": 1, "errors": 1, "skipped": 1, "passed": 2}
    totals = _write(
        tmp_path, f'<testsuites tests="5" failures="1" errors="1">{suites}</testsuites>'
    )
    assert summarize(totals)["passed"] == 2


def test_attributes_win_and_missing_ones_are_counted(tmp_path: Path) -> None:
    """A suite's attribute is used when present; a missing one is counted from its cases."""
    path = _write(tmp_path, f'<testsuite tests="4" failures="1">{_case("<skipped/>")}</testsuite>')
    assert summarize(path) == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2}


def test_nested_suites_count_once(tmp_path: Path) -> None:
    """A suite of suites is a grouping: its children are counted, not its own totals."""
    inner = (
        f'<testsuite name="x" tests="2" failures="1">{_case()}{_case("<failure/>")}</testsuite>'
        f'<testsuite name="y">{_case()}</testsuite>'
    )
    path = _write(
        tmp_path,
        f'<testsuites tests="4"><testsuite name="outer" tests="3" failures="1">{inner}'
        f"</testsuite><testsuite>{_case()}</testsuite></testsuites>",
    )
    assert summarize(path) == {"tests": 4, "failures": 1, "errors": 0, "skipped": 0, "passed": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not well-formed XML: no element found"),
        ("<testsuite>", "not well-formed XML"),
        ("tests=5", "not well-formed XML"),
        ("<report/>", "the root element is <report>"),
        ("<testsuites></testsuites>", "looked for <testsuite> elements, found none"),
        ('<testsuite tests="five"/>', "tests='five', not a whole number"),
        ('<testsuite tests="-1"/>', "not a whole number"),
        ('<testsuite tests="1" failures="2"/>', "passed would be negative"),
        (
            '<testsuites tests="9"><testsuite tests="2"/></testsuites>',
            "the root <testsuites> says tests=9, but its suites add up to 2",
        ),
        ("<testsuite>&undefined;</testsuite>", "undefined entity"),
        ("<a>" * 300 + "</a>" * 300, "the root element is <a>"),
        ("<testsuite>" + "<x>" * 300 + "</x>" * 300 + "</testsuite>", "nested more than 256"),
    ],
)
def test_refusals(tmp_path: Path, text: str, message: str) -> None:
    """Malformed XML, the wrong root, bad counts and a self-contradicting report are refused."""
    with pytest.raises(EvidenceParseError, match=message) as info:
        JUNIT.parse(_write(tmp_path, text), {"field": "passed"})
    assert "junit.xml" in str(info.value)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
]>
<testsuite name="&lol9;" tests="1"/>
"""


@pytest.mark.parametrize(
    "text",
    [
        BILLION_LAUGHS,
        '<!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]><testsuite name="&x;"/>',
        '<!DOCTYPE testsuite SYSTEM "http://example.invalid/junit.dtd"><testsuite/>',
        "<!DOCTYPE testsuite><testsuite/>",
    ],
)
def test_refuses_every_doctype(tmp_path: Path, text: str) -> None:
    """A DOCTYPE (entity bombs, external entities, external DTDs) is refused outright."""
    with pytest.raises(EvidenceParseError, match=r"<!DOCTYPE> \(refused"):
        JUNIT.parse(_write(tmp_path, text), {"field": "tests"})
