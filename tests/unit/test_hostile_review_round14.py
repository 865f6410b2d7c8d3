"""The fourteenth hostile review (the egress allowlist, and what `runner serve` takes for a
request), the parts that need no engine: which addresses the proxy connects an allowed name
to, and requests that are no request. The rest is in
tests/integration/test_hostile_review_round14.py and tests/integration/test_egress_proxy.py."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from runner.app import server
from tests.unit.test_hostile_review_round12 import FINGERPRINT, _served
from tests.unit.test_hostile_secrets import _proxy

OPENED = ["10.20.0.0/16", "fd12::/16"]


@pytest.mark.parametrize(
    ("address", "reached"),
    [
        ("93.184.216.34", True),
        ("2606:4700::1111", True),
        ("10.20.3.4", True),  # in a range the policy opened
        ("fd12::5", True),
        ("10.21.0.1", False),  # private, not opened
        ("127.0.0.1", False),
        ("::1", False),
        ("169.254.169.254", False),  # a cloud's metadata service
        ("fe80::1", False),
        ("100.64.0.1", False),  # shared (carrier-grade NAT)
        ("172.17.0.1", False),  # the engine's default bridge
        ("192.168.1.1", False),
        ("fd00::1", False),
        ("0.0.0.0", False),  # noqa: S104 - an address, not a binding
        ("224.0.0.1", False),
        ("ff02::1", False),
        ("255.255.255.255", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:10.20.0.1", False),  # mapped: refused even into an opened range
        ("2002:a9fe:a9fe::1", False),  # 6to4 carrying 169.254.169.254
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 carrying it
        ("64:ff9b::5db8:d822", True),  # NAT64 carrying a public one
        ("64:ff9b:1::a00:1", False),  # the local-use NAT64 prefix
    ],
)
def test_the_proxy_connects_an_allowed_name_only_to_a_public_or_opened_address(
    address: str, reached: bool
) -> None:
    proxy = _proxy()
    networks = tuple(ipaddress.ip_network(n) for n in OPENED)
    assert proxy.reachable(ipaddress.ip_address(address), networks) is reached


def test_a_name_that_resolves_nowhere_public_is_refused_naming_the_address() -> None:
    proxy = _proxy()
    with pytest.raises(proxy.Refusal, match=r"^resolves to a non-public address: 127\.0\.0\.1$"):
        proxy.resolve("127.0.0.1", 80, ())
    assert proxy.resolve("127.0.0.1", 80, (ipaddress.ip_network("127.0.0.0/8"),)) == [
        (2, ("127.0.0.1", 80))
    ]


GOOD = {"argv": ["run"], "cwd": "/", "env": {}, "code": FINGERPRINT, "umask": 0o022}


@pytest.mark.parametrize(
    "line",
    [
        b"[]",
        b'"run"',
        b"7",
        b"null",
        b"{not json",
        json.dumps({k: v for k, v in GOOD.items() if k != "argv"}).encode(),
        json.dumps({**GOOD, "argv": "run"}).encode(),
        json.dumps({**GOOD, "argv": ["run", 7]}).encode(),
        json.dumps({**GOOD, "cwd": None}).encode(),
        json.dumps({**GOOD, "env": {"A": 1}}).encode(),
        json.dumps({**GOOD, "env": []}).encode(),
        json.dumps({**GOOD, "code": ["x"]}).encode(),
    ],
)
def test_a_request_that_is_no_clients_is_not_served_and_says_why(
    line: bytes, tmp_path: Path
) -> None:
    """Before: JSON that is no object (or no JSON, or an object of other fields) ended the
    fork as "the server failed: AttributeError" (or KeyError, or an argument made a string
    of whatever it was), exit 4. Now it is not served: its sender is told why, and a client
    of this runner runs the command itself."""
    answer, code = _served(line + b"\n", lambda argv: 0, tmp_path)
    assert code == server.STALE_EXIT
    assert "not one a runner client sends" in answer["stale"], answer


def test_the_clients_own_request_is_still_served(tmp_path: Path) -> None:
    def dispatch(argv: list[str]) -> int:  # run in the fork: its exit code says it ran
        return 3 if argv == ["run"] else 5

    answer, code = _served(json.dumps(GOOD).encode() + b"\n", dispatch, tmp_path)
    assert (answer, code) == ({"exit": 3}, 3)
