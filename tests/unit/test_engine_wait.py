"""A watched container's wait, kept open between the watch's ticks
(runner/backends/transport.py ``KeptRequests``, ``KeptAnswer``), against scripted engines on
a Unix socket: one request for a job's whole run, however the engine sends its answer, and
never a job that looks as if it still ran after its answer came.

The real engines' waits run in every integration test that runs a job."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.backends.docker import DockerBackend
from runner.backends.podman import PodmanBackend
from runner.core.errors import ContainerVanished, EngineUnavailable
from tests.support.engine_socket import UnixEngine

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
"""What Docker sends as soon as it has registered a wait (the body comes when it ends)."""


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


EXITED_3 = chunked(b'{"Error":null,"StatusCode":3}\n')

Script = Callable[[socket.socket, threading.Event], None]
"""What the engine does on one wait request's connection (the request read already)."""


class ScriptedEngine(UnixEngine):
    """An Engine API on a Unix socket: ``/_ping`` and a removal answered, each wait request
    handed to the next of ``scripts`` (the last one repeats); it counts the wait requests it
    got and notes when a connection it served was ended by the runner."""

    def __init__(self, path: Path, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.waits = 0
        self.closed_by_runner = threading.Event()
        self.release = threading.Event()
        """Set by a test: a script waiting for it sends the end of its answer."""
        super().__init__(path)

    def answer(self, conn: socket.socket, line: bytes) -> None:
        if line.startswith(b"DELETE "):
            conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            return
        if b"/wait" not in line:
            super().answer(conn, line)
            return
        self.waits += 1
        self.scripts[min(self.waits, len(self.scripts)) - 1](conn, self.release)
        conn.settimeout(30)
        if conn.recv(1) == b"":  # the runner ended the request
            self.closed_by_runner.set()

    def close(self) -> None:
        self.release.set()
        super().close()


def headers_then_end(conn: socket.socket, release: threading.Event) -> None:
    """Docker's way: the headers at once, the body when the test says the job ended."""
    conn.sendall(HEAD)
    release.wait(30)
    conn.sendall(EXITED_3)


def all_at_once(conn: socket.socket, release: threading.Event) -> None:
    """A container that had ended already: headers and body in one write."""
    conn.sendall(HEAD + EXITED_3)


def nothing_then_end(conn: socket.socket, release: threading.Event) -> None:
    """An engine that sends nothing until the end (Podman's may)."""
    release.wait(30)
    conn.sendall(HEAD + EXITED_3)


def hang_up(conn: socket.socket, release: threading.Event) -> None:
    """An engine that ends the request unanswered (a restart, a limit of its own)."""
    conn.sendall(HEAD)
    conn.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def engine(short_dir: Path, *scripts: Script) -> Iterator[tuple[ScriptedEngine, DockerBackend]]:
    e = ScriptedEngine(short_dir / "engine.sock", *scripts)
    try:
        yield e, DockerBackend(f"unix://{e.path}", timeout=5)
    finally:
        e.close()


def ticks_until(backend: DockerBackend, limit: float = 20) -> tuple[int | None, int]:
    """Wait as the watch loop does (0.05 s ticks) until an exit code or ``limit`` seconds;
    the code and the ticks it took."""
    began, ticks = time.monotonic(), 0
    while time.monotonic() - began < limit:
        ticks += 1
        code = backend.wait("c1", 0.05)
        if code is not None:
            return code, ticks
    return None, ticks


def test_a_running_job_costs_one_wait_request_for_all_its_ticks(short_dir: Path) -> None:
    """Before, every tick (five a second) sent a wait request on a new connection."""
    with engine(short_dir, headers_then_end) as (e, backend):
        for _ in range(10):
            assert backend.wait("c1", 0.02) is None
        assert e.waits == 1
        e.release.set()
        assert ticks_until(backend)[0] == 3
        assert e.waits == 1


def test_an_answer_that_came_with_its_headers_is_seen_at_once(short_dir: Path) -> None:
    """Headers and body in one write land in http.client's buffer, not the socket: a look at
    the socket alone would say "still running" until the budget's end."""
    with engine(short_dir, all_at_once) as (e, backend):
        assert backend.wait("c1", 2) == 3
        assert e.waits == 1


def test_an_engine_silent_until_the_end_is_waited_for(short_dir: Path) -> None:
    with engine(short_dir, nothing_then_end) as (e, backend):
        for _ in range(5):
            assert backend.wait("c1", 0.02) is None
        e.release.set()
        assert ticks_until(backend)[0] == 3
        assert e.waits == 1


def hang_up_later(conn: socket.socket, release: threading.Event) -> None:
    """The headers; at the test's word, the connection ended unanswered."""
    conn.sendall(HEAD)
    release.wait(30)
    conn.shutdown(socket.SHUT_RDWR)


def cut_short(conn: socket.socket, release: threading.Event) -> None:
    """The headers; at the test's word, the end's first bytes, then nothing."""
    conn.sendall(HEAD)
    release.wait(30)
    conn.sendall(b"1e\r\n")
    time.sleep(30)


@pytest.mark.parametrize("kept", [hang_up_later, cut_short])
def test_a_kept_request_ended_unanswered_or_cut_short_is_asked_again(
    short_dir: Path, kept: Script
) -> None:
    """A kept request that ends unanswered is asked again, not taken as the engine gone; one
    cut short (found by the review: the end's first bytes, then a stall) is asked again at
    the next look, not left until the job's deadline. A new request is answered at once."""
    with engine(short_dir, kept, all_at_once) as (e, backend):
        assert backend.wait("c1", 0.02) is None
        e.release.set()
        assert ticks_until(backend)[0] == 3
        assert e.waits == 2


def test_a_fresh_request_the_engine_ends_unanswered_is_the_engine_failing(
    short_dir: Path,
) -> None:
    with engine(short_dir, hang_up) as (e, backend):
        with pytest.raises(EngineUnavailable, match="waiting for the job container"):
            backend.wait("c1", 2)
        assert e.waits == 1


def test_a_wait_for_a_container_that_is_gone_says_so(short_dir: Path) -> None:
    def gone(conn: socket.socket, release: threading.Event) -> None:
        body = b'{"message":"No such container: c1"}'
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    with engine(short_dir, gone) as (_, backend), pytest.raises(ContainerVanished):
        backend.wait("c1", 1)


def test_removing_the_container_ends_its_kept_request(short_dir: Path) -> None:
    def headers_only(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD)

    with engine(short_dir, headers_only) as (e, backend):
        assert backend.wait("c1", 0.02) is None
        backend.remove("c1")
        assert e.closed_by_runner.wait(10)


def test_an_answer_that_trickles_never_holds_a_look_past_its_time(short_dir: Path) -> None:
    """A begun answer must end within the call's own time, as every call's must: a trickle
    cannot hold the watch loop (a look at the deadline waits 0.01 s), and the request that
    trickled is not kept (the next look asks anew)."""

    def trickle(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD + b"40\r\n")
        for _ in range(600):
            if release.wait(0.05):
                return
            conn.sendall(b" ")

    with engine(short_dir, trickle) as (e, backend):
        for _ in range(5):
            began = time.monotonic()
            assert backend.wait("c1", 0.1) is None
            assert time.monotonic() - began < 3  # 0.1 s and the read floor; a load adds some
        assert e.waits == 5


def test_a_stalled_status_line_is_not_waited_for_past_the_look(short_dir: Path) -> None:
    """Found by the review: a status line and then nothing held a look for the backend's
    whole timeout (60 s by default), past the job's deadline, then failed the job."""

    def stall(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        release.wait(30)

    with engine(short_dir, stall) as (_, backend):
        backend = DockerBackend(backend._url, timeout=30)
        began = time.monotonic()
        assert backend.wait("c1", 0.2) is None
        assert time.monotonic() - began < 10


def test_a_kept_request_that_went_silent_is_sent_anew_when_old(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the review: a connection that died without a word (a network's idle drop)
    was kept for the whole run, the end never seen. Now a kept request is sent anew once
    ``KEPT_SECONDS`` old (10 s; here 0.3 s)."""
    from runner.backends import transport

    monkeypatch.setattr(transport, "KEPT_SECONDS", 0.3)

    def silent(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD)
        time.sleep(30)

    with engine(short_dir, silent, all_at_once) as (e, backend):
        assert backend.wait("c1", 0.02) is None
        code, _ = ticks_until(backend, limit=10)
        assert code == 3
        assert e.waits == 2


def test_an_answer_past_the_cap_is_refused(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.backends import transport

    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1024)

    def big(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD + chunked(b'{"StatusCode":3,"pad":"' + b"a" * 4096 + b'"}'))

    with (
        engine(short_dir, big) as (_, backend),
        pytest.raises(EngineUnavailable, match="more than 1,024 bytes"),
    ):
        backend.wait("c1", 2)


def test_podmans_wait_keeps_its_request_too(short_dir: Path) -> None:
    def libpod(conn: socket.socket, release: threading.Event) -> None:
        release.wait(30)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n7\n")

    e = ScriptedEngine(short_dir / "podman.sock", libpod)
    try:
        backend = PodmanBackend(f"unix://{e.path}", timeout=5)
        for _ in range(5):
            assert backend.wait("c1", 0.02) is None
        e.release.set()
        code, _ = ticks_until(backend)
        assert code == 7
        assert e.waits == 1
    finally:
        e.close()


def test_a_trickled_chunk_line_never_holds_a_look_past_its_time(short_dir: Path) -> None:
    """Found by the second review: the end's chunk-size line sent a byte every 30 ms held one
    look as long as the trickle lasted (one read of it gave every receive its whole time
    again). Now every receive of a body shares the look's end."""

    def trickle_line(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD)
        release.wait(30)
        conn.sendall(b"1e;")
        for _ in range(300):
            time.sleep(0.03)
            conn.sendall(b"x")

    with engine(short_dir, trickle_line) as (e, backend):
        assert backend.wait("c1", 0.02) is None
        e.release.set()
        time.sleep(0.1)
        began = time.monotonic()
        assert backend.wait("c1", 0.2) is None
        assert time.monotonic() - began < 3  # the trickle lasts 9 s


def test_connecting_to_an_engine_that_does_not_accept_ends_with_the_look() -> None:
    """Found by the second review: a new request connected under the backend's whole timeout
    (60 s by default), so a tcp:// engine whose backlog is full held each look that long."""
    from runner.backends import transport

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    url = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    transport.KNOWN[(url, "prefix")] = "/v1.41"
    filled = []
    try:
        for _ in range(8):  # fill the backlog: a further connect waits for its SYN's answer
            s = socket.socket()
            s.settimeout(0.3)
            try:
                s.connect(server.getsockname())
            except OSError:
                s.close()
                break
            filled.append(s)
        backend = DockerBackend(url, timeout=30)
        began = time.monotonic()
        assert backend.wait("c1", 0.2) is None
        assert time.monotonic() - began < 10
    finally:
        transport.KNOWN.pop((url, "prefix"), None)
        for s in filled:
            s.close()
        server.close()


def test_a_removal_during_a_look_ends_the_request_that_look_holds(short_dir: Path) -> None:
    """Found by the second review: the look holds its request out of the kept ones, so a
    removal by another thread (the lease's) found nothing, and the look kept it after."""

    def headers_only(conn: socket.socket, release: threading.Event) -> None:
        conn.sendall(HEAD)

    with engine(short_dir, headers_only) as (e, backend):
        assert backend.wait("c1", 0.01) is None
        look = threading.Thread(target=backend.wait, args=("c1", 0.5))
        look.start()
        time.sleep(0.1)
        backend.remove("c1")
        look.join()
        assert e.closed_by_runner.wait(10)
        assert backend.wait("c1", 0.01) is None  # a later look asks anew
        assert e.waits == 2


def test_an_old_kept_request_is_read_before_it_is_sent_anew(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the second review: at the deadline's look (0.01 s) an old request was sent
    anew with its answer unread in the socket, so a job that had ended read as timed out."""
    from runner.backends import transport

    monkeypatch.setattr(transport, "KEPT_SECONDS", 0.3)

    def slow_fresh(conn: socket.socket, release: threading.Event) -> None:
        time.sleep(0.5)
        conn.sendall(HEAD + EXITED_3)

    with engine(short_dir, headers_then_end, slow_fresh) as (e, backend):
        assert backend.wait("c1", 0.02) is None
        e.release.set()
        time.sleep(0.5)
        assert backend.wait("c1", 0.01) == 3
        assert e.waits == 1
