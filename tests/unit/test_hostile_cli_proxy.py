"""Regression tests for issue 25's items 8 to 10: one meaning per key flag (``--trusted-keys``
names issuer keys on every command; result signers are ``--result-keys``) and
``runner verify-result`` re-parsing each value from its evidence; the egress proxy refusing the
header lines RFC 9112 says to refuse; ``runner cleanup`` acting on one state folder only.

The verify-result and cleanup cases use the real engine (a toy run, real egress slots); the
proxy's cases run the proxy program itself on loopback, as
tests/integration/test_egress_proxy.py does, with its fixture.

The tests that need the engine are in tests/integration/test_hostile_cli_proxy.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.egress import slots as egress
from runner.egress.proxylog import read_log
from runner.execution import sweeper
from tests.integration.test_egress_proxy import Proxy, proxy  # noqa: F401 - the proxy fixture
from tests.unit.test_egress import PLAN, _fake

# ------------------------------------------------------- 9. header lines RFC 9112 refuses


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("head", "detail"),
    [
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHost : other.test", "whitespace before"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHost\t: other.test", "whitespace before"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nContent-Length : 5", "whitespace before"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nTransfer-Encoding : chunked", "whitespace"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\r\n Host: other.test", "folding"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\r\n\tb", "folding"),
        (b"CONNECT localhost:{up} HTTP/1.1\r\nX-A: a\r\n b", "folding"),
        (b"CONNECT localhost:{up} HTTP/1.1\r\nHost : other.test", "whitespace before"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX(A): b", "no token"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHo st: other.test", "no token"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\n: b", "no field name"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A", "no field name"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\rHost: other.test", "CR, LF or NUL"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nX-A: a\nContent-Length: 9", "CR, LF or NUL"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\x00b", "CR, LF or NUL"),
    ],
)
def test_header_lines_rfc_9112_refuses_are_refused(
    proxy: Proxy,  # noqa: F811 - the fixture imported above
    head: bytes,
    detail: str,
) -> None:
    """Each used to be forwarded as it came (a second Host or a Content-Length the proxy
    never saw, for whatever reads it onward); now 400, logged, nothing sent onward."""
    got = proxy.ask(head.replace(b"{up}", str(proxy.upstream).encode()) + b"\r\n\r\n")
    assert got.split(b" ")[1] == b"400", got
    assert b"200" not in got
    [c] = read_log(proxy.log())
    assert c.decision == "refused" and c.detail.startswith("bad request: "), c
    assert detail in c.detail


@pytest.mark.hostile
@pytest.mark.parametrize(
    "line",
    [
        b"GET http://localhost:{up}/a\rb HTTP/1.1",  # a bare CR in the target
        b"GET http://localhost:{up}/ HTTP/1.1\rX-A:b",  # ... after the version
        b"G(T http://localhost:{up}/ HTTP/1.1",  # a method that is no token
        b"GET http://localhost:{up}/ HTTP/1.7",  # no HTTP/1 version there is
    ],
)
def test_a_request_line_with_a_bare_cr_or_no_token_is_refused(
    proxy: Proxy,  # noqa: F811
    line: bytes,
) -> None:
    got = proxy.ask(line.replace(b"{up}", str(proxy.upstream).encode()) + b"\r\n\r\n")
    assert got.split(b" ")[1] == b"400", got
    [c] = read_log(proxy.log())
    assert (c.decision, c.detail) == ("refused", "bad request")


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("fields", "status"),
    [
        (b"Content-Length: 3\r\nContent-Length: 4", b"400"),  # two values that differ
        (b"Content-Length: 3\r\nTransfer-Encoding: chunked", b"411"),  # both
        (b"Content-Length: +3", b"400"),  # no number
    ],
)
def test_what_the_proxy_already_refused_stays_refused(
    proxy: Proxy,  # noqa: F811
    fields: bytes,
    status: bytes,
) -> None:
    head = f"POST http://localhost:{proxy.upstream}/ HTTP/1.1\r\n".encode() + fields
    got = proxy.ask(head + b"\r\n\r\nabcd")
    assert got.split(b" ")[1] == status, got


@pytest.mark.hostile
def test_well_formed_fields_still_pass(proxy: Proxy) -> None:  # noqa: F811
    """A name of every token character, a value with a tab and spaces in it, the same
    Content-Length twice: forwarded as before."""
    got = proxy.ask(
        f"POST http://localhost:{proxy.upstream}/ok HTTP/1.1\r\n"
        "X-Odd_Name.1!#$%&'*+^`|~: a\tb  c\r\nContent-Length: 2\r\ncontent-length:2\r\n"
        "\r\nhi".encode()
    )
    assert got.startswith(b"HTTP/1.1 200 OK"), got
    seen = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert seen["body"] == "hi" and "a\tb  c" in seen["headers"]["x-odd_name.1!#$%&'*+^`|~"]


@pytest.mark.hostile
def test_a_slot_from_before_the_state_label_is_left_alone(tmp_path: Path) -> None:
    """Slots made before they carried their state folder (org.runner.state-dir) are neither
    removed nor listed by cleanup (their own folder's runners still reap them when idle)."""
    fake, state = _fake(), tmp_path / "state"
    old = egress.lease(fake, PLAN, "runner-j-a1", state)
    new = egress.lease(fake, PLAN, "runner-k-a1", state)
    egress.release(old)
    egress.release(new)
    for c in fake.containers.values():
        if c.spec.labels[egress.SLOT] == old.slot:
            c.spec.labels.pop(egress.STATE)
            assert c.spec.labels[egress.LOCK].startswith(str(state))
    report = sweeper.sweep(fake, state_dir=state, dry_run=True)
    assert [x["name"] for x in report["wouldRemove"]] == [new.slot]
    report = sweeper.sweep(fake, state_dir=state)
    assert [x["name"] for x in report["removed"]] == [new.slot]
    assert {c.spec.labels[egress.SLOT] for c in fake.containers.values()} == {old.slot}
    assert egress.reap(fake, idle_seconds=0.0, folder=egress.pool_dir(state)) == [old.slot]
