#!/usr/bin/env python3
"""Serve a folder over HTTP on loopback, with Range requests (resumable downloads), for trying
assets locally: `runner fetch` and `runner run` fetch from it as from any asset host.

    scripts/serve_assets.py examples/asset-evaluation/served --port 8765

Only files directly or below the folder are served (no link followed, no '..'); GET and HEAD;
``Range: bytes=N-`` and ``bytes=N-M`` answered with 206. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import stat
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 1024 * 1024


def make_handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _file(self) -> tuple[int, int] | None:
            rel = unquote(urlsplit(self.path).path).lstrip("/")
            parts = [p for p in rel.split("/") if p not in ("", ".")]
            if not parts or ".." in parts:
                return None
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for name in parts[:-1]:
                    nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    os.close(fd)
                    fd = nxt
                f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            except OSError:
                return None
            finally:
                os.close(fd)
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode):
                os.close(f)
                return None
            return f, st.st_size

        def _answer(self, body: bool) -> None:
            found = self._file()
            if found is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            fd, size = found
            with os.fdopen(fd, "rb") as f:
                start, end = 0, size - 1
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if m:
                    start = int(m.group(1))
                    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                    if start >= size or start > end:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    self.send_response(200)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start + 1))
                self.end_headers()
                if not body:
                    return
                f.seek(start)
                left = end - start + 1
                while left > 0 and (chunk := f.read(min(CHUNK, left))):
                    self.wfile.write(chunk)
                    left -= len(chunk)

        def do_GET(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write(f"serve_assets: {self.address_string()} {fmt % args}\n")

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--bind", default="127.0.0.1", help="address (default: loopback only)")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.bind, args.port), make_handler(args.folder.resolve()))
    print(f"serving {args.folder} on http://{args.bind}:{server.server_address[1]}/", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
