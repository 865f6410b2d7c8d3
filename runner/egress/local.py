"""This host's own addresses: no allowed name may lead the egress proxy to one of them.

The proxy's upstream network is a bridge whose gateway is this host, and a host's public
address is a public address: either would let whoever runs an allowed name's DNS reach every
service this host runs on all its addresses. So each lease's rules name them, and the proxy
refuses them before anything else (``images/proxy/egress-proxy``). Read from ``/proc`` of the
runner's network namespace, which is the engine's on a host it runs on: ``net/fib_trie``'s
local routes (every IPv4 address of every interface) and ``net/if_inet6``. Link-local and
loopback addresses are left out (the proxy refuses those ranges whole).
"""

from __future__ import annotations

import ipaddress

__all__ = ["MAX_ADDRESSES", "host_addresses"]

MAX_ADDRESSES = 4096
"""At most this many are named (a host with more is one the proxy must not serve anyway)."""
_READ_MAX = 8 << 20


def host_addresses() -> tuple[str, ...]:
    """This host's addresses (IPv4 and IPv6), sorted; those that cannot be read are left out."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    last = ""
    for line in _read("/proc/net/fib_trie").splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:]
        elif text == "/32 host LOCAL" and last:
            _add(found, last)
    for line in _read("/proc/net/if_inet6").splitlines():
        digits = line.split(" ", 1)[0]
        if len(digits) == 32:
            _add(found, ":".join(digits[i : i + 4] for i in range(0, 32, 4)))
    kept = sorted(found, key=lambda a: (a.version, int(a)))[:MAX_ADDRESSES]
    return tuple(str(a) for a in kept)


def _add(found: set[ipaddress.IPv4Address | ipaddress.IPv6Address], text: str) -> None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return
    if not (address.is_loopback or address.is_link_local or address.is_unspecified):
        found.add(address)


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(_READ_MAX)
    except OSError:
        return ""
