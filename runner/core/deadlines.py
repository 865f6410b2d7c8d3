"""Deadlines on an HTTP response (an asset's, a registry's), each a thread that shuts the
connection's socket down (which wakes a read blocked on it): :class:`HeadDeadline`, the
response head (status line and headers) within so many seconds, the connection handed over by
:func:`adapter_class`'s ``requests`` adapter as soon as it is made; :class:`RateWatch`, the
body at a least rate over a window, so that a source that trickles (a byte every 59 s defeats
the read timeout) is cut off rather than hold the digest's lock, and every runner waiting on
it, for ever. The fetch that uses them is :mod:`runner.caches.download`;
:mod:`runner.images.registry` holds a :class:`HeadDeadline` until a small answer's body is read
too, a deadline on the whole."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["HeadDeadline", "RateWatch", "adapter_class", "pool_classes"]


class RateWatch:
    """Cuts a response's connection when fewer than ``min_rate * window`` bytes arrived in the
    last ``window`` seconds, as ``received()`` counts them (a thread; shutting the socket down
    wakes the read)."""

    def __init__(
        self, resp: Any, received: Callable[[], int], window: float, min_rate: int
    ) -> None:
        self.resp, self.received = resp, received
        self.expired = False
        self.window, self.min_rate = window, min_rate
        self.least = int(min_rate * window)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="asset-rate", daemon=True)

    def __enter__(self) -> RateWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _watch(self) -> None:
        seen = self.received()
        while not self.stop.wait(self.window):
            if self.received() - seen < self.least:
                self.expired = True
                sock = getattr(getattr(self.resp.raw, "connection", None), "sock", None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return
            seen = self.received()

    def too_slow(self, url: str) -> str:
        """Why the source (``url``, redacted) was cut off."""
        return (
            f"{url} sent fewer than {self.least:,} bytes in {self.window:g} s (less "
            f"than {self.min_rate:,} bytes a second); cut off as too slow"
        )


_current = threading.local()
"""The :class:`HeadDeadline` of the request this thread is sending (None between requests)."""


class HeadDeadline:
    """Shuts down the connection of a request whose response head has not arrived within
    ``seconds``. The connection's socket is handed over as it is made (:func:`adapter_class`) and
    kept as a duplicate, so the one shut down is always that connection's, never a file
    descriptor number since reused."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="asset-head", daemon=True)

    def __enter__(self) -> HeadDeadline:
        _current.deadline = self
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        _current.deadline = None
        self.stop.set()
        self.thread.join()
        with self.lock:
            for sock in self.socks:
                sock.close()
            self.socks.clear()

    def add(self, sock: socket.socket) -> None:
        """The request's connection (from the thread sending it): a duplicate of its file
        descriptor (a TLS socket cannot ``dup()`` itself), closed when the head is in."""
        dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
        with self.lock:
            self.socks.append(dup)
            if self.expired:
                _shut(dup)

    def _watch(self) -> None:
        if self.stop.wait(self.seconds):
            return
        with self.lock:
            self.expired = True
            for sock in self.socks:
                _shut(sock)

    def too_slow(self, url: str) -> str:
        """Why the source (``url``, redacted) was cut off."""
        return (
            f"{url} did not send its response head (status line and headers) within "
            f"{self.seconds:g} s; cut off as too slow"
        )


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@functools.cache
def adapter_class() -> Any:
    """An ``HTTPAdapter`` whose connections hand their socket, as soon as it is connected (a
    TLS handshake comes after) or taken from the pool again (kept alive), to the
    :class:`HeadDeadline` of the request in hand (:func:`pool_classes`)."""
    import requests.adapters

    pools = pool_classes()

    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = dict(pools)

    return Adapter


@functools.cache
def pool_classes() -> dict[str, Any]:
    """``urllib3`` connection pools (for a ``PoolManager``'s ``pool_classes_by_scheme``) whose
    connections hand their socket, as soon as it is connected or taken from the pool again,
    to the :class:`HeadDeadline` of the request in hand."""
    import urllib3.connection
    import urllib3.connectionpool

    def watched(sock: socket.socket) -> socket.socket:
        deadline = getattr(_current, "deadline", None)
        if deadline is not None:
            deadline.add(sock)
        return sock

    class Conn(urllib3.connection.HTTPConnection):
        def _new_conn(self) -> socket.socket:
            return watched(super()._new_conn())

    class TLSConn(urllib3.connection.HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            return watched(super()._new_conn())

    class Reused:
        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)  # type: ignore[misc]
            sock = getattr(conn, "sock", None)
            if sock is not None:  # a connection kept alive: no new socket is made for it
                watched(sock)
            return conn

    class Pool(Reused, urllib3.connectionpool.HTTPConnectionPool):
        ConnectionCls = Conn

    class TLSPool(Reused, urllib3.connectionpool.HTTPSConnectionPool):
        ConnectionCls = TLSConn

    return {"http": Pool, "https": TLSPool}
