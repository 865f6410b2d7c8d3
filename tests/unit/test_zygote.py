"""The tests' fork server (tests/support/cli.py, tests/support/zygote.py): a command forked from
it ends as a fresh ``python -m`` does (exit codes, streams, tracebacks, atexit, signals), with
exactly the environment, directory and stdin it is given, and a timeout kills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import cli, run_cli

PROBE = """\
import atexit, json, os, signal, sys, threading, time

what = sys.argv[1]
if what == "env":
    print(json.dumps({k: os.environ.get(k) for k in ("ZYG_A", "ZYG_B")}))
    os.environ["ZYG_B"] = "set by the child"
elif what == "where":
    print(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0], "argv": sys.argv}))
elif what == "stdin":
    print(sys.stdin.read().upper(), end="")
elif what == "streams":
    print("to stdout")
    print("to stderr", file=sys.stderr)
    sys.stdout.write("no newline")
elif what == "exit":
    print("leaving")
    sys.exit(int(sys.argv[2]))
elif what == "exit-text":
    sys.exit("a message")
elif what == "crash":
    def inner():
        raise ValueError("boom")
    inner()
elif what == "atexit":
    atexit.register(print, "at exit")
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
elif what == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
elif what == "interrupt":
    raise KeyboardInterrupt
elif what == "umask":
    print(oct(os.umask(0)))
elif what == "pids":
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
elif what == "handled":
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), sys.exit(7)))
    print("waiting", flush=True)
    time.sleep(60)
elif what == "sleep":
    print(os.getpid(), flush=True)
    time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _zygote_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the zygote: on even where the session switched it off."""
    monkeypatch.delenv("TESTS_RUNNER_ZYGOTE", raising=False)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "zprobe.py").write_text(PROBE)
    return tmp_path


def forked(probe: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = kw.pop("env", None) or dict(os.environ)
    return cli.run(list(args), env=env, cwd=probe, module="zprobe", **kw)  # type: ignore[arg-type]


def fresh(probe: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = kw.pop("env", None) or dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "zprobe", *args], capture_output=True, text=True, env=env,
        cwd=probe, check=False, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def test_the_zygote_is_in_use() -> None:
    assert cli.zygote_pid() is not None, "the zygote did not start: every test ran fresh"


def test_a_command_is_a_process_of_its_own_forked_from_the_zygote(probe: Path) -> None:
    pids = json.loads(forked(probe, "pids").stdout)
    assert pids["ppid"] == cli.zygote_pid()
    assert pids["pid"] not in (os.getpid(), cli.zygote_pid())


@pytest.mark.parametrize(
    "args",
    [
        ["streams"],
        ["exit", "0"],
        ["exit", "3"],
        ["exit", "300"],
        ["exit-text"],
        ["crash"],
        ["atexit"],
        ["sigterm"],
        ["interrupt"],
        ["where"],
        ["umask"],
    ],
    ids=" ".join,
)
def test_a_fork_ends_as_a_fresh_interpreter_does(probe: Path, args: list[str]) -> None:
    """Exit code, stdout and stderr (each its own) are those of ``python -m``: an uncaught
    exception's traceback and 1, sys.exit's codes and message, atexit handlers and non-daemon
    threads run, a signal's death, argv, cwd and sys.path[0]."""
    got, want = forked(probe, *args), fresh(probe, *args)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_the_outcomes_compared_are_the_ones_meant(probe: Path) -> None:
    """The comparison above is of something: the cases end as a fresh interpreter ends them."""
    crash = forked(probe, "crash")
    assert crash.returncode == 1 and crash.stderr.startswith("Traceback (most recent call last)")
    assert "zygote" not in crash.stderr and crash.stderr.endswith("ValueError: boom\n")
    assert forked(probe, "exit", "300").returncode == 300 & 0xFF
    assert forked(probe, "exit-text").stderr == "a message\n"
    assert forked(probe, "sigterm").returncode == -signal.SIGTERM
    assert forked(probe, "interrupt").returncode == -signal.SIGINT
    assert forked(probe, "atexit").stdout == "thread done\nat exit\n"
    streams = forked(probe, "streams")
    assert (streams.stdout, streams.stderr) == ("to stdout\nno newline", "to stderr\n")
    where = json.loads(forked(probe, "where").stdout)
    assert where["cwd"] == where["path0"] == str(probe)
    assert where["argv"] == [str(probe / "zprobe.py"), "where"]


