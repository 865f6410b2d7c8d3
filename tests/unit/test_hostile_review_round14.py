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
HOST = ["203.0.113.9/32", "2a01:4f8::1/128", "10.20.0.1/32", "9.9.9.0/28"]
"""This host's own addresses and ranges, as the runner names them in the rules."""


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
        ("::7f00:1", False),  # IPv4-compatible 127.0.0.1 (3.11.2's is_global says True)
        ("::a9fe:a9fe", False),  # IPv4-compatible 169.254.169.254
        ("::ffff:0:7f00:1", False),  # SIIT's IPv4-translated form
        ("5f00::1", False),  # outside global unicast
        ("100:0:0:1::1", False),
        ("203.0.113.9", False),  # this host's own (public) address
        ("2a01:4f8::1", False),  # this host's bridge gateway on a global prefix
        ("2002:cb00:7109::1", False),  # 6to4 carrying this host's address
        ("10.20.0.1", False),  # this host, inside a range the policy opened
        ("9.9.9.5", False),  # in a range routed to this host (AnyIP)
        ("9.9.9.17", True),
        ("168.63.129.16", False),  # Azure's WireServer, public in form only
        ("2001:1::1", False),  # an IETF anycast (port control) the image's Python calls global
        ("3fff::1", False),  # documentation
    ],
)
def test_the_proxy_connects_an_allowed_name_only_to_a_public_or_opened_address(
    address: str, reached: bool
) -> None:
    proxy = _proxy()
    networks = tuple(ipaddress.ip_network(n) for n in OPENED)
    own = tuple(map(ipaddress.ip_network, HOST))
    assert proxy.reachable(ipaddress.ip_address(address), networks, own) is reached


def test_a_name_that_resolves_nowhere_public_is_refused_naming_the_address() -> None:
    proxy = _proxy()
    with pytest.raises(proxy.Refusal, match=r"^resolves to a non-public address: 127\.0\.0\.1$"):
        proxy.resolve("127.0.0.1", 80, ())
    own = (ipaddress.ip_network("127.0.0.0/8"),)
    opened = (ipaddress.ip_network("127.0.0.0/8"),)
    with pytest.raises(proxy.Refusal, match=r"^resolves to this host: 127\.0\.0\.1$"):
        proxy.resolve("127.0.0.1", 80, opened, own)
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


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"env": {"": "x"}}, "variable '' cannot be set"),  # a parent's execve can hand one on
        ({"env": {"A=B": "x"}}, "variable 'A=B' cannot be set"),
        ({"env": {"A": "x\0y"}}, "variable 'A' cannot be set"),
        ({"env": {"A": "\ud800"}}, "cannot be set"),  # not even surrogateescape encodes it
        ({"cwd": "/no\0where"}, "name cannot be used"),
        ({"cwd": "/no/such/folder/at/all"}, "cannot be entered"),
        ({"cwd": "/etc/hostname"}, "cannot be entered"),  # as one whose mode forbids it
        ({"argv": ["run", "a\0b"]}, "an argument"),
    ],
)
def test_a_request_a_fork_cannot_take_on_is_not_served(
    change: dict[str, object], why: str, tmp_path: Path
) -> None:
    """Before: each passed the check of its shape, then failed in the fork as it set the
    environment or the folder ("the server failed", exit 4) where the command would have run
    in the client's own process. Now it is not served, and the client runs it itself."""
    answer, code = _served(json.dumps({**GOOD, **change}).encode() + b"\n", lambda a: 0, tmp_path)
    assert code == server.STALE_EXIT and why in answer["stale"], answer


def test_a_request_nested_past_the_parsers_depth_is_not_served(tmp_path: Path) -> None:
    """Before: RecursionError, "the server failed" (exit 4)."""
    for line in (b"[" * 100_000 + b"]" * 100_000, json.dumps({**GOOD, "argv": 0}).encode()
                 .replace(b"0", b"[" * 5000 + b"]" * 5000)):  # fmt: skip
        answer, code = _served(line + b"\n", lambda argv: 0, tmp_path)
        assert code == server.STALE_EXIT and "not one a runner client" in answer["stale"]


def test_a_real_clients_odd_environment_is_still_served(tmp_path: Path) -> None:
    """Non-ASCII, the surrogates a name that is not UTF-8 decodes to, newlines: served."""
    from runner.client import _request

    env = {"A": "é\n\u2028", "B\udcff": "\udc80"}
    line = _request(["run"], str(tmp_path), env, FINGERPRINT, 0o022)

    def dispatch(argv: list[str]) -> int:
        import os

        return 3 if os.environ.get("B\udcff") == "\udc80" and os.getcwd() == str(tmp_path) else 5

    answer, code = _served(line, dispatch, tmp_path)
    assert (answer, code) == ({"exit": 3}, 3)


def test_the_clients_own_request_is_still_served(tmp_path: Path) -> None:
    def dispatch(argv: list[str]) -> int:  # run in the fork: its exit code says it ran
        return 3 if argv == ["run"] else 5

    answer, code = _served(json.dumps(GOOD).encode() + b"\n", dispatch, tmp_path)
    assert (answer, code) == ({"exit": 3}, 3)


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 9.9.9.0/28 2 0 2
        |-- 9.9.9.0
           /28 host LOCAL
     |-- 127.0.0.1
        /32 host LOCAL
     |-- 172.17.0.1
        /32 host LOCAL
     |-- 172.17.255.255
        /32 link BROADCAST
     |-- 203.0.113.9
        /32 host LOCAL
     +-- 8.8.4.0/28 2 0 2
        |-- 8.8.4.0
           /28 host LOCAL tos=16
