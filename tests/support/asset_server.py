"""A loopback HTTP server for asset tests: Python's standard library, with Range requests, and
knobs for what a real source does wrong (503s, a cut connection, a slow line, wrong bytes).
It counts what it sends, so a test can prove a resume sent fewer bytes."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Served:
    """One file and how it is served."""

    body: bytes
    fail_first: int = 0
    """Answer 503 to this many requests first."""
    status: int | None = None
    """Always answer this status (404 ...) instead."""
    cut_after: int | None = None
    """Close the connection after this many body bytes (once; later requests are whole)."""
    delay_per_chunk: float = 0.0
    chunk: int = 64 * 1024
    ranges: bool = True
    redirect_to: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers on a 200/206 answer (a Content-Encoding the body does not have ...)."""


@dataclass
class Log:
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    """(path, Range header) per request."""
    sent: list[int] = field(default_factory=list)
    """Body bytes sent per request."""
    authorization: list[str | None] = field(default_factory=list)
    """The Authorization header per request (None: none sent)."""


class AssetServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.files: dict[str, Served] = {}
        self.log = Log()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                server._get(self)

        self.host = host
        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}/{path.lstrip('/')}"

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.lstrip("/")
        rng = h.headers.get("Range")
        with self.lock:
            self.log.requests.append((path, rng))
            self.log.authorization.append(h.headers.get("Authorization"))
            index = len(self.log.sent)
            self.log.sent.append(0)
            served = self.files.get(path)
            if served is not None and served.fail_first > 0:
                served.fail_first -= 1
                fail = True
            else:
                fail = False
        if served is None or served.status is not None or fail:
            code = 404 if served is None else (served.status or 503)
            h.send_response(code)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if served.redirect_to is not None:
            h.send_response(302)
            h.send_header("Location", served.redirect_to)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        body = served.body
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if served.ranges and match is not None:
            start = int(match.group(1))
            if start >= len(body):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(body)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            h.send_response(200)
        h.send_header("Content-Length", str(len(body) - start))
        for name, value in served.headers.items():
            h.send_header(name, value)
        h.end_headers()
        cut = served.cut_after
        served.cut_after = None
        pos = start
        try:
            while pos < len(body):
                end = min(pos + served.chunk, len(body))
                if cut is not None and end - start > cut:
                    end = start + cut
                    h.wfile.write(body[pos:end])
                    with self.lock:
                        self.log.sent[index] += end - pos
                    h.wfile.flush()
                    h.close_connection = True
                    return
                h.wfile.write(body[pos:end])
                with self.lock:
                    self.log.sent[index] += end - pos
                pos = end
                if served.delay_per_chunk:
                    time.sleep(served.delay_per_chunk)
        except (BrokenPipeError, ConnectionResetError):
            return

    def gets(self, path: str) -> int:
        return sum(1 for p, _ in self.log.requests if p == path)


@contextmanager
def asset_server(host: str = "127.0.0.1") -> Iterator[AssetServer]:
    """A server on ``host`` (another loopback address, 127.0.0.2, is another host)."""
    s = AssetServer(host)
    s.thread.start()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()
