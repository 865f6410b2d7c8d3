"""`runner serve`: `runner run` and `runner verify` handed to a warm server, on the real engine."""

from __future__ import annotations

import contextlib
import json
import os
import re
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


@contextlib.contextmanager
def _serving(tmp_path: Path, *flags: str) -> Iterator[tuple[dict[str, str], Path]]:
    """A running `runner serve` (its interpreter given ``flags``); the environment that points
    clients at it, and its log."""
    env = {**os.environ, "RUNNER_SERVER": str(tmp_path / "s.sock")}
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, *flags, "-m", "runner", "serve"], env=env, stdout=sink, stderr=sink
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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A running `runner serve`; the environment that points clients at it, and its log."""
    with _serving(tmp_path) as found:
        yield found


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


def test_a_served_job_imports_nothing_the_server_did_not(tmp_path: Path, image_id: str) -> None:
    """Every module a served `runner run` or `runner verify` needs is imported once, by the
    server before it forks (runner.app.warmup), not again by each fork: the server runs with
    ``-X importtime``, whose lines a fork writes to its client's stderr."""
    contract = write_contract(tmp_path, image_id)
    with _serving(tmp_path, "-X", "importtime") as (env, log):
        ran = _run(env, "run", str(contract), "--json", *_job_args(tmp_path / "state"))
        verified = _run(env, "verify", str(contract), "--allow-unsigned")
    assert "import time:" in log.read_text()  # the flag took: the server's own imports
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["status"] == "succeeded"
    assert verified.returncode == 0, verified.stderr[-3000:]
    for proc in (ran, verified):
        imports = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
        assert imports == [], "\n".join(imports)
    served_lines = [line for line in log.read_text().splitlines() if ": runner " in line]
    assert len(served_lines) == 2, log.read_text()[-3000:]


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


def _server_pid(log: Path, timeout: float = 60) -> int:
    """The pid a server's log says it listens with, once it does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"listening on .* \(pid (\d+)\)", log.read_text() if log.exists() else "")
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no server listened: {log.read_text() if log.exists() else ''}")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_autoserve_starts_one_server_that_later_commands_use(tmp_path: Path, image_id: str) -> None:
    """RUNNER_AUTOSERVE: clients that find no server run their commands themselves, and
    between them start exactly one server (each tried, one held the lock), in the
    background; the next command is that server's."""
    sock = tmp_path / "s.sock"
    log = tmp_path / "s.sock.log"
    env = {**os.environ, "RUNNER_SERVER": str(sock), "RUNNER_AUTOSERVE": "2m"}
    contract = write_contract(tmp_path, image_id)
    argv = [sys.executable, "-m", "runner", "verify", str(contract), "--allow-unsigned"]
    clients = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(6)
    ]
    pid = None
    try:
        for client in clients:
            out, err = client.communicate(timeout=120)
            assert client.returncode == 0 and out.startswith(b"ok: "), err[-3000:]
        pid = _server_pid(log)
        again = _run(env, "verify", str(contract), "--allow-unsigned")
        assert again.returncode == 0 and again.stdout.startswith("ok: "), again.stderr
        text = log.read_text()
        assert text.count("listening on") == 1, text
        assert f"verify {contract} --allow-unsigned" in text  # served: the server logged it
        assert "stops after 120 s idle" in text
        assert sock.stat().st_mode & 0o777 == 0o600 and log.stat().st_mode & 0o777 == 0o600
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert _gone(pid, 30)
    assert not sock.exists()


def _idle_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, str], Path]:
    """`runner serve --idle-exit 2s` on ``tmp_path/s.sock``: the process, the environment
    that points clients at it, and its log."""
    env = {**os.environ, "RUNNER_SERVER": str(tmp_path / "s.sock")}
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", "--idle-exit", "2s"],
            env=env,
            stdout=sink,
            stderr=sink,
        )
    return server, env, log


