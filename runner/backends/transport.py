"""The Engine API's transport, under both engines' backends (Docker's and Podman's): the
connection to the engine (a Unix socket, TCP, or TCP with TLS, as ``DOCKER_HOST`` says), every
receive of a call bounded by one deadline, answers read under a cap, the facts an engine
does not change while it runs, and the one request a watch keeps open across its ticks
(:class:`KeptRequests`). The calls themselves are the backends' (``runner.backends.docker``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runner.core.errors import EngineUnavailable

__all__ = [
    "DEFAULT_SOCKET",
    "KEPT_MAX",
    "KEPT_SECONDS",
    "KNOWN",
    "MAX_ANSWER_BYTES",
    "READ_FLOOR",
    "DeadlineSocket",
    "KeptAnswer",
    "KeptRequests",
    "UnixConnection",
    "endpoint",
    "engine_url",
    "read_within",
    "shut",
]

DEFAULT_SOCKET = "/var/run/docker.sock"


def shut(conn: http.client.HTTPConnection) -> Callable[[], None]:
    """What ends a connection another thread reads from (its read returns at once): its
    socket, taken now (once the request is sent), since http.client lets go of it
    (``conn.sock`` None) when the answer says ``Connection: close``; the answer still reads
    from it."""
    sock = conn.sock

    def end() -> None:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    return end


class DeadlineSocket(socket.socket):
    """A socket whose receives share one deadline (``time.monotonic()``; None: none), each
    also bounded by the timeout it was given: an engine that trickles its answer, a byte
    within every receive's timeout, is cut off at the call's limit all the same (a watch
    loop held in one call could not stop a job at its budget's end). It bounds the whole
    exchange, the status line and headers too, on a Unix socket; :func:`read_within` bounds
    an answer's body on every transport."""

    __slots__ = ("deadline", "per_receive")
    deadline: float | None
    per_receive: float | None

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the engine's answer did not end within the call's limit")
            self.settimeout(left if self.per_receive is None else min(left, self.per_receive))
        return super().recv_into(buffer, nbytes, flags)


class UnixConnection(http.client.HTTPConnection):
    """HTTP over the engine's Unix socket, every receive of a call bounded by ``deadline``."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path
        self.deadline: float | None = None
        """Set before the request: every receive of the call ends by then."""

    def connect(self) -> None:
        sock = DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.per_receive, sock.deadline = self.timeout, self.deadline
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The most of one engine answer read into memory (a listing, an inspect, an error): an
answer past it is refused, not read on. Streams (logs, archives) are read by their callers,
each under its own cap."""


def read_within(response: http.client.HTTPResponse, sock: Any, seconds: float | None) -> bytes:
    """An answer's body, at most :data:`MAX_ANSWER_BYTES` and a byte of it, read within
    ``seconds`` in all (None: no limit). A timeout on each receive alone let an engine that
    sends a byte at a time, each within it, hold the runner for as long as it liked; past
    ``seconds`` a TimeoutError, as a receive's own timeout is (``wait`` reads it so)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    parts: list[bytes] = []
    got = 0
    while got <= MAX_ANSWER_BYTES:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the answer did not arrive within {seconds:g} s")
            if sock is not None:
                sock.settimeout(left)
        chunk = response.read1(min(1024 * 1024, MAX_ANSWER_BYTES + 1 - got))
        if not chunk:
            if response.length:  # cut short: as read() says it
                raise http.client.IncompleteRead(b"".join(parts), response.length)
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


KNOWN: dict[tuple[str, str], str] = {}
"""(endpoint, fact) -> value, for what an engine does not change while it runs (the API
version agreed, its architecture): asked once per process, and inherited by a batch's jobs."""


def engine_url(base_url: str | None) -> str:
    """The engine's address: ``base_url``, else ``DOCKER_HOST``, else the default socket."""
    return base_url or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"


def endpoint(url: str) -> Callable[[float | None], http.client.HTTPConnection]:
    """A connection factory for the engine at ``url``."""
    parts = urlsplit(url)
    if parts.scheme in ("unix", "http+unix"):
        path = parts.path or DEFAULT_SOCKET
        return lambda timeout: UnixConnection(path, timeout)
    if parts.scheme in ("tcp", "http", "https"):
        host, port = parts.hostname or "localhost", parts.port
        tls = parts.scheme == "https" or os.environ.get("DOCKER_TLS_VERIFY", "") not in ("", "0")
        if not tls:
            return lambda timeout: http.client.HTTPConnection(host, port or 2375, timeout=timeout)
        import ssl  # only for a TLS engine

        certs = Path(os.environ.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        context.load_cert_chain(str(certs / "cert.pem"), str(certs / "key.pem"))
        return lambda timeout: http.client.HTTPSConnection(
            host, port or 2376, timeout=timeout, context=context
        )
    raise EngineUnavailable(
        f"DOCKER_HOST {url!r}: only unix:// and tcp:// engines are supported",
        hint="point DOCKER_HOST at the engine's socket (unix:///var/run/docker.sock) or a "
        "tcp:// address; for ssh:// engines forward the socket with `ssh -L`",
    )


class KeptAnswer:
    """A request sent once whose answer comes when something ends (a container's ``wait``),
    kept open across the calls that look for it: a watch loop that looks every 0.2 s sends
    one request for the job's whole run, not five a second, each a connection, a handler and
    a waiter in the engine (about 7 ms of CPU a second of every running job, the runner's
    and the engine's together, half of what watching it cost: a job that slept, measured
    as ``benchmarks/watch.py`` does).

    Docker answers a wait with its status line and headers at once and the body when the
    container ends; Podman may send nothing until then. Either way the socket is looked at
    without reading, and an answer is read only once bytes are there, and only within the
    call's own time, as every call is: an answer begun and not ended by then is a
    TimeoutError, and its request is not kept (its reader is spent). Used by one thread at a
    time."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.sock: Any = conn.sock
        self.response: http.client.HTTPResponse | None = None
        self.sent = time.monotonic()

    def answer(self, until: float) -> tuple[int, bytes] | None:
        """The status and body once the engine answered; None when nothing (more) came by
        ``until`` (``time.monotonic()``). What did come is read by then (at least
        :data:`READ_FLOOR` seconds), else a TimeoutError; an engine that ended the connection
        unanswered raises OSError or http.client.HTTPException."""
        if self.response is None:
            if not self._ready(until):
                return None
            ends = max(until, time.monotonic() + READ_FLOOR)
            if isinstance(self.sock, DeadlineSocket):  # the status line and headers in time
                self.sock.deadline = ends
            self.sock.settimeout(ends - time.monotonic())
            try:
                self.response = self.conn.getresponse()
            finally:
                if isinstance(self.sock, DeadlineSocket):
                    self.sock.deadline = None
            if self.response.status >= 300:  # an error is answered whole, at once
                return self.response.status, self._body(ends)
        if not self._ready(until):
            return None
        return self.response.status, self._body(max(until, time.monotonic() + READ_FLOOR))

    def _body(self, ends: float) -> bytes:
        """The body, whole by ``ends``: every receive of it, a chunk's size line and the
        trailer's lines too (which one read of ``read_within`` may hold), on a Unix socket."""
        assert self.response is not None  # noqa: S101 - the headers were read
        if isinstance(self.sock, DeadlineSocket):
            self.sock.deadline = ends
        try:
            return read_within(self.response, self.sock, max(ends - time.monotonic(), 0.001))
        finally:
            if isinstance(self.sock, DeadlineSocket):
                self.sock.deadline = None

    def _ready(self, until: float) -> bool:
        """Whether bytes of the answer (or its end) are there, waiting for them until ``until``:
        what the answer's headers brought along is in the response's buffer, not the socket."""
        fp = self.response.fp if self.response is not None else None
        if self.response is not None and fp is None:
            return True  # read whole already (an empty body)
        if fp is not None:
            self.sock.settimeout(0.0)  # a look into the buffer, never a wait
            with contextlib.suppress(OSError):  # TLS's "would block"; an error shows below
                if fp.peek(1):
                    return True
        pending = getattr(self.sock, "pending", None)  # TLS: bytes already decrypted
        if pending is not None and pending():
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        left = max(until - time.monotonic(), 0.0)
        return bool(poller.poll(int(left * 1000)))

    def close(self) -> None:
        """End the request (the engine drops its waiter): the response holds the socket once
        http.client has handed it over, so both are closed."""
        if self.response is not None:
            self.response.close()
        self.conn.close()
        with contextlib.suppress(OSError):
            self.sock.close()


READ_FLOOR = 0.05
"""The least time a begun answer is given to end, even when the call's own time is all but
spent (a look at the deadline waits 0.01 s): an answer the engine writes at once is read
whole, not cut at a byte."""


KEPT_MAX = 64
"""The most requests one :class:`KeptRequests` keeps open (one per job its backend watches)."""
KEPT_SECONDS = 10.0
"""A kept request older than this is sent anew: one request every 10 s of a job's run, where
one every look (0.2 s) was, and a connection that died without a word costs at most this."""


class KeptRequests:
    """Requests kept open from one call to the next, by key (a container's id): each call
    looks whether its request's answer came (:class:`KeptAnswer`), sending it first when none
    is kept. Each call ends within its own time, its connecting included: an answer begun and
    not ended by then is not waited for (the next call asks again). A kept request is sent
    anew once :data:`KEPT_SECONDS` old, after a look that takes an answer already there; one
    the engine ended unanswered (a restart, its own limits) is sent again at once; a fresh
    one's failure is raised (OSError or http.client.HTTPException) for the caller to name.
    Safe across threads: a call holds its request out of the kept ones, and a :meth:`drop`
    meanwhile (the container removed, by the lease's thread) has that call close it."""

    def __init__(self, connect: Callable[[float | None], http.client.HTTPConnection]) -> None:
        self._connect = connect
        self._kept: dict[str, KeptAnswer] = {}
        self._lock = threading.Lock()
        self._asking: dict[str, int] = {}
        """Keys calls are asking on now, and how many."""
        self._dropped: set[str] = set()
        """Keys dropped while a call held their request: that call closes it."""

    def answer(self, key: str, path: str, timeout: float) -> tuple[int, bytes] | None:
        """The status and body of ``POST path`` for ``key`` once the engine answered within
        ``timeout`` seconds (at least 0.01 s); None before."""
        until = time.monotonic() + max(timeout, 0.01)
        with self._lock:
            kept = self._kept.pop(key, None)
            self._asking[key] = self._asking.get(key, 0) + 1
        expired = kept is not None and time.monotonic() - kept.sent > KEPT_SECONDS
        try:
            while True:
                fresh = kept is None
                try:
                    if kept is None:
                        kept = self._send(path, until)
                    answer = kept.answer(time.monotonic() if expired else until)
                except TimeoutError:  # begun, not ended in time: as a call's own timeout was
                    if kept is not None:
                        kept.close()
                    return None
                except (OSError, http.client.HTTPException):
                    if kept is not None:
                        kept.close()
                    kept = None
                    if fresh:
                        raise
                    continue
                except BaseException:  # a Ctrl-C while it waits: the request goes with it
                    if kept is not None:
                        kept.close()
                    raise
                if answer is not None:
                    kept.close()
                    return answer
                if expired:  # nothing there: asked anew, within this call's time
                    kept.close()
                    kept, expired = None, False
                    continue
                self._keep(key, kept)
                return None
        finally:
            with self._lock:
                self._asking[key] -= 1
                if not self._asking[key]:
                    del self._asking[key]
                    self._dropped.discard(key)

    def drop(self, key: str) -> None:
        """End the request kept for ``key``; one a call holds now is ended by that call."""
        with self._lock:
            kept = self._kept.pop(key, None)
            if key in self._asking:
                self._dropped.add(key)
        if kept is not None:
            kept.close()

    def _keep(self, key: str, kept: KeptAnswer) -> None:
        """Keep ``kept`` for the next call on ``key``, unless ``key`` was dropped meanwhile."""
        gone: list[KeptAnswer] = []
        with self._lock:
            if key in self._dropped:
                gone.append(kept)
            else:
                old = self._kept.pop(key, None)
                if old is not None:  # another thread's call on the same key: one is enough
                    gone.append(old)
                self._kept[key] = kept
                while len(self._kept) > KEPT_MAX:  # never read again (its job's watch
                    gone.append(self._kept.pop(next(iter(self._kept))))  # ended otherwise)
        for one in gone:
            one.close()

    def _send(self, path: str, until: float) -> KeptAnswer:
        """Send ``POST path``, connecting within the call's time (``until``)."""
        conn = self._connect(max(until - time.monotonic(), READ_FLOOR))
        try:
            conn.request("POST", path, headers={"Host": "docker"})
        except BaseException:
            conn.close()
            raise
        return KeptAnswer(conn)
