"""``runner serve``: a warm runner that ``runner run`` and ``runner verify`` hand their work to.

A fresh runner process spends most of its own time importing (pydantic and the models built on
it, cryptography) before it reaches the engine; for a short job that is more than the engine's
own work. ``runner serve`` imports everything once and listens on a Unix socket (the user's
alone: mode 0600, and the peer's uid is checked). ``runner run`` and ``runner verify`` look for
that socket first; when a server answers, the command is run in a process forked from the
server, with the client's own standard input, output and error (passed over the socket), its
working directory and its environment, so that progress, tty detection, ``--json`` output and
exit codes are exactly those of an in-process run. Mercurial's ``chg`` works the same way.

- Ctrl-C or SIGTERM to the client is passed on: the job stops as an in-process one does.
- A client that dies (even ``kill -9``) does not stop the job: it runs to its end, its envelope
  is written, and the job's next ``runner run`` prints it. Under Slurm, one that dies before
  the job's lock is taken (verification, the plan) cancels it (see :func:`_watch_client`).
- A server whose code differs from the client's (the checkout changed since it started, or
  another interpreter) is not used: the client says so and runs the command itself.
- No server, or one that does not answer: the client runs the command itself, silently.

The socket is ``$RUNNER_SERVER``, else ``<config dir>/server.sock``; ``RUNNER_SERVER=off``
keeps every command in its own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from runner.app.host import code_fingerprint, open_server_lock, peer
from runner.app.standing import same_standing
from runner.app.warmup import warm_up
from runner.core import locks
from runner.state import jobdir

__all__ = ["retiring", "serve"]

STALE_EXIT = 75
"""The exit code of a server's fork that refused its client as running other code: served
nothing, so it does not count as the server being busy (``--idle-exit``)."""

_MAX_REQUEST = 1 << 20
"""The largest request (command line, directory, environment) a server runs; a larger one the
client runs itself."""

_REQUEST_SECONDS = 10.0
"""How long a fork waits for its client's request (sent as the client connects): a connection
that sends none does not hold a fork, nor an idle server up, for longer."""

# -- the server ---------------------------------------------------------------------------------


def _handle(
    conn: socket.socket, fingerprint: str, dispatch: Callable[[list[str]], int], log: str
) -> None:
    """In the forked child: take the client's request and descriptors, run it, answer."""
    code = 4
    try:
        os.setsid()  # the server's terminal signals are not the job's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Until the command installs its own: a cancel is a KeyboardInterrupt, as in `runner`.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        data, fds = _read_request(conn)
        line, _, rest = data.partition(b"\n")  # rest: a cancel sent at once after it
        request = _parsed(line)
        if isinstance(request, str):
            why: str | None = request
        else:
            why = _not_served(conn, request, fds, fingerprint) or _enter(request["cwd"])
        if why is not None or isinstance(request, str):
            conn.sendall(json.dumps({"stale": why}).encode() + b"\n")
            os._exit(STALE_EXIT)
        argv, umask = request["argv"], request["umask"]
        os.write(2, f"{log}: runner {_shown(argv)}\n".encode())  # still the server's log
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(umask)  # the client's: the job's folders and files as an in-process run's
        threading.Thread(target=_watch_client, args=(conn, rest), daemon=True).start()
        code = dispatch(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:  # cancelled before the command could install its own handling
        print("runner: interrupted", file=sys.stderr)
        code = 130
    except BaseException as exc:  # noqa: BLE001 - reported to the client as an exit code
        print(f"runner: infrastructure: the server failed: {exc!r}", file=sys.stderr)
    finally:
        # The command is over: a cancel from here on (the client leaving once it has the
        # answer is one, under Slurm) ends this fork at once, with the command's code; it
        # must not raise in this frame, nor wait for a flush that never ends.
        def leave(signum: int, frame: FrameType | None) -> None:
            os._exit(code & 0xFF)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, leave)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code & 0xFF}).encode() + b"\n")
        os._exit(code & 0xFF)


