"""The egress proxy's log, read: each request the job made of tinyproxy, with its outcome.

tinyproxy 1.11 (``LogLevel Info``) writes a line when it reads a request, when it refuses one
(naming its URL, its file descriptor or its CONNECT port), when it opens an onward connection
(naming host and port) and when that connection is made or fails. :func:`read_log` puts these
together into :class:`~runner.envelope.EgressConnection` values; it only reads text, and a line
it does not know is skipped.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from runner.envelope import EgressConnection

_LINE = re.compile(
    r"(?:(?P<at>\d{4}-\d\d-\d\dT[0-9:.]+Z) )?[A-Z]+ +[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d\.\d{3} "
    r"\[\d+\]: (?P<msg>.*)"
)
_REQUEST = re.compile(r"Request \(file descriptor (\d+)\): (.*)")
_TRANSPARENT = re.compile(r"process_request: trans Host (\S+) (.*) for (\d+)")
_FILTERED = re.compile(r'Proxying refused on filtered url "(.*?)"?')  # cut at 800 bytes: no quote
_PORT = re.compile(r"Refused CONNECT method on port (-?\d+)")
_UNKNOWN = re.compile(r"Unknown method \((.*)\) or protocol \((.*)\)")
_BAD = re.compile(r"process_request: Bad Request on file descriptor (\d+)")
_LOOP = re.compile(r"Prevented endless loop \(file descriptor (\d+)\): .*")
_OPEN = re.compile(r"opensock: opening connection to (.*):(-?\d+)")
_NO_ADDRESS = re.compile(r"opensock: Could not retrieve address info for (.*):(-?\d+): .*")
_NO_CONNECTION = re.compile(r"opensock: Could not establish a connection to (.*):(-?\d+)")
_CONNECTED = re.compile(r'Established connection to host "(.*)" using file descriptor \d+\.')
_KEY = 600
"""tinyproxy cuts a log line at 800 bytes: URLs are compared on their first 600."""


def where(method: str, url: str) -> tuple[str, int] | None:
    """The host and port tinyproxy would connect to for this request line (its
    ``extract_url``), or None when it is no proxy request (it is then refused)."""
    if url[:7].lower() == "http://":
        rest, default = url[7:], 80
    elif method == "CONNECT":
        rest, default = url, 443
    else:
        return None
    host = rest.split("/", 1)[0]
    host = host.split("@", 1)[1] if "@" in host else host
    port = 0
    colon = host.rfind(":")
    if colon >= 0 and "]" not in host[colon:]:
        digits = re.match(r"\s*[-+]?\d+", host[colon + 1 :])
        port = int(digits.group()) if digits else 0
        host = host[:colon]
    if host.startswith("[") and "]" in host:
        host = host[1 : host.rindex("]")]
    return host, port or default


Decision = Literal["allowed", "refused", "incomplete"]


@dataclass
class _Request:
    index: int
    """Its position among the requests read."""
    at: str | None
    fd: int
    method: str
    target: str
    """What the job asked for (the request line's URL)."""
    url: str
    """What tinyproxy filtered and connected by (rebuilt from Host for a transparent request)."""
    decision: Decision | None = None
    detail: str = "no outcome"
    answered: bool = False
    """Its onward connection's outcome is known (connected, or unreachable)."""

    @property
    def hostport(self) -> tuple[str, int] | None:
        return where(self.method, self.url)


class _Queues:
    """Requests in the order they were read, by a key; decided ones are dropped lazily."""

    def __init__(self) -> None:
        self._q: dict[Any, deque[_Request]] = {}

    def add(self, key: Any, r: _Request) -> None:
        self._q.setdefault(key, deque()).append(r)

    def first(
        self, key: Any, before: int, ok: Callable[[_Request], bool] = lambda r: True
    ) -> _Request | None:
        """The earliest request under ``key`` read before position ``before``, still open
        (undecided; or, allowed and unanswered, for :meth:`first_allowed`), for which ``ok``
        holds."""
        queue = self._q.get(key)
        while queue and queue[0].decision is not None and queue[0].answered:
            queue.popleft()
        for r in queue or ():
            if r.index >= before:
                return None
            if ok(r):
                return r
        return None


def read_log(text: str) -> list[EgressConnection]:
    """The requests in a tinyproxy log (``LogLevel Info``, lines as the engine keeps them,
    with or without its timestamps), each with its outcome.

    tinyproxy serves each connection on its own thread, so the lines of concurrent requests
    interleave, and only some lines name the request they belong to. A refusal names the URL
    (or the file descriptor, or the CONNECT port) and is matched to the earliest undecided
    request with it; the proxy's onward connections name host and port and are matched the
    same way once every refusal is placed, so a refused request is never taken for an allowed
    one. Among concurrent requests to one host, which one failed to connect is not certain."""
    requests: list[_Request] = []
    by_fd: dict[int, _Request] = {}
    by_url, by_port = _Queues(), _Queues()
    later: list[tuple[int, str, re.Match[str]]] = []

    def undecided(r: _Request) -> bool:
        return r.decision is None

    def asked(url: str = "", method: str = "") -> Callable[[_Request], bool]:
        return lambda q: (
            q.decision is None and (q.url[:_KEY] == url[:_KEY] if url else q.method == method)
        )

    def answers(host: str, port: int | None) -> Callable[[_Request], bool]:
        """An allowed request to ``host`` (and ``port``, when given) not yet answered."""
        return lambda q: (
            q.decision == "allowed"
            and not q.answered
            and (port is None or q.hostport == (host, port))
        )

    def refuse(r: _Request | None, detail: str) -> None:
        if r is not None and r.decision is None:
            r.decision, r.detail, r.answered = "refused", detail, True

    # Lines end at "\n" only, as the engine splits them: a "\r" the job puts in a request
    # line or a Host header stays inside its line and can forge none.
    for line in text.split("\n"):
        m = _LINE.fullmatch(line)
        if m is None:
            continue
        msg, here = m["msg"], len(requests)
        if r := _REQUEST.fullmatch(msg):
            method, _, rest = r[2].partition(" ")
            url = rest.split(" ", 1)[0]
            req = _Request(here, m["at"], int(r[1]), method, url or method, url)
            requests.append(req)
            by_fd[req.fd] = req
            by_url.add(url[:_KEY], req)
            if method == "CONNECT" and (hp := req.hostport) is not None:
                by_port.add(hp[1], req)
        elif r := _TRANSPARENT.fullmatch(msg):
            found = by_fd.get(int(r[3]))
            if found is not None and found.decision is None:
                found.method, found.url = r[1], r[2]
                by_url.add(r[2][:_KEY], found)
        elif r := _FILTERED.fullmatch(msg):
            refuse(by_url.first(r[1][:_KEY], here, asked(url=r[1])), "not on the allowlist")
        elif r := _PORT.fullmatch(msg):
            refuse(by_port.first(int(r[1]), here, undecided), "port not allowed")
        elif r := _UNKNOWN.fullmatch(msg):
            refuse(by_url.first(r[2][:_KEY], here, asked(method=r[1])), "not an HTTP proxy request")
        elif r := _BAD.fullmatch(msg):
            refuse(by_fd.get(int(r[1])), "bad request")
        elif r := _LOOP.fullmatch(msg):
            refuse(by_fd.get(int(r[1])), "a loop back to the proxy")
        elif r := _OPEN.fullmatch(msg):
            later.append((here, "open", r))
        elif (r := _NO_ADDRESS.fullmatch(msg)) or (r := _NO_CONNECTION.fullmatch(msg)):
            later.append((here, "unreachable", r))
        elif r := _CONNECTED.fullmatch(msg):
            later.append((here, "connected", r))

    by_target, by_host = _Queues(), _Queues()
    for req in requests:
        if req.decision is None and (hp := req.hostport) is not None:
            by_target.add(hp, req)
    for here, kind, m in later:  # the onward connections, once every refusal is placed
        if kind == "open":
            hp = (m[1], int(m[2]))
            found = by_target.first(hp, here, undecided)
            if found is not None:
                found.decision = "allowed"
                by_host.add(hp[0], found)
            continue
        port = None if kind == "connected" else int(m[2])
        found = by_host.first(m[1], here, answers(m[1], port))
        if found is not None:
            found.detail, found.answered = kind, True
    return [
        EgressConnection(
            at=req.at,
            method=req.method[:32],
            target=req.target[:_KEY],
            host=hp[0][:253] if (hp := req.hostport) else None,
            port=hp[1] if hp and 0 < hp[1] < 65536 else None,
            decision=req.decision or "incomplete",
            detail=req.detail,
        )
        for req in requests
    ]
