"""This host's own addresses: no allowed name may lead the egress proxy to one of them.

The proxy's upstream network is a bridge whose gateway is this host, and a host's public
address is a public address: either would let whoever runs an allowed name's DNS reach every
service this host runs on all its addresses. So each lease's rules name them, and the proxy
refuses them before anything else (``images/proxy/egress-proxy``). They are this host's local
routes, read from ``/proc`` of the runner's network namespace (the engine's, on a host it
runs on): every ``LOCAL`` entry of ``net/fib_trie`` at any prefix (an address is a ``/32``; a
range routed to this host, AnyIP, is wider) and every ``RTF_LOCAL`` route of
``net/ipv6_route``. Only those the proxy could otherwise connect to are named: a range that is
public in part, or that overlaps one the policy opened (``privateNetworks``); the rest the
proxy refuses whole already. Read in full, each time a lease is taken (a host's addresses
change); unreadable, or more than :data:`MAX_RANGES` after merging, no lease is given.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator

from runner.core.errors import InfrastructureError

__all__ = ["MAX_RANGES", "host_addresses", "ipv4_local", "ipv6_local"]

MAX_RANGES = 16384
"""The most ranges a lease's rules name (after merging adjacent ones)."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LOCAL_V4 = re.compile(r"/(\d{1,2}) \w+ LOCAL( tos=\d+)?")
_RTF_LOCAL = 0x80000000
_NEVER_V6 = tuple(map(ipaddress.IPv6Network, ("::1/128", "fe80::/10", "ff00::/8")))
"""IPv6 ranges the proxy refuses whole (a local one in a range the policy opened is named all
the same: the overlap check comes first)."""


def host_addresses(opened: Iterable[str] = ()) -> tuple[str, ...]:
    """This host's local addresses and ranges (CIDR) the proxy must refuse, given the ranges
    the policy ``opened``; InfrastructureError when they cannot all be read."""
    wide = [ipaddress.ip_network(x) for x in opened]
    found: list[Network] = []
    v6 = list(_lines("/proc/net/ipv6_route", missing_ok=True))  # missing: a kernel without
    # IPv6 (ipv6.disable=1), where the proxy reaches no IPv6 address either
    for net in [*ipv4_local(_lines("/proc/net/fib_trie")), *ipv6_local(v6)]:
        if any(net.overlaps(o) for o in wide if o.version == net.version) or _may_be_public(net):
            found.append(net)
    merged = [
        *ipaddress.collapse_addresses(n for n in found if isinstance(n, ipaddress.IPv4Network)),
        *ipaddress.collapse_addresses(n for n in found if isinstance(n, ipaddress.IPv6Network)),
    ]
    if len(merged) > MAX_RANGES:
        raise InfrastructureError(
            f"this host has {len(merged)} public local address ranges, more than the egress "
            f"proxy is told of ({MAX_RANGES}): a job could reach this host through one left out",
            hint="run jobs with egress on a host with fewer local addresses",
        )
    return tuple(str(n) for n in merged)


def _may_be_public(net: Network) -> bool:
    """Whether some address of ``net`` may be one the proxy would connect to unopened: IPv6,
    all but loopback, link-local and multicast (the proxy judges a NAT64 or 6to4 address by
    the IPv4 it carries, so such a local range is this host's whatever its prefix)."""
    if isinstance(net, ipaddress.IPv6Network):
        return not any(net.subnet_of(n) for n in _NEVER_V6)
    return not (net.is_private or net.is_loopback or net.is_link_local or net.is_multicast)


def _lines(path: str, *, missing_ok: bool = False) -> Iterator[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            yield from f
    except FileNotFoundError:
        if not missing_ok:
            raise InfrastructureError(
                f"this host's addresses could not be read: {path} does not exist",
                hint="run the runner where /proc/net is mounted",
            ) from None
    except OSError as exc:
        raise InfrastructureError(
            f"this host's addresses could not be read from {path}: {exc.strerror or exc}",
            hint="the egress proxy must be told them (so that no allowed name leads to this "
            "host); run the runner where /proc/net is readable",
        ) from exc


def ipv4_local(lines: Iterable[str]) -> Iterator[Network]:
    """The local routes in ``/proc/net/fib_trie``'s ``lines``: each ``LOCAL`` entry, at its
    prefix, under the leaf (``|-- address``) it follows, of the main and local tables only (a
    policy-routing table's ``local 0.0.0.0/0``, as transparent proxies set for marked
    packets, is no address of this host's for the proxy's own packets)."""
    last, table = "", ""
    for line in lines:
        if line[:1] not in (" ", ""):  # a table's header at the line's start: "Main:", "Id 9:"
            table, last = line.strip(), ""
            continue
        if table not in ("Main:", "Local:"):
            continue
        text = line.strip()
        if text.startswith("|-- "):  # a leaf: its routes follow ("+-- " is an inner node)
            last = text[4:].split(" ", 1)[0]
        elif (m := _LOCAL_V4.fullmatch(text)) and last:
            try:
                yield ipaddress.ip_network(f"{last}/{m.group(1)}", strict=False)
            except ValueError:
                continue


def ipv6_local(lines: Iterable[str]) -> Iterator[Network]:
    """The local routes (``RTF_LOCAL``) in ``/proc/net/ipv6_route``'s ``lines``."""
    for line in lines:
        fields = line.split()
        if len(fields) < 9 or len(fields[0]) != 32:
            continue
        try:
            if not int(fields[8], 16) & _RTF_LOCAL:
                continue
            digits = fields[0]
            address = ":".join(digits[i : i + 4] for i in range(0, 32, 4))
            yield ipaddress.ip_network(f"{address}/{int(fields[1], 16)}", strict=False)
        except ValueError:
            continue
