"""``RUNNER_AUTOSERVE`` (runner.client.autostart) and when a server with ``--idle-exit`` stops
(runner.app.server.retiring): the decisions, with real lock files and no server started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner import client
from runner.app.host import server_lock
from runner.app.server import retiring
from runner.core import locks


@pytest.mark.parametrize("value", ["", "0", "off", "OFF", " no ", "false"])
def test_off_values_start_nothing(tmp_path: Path, no_spawn: list[list[str]], value: str) -> None:
    assert client.autostart(str(tmp_path / "s.sock"), value) is False
    assert no_spawn == [] and not (tmp_path / "s.sock.lock").exists()


@pytest.mark.parametrize("value", ["soon", "-5", "0s", "10 parsecs", "nan"])
def test_a_value_that_is_no_duration_is_said_and_starts_nothing(
    tmp_path: Path, no_spawn: list[list[str]], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert client.autostart(str(tmp_path / "s.sock"), value) is False
    assert no_spawn == []
    assert "RUNNER_AUTOSERVE" in capsys.readouterr().err


def test_a_held_lock_means_a_server_is_there_or_starting(
    tmp_path: Path, no_spawn: list[list[str]]
) -> None:
    sock = tmp_path / "s.sock"
    held = locks.try_lock(Path(server_lock(str(sock))), opener=locks.open_private_lock_file)
    assert held is not None
    try:
        assert client.autostart(str(sock), "10m") is False
        assert no_spawn == []
    finally:
        locks.release(held)


def test_the_server_is_started_with_the_lock_and_an_absolute_socket(
    tmp_path: Path, no_spawn: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argv of the server started: the idle time as given, the lock's descriptor, -P (no
    runner/ from the working folder); the lock file and the log are the user's alone."""
    monkeypatch.chdir(tmp_path)
    assert client.autostart("relative.sock", " 90s ") is True
    [argv] = no_spawn
    assert argv[1:6] == ["-P", "-m", "runner", "serve", "--idle-exit"]
    assert argv[6] == "90s" and argv[7] == "--lock-fd"
    assert (tmp_path / "relative.sock.lock").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "relative.sock.log").stat().st_mode & 0o777 == 0o600
    assert not locks.is_held(tmp_path / "relative.sock.lock")  # the recorder holds nothing


def test_an_idle_server_stops_only_with_nothing_running() -> None:
    assert retiring(60, 59.9, 0, "code", None) is None
    assert retiring(60, 60, 0, "code", None) == "stopped after 60 s idle"
    assert retiring(60, 600, 1, "code", None) is None  # a command still runs
    assert retiring(60, 600, 1, "code", "code") is None


def test_a_server_whose_code_changed_stops_at_once() -> None:
    """Its clients would all be told it is stale; stopping lets the next start a fresh one."""
    reason = retiring(3600, 0, 2, "old", "new")
    assert reason is not None and "code changed" in reason


@pytest.mark.parametrize("value", ["8d", "1e308"])
def test_an_idle_time_past_a_week_is_refused(
    tmp_path: Path, no_spawn: list[list[str]], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert client.autostart(str(tmp_path / "s.sock"), value) is False
    assert no_spawn == [] and "at most 7 days" in capsys.readouterr().err


def test_an_installed_runner_is_not_put_before_the_standard_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner in site-packages is found by the server by itself; a checkout's (or an
    editable install's) folder comes first on the server's PYTHONPATH."""
    import site

    where = client.runner_folder()
    assert where is not None and os.path.isdir(os.path.join(where, "runner"))
    monkeypatch.setattr(site, "getsitepackages", lambda: [where])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert client.runner_folder() is None
    assert "PYTHONPATH" not in client.server_environment("/run/s.sock", client.runner_folder())


def test_a_runner_folder_with_a_path_separator_starts_nothing(
    tmp_path: Path,
    no_spawn: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PYTHONPATH cannot name it: the server would import another runner, and refuse every
    client as stale."""
    monkeypatch.setattr(client, "runner_folder", lambda: "/opt/a:b")
    assert client.autostart(str(tmp_path / "s.sock"), "10m") is False
    assert no_spawn == [] and "':' in its name" in capsys.readouterr().err
