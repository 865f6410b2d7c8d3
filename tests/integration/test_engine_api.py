"""The runner's own Engine API client (runner/backends/docker.py) against the real engine:
endpoints from DOCKER_HOST, errors, and the calls no job test looks at directly.

The tests that need no engine are in tests/unit/test_engine_api.py."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends.base import ContainerSpec
from runner.backends.docker import DockerBackend
from runner.backends.types import Limits
from runner.core.errors import ContainerVanished
from tests.support import SESSION_ID, SESSION_LABEL

MIB = 1024 * 1024


@pytest.fixture
def tcp_engine() -> Iterator[str]:
    """The local engine's socket, forwarded to a loopback TCP port (as a tcp:// engine)."""

    class Forward(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect("/var/run/docker.sock")

            def pump(src: socket.socket, dst: socket.socket) -> None:
                try:
                    while data := src.recv(65536):
                        dst.sendall(data)
                except OSError:
                    pass
                finally:
                    dst.shutdown(socket.SHUT_WR)

            back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
            back.start()
            pump(self.request, upstream)
            back.join(timeout=30)
            upstream.close()

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.docker
def test_a_tcp_engine_answers_as_the_socket_does(tcp_engine: str, image_id: str) -> None:
    local, remote = DockerBackend(), DockerBackend(base_url=tcp_engine)
    assert remote.architecture() == local.architecture() != ""
    info = remote.inspect_image(image_id)
    assert info is not None and info.id == image_id
    assert remote.inspect_image("sha256:" + "0" * 64) is None


def _spec(image_id: str, command: list[str]) -> ContainerSpec:
    limits = Limits(
        cpus=1,
        memory_bytes=256 * MIB,
        memory_swap_bytes=256 * MIB,
        shm_bytes=64 * MIB,
        pids=64,
        tmpfs_bytes=16 * MIB,
        gpus="none",
        network="none",
        timeout_seconds=60,
    )
    return ContainerSpec(
        name=f"runner-test-engine-api-{uuid.uuid4().hex[:8]}",
        image=image_id,
        entrypoint=["/bin/sh", "-c"],
        command=command,
        user="10001:10001",
        working_dir="/",
        environment={"GREETING": "hello"},
        labels={SESSION_LABEL: SESSION_ID},
        mounts=[],
        limits=limits,
    )


@pytest.mark.docker
def test_container_lifecycle_and_the_engine_log(tmp_path: Path, image_id: str) -> None:
    """create, start, wait, inspect, the engine's log (stdout and stderr demultiplexed, capped)
    and remove; a removed container is ContainerVanished, and removing it again is no error."""
    backend = DockerBackend()
    script = 'echo "$GREETING out"; echo "err line" >&2; exit 3'
    cid = backend.create(_spec(image_id, [script]))
    try:
        backend.start(cid)
        assert backend.wait(cid, 60) == 3
        state = backend.state(cid)
        assert (state.running, state.exit_code, state.id) == (False, 3, cid)
        log = tmp_path / "engine.log"
        size = backend.save_logs(cid, log, 1 << 20)
        text = log.read_text()
        assert size == len(log.read_bytes())
        assert "hello out\n" in text and "err line\n" in text
        assert text.split(" ", 1)[0].startswith("20")  # each line starts with its timestamp
        assert backend.save_logs(cid, log, 10) == 10 and len(log.read_bytes()) == 10
        assert [c.id for c in backend.find({SESSION_LABEL: SESSION_ID})] == [cid]
    finally:
        backend.remove(cid)
    with pytest.raises(ContainerVanished):
        backend.state(cid)
    backend.remove(cid)


def test_the_engines_oom_event_of_a_container(image_id: str) -> None:
    """``oom_logged``: the engine's ``oom`` event of a container its memory cap killed is
    found (the runner asks for it when a job ended by SIGKILL without OOMKilled: Docker sets
    the flag only when the event reaches it before the exit's), and none of one that ended
    by its own SIGKILL."""
    backend = DockerBackend()
    since = time.time() - 1
    hog = "python3 -c 'b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))'"
    for script, oom in ((hog, True), ("kill -9 $$", False)):
        cid = backend.create(_spec(image_id, [script]))
        try:
            backend.start(cid)
            assert backend.wait(cid, 60) == 137
            assert backend.oom_logged(cid, since) is oom, script
        finally:
            backend.remove(cid)