def test_an_idle_server_stops_by_itself_and_one_socket_has_one_server(tmp_path: Path) -> None:
    """`runner serve --idle-exit`: a second server on the same socket is refused (exit 2)
    while the first lives; the first, with nothing to do, stops by itself and removes its
    socket; then a server may start there again."""
    first, env, log = _idle_server(tmp_path)
    try:
        assert _server_pid(log) == first.pid
        second = _run(env, "serve")
        assert second.returncode == 2
        assert "already listens" in second.stderr, second.stderr
        assert first.wait(timeout=60) == 0
        assert "stopped after 2 s idle" in log.read_text()
        assert not (tmp_path / "s.sock").exists()
        refused = _run(env, "serve", "--idle-exit", "0")
        assert refused.returncode == 2 and "--idle-exit" in refused.stderr
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_clients_running_other_code_do_not_keep_an_idle_server_up(tmp_path: Path) -> None:
    """A stale request (another checkout's client) is refused and served nothing: a server with
    --idle-exit stops all the same while such requests keep coming (they counted as work,
    and a server no one could use stayed up as long as they came)."""
    sock = tmp_path / "s.sock"
    server, _, log = _idle_server(tmp_path)
    try:
        _server_pid(log)
        refused = 0
        deadline = time.monotonic() + 120
        while server.poll() is None and time.monotonic() < deadline:
            conn = socket.socket(socket.AF_UNIX)
            try:
                conn.connect(str(sock))
                request = {"argv": ["verify"], "cwd": "/", "env": {}, "code": "other"}
                socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
                if "stale" in conn.makefile().readline():
                    refused += 1
            except OSError:
                pass  # the server went between its socket's removal and its end
            finally:
                conn.close()
            time.sleep(0.3)
        assert server.wait(timeout=30) == 0
        assert refused >= 1 and "stopped after 2 s idle" in log.read_text()
        assert "not served (no request, or the client runs it)" in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_slurm_client_that_ends_leaves_the_server_and_its_socket(
    tmp_path: Path, image_id: str, served: tuple[dict[str, str], Path]
) -> None:
    """Under Slurm a served fork cancels its job when its client goes away before the job's
    lock is taken; after the command, the client's leaving raced the fork's reply: the
    fork's SIGTERM to itself, raised as KeyboardInterrupt after the reply and before its
    exit, unwound the fork into the server's own loop, which removed the server's socket (only
    the first jobs on a Slurm node were served). Now every later command is served too."""
    env, log = served
    env = {**env, "SLURM_JOB_ID": "4242"}
    contract = write_contract(tmp_path, image_id)
    for _ in range(6):
        done = _run(env, "verify", str(contract), "--allow-unsigned")
        assert done.returncode == 0 and done.stdout.startswith("ok: "), done.stderr
        assert Path(env["RUNNER_SERVER"]).exists(), log.read_text()
    served_lines = [line for line in log.read_text().splitlines() if ": runner verify" in line]
    assert len(served_lines) == 6, log.read_text()
    assert "exit 130" not in log.read_text()


def test_a_fork_stuck_writing_to_its_client_ends_on_a_cancel(tmp_path: Path) -> None:
    """A served command whose output goes to a pipe no one reads any more blocks in the
    fork's last flush; a cancel then ends the fork with the command's code (it ignored
    cancels there, and only kill -9 freed it and its server's --idle-exit)."""
    from runner.app import server

    ours, theirs = socket.socketpair()
    r, w = os.pipe()  # stdout and stderr of the "client": never read
    pid = os.fork()
    if pid == 0:  # the server's fork, as take() makes it
        try:
            ours.close()

            # As the server's own stdout: a buffered file on descriptor 1, which _handle
            # points at the client's.
            sys.stdout = open(1, "w", buffering=1 << 20, closefd=False)  # noqa: SIM115

            def dispatch(argv: list[str]) -> int:
                print("x" * (1 << 17))  # in the buffer: the fork's last flush blocks on it
                return 0

            server._handle(theirs, "code", dispatch, "test")
        finally:
            os._exit(70)
    theirs.close()
    try:
        request = {"argv": ["verify"], "cwd": "/", "env": {}, "code": "code", "umask": 0o022}
        devnull = os.open(os.devnull, os.O_RDONLY)
        socket.send_fds(ours, [json.dumps(request).encode() + b"\n"], [devnull, w, w])
        os.close(devnull)
        time.sleep(1)  # the fork writes until the pipe is full, then waits in the flush
        ours.sendall(b"cancel\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the fork stayed stuck after a cancel")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        ours.close()
        os.close(r)
        os.close(w)
