"""The egress proxy program itself (``images/proxy/egress-proxy``), run as a process on
loopback with test hosts of its own (no engine): what it lets through, what it refuses, that
the bytes of a tunnel arrive whole, and that its log reads back into the envelope's records.
The same program in its image, between containers, is tested in tests/test_egress.py.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.proxylog import read_log

PROXY = Path(__file__).parents[1] / "images" / "proxy" / "egress-proxy"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/bytes/"):
            size = int(self.path.split("/")[2])
            body = bytes(range(256)) * (size // 256)
        else:
            seen = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
            body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Proxy:
    port: int
    upstream: int
    """A test host's port on 127.0.0.1, reachable as ``localhost``."""
    process: subprocess.Popen[bytes]

    def ask(self, head: bytes, *, read_all: bool = True) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(head)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
                if not read_all and b"\r\n\r\n" in got:
                    break
            return got

    def log(self) -> str:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        return out.decode()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    rules = {"lease": "L1", "allow": [f"localhost:{port}"]}
    env = {
        "EGRESS_RULES": json.dumps(rules),
        "EGRESS_CLIENTS": "127.0.0.0/8",
        "EGRESS_ADDRESS": "127.0.0.1",
        "EGRESS_PORT": "0",
        "PATH": os.environ["PATH"],
    }
    process = subprocess.Popen([sys.executable, "-I", str(PROXY)], env=env, stdout=subprocess.PIPE)
    assert process.stdout is not None
    first = process.stdout.readline().decode()
    assert first.startswith("egress-proxy: accepting connections on port ")
    try:
        yield Proxy(int(first.rsplit(" ", 1)[1]), port, process)
    finally:
        process.kill()
        process.wait()
        server.shutdown()


def test_a_tunnel_to_an_allowed_pair_carries_every_byte(proxy: Proxy) -> None:
    size = 3 * 1024 * 1024 + 512
    head = f"CONNECT localhost:{proxy.upstream} HTTP/1.1\r\n\r\n".encode()
    request = f"GET /bytes/{size} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    got = proxy.ask(head + request)  # the request follows the CONNECT in one write
    assert got.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
    body = got.split(b"\r\n\r\n", 2)[2]
    assert body == bytes(range(256)) * (size // 256)
    [c] = read_log(proxy.log())
    assert (c.method, c.host, c.port, c.decision, c.detail) == (
        "CONNECT",
        "localhost",
        proxy.upstream,
        "allowed",
        "connected",
    )


def test_plain_http_is_forwarded_once_without_the_proxy_headers(proxy: Proxy) -> None:
    got = proxy.ask(
        f"GET http://LOCALHOST:{proxy.upstream}/a?b=1 HTTP/1.1\r\nHost: localhost\r\n"
        "Proxy-Authorization: secret\r\nConnection: keep-alive\r\n\r\n".encode()
    )
    assert got.startswith(b"HTTP/1.1 200 OK")
    seen = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert seen["path"] == "/a?b=1"
    assert "proxy-authorization" not in seen["headers"]
    assert seen["headers"]["connection"] == "close"


@pytest.mark.parametrize(
    ("head", "status", "detail"),
    [
        (b"CONNECT other.test:{up} HTTP/1.1", b"403", "not on the allowlist"),  # another host
        (b"CONNECT localhost:1 HTTP/1.1", b"403", "port not allowed"),  # another port
        (b"CONNECT 127.0.0.1:{up} HTTP/1.1", b"403", "not on the allowlist"),  # an IP literal
        (b"CONNECT localhost.:{up} HTTP/1.1", b"403", "not on the allowlist"),  # not whole
        (b"CONNECT localhost:{up}/x HTTP/1.1", b"400", "bad request"),
        (b"CONNECT localhost HTTP/1.1", b"400", "bad request"),  # no port
        (b"CONNECT [::1]:{up} HTTP/1.1", b"400", "bad request"),
        (b"GET http://localhost:{up}@other.test:443/ HTTP/1.1", b"400", "bad request"),
        (b"GET http://other.test:{up}/ HTTP/1.1", b"403", "not on the allowlist"),
        (b"GET / HTTP/1.1\r\nHost: localhost:{up}", b"400", "not an HTTP proxy request"),
        (b"GET https://localhost:{up}/ HTTP/1.1", b"400", "not an HTTP proxy request"),
        (b"GARBAGE", b"400", "bad request"),
        (b"CONNECT localhost:{up} HTTP/1.1\r\nX: " + b"a" * 20000, b"400", "bad request"),
    ],
)
def test_everything_else_is_refused_and_logged(
    proxy: Proxy, head: bytes, status: bytes, detail: str
) -> None:
    got = proxy.ask(head.replace(b"{up}", str(proxy.upstream).encode()) + b"\r\n\r\n")
    assert got.split(b" ")[1] == status
    [c] = read_log(proxy.log())
    assert (c.decision, c.detail) == ("refused", detail)


def test_its_log_is_one_lease_and_forges_nothing(proxy: Proxy) -> None:
    """A request line with a newline and a fake JSON line in it stays inside its own line;
    lines of another lease are not this attempt's."""
    forged = '\n{"id":99,"lease":"L1","event":"request","method":"GET","target":"x"}'
    proxy.ask(f"GET http://other.test:443/{forged} HTTP/1.1\r\n\r\n".encode())
    text = proxy.log()
    [c] = read_log(text)
    assert c.decision == "refused"
    assert read_log(text, "L2") == [] and len(read_log(text, "L1")) == 1
    assert read_log(text + '\n2026-12-01T00:00:00Z {"id":7,"event":"request"}')[1:] == [
        read_log('{"id":7,"event":"request"}')[0]
    ]


def test_an_abandoned_request_is_incomplete() -> None:
    line = '{"id":3,"lease":"L","event":"request","method":"CONNECT","target":"a:1","at":"T"}'
    [c] = read_log(line + "\nnot json\n{}\n")
    assert (c.method, c.decision, c.detail, c.at) == ("CONNECT", "incomplete", "no outcome", "T")
