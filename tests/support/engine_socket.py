"""Scripted Engine APIs on a Unix socket, for the engine client's tests: a base that accepts
each connection in a thread of its own, reads the request's head and hands it to
:meth:`UnixEngine.answer`, and the short folder a socket's path needs (at most 107 bytes)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def short_folder(prefix: str = "engine-") -> Iterator[Path]:
    """A fresh folder under /tmp (a short path, for Unix sockets), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class UnixEngine:
    """An Engine API listening on ``path``: every connection is read up to its request's
    head and answered by :meth:`answer`, each in a thread of its own; ``/_ping`` is answered
    with API version 1.41 unless a subclass answers it itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.closed = threading.Event()
        """Set by :meth:`close`: a script that waits on it ends."""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a client that stops reading: its choice
            request = b""
            while b"\r\n\r\n" not in request:
                got = conn.recv(65536)
                if not got:
                    return
                request += got
            self.answer(conn, request.split(b"\r\n", 1)[0])

    def answer(self, conn: socket.socket, line: bytes) -> None:
        """Answer the request whose first line is ``line`` on ``conn``."""
        if b"/_ping" in line:
            conn.sendall(b"HTTP/1.1 200 OK\r\nAPI-Version: 1.41\r\nContent-Length: 2\r\n\r\nOK")

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
