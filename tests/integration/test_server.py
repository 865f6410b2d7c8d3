"""`runner serve`: `runner run` and `runner verify` handed to a warm server, on the real engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    session_containers,
    signal_when_running,
    start_job,
    wait_running,
    write_contract,
)

pytestmark = pytest.mark.docker

EVALUATE = (
    "python3 /job/input/repository/evaluate.py --checkpoint /job/input/repository/checkpoint.json"
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A running `runner serve`; the environment that points clients at it, and its log."""
    env = {**os.environ, "RUNNER_SERVER": str(tmp_path / "s.sock")}
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve"], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.05)
        assert (tmp_path / "s.sock").stat().st_mode & 0o777 == 0o600
        yield env, log
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert not (tmp_path / "s.sock").exists()


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _job_args(state: Path) -> list[str]:
    return [
        "--state-dir",
        str(state),
        "--allow-unsigned",
        "--label",
        f"{SESSION_LABEL}={SESSION_ID}",
    ]


def test_run_and_verify_through_the_server(
    tmp_path: Path, image_id: str, served: tuple[dict[str, str], Path]
) -> None:
    """The same envelope, output streams and exit codes as in-process, and the server's log
    shows the requests were its own."""
    env, log = served
    contract = write_contract(tmp_path, image_id)
    state = tmp_path / "state"
    machine = _run(env, "run", str(contract), "--json", *_job_args(state))
    assert machine.returncode == 0, machine.stderr[-3000:]
    envelope = json.loads(machine.stdout)
    assert envelope["status"] == "succeeded" and envelope["measurements"][0]["value"] == 0.819
    people = _run(env, "run", str(contract), "--rerun", *_job_args(state))
    assert people.returncode == 0, people.stderr[-3000:]
    assert "toy-accuracy" in people.stdout and "==> container" in people.stderr
    verified = _run(env, "verify", str(contract), "--allow-unsigned")
    assert verified.returncode == 0 and verified.stdout.startswith("ok: ")
    broken = json.loads(contract.read_text())
    broken["contractDigest"] = "sha256:" + "0" * 64
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    refused = _run(env, "run", str(tmp_path / "broken.json"), "--json", *_job_args(state))
    assert refused.returncode == 3
    assert json.loads(refused.stdout)["failure"]["category"] == "invalid_contract"
    assert _run(env, "run", "--no-such-option").returncode == 2
    served_lines = [line for line in log.read_text().splitlines() if ": runner " in line]
    assert len(served_lines) == 5, log.read_text()
    assert session_containers() == []


def test_ctrl_c_on_a_client_cancels_its_job(
    tmp_path: Path, image_id: str, served: tuple[dict[str, str], Path]
) -> None:
    env, _ = served
    contract = write_contract(tmp_path, image_id, command=["sleep", "120"])
    client = start_job(contract, tmp_path / "s", env=env)
    out, err = signal_when_running(client, signal.SIGINT)
    assert client.returncode == 130, err[-3000:]
    envelope = json.loads(out)
    assert envelope["failure"]["category"] == "cancelled"
    assert envelope["container"]["stoppedByRunner"] is True
    assert session_containers() == []


def test_a_killed_client_leaves_its_job_to_finish(
    tmp_path: Path, image_id: str, served: tuple[dict[str, str], Path]
) -> None:
    """kill -9 of a client does not stop its job: it ends, and the next run prints its
    envelope."""
    env, _ = served
    contract = write_contract(tmp_path, image_id, command=["sh", "-c", f"sleep 3; {EVALUATE}"])
    state = tmp_path / "state"
    client = start_job(contract, state, env=env)
    wait_running(client)
    client.kill()
    client.wait()
    deadline = time.monotonic() + 120
    while session_containers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_containers() == []
    again = _run(env, "run", str(contract), "--json", *_job_args(state))
    assert again.returncode == 0, again.stderr[-3000:]
    envelope = json.loads(again.stdout)
    assert envelope["status"] == "succeeded" and envelope["measurements"][0]["value"] == 0.819
    assert "already finished" in again.stderr


def test_a_server_running_other_code_is_not_used(
    served: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """A request whose code fingerprint differs is answered `stale`; the real client then runs
    the command itself and says why."""
    env, _ = served
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(env["RUNNER_SERVER"])
    request = {"argv": ["parsers"], "cwd": "/", "env": {}, "code": "another checkout"}
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    assert "stale" in json.loads(conn.makefile().readline())
    conn.close()


def test_no_server_or_a_dead_one_means_in_process(tmp_path: Path, image_id: str) -> None:
    """No socket, a socket nobody listens on, or RUNNER_SERVER=off: the command runs here."""
    contract = write_contract(tmp_path, image_id)
    dead = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(dead))
    listener.close()  # the file stays, nobody listens
    for value in (str(tmp_path / "none.sock"), str(dead), "off"):
        env = {**os.environ, "RUNNER_SERVER": value}
        proc = _run(env, "verify", str(contract), "--allow-unsigned")
        assert proc.returncode == 0 and proc.stdout.startswith("ok: "), (value, proc.stderr)