Id 2004:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 host LOCAL
"""
IPV6_ROUTE = (
    "2a0104f8000000000000000000000001 80 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n"
    "2a0104f8000000000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n"
    "20010db8aaaa00000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000000 00000001 00000000 80200001       lo\n"
    "0064ff9b000000000000000000000000 60 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000000 00000001 00000000 80200001       lo\n"
)


def test_the_rules_name_this_hosts_own_addresses_and_ranges() -> None:
    """Before: a name's DNS could lead the proxy to this host's public address, or to the
    upstream network's gateway (this host) once its range was opened, and so to every
    service this host runs on all its addresses. The rules now name this host's local
    routes, which the proxy refuses first: every LOCAL entry at its own prefix (a range
    routed to this host, AnyIP, too, where only /32 was read) and IPv6's RTF_LOCAL routes
    (where only interface addresses were)."""
    from runner.egress.local import host_addresses, ipv4_local, ipv6_local

    v4 = [str(n) for n in ipv4_local(FIB_TRIE.splitlines())]
    assert v4 == ["9.9.9.0/28", "127.0.0.1/32", "172.17.0.1/32", "203.0.113.9/32", "8.8.4.0/28"]
    # (a transparent proxy's "local 0.0.0.0/0 table 2004" is for marked packets: not ours)
    v6 = [str(n) for n in ipv6_local(IPV6_ROUTE.splitlines())]
    assert v6 == ["2a01:4f8::1/128", "2001:db8:aaaa::/64", "64:ff9b::/96"]  # local routes only
    found = host_addresses()  # this host's: only what the proxy could otherwise reach
    assert all(not ipaddress.ip_network(n).is_private for n in found if ":" not in n)
    assert all(not ipaddress.ip_network(n).is_loopback for n in found)
    opened = host_addresses(["127.0.0.0/8", "172.16.0.0/12"])
    assert "127.0.0.0/8" in opened  # opened by the policy: named, and so refused still


def test_a_flood_of_short_requests_does_not_push_the_cap_out_of_the_kept_log(
    tmp_path: Path,
) -> None:
    """The runner kept 16 MiB of the lease's lines as the engine gives them, its timestamps
    counted: a flood of short requests (about a fifth of each line is the timestamp) filled
    that before the proxy's 15 MiB cap, so its log-capped line and tally never made it in,
    the record said nothing was truncated, and the requests after the flood went uncounted.
    Now only the proxy's own bytes count."""
    from runner.egress import slots as egress
    from tests.unit.test_egress import PLAN, _fake, _serve

    def flood(lease: str) -> bytes:
        def line(i: int) -> str:
            fields = {"id": i, "lease": lease, "event": "refused", "detail": "bad request"}
            return f"2026-12-01T00:00:00.123456789Z {json.dumps(fields, separators=(',', ':'))}\n"

        count = (15 << 20) // (len(line(100_000)) - 31)
        lines = "".join(line(i) for i in range(count))
        end = [{"event": "log-capped", "lease": lease},
               {"event": "tally", "lease": lease, "requests": count + 3, "refused": count,
                "connected": 3, "unreachable": 0}]  # fmt: skip
        tail = "".join(f"2026-12-01T00:00:01Z {json.dumps(x, separators=(',', ':'))}\n"
                       for x in end)  # fmt: skip
        return (lines + tail).encode()

    fake, state = _fake(), tmp_path / "state"
    eg = egress.lease(fake, PLAN, "runner-j-a1", state)
    _serve(fake, flood)
    record = egress.down(fake, eg, tmp_path / "rec", tmp_path)
    assert record.logTruncated and record.problems == []
    assert record.allowed == 3 and record.refused > 100_000
    assert (tmp_path / "rec" / "egress.log").read_text().count('"event":"tally"') == 1


def test_a_local_nat64_range_is_named_and_a_failed_read_refuses_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local route in 64:ff9b::/96 was left out (not in 2000::/3), though the proxy
    connects to such an address when the IPv4 it carries is public; and an ipv6_route the
    runner may not read (AppArmor, SELinux) counted as no IPv6 at all. Now every IPv6 local
    range but loopback, link-local and multicast is named, and only a missing file (a kernel
    without IPv6) counts as none."""
    import builtins

    from runner.core.errors import InfrastructureError
    from runner.egress import local

    real = builtins.open

    def fake(path: object, *args: object, **kwargs: object) -> object:
        if path == "/proc/net/ipv6_route":
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)  # type: ignore[call-overload]

    nat64 = ipaddress.ip_network("64:ff9b::/96")
    assert local._may_be_public(nat64) and not local._may_be_public(ipaddress.ip_network("::1"))
    monkeypatch.setattr(builtins, "open", fake)
    with pytest.raises(InfrastructureError, match="ipv6_route"):
        local.host_addresses()
