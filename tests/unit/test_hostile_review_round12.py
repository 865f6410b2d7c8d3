"""The twelfth hostile review (the warm-process path: `runner serve`, its client, the batch):
kept closed. No engine.

What a fork of the server runs with must be what the client's own process would have run with
(its umask, its groups), a request's framing must not be bent by its size or by a cancel sent
right after it, and a batch must reap only its own jobs and never leave one orphaned."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.app import batch, server
from runner.app import standing as standings
from runner.app.standing import same_standing, standing
from runner.client import _request, try_client
from runner.execution import orchestrator

pytestmark = pytest.mark.hostile

FINGERPRINT = "the code"


def _served(
    request: bytes, dispatch: Callable[[list[str]], int], tmp_path: Path
) -> tuple[dict[str, Any], int]:
    """``request`` (with /dev/null as the three descriptors) handed to a fork running the
    server's ``_handle`` over a socket pair; its answer and its exit status."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the fork's own
        ours.close()
        server._handle(theirs, FINGERPRINT, dispatch, "test")
        os._exit(99)  # _handle never returns
    theirs.close()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        socket.send_fds(ours, [request], [null, null, null])
    finally:
        os.close(null)
    reply = ours.makefile("rb").readline()
    ours.close()
    _, status = os.waitpid(pid, 0)
    return json.loads(reply) if reply else {}, os.waitstatus_to_exitcode(status)


def _line(argv: list[str], env: dict[str, str] | None = None, umask: int = 0o022) -> bytes:
    return _request(argv, "/", env or {}, FINGERPRINT, umask)


def test_a_served_command_runs_with_the_clients_umask(tmp_path: Path) -> None:
    """A fork kept the server's umask: a client with umask 077 got its job's folders 0755 and
    its cache's lock files 0644, where the same command run in its own process made them 0700
    and 0600."""
    made = tmp_path / "made"

    def dispatch(argv: list[str]) -> int:
        made.mkdir()
        return 0

    old = os.umask(0o022)  # the server's
    try:
        answer, _ = _served(_line(["run"], umask=0o077), dispatch, tmp_path)
    finally:
        os.umask(old)
    assert answer == {"exit": 0}
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_request_with_no_umask_or_a_wrong_one_runs_nothing(tmp_path: Path) -> None:
    ran: list[list[str]] = []
    for umask in ("0", -1, 0o1000, None, 1.5, True):
        request: dict[str, Any] = {
            "argv": ["run"], "cwd": "/", "env": {}, "code": FINGERPRINT, "umask": umask
        }  # fmt: skip
        answer, code = _served(json.dumps(request).encode() + b"\n", ran.append, tmp_path)  # type: ignore[arg-type]
        assert "umask" in answer["stale"] and code == server.STALE_EXIT, umask
    assert ran == []


def test_a_cancel_sent_right_after_a_large_request_cancels(tmp_path: Path) -> None:
    """A Ctrl-C on a client whose request is large (its environment) sent ``cancel`` in the
    same read as the request's end: the server took it for part of the request (exit 4,
    "Extra data") instead of cancelling (130)."""

    def dispatch(argv: list[str]) -> int:
        time.sleep(30)
        return 0

    env = {f"V{i}": "x" * 50_000 for i in range(6)}  # 300 kB
    started = time.monotonic()
    answer, _ = _served(_line(["run"], env) + b"cancel\n", dispatch, tmp_path)
    assert answer == {"exit": 130}
    assert time.monotonic() - started < 20


def test_a_request_over_the_cap_is_run_by_the_client(tmp_path: Path) -> None:
    """An environment over the cap made the client exit 4 with nothing said (the error went to
    the server's log, and the command was not run); now the server says why it does not run
    it, and the client runs it in its own process, as it would with no server."""
    ran: list[list[str]] = []
    env = {f"V{i}": "\u00e9" * 60_000 for i in range(6)}  # 360 kB, six times that escaped
    answer, code = _served(_line(["verify"], env), ran.append, tmp_path)  # type: ignore[arg-type]
    assert "over 1048576 bytes" in answer["stale"]
    assert code == server.STALE_EXIT and ran == []


def test_a_connection_that_sends_no_request_does_not_hold_a_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork waited for its request for ever: one idle connection held a fork, and an
    ``--idle-exit`` server up, as long as it stayed open."""
    monkeypatch.setattr(server, "_REQUEST_SECONDS", 0.2)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = _fork_handling(theirs, ours)
    try:
        assert _ended(pid, 20) == server.STALE_EXIT  # served nothing; None: it still waits
    finally:
        ours.close()


def _fork_handling(theirs: socket.socket, ours: socket.socket) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the fork's own
        ours.close()
        server._handle(theirs, FINGERPRINT, lambda argv: 0, "test")
        os._exit(99)
    theirs.close()
    return pid


def _ended(pid: int, within: float) -> int | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_request_trickled_in_does_not_hold_a_fork_past_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait for the request was per read: a client sending a byte every few seconds held
    its fork (and an idle server) as long as it liked."""
    monkeypatch.setattr(server, "_REQUEST_SECONDS", 1.0)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = _fork_handling(theirs, ours)
    started, gave_up = time.monotonic(), None
    try:
        for byte in b'{"argv": ["verify"], "cwd": "/", "env": {}}':
            ours.send(bytes([byte]))
            time.sleep(0.2)
    except OSError:  # the fork gave up and closed
        gave_up = time.monotonic() - started
    assert _ended(pid, 10) == server.STALE_EXIT
    ours.close()
    assert gave_up is not None and gave_up < 5


