"""The client half of ``runner serve`` (see runner/app/server.py): hand a command to a running
server, or say that it must run here.

Kept to the standard library's lightest modules, since it is on the path of every ``runner``
start-up: ``main`` decides before ``runner.cli`` (argparse and the rest) is imported. Where the
socket is, and what code this is, come from runner/app/host.py.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from types import FrameType
    from typing import NoReturn

__all__ = ["autostart", "main", "served"]

AUTOSERVE_OFF = frozenset({"", "0", "off", "no", "false"})
"""``RUNNER_AUTOSERVE`` values that start no server (as unset)."""

LOG_MAX_BYTES = 1 << 20
"""A started server's log (``<socket>.log``) begins afresh when it has grown past this."""


def try_client(path: str, argv: list[str]) -> int | None:
    """Hand ``argv`` to the server at ``path``; its exit code, or None to run it here."""
    if not os.path.exists(path):
        return None
    import contextlib
    import json
    import signal
    import socket

    from runner.app.host import code_fingerprint

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None  # a socket left by a server that is gone
    request = {
        "argv": argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "code": code_fingerprint(),
    }
    try:
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    except OSError:
        conn.close()
        return None

    def cancel(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"cancel\n")

    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGTERM, cancel)
    reply = b""
    while not reply.endswith(b"\n"):
        try:
            chunk = conn.recv(4096)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        reply += chunk
    conn.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        answer = json.loads(reply)
    except ValueError:
        print(f"runner: the runner server at {path} stopped answering", file=sys.stderr)
        return 4
    if "stale" in answer:
        print(
            f"runner: the runner server at {path} runs other code ({answer['stale']}); "
            "running in this process (restart `runner serve` to use it again)",
            file=sys.stderr,
        )
        return None
    return int(answer["exit"])


def autostart(path: str, idle: str) -> bool:
    """``RUNNER_AUTOSERVE``: no server answered at ``path``, so start ``runner serve
    --idle-exit <idle>`` there in the background, in a session of its own, unless one holds
    the socket's lock (it listens, or is starting); whether one was started. The command that
    found no server runs in its own process all the same: it does not wait for the server.

    The lock is taken here, before the server starts, and handed to it open, so that clients
    started at once start one server between them. Its log (``<socket>.log``, yours alone)
    begins afresh past :data:`LOG_MAX_BYTES`. A value that is not a duration, or a server
    that cannot be started, is said on stderr; the command runs on."""
    if idle.strip().lower() in AUTOSERVE_OFF:
        return False
    import stat
    import subprocess
    from pathlib import Path

    from runner.app.host import server_lock
    from runner.core import locks, units

    try:
        if units.parse_seconds(idle) <= 0:
            raise units.BadDuration(f"not a duration above 0: {idle!r}")
    except units.BadDuration as exc:
        print(f"runner: RUNNER_AUTOSERVE: {exc}; no server started", file=sys.stderr)
        return False
    socket_file = Path(os.path.abspath(path))
    if len(str(socket_file)) > 100:  # as `runner serve` refuses it (a Unix socket's limit)
        print(f"runner: RUNNER_AUTOSERVE: {socket_file} is too long for a socket", file=sys.stderr)
        return False
    try:
        socket_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = locks.try_lock(
            Path(server_lock(str(socket_file))), opener=locks.open_private_lock_file
        )
    except OSError as exc:
        print(f"runner: RUNNER_AUTOSERVE: no server started: {exc}", file=sys.stderr)
        return False
    if lock is None:
        return False  # a server holds it: it listens, or is about to
    log_file = socket_file.with_name(socket_file.name + ".log")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        log = os.open(log_file, flags | os.O_NONBLOCK, 0o600)  # a FIFO there: no wait
        try:
            if not stat.S_ISREG(os.fstat(log).st_mode):
                raise OSError(f"{log_file} is not a regular file")
            os.set_blocking(log, True)
            if os.fstat(log).st_size > LOG_MAX_BYTES:
                os.ftruncate(log, 0)
            subprocess.Popen(
                # -P and cwd /: the runner the client runs, never a runner/ in its folder
                [sys.executable, "-P", "-m", "runner", "serve", "--idle-exit", idle.strip(),
                 "--lock-fd", str(lock)],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(lock,),
                start_new_session=True,  # not in the client's process group: Ctrl-C is not its
                env={**os.environ, "RUNNER_SERVER": str(socket_file)},
            )  # fmt: skip
        finally:
            os.close(log)
    except OSError as exc:
        print(f"runner: RUNNER_AUTOSERVE: no server started: {exc}", file=sys.stderr)
        return False
    finally:
        os.close(lock)  # the server holds it now (the same open file), or no one
    return True


def served(given: list[str]) -> bool:
    """Whether the command line ``given`` is one a client hands to a server: one that starts
    with ``run`` or ``verify`` (one that starts with a logging option runs here, as before)
    and that the server runs (:func:`runner.app.host.served`)."""
    from runner.app.host import SERVED
    from runner.app.host import served as served_there

    return bool(given) and given[0] in SERVED and served_there(given)


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``runner`` command: a served command goes to the server when one answers;
    everything else (and a served command without a server) runs in this process."""
    given = sys.argv[1:] if argv is None else argv
    if served(given) and "-h" not in given and "--help" not in given:
        from runner.app.host import socket_path

        path = socket_path()
        code = try_client(path, given) if path is not None else None
        if code is not None:
            sys.exit(code)
        if path is not None and os.environ.get("RUNNER_AUTOSERVE"):
            autostart(path, os.environ["RUNNER_AUTOSERVE"])
    from runner.cli import dispatch

    sys.exit(dispatch(given))