def test_each_command_has_exactly_its_own_environment(probe: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZYG_")}
    first = forked(probe, "env", env={**base, "ZYG_A": "first"})
    second = forked(probe, "env", env=base)
    assert json.loads(first.stdout) == {"ZYG_A": "first", "ZYG_B": None}
    assert json.loads(second.stdout) == {"ZYG_A": None, "ZYG_B": None}  # nothing left over


def test_stdin_is_the_input_given_else_empty(probe: Path) -> None:
    assert forked(probe, "stdin", input="some text\n").stdout == "SOME TEXT\n"
    assert forked(probe, "stdin").stdout == ""


def test_a_timeout_kills_the_command(probe: Path) -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        forked(probe, "sleep", timeout=2)
    assert time.monotonic() - started < 30
    pid = int(caught.value.stdout.split()[0])  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_what_a_fork_could_get_wrong_runs_fresh(probe: Path) -> None:
    """A request whose start-up variables differ from the zygote's (PYTHONPATH here) runs in
    a fresh interpreter: a child of this process, not of the zygote."""
    env = {**os.environ, "PYTHONPATH": f"{probe}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    pids = json.loads(forked(probe, "pids", env=env).stdout)
    assert pids["ppid"] == os.getpid()


def test_a_folder_with_a_runner_of_its_own_runs_fresh(tmp_path: Path) -> None:
    """``python -m runner`` in a folder holding a ``runner`` package imports that one
    (``sys.path[0]``): so does run_cli there, in a fresh interpreter."""
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "__init__.py").write_text("")
    (tmp_path / "runner" / "__main__.py").write_text("print('the other runner')\n")
    done = cli.run(["--version"], env=dict(os.environ), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "the other runner\n"), done.stderr


def test_a_zygote_that_is_gone_is_said_to_be() -> None:
    zygote = cli._Zygote()
    zygote.proc.kill()
    zygote.proc.wait()
    with pytest.raises(cli.ZygoteGone):
        zygote.start(["--version"], dict(os.environ), os.getcwd(), [0, 1, 2], "runner")
    zygote.close()


@pytest.mark.parametrize(
    "args",
    [
        ["parsers", "list", "--json"],
        ["no-such-command"],
        ["job", "status", "nope"],
        ["job", "--help"],
        ["verify", "contract", "missing.json"],
        ["--log-level", "loud", "parsers"],
    ],
    ids=" ".join,
)
def test_runner_commands_forked_say_what_fresh_ones_say(tmp_path: Path, args: list[str]) -> None:
    """The runner itself, forked and fresh: the same exit code, stdout and stderr (no warning
    or message that a fresh start prints is lost to the zygote's own start)."""
    env = {**os.environ, "RUNNER_STATE_DIR": str(tmp_path / "state")}
    got = cli.run(args, env=env, cwd=tmp_path)
    want = subprocess.run(
        [sys.executable, "-m", "runner", *args], capture_output=True, text=True, env=env,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert got.returncode != 0 or got.stdout


def test_a_dead_zygote_means_fresh_interpreters_said_once(
    probe: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = cli._Zygote()
    dead.proc.kill()
    dead.proc.wait()
    monkeypatch.setattr(cli, "_zygote", dead)
    monkeypatch.setattr(cli, "_broken", None)
    first, second = forked(probe, "pids"), forked(probe, "pids")
    assert json.loads(first.stdout)["ppid"] == json.loads(second.stdout)["ppid"] == os.getpid()
    assert capsys.readouterr().err.count("the runner zygote cannot be used") == 1


def test_run_cli_reaches_the_runner_through_the_zygote(tmp_path: Path) -> None:
    """The real entry point, forked: exit codes as `runner` chooses them, and the env given."""
    missing = run_cli("job", "status", "nope", env={"RUNNER_STATE_DIR": str(tmp_path / "s")})
    assert missing.returncode == 5, missing.stderr
    assert str(tmp_path / "s") in missing.stderr
    assert run_cli("no-such-command").returncode == 2
    assert run_cli("--version").stdout.startswith("runner ")


def test_a_background_command_is_a_popen_with_signals(probe: Path) -> None:
    """cli.popen (start_job's): poll while it runs, a signal its handler catches, communicate;
    the same as a real Popen of ``python -m`` gives."""
    results = []
    for proc in (
        cli.popen(["handled"], env=dict(os.environ), cwd=probe, module="zprobe"),
        subprocess.Popen(
            [sys.executable, "-m", "zprobe", "handled"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=probe,
        ),
    ):
        assert proc.stdout is not None
        assert proc.stdout.readline() == "waiting\n"
        assert proc.poll() is None and proc.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        results.append((proc.returncode, proc.poll(), out, err))
    with cli.popen(["pids"], env=dict(os.environ), cwd=probe, module="zprobe") as forked_one:
        assert isinstance(forked_one, cli.Forked)
        forked_one.communicate(timeout=30)
    assert results[0] == results[1] == (7, 7, "got SIGTERM\n", "")


def test_a_sigint_sent_as_soon_as_the_pid_is_known_is_not_lost(probe: Path) -> None:
    """The zygote ignores SIGINT; a fork signalled before it set its own handler once dropped
    the signal and ran on (a reattaching runner Ctrl-C'd at once ran its job to the end). The
    fork now holds it pending, and ends by it as a fresh interpreter does."""
    for _ in range(5):
        proc = cli.popen(["sleep"], env=dict(os.environ), cwd=probe, module="zprobe")
        assert isinstance(proc, cli.Forked)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGINT, proc.returncode