def test_a_client_that_closes_without_a_word_was_not_served() -> None:
    """It was logged as the server failing (JSONDecodeError) and counted as a command served,
    which restarted an idle server's clock."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = _fork_handling(theirs, ours)
    ours.close()
    assert _ended(pid, 10) == server.STALE_EXIT


def _peer_of(path: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """A process started with ``argv`` (a wrapper such as ``unshare -m``) that connects to
    ``path`` and stays connected until its stdin closes."""
    code = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "print('in', flush=True); sys.stdin.read()"
    )
    peer = subprocess.Popen(
        [*argv, sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert peer.stdout is not None and peer.stdout.readline() == b"in\n"
    return peer


@pytest.fixture
def listening(tmp_path: Path) -> tuple[str, socket.socket]:
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(4)
    return path, listener


WRAPPERS = {
    "groups": ["setpriv", "--groups", "4242,4243"],  # the engine's group, say, missing or added
    "gid": ["setpriv", "--regid", "4242", "--keep-groups"],
    "capabilities": ["setpriv", "--inh-caps", "-all", "--bounding-set", "-dac_override"],
    "no-new-privs": ["setpriv", "--no-new-privs"],
    "mount-namespace": ["unshare", "--mount"],  # the engine's socket hidden under another mount
}


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "before-6.5"])
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_a_client_that_may_do_other_things_than_the_server_is_not_served(
    listening: tuple[str, socket.socket], wrapper: str, pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the uid was compared: a process of the same uid without the engine's group, without
    a capability, or with the engine's socket out of its sight had its job run by a server
    that has them, where in its own process it could not reach the engine. Its ids, groups,
    capabilities, no-new-privileges, seccomp, label and namespaces must all be the server's;
    so too on a kernel with no pidfd of a peer (an option it does not know: ENOPROTOOPT)."""
    assert os.geteuid() == 0, "the test suite runs as root (see README, Tests)"
    if not pidfd:
        monkeypatch.setattr(standings, "_SO_PEERPIDFD", 9999)
    path, listener = listening
    request = {"code": FINGERPRINT}
    same = _peer_of(path, [])
    other = _peer_of(path, WRAPPERS[wrapper])
    try:
        conn, _ = listener.accept()
        assert same_standing(conn)
        assert server._not_served(conn, request, [0, 1, 2], FINGERPRINT) is None
        conn, _ = listener.accept()
        assert not same_standing(conn)
        why = server._not_served(conn, request, [0, 1, 2], FINGERPRINT)
        assert why is not None and "may do other things" in why
    finally:
        for peer in (same, other):
            peer.communicate(b"", timeout=30)


def test_a_client_gone_before_it_is_looked_at_is_not_served(
    listening: tuple[str, socket.socket],
) -> None:
    """Its pid may be another process's by then: nothing read of it is believed."""
    path, listener = listening
    gone = _peer_of(path, [])
    conn, _ = listener.accept()
    gone.communicate(b"", timeout=30)
    assert not same_standing(conn)
    assert standing(gone.pid) is None