def _read_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The client's request line (and what came with it) and its descriptors: at most one byte
    over :data:`_MAX_REQUEST`, all within :data:`_REQUEST_SECONDS`. None in time, or a client
    that closed without a word, ends this fork as not served, with nobody to answer."""
    deadline = time.monotonic() + _REQUEST_SECONDS
    try:
        conn.settimeout(_REQUEST_SECONDS)
        data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST + 1, 3)
        while data and b"\n" not in data and len(data) <= _MAX_REQUEST:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            more = conn.recv(_MAX_REQUEST + 1 - len(data))
            if not more:
                break
            data += more
    except TimeoutError:
        os._exit(STALE_EXIT)
    if not data:
        os._exit(STALE_EXIT)
    conn.settimeout(None)
    return data, fds


def _parsed(line: bytes) -> dict[str, Any] | str:
    """The request, checked to be the shape a client of this runner sends
    (:func:`runner.client._request`), or why it is not served: one over :data:`_MAX_REQUEST`
    (an environment that large runs in the client's own process, as it would with no
    server), or one that is no such request (its sender runs the command itself, or learns
    that this socket is a runner server's)."""
    if len(line) > _MAX_REQUEST:
        return f"its request is over {_MAX_REQUEST} bytes (its environment, mostly)"
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        request = None

    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(x, str) for x in value)

    env = request.get("env") if isinstance(request, dict) else None
    if (
        not isinstance(request, dict)
        or not strings(request.get("argv"))
        or not isinstance(request.get("cwd"), str)
        or not isinstance(env, dict)
        or not strings([*env, *env.values()])
        or not isinstance(request.get("code"), str)
    ):
        return (
            "its request is not one a runner client sends (a JSON object of argv, cwd, env, "
            "code and umask)"
        )
    # What a process of its own may hold and a fork cannot set: a variable named "" or "A=B"
    # (a parent's execve can hand one on), a NUL, a lone surrogate.
    for key, value in env.items():
        if not _settable(key, value):
            return f"its environment variable {key[:64]!r} cannot be set in a fork of the server"
    if not _path(request["cwd"]):
        return "its working directory's name cannot be used (a NUL, or a lone surrogate)"
    if not all(_path(a) for a in request["argv"]):
        return "an argument cannot be passed on (a NUL, or a lone surrogate)"

    umask = request.get("umask")
    if type(umask) is not int or not 0 <= umask <= 0o777:
        return (
            f"the request's umask is {umask!r}, not a number from 0 to 0o777 (a client of "
            "this runner sends its own; run the command with RUNNER_SERVER=off)"
        )
    return request


def _path(text: str) -> bool:
    """Whether ``text`` can be a path or an argument: encodable, with no NUL."""
    try:
        return b"\0" not in os.fsencode(text)
    except UnicodeError:
        return False


def _settable(key: str, value: str) -> bool:
    """Whether ``os.environ[key] = value`` can be done."""
    return bool(key) and "=" not in key and _path(key) and _path(value)


def _not_served(
    conn: socket.socket, request: dict[str, Any], fds: list[int], fingerprint: str
) -> str | None:
    """Why this server does not run ``request`` (the client then runs it itself, saying why),
    or None: a request of other code, other descriptors than the three standard ones, a
    client that may do other things than the server (:mod:`runner.app.standing`: a fork runs
    with the server's groups, capabilities and namespaces, so a client without the engine's
    group, or with the engine's socket out of its sight, would reach the engine through the
    server)."""
    if request.get("code") != fingerprint:
        return "it runs other code (a different checkout or interpreter)"
    if len(fds) != 3:
        return f"{len(fds)} file descriptors passed, not stdin, stdout and stderr"
    if not same_standing(conn):
        return (
            "it may do other things than the server (its uids, gids, groups, capabilities, "
            "seccomp, LSM label or namespaces differ): start `runner serve` as you run `runner`"
        )
    return None


def _enter(cwd: str) -> str | None:
    """Enter the client's working directory (in the fork: before its descriptors are
    taken, while it can still be answered), or say why not."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        return f"its working directory cannot be entered: {exc.strerror or exc}"
    return None


def _shown(argv: list[str]) -> str:
    """A command line for the server's log: one line, whatever its arguments hold (an odd
    one JSON-quoted, so that no argument can write a line of the log's own)."""
    return " ".join(
        a if a and a.isascii() and a.isprintable() and " " not in a else json.dumps(a) for a in argv
    )


def _watch_client(conn: socket.socket, buffered: bytes = b"") -> None:
    """``cancel`` from the client stops the job (as SIGTERM does); a client that goes away
    leaves the job running, with its output sent nowhere. Under Slurm (``SLURM_JOB_ID`` in
    the client's environment) a client that goes away before this process owns a job (its
    lock: :func:`runner.state.jobdir.holding`) cancels it: the batch step stays only for a
    runner that owns the job (runner.scheduling.slurm.step), so a job started later would run
    outside the allocation. ``buffered``: what came after the request in its read."""
    while True:
        if b"cancel\n" in buffered:
            buffered = b""
            os.kill(os.getpid(), signal.SIGTERM)
        try:
            chunk = conn.recv(64)
        except OSError:
            chunk = b""
        if not chunk:
            devnull = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            if os.environ.get("SLURM_JOB_ID") and not jobdir.holding():
                os.kill(os.getpid(), signal.SIGTERM)
            return
        buffered += chunk


