"""Hostile review of ``RUNNER_AUTOSERVE`` (runner.client.autostart) and of the client's
server: what another user, a planted file or the client's own environment could make of a
server started on demand, or of a socket someone else listens on. Real files, locks and
sockets; no server is started (Popen recorded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner import client
from runner.app.host import server_lock
from runner.core import locks


def test_a_fifo_or_a_link_at_the_log_starts_nothing_and_frees_the_lock(
    tmp_path: Path, no_spawn: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile: a FIFO planted where the log goes would block the client's open, a link would
    send the server's log elsewhere. Neither: no server, the lock let go, the command runs."""
    sock = tmp_path / "s.sock"
    os.mkfifo(tmp_path / "s.sock.log")
    assert client.autostart(str(sock), "10m") is False
    (tmp_path / "s.sock.log").unlink()
    target = tmp_path / "elsewhere"
    (tmp_path / "s.sock.log").symlink_to(target)
    assert client.autostart(str(sock), "10m") is False
    assert no_spawn == [] and not target.exists()
    assert not locks.is_held(Path(server_lock(str(sock))))
    assert capsys.readouterr().err.count("no server started") == 2


def test_a_socket_path_too_long_starts_nothing(
    tmp_path: Path, no_spawn: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert client.autostart(str(tmp_path / ("x" * 120)), "10m") is False
    assert no_spawn == [] and "too long" in capsys.readouterr().err


def test_never_under_slurm(
    tmp_path: Path, no_spawn: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started inside one Slurm job's allocation would run the node's next jobs there
    too, and end with the first: under Slurm the node's own `runner serve` is the way."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert client.autostart(str(tmp_path / "s.sock"), "10m") is False
    assert no_spawn == [] and not (tmp_path / "s.sock.lock").exists()


@pytest.mark.parametrize("planted", ["folder", "dangling link", "file"])
def test_something_else_than_a_socket_at_the_path_starts_nothing(
    tmp_path: Path, no_spawn: list[list[str]], planted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every server started there would fail at once, for every command: say so instead."""
    sock = tmp_path / "s.sock"
    if planted == "folder":
        sock.mkdir()
    elif planted == "file":
        sock.write_text("")
    else:
        sock.symlink_to(tmp_path / "missing")
    assert client.autostart(str(sock), "10m") is False
    assert no_spawn == [] and "is not a socket" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["lock", "log"])
def test_a_lock_or_log_of_another_user_starts_nothing(
    tmp_path: Path,
    no_spawn: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    which: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hostile: in a shared folder another user could hold `<socket>.lock` (no server ever
    starts, `runner serve` says one is there) or own `<socket>.log` (and read every command
    line served). A file this user does not own is refused, said, and no server is started.
    Another user is this process seen with another effective uid."""
    sock = tmp_path / "s.sock"
    (tmp_path / f"s.sock.{which}").write_text("")
    os.chmod(tmp_path / f"s.sock.{which}", 0o666)  # noqa: S103 - planted by "another user"
    real = os.geteuid()
    opened = {"lock": False}
    from runner.app import host

    if which == "lock":
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    else:
        original = host.open_server_lock

        def then_another_user(path: str) -> int:
            fd = original(path)
            opened["lock"] = True
            monkeypatch.setattr(os, "geteuid", lambda: real + 1)
            return fd

        monkeypatch.setattr(host, "open_server_lock", then_another_user)
    assert client.autostart(str(sock), "10m") is False
    monkeypatch.setattr(os, "geteuid", lambda: real)
    assert no_spawn == [] and "not to this user" in capsys.readouterr().err
    assert which == "lock" or opened["lock"]
    assert not locks.is_held(tmp_path / "s.sock.lock")


def test_the_started_server_keeps_little_of_the_client_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The server imports this client's runner (its folder first on PYTHONPATH, the client's
    own entries made absolute: the server runs in /), and keeps the variables that say how
    to run, never a client's secrets (they would show in /proc/<pid>/environ of the server and
    of every process forked from it, long after that client)."""
    import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("MY_TOKEN", "t")
    monkeypatch.setenv("DOCKER_HOST", "unix:///x.sock")
    monkeypatch.setenv("RUNNER_STATE_DIR", "/state")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("PYTHONPATH", f"lib{os.pathsep}/abs")
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    env = client.server_environment("/run/s.sock", client.runner_folder())
    assert "ANTHROPIC_API_KEY" not in env and "MY_TOKEN" not in env and "SLURM_JOB_ID" not in env
    assert env["DOCKER_HOST"] == "unix:///x.sock" and env["RUNNER_STATE_DIR"] == "/state"
    assert env["LC_ALL"] == "C.UTF-8" and env["RUNNER_SERVER"] == "/run/s.sock"
    assert env["PYTHONUNBUFFERED"] == "1"  # Python's own settings: the forks' streams
    where = str(Path(runner.__file__).resolve().parent.parent)
    assert env["PYTHONPATH"].split(os.pathsep) == [where, str(tmp_path / "lib"), "/abs"]


def test_a_server_of_another_user_is_never_handed_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile: a socket in a shared folder, listened on by another user's process, would be
    handed the client's whole environment and its terminal, and its answer believed. The
    client asks the listener's uid first (SO_PEERCRED) and runs the command itself. Another
    user is this process seen with another effective uid."""
    import socket

    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t")
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    try:
        assert client.try_client(str(path), ["verify", "task.json"]) is None
        conn, _ = listener.accept()
        conn.settimeout(5)
        assert conn.recv(1 << 16) == b""  # closed before a byte was sent
        conn.close()
    finally:
        listener.close()
    assert f"served by uid {real}, not by you" in capsys.readouterr().err
