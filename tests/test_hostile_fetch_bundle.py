"""Hostile sources and bundles, and the distribution's own Python (issue 25, items 6, 7, 14):
a source that trickles its response head. Loopback servers only."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.errors import AssetUnavailable
from runner.policy import AssetGrant
from tests.support.asset_server import Served, asset_server

pytestmark = pytest.mark.hostile

MiB = 1024 * 1024

# -- item 6: a response head that trickles ------------------------------------------------


@contextmanager
def _trickling_head(per_byte: float, for_at_most: float) -> Iterator[tuple[str, threading.Event]]:
    """A stdlib socket server that answers every request with a response head sent one byte
    every ``per_byte`` seconds (never a read timeout), for at most ``for_at_most`` seconds;
    its URL and an event set once a request has come in."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()
    asked = threading.Event()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\nx"

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            asked.set()
            until = time.monotonic() + for_at_most
            for byte in head:
                if stop.is_set() or time.monotonic() > until:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client cut it off
                time.sleep(per_byte)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/slow-head", asked
    finally:
        stop.set()
        thread.join()
        srv.close()


def test_a_response_head_that_trickles_is_cut_off_and_frees_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head sent a byte every 0.2 s never trips the 60 s read timeout, and held the fetch
    (and the digest's lock) for as long as the server kept going. With the head's deadline
    scaled down to 1.5 s, the fetch fails within a few seconds naming the source and the
    head, and a second fetch of the same digest from a good source, waiting at most 20 s
    for the lock, gets it while the first server is still trickling."""
    import runner.download

    monkeypatch.setattr(runner.download, "HEAD_TIMEOUT", 1.5, raising=False)
    body = os.urandom(256 * 1024)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()

    def asset(source: str) -> Asset:
        return Asset.model_validate(
            {"id": "data", "sources": [source], "size": len(body), "path": "blob.bin",
             "sha256": digest}
        )  # fmt: skip

    grant = AssetGrant(allowHosts=["127.0.0.1"], retries=0)
    cache = AssetCache(tmp_path / "cache")
    failed: list[BaseException] = []
    took: list[float] = []
    with _trickling_head(per_byte=0.2, for_at_most=60) as (slow_url, asked):

        def first() -> None:
            since = time.monotonic()
            try:
                fetch(asset(slow_url), tmp_path, cache, grant)
            except BaseException as exc:  # noqa: BLE001 - kept for the assertions below
                failed.append(exc)
            took.append(time.monotonic() - since)

        thread = threading.Thread(target=first, daemon=True)
        thread.start()
        assert asked.wait(20), "the first fetch never reached the trickling server"
        with asset_server() as good:
            good.files["good"] = Served(body)
            got = fetch(asset(good.url("good")), tmp_path, cache, grant, lock_timeout=20)
        assert got.downloaded == len(body)
        thread.join(30)
        assert not thread.is_alive()
    assert took and took[0] < 15, took
    (exc,) = failed
    assert isinstance(exc, AssetUnavailable), repr(exc)
    assert slow_url in exc.message and "response head" in exc.message, exc.message
    assert "within 1.5 s" in exc.message and "too slow" in exc.message, exc.message


def test_a_trickling_head_after_a_redirect_on_a_kept_alive_connection_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redirect's target on the same host is asked on the same (kept-alive) connection,
    for which no new socket is made: its head has the deadline too."""
    import runner.download

    monkeypatch.setattr(runner.download, "HEAD_TIMEOUT", 1.0, raising=False)
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    second: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /two\r\nContent-Length: 0\r\n\r\n")
            conn.settimeout(10)
            second.append(conn.recv(65536))
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 300:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    body = b"x"
    asset = Asset.model_validate(
        {"id": "data", "sources": [f"http://127.0.0.1:{port}/one"], "size": 1, "path": "b",
         "sha256": "sha256:" + hashlib.sha256(body).hexdigest()}
    )  # fmt: skip
    since = time.monotonic()
    try:
        with pytest.raises(AssetUnavailable, match="response head") as err:
            fetch(asset, tmp_path, AssetCache(tmp_path / "c"),
                  AssetGrant(allowHosts=["127.0.0.1"], retries=0))  # fmt: skip
    finally:
        thread.join(40)
        srv.close()
    assert time.monotonic() - since < 15
    assert second and second[0].startswith(b"GET /two "), second  # the same connection
    assert f"127.0.0.1:{port}/two" in err.value.message