def serve(
    path: Path,
    dispatch: Callable[[list[str]], int],
    announce: Callable[[str], None],
    *,
    idle_exit: float | None = None,
    lock_fd: int | None = None,
) -> int:
    """Listen on ``path`` until SIGINT or SIGTERM; each request runs in its own fork.

    One server a socket: it holds ``<socket>.lock`` (:func:`runner.app.host.server_lock`)
    while it lives, taken before the rest, so that servers started at once end with one
    listening; ``lock_fd`` is that lock taken already (by the client that started this
    server, runner.client.autostart). With ``idle_exit`` seconds it stops by itself once
    that long has passed with no command running or received, or as soon as the runner's
    code on disk changes (see :func:`retiring`): the next client starts a fresh one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = _hold_lock(path, lock_fd)
    except OSError as exc:
        announce(f"cannot take the socket's lock: {exc}")
        return 2
    if lock is None:
        announce(f"a runner server already listens on {path}, or is starting")
        return 2
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # left by a server that is gone
        else:
            announce(f"a runner server already listens on {path}")
            return 2
        finally:
            probe.close()
    warm_up()
    fingerprint = code_fingerprint()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    listener.listen(64)
    listener.settimeout(1.0)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    announce(
        f"listening on {path} (pid {os.getpid()}); `runner run` and `runner verify` use it"
        + (f"; stops after {idle_exit:g} s idle" if idle_exit is not None else "")
    )
    children: dict[int, str] = {}
    last_busy = time.monotonic()
    checked = last_busy

    def reap() -> None:
        nonlocal last_busy
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                if code == STALE_EXIT:  # it served nothing: the idle time runs on
                    announce(f"{children.pop(pid)}: not served (no request, or the client runs it)")
                    continue
                announce(f"{children.pop(pid)}: exit {code}")
                last_busy = time.monotonic()

    def take(conn: socket.socket) -> None:
        peer_pid, peer_uid = peer(conn)
        if peer_uid != os.geteuid():
            announce(f"refused pid {peer_pid}: uid {peer_uid} is not this server's")
            conn.close()
            return
        label = f"{time.strftime('%H:%M:%S')} pid {peer_pid}"
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            try:
                listener.close()
                os.close(lock)  # closed, not unlocked: the lock is the server's, not this job's
                _handle(conn, fingerprint, dispatch, label)
            finally:  # never back into this loop, whatever escaped: its finally would remove
                os._exit(70)  # the server's socket (EX_SOFTWARE; _handle exits by itself)
        conn.close()
        children[child] = label

    why = "stopped"
    try:
        while not stopping:
            reap()
            if idle_exit is not None:
                now = time.monotonic()
                code_now = None
                if now - checked >= _CODE_CHECK_SECONDS:
                    checked, code_now = now, code_fingerprint()
                reason = retiring(idle_exit, now - last_busy, len(children), fingerprint, code_now)
                if reason is not None:
                    why = reason
                    path.unlink(missing_ok=True)  # no new client finds it; then those queued
                    _drain(listener, take)
                    break
            try:
                conn, _ = listener.accept()
            except (TimeoutError, InterruptedError):
                continue
            take(conn)
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        locks.release(lock)
    announce(f"{why}; {len(children)} command(s) still running go on by themselves")
    return 0


_CODE_CHECK_SECONDS = 5.0
"""How often a server that stops by itself (``idle_exit``) looks whether its code changed."""


def _hold_lock(path: Path, given: int | None) -> int | None:
    """The server's lock, taken (or ``given`` taken already), never handed to a program it
    starts; None when another server holds it. One of another user: OSError."""
    fd = open_server_lock(str(path)) if given is None else given
    os.set_inheritable(fd, False)
    if not locks.acquire(fd, wait=False):  # given: ours already, a no-op
        os.close(fd)
        return None
    return fd


def retiring(
    idle_exit: float, idle: float, running: int, fingerprint: str, code_now: str | None
) -> str | None:
    """Why a server with ``idle_exit`` stops now, or None: its runner code on disk changed
    (``code_now``, when looked at, differs from the ``fingerprint`` it started with: it would
    refuse every client); or nothing ran for ``idle_exit`` seconds (``idle``, with no command
    ``running``)."""
    if code_now is not None and code_now != fingerprint:
        return "stopped: the runner's code changed since it started"
    if running == 0 and idle >= idle_exit:
        return f"stopped after {idle_exit:g} s idle"
    return None


def _drain(listener: socket.socket, take: Callable[[socket.socket], None]) -> None:
    """Serve the clients that connected before the socket's name was removed."""
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(True)
        take(conn)