def test_a_server_that_cannot_read_its_own_standing_serves_no_one(
    listening: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unread on both sides (a server with so many groups that its status was cut short) was
    "the same": every client was served."""
    path, listener = listening
    client = _peer_of(path, [])
    try:
        conn, _ = listener.accept()
        assert same_standing(conn)
        monkeypatch.setattr(standings, "standing", lambda pid="self": None)
        assert not same_standing(conn)
    finally:
        client.communicate(b"", timeout=30)


def test_a_process_name_cannot_forge_a_line_of_its_status() -> None:
    """A process names itself (``/proc/self/comm``); the kernel escapes only a newline there,
    and ``splitlines`` also split at a file separator or a NEL."""
    code = (
        "import sys; open('/proc/self/comm', 'w').write('a\\x1cUid:\\t9 9 9 9'); "
        "print('in', flush=True); sys.stdin.read()"
    )
    named = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert named.stdout is not None and named.stdout.readline() == b"in\n"
        theirs = standing(named.pid)
        assert theirs is not None and theirs["Uid"] == standing()["Uid"]  # type: ignore[index]
    finally:
        named.communicate(b"", timeout=30)


def test_what_is_compared() -> None:
    ours = standing()
    assert ours is not None
    assert {"Uid", "Gid", "Groups", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp", "label",
            "ns mnt", "ns user"} <= set(ours)  # fmt: skip
    assert str(os.getegid()) in ours["Groups"].split()


def test_a_command_line_writes_one_line_of_the_servers_log() -> None:
    """An argument with a newline wrote a line of the log's own (a forged "exit 0")."""
    shown = server._shown(["run", "a.json\nrunner serve: 09:00:00 pid 1: exit 0", "--json"])
    assert "\n" not in shown and shown.startswith("run ") and shown.endswith(" --json")
    assert server._shown(["run", "task.json", "--json"]) == "run task.json --json"


def test_a_client_in_a_removed_folder_runs_the_command_itself(tmp_path: Path) -> None:
    """``os.getcwd()`` raised in the client (rc 1, a traceback) where the command run in its
    own process works."""
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (
        "import os, sys; from runner.client import try_client; os.chdir(sys.argv[1]); "
        "os.rmdir(sys.argv[1]); print(try_client(sys.argv[2], ['verify']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(gone), str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    listener.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
    assert try_client(str(tmp_path / "none.sock"), ["verify"]) is None


def _fake_child(seconds: dict[str, float]) -> Callable[[Path, Any, Path], None]:
    def child(path: Path, options: Any, out: Path) -> None:  # pragma: no cover - a fork's
        def stopped(signum: int, frame: object) -> None:
            (out.parent.parent / f"{path.name}.stopped").write_text("")
            os._exit(0)

        signal.signal(signal.SIGTERM, stopped)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # as _child
        (out.parent.parent / f"{path.name}.pid").write_text(str(os.getpid()))
        time.sleep(seconds[path.name])
        out.write_text(json.dumps({"status": "succeeded", "contract": path.name}))
        os._exit(0)

    return child


def test_a_batch_reaps_only_its_own_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With RUNNER_AUTOSERVE the server a client starts is a child of the batch's process: when
    it stopped (idle), the batch's ``os.wait`` reaped it, took it for a job (KeyError), and
    ended with "internal error", its jobs and their containers left running."""
    monkeypatch.setattr(batch, "_child", _fake_child({"a": 1.0, "b": 1.5}))
    other = subprocess.Popen(["sleep", "0.2"])  # as the server RUNNER_AUTOSERVE starts
    options = orchestrator.RunOptions(state_dir=tmp_path / "state")
    results = batch.run_many([tmp_path / "a", tmp_path / "b"], options, parallel=2)
    assert [r["contract"] for r in results] == ["a", "b"]
    other.wait(timeout=10)


def test_a_batch_that_fails_stops_its_running_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the batch's own loop left its running jobs orphaned (under init, their
    containers running, their results lost with the batch's folder); they are stopped as a
    SIGTERM to the batch stops them, and waited for."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setattr(batch, "_child", _fake_child({"quick": 0.5, "long": 60.0}))
    options = orchestrator.RunOptions(state_dir=tmp_path / "state")

    def done(index: int, path: Path, data: dict[str, Any]) -> None:
        raise RuntimeError("the caller's own bug")

    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(jobs / "batch"))
    (jobs / "batch").mkdir()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="own bug"):
        batch.run_many([jobs / "quick", jobs / "long"], options, parallel=2, on_done=done)
    assert time.monotonic() - started < 30
    assert (jobs / "long.stopped").exists()
    with pytest.raises(ChildProcessError):  # waited for: not even a zombie left
        os.waitpid(int((jobs / "long.pid").read_text()), os.WNOHANG)


class _Interrupted(Exception):
    pass


def test_a_second_signal_stops_a_failed_batch_waiting_for_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that failed waited for its stopped jobs with its own handlers still installed:
    a job that did not end (an engine that hangs its stop) held it, and no Ctrl-C could end
    the wait. The caller's handlers are back before it waits."""
    jobs = tmp_path / "jobs"
    (jobs / "batch").mkdir(parents=True)

    def stubborn(path: Path, options: Any, out: Path) -> None:  # pragma: no cover - a fork's
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        (out.parent.parent / f"{path.name}.pid").write_text(str(os.getpid()))
        time.sleep(0.5 if path.name == "quick" else 120)
        out.write_text("{}")
        os._exit(0)

    def interrupted(signum: int, frame: object) -> None:
        raise _Interrupted

    def done(index: int, path: Path, data: dict[str, Any]) -> None:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        raise RuntimeError("the caller's own bug")

    monkeypatch.setattr(batch, "_child", stubborn)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(jobs / "batch"))
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        options = orchestrator.RunOptions(state_dir=tmp_path / "state")
        started = time.monotonic()

        def send_term(signum: int, frame: object) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the second signal, to the caller's handler

        signal.signal(signal.SIGUSR1, send_term)
        with pytest.raises(_Interrupted):
            batch.run_many([jobs / "quick", jobs / "long"], options, parallel=2, on_done=done)
        assert time.monotonic() - started < 30
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        long = int((jobs / "long.pid").read_text())
        os.kill(long, signal.SIGKILL)
        os.waitpid(long, 0)


def test_a_fork_that_fails_leaves_ctrl_c_to_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT and SIGTERM are held across each fork; a fork that fails (EAGAIN: the user's
    process limit) must not leave them held, or no Ctrl-C would reach the batch again."""

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(batch.os, "fork", no_fork)
    options = orchestrator.RunOptions(state_dir=tmp_path / "state")
    with pytest.raises(BlockingIOError):
        batch.run_many([tmp_path / "a"], options, parallel=1)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.SIGINT not in held and signal.SIGTERM not in held
