"""The runner's own Engine API client (runner/backends/docker.py) against the real engine:
endpoints from DOCKER_HOST, errors, and the calls no job test looks at directly.

The tests that need the engine are in tests/integration/test_engine_api.py."""

from __future__ import annotations

import socket

import pytest

from runner.backends.docker import DockerBackend
from runner.core.errors import EngineUnavailable


def test_an_ssh_engine_is_refused_with_a_hint() -> None:
    with pytest.raises(EngineUnavailable, match="only unix:// and tcp://") as err:
        DockerBackend(base_url="ssh://user@host")
    assert "ssh -L" in (err.value.hint or "")


def test_a_closed_tcp_port_is_engine_unavailable() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EngineUnavailable, match=r"cannot be reached .*ConnectionRefusedError"):
        DockerBackend(base_url=f"tcp://127.0.0.1:{port}").ping()
