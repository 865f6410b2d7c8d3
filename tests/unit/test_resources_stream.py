"""The Docker backend's stats stream against a hostile engine: a loopback HTTP server speaking
the Engine API's stats answers (no engine): good answers are handed on, an answer past the
line cap ends the reading (nothing after it is read), and a stream that never ends is closed
at once by the handle."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from runner.backends.base import LogFollow, StatsSample
from runner.backends.docker import DockerBackend
from runner.backends.stats import STATS_LINE_MAX

GOOD = json.dumps(
    {"read": "2026-12-02T17:30:12Z", "cpu_stats": {"cpu_usage": {"total_usage": 5}}}
).encode()


class _Engine(http.server.BaseHTTPRequestHandler):
    body: ClassVar[list[bytes]] = []
    endless: ClassVar[bool] = False
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/_ping":
            self.send_response(200)
            self.send_header("API-Version", "1.41")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for chunk in self.body:
                self.wfile.write(chunk)
                self.wfile.flush()
            while self.endless:  # the answer of an engine that never ends its stream
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return


@pytest.fixture
def engine() -> Iterator[DockerBackend]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield DockerBackend(base_url=f"tcp://127.0.0.1:{server.server_address[1]}", timeout=10)
    finally:
        _Engine.endless = False
        server.shutdown()
        server.server_close()


@pytest.mark.hostile
def test_an_answer_past_the_line_cap_ends_the_reading(engine: DockerBackend) -> None:
    _Engine.body = [GOOD + b"\n", b"{" + b" " * STATS_LINE_MAX + b"\n", GOOD + b"\n"]
    got: list[StatsSample] = []
    engine.follow_stats("c", got.append)
    assert got == [StatsSample(cpu_ns=5)]  # the good answer after the huge one is not read


@pytest.mark.hostile
def test_the_zero_answer_ends_the_stream(engine: DockerBackend) -> None:
    zero = json.dumps({"read": "0001-01-01T00:00:00Z"}).encode()
    _Engine.body = [GOOD + b"\n", GOOD + b"\n", zero + b"\n", GOOD + b"\n"]
    got: list[StatsSample] = []
    engine.follow_stats("c", got.append)
    assert len(got) == 2


@pytest.mark.hostile
def test_a_stream_that_never_ends_is_closed_by_its_handle(engine: DockerBackend) -> None:
    _Engine.body, _Engine.endless = [GOOD + b"\n"], True
    got: list[StatsSample] = []
    handle = LogFollow()
    thread = threading.Thread(target=engine.follow_stats, args=("c", got.append, handle))
    thread.start()
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.cancel()
    thread.join(10)
    assert not thread.is_alive() and got == [StatsSample(cpu_ns=5)]
