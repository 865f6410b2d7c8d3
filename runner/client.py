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
    from pathlib import Path
    from types import FrameType
    from typing import NoReturn

__all__ = ["autostart", "main", "served"]

AUTOSERVE_OFF = frozenset({"", "0", "off", "no", "false"})
"""``RUNNER_AUTOSERVE`` values that start no server (as unset)."""

LOG_MAX_BYTES = 1 << 20
"""A started server's log (``<socket>.log``) begins afresh when it has grown past this."""


def try_client(path: str, argv: list[str]) -> int | None:
    """Hand ``argv`` to the server at ``path``; its exit code, or None to run it here.

    Speaks through the C modules under the standard library's: ``_socket`` (``socket``'s
    enums and selectors cost about 3 ms), ``_json``'s string encoder for the request, and
    ``_signal`` for the cancel. ``json``, ``signal`` and ``struct`` would bring ``re`` and
    ``enum`` with them: about 8 of the 24 ms a served command's client took here when the
    console script imports nothing else (uv's; pip's imports ``re`` itself)."""
    if not os.path.exists(path):
        return None
    try:
        cwd = os.getcwd()
    except OSError:  # a folder removed under us: the command says what it makes of that
        return None
    import _socket

    if TYPE_CHECKING:  # typeshed has no stub of _signal, the C module under signal
        import signal as _signal
    else:
        import _signal

    from runner.app.host import code_fingerprint, peer

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
        _, uid = peer(conn)
    except OSError:
        conn.close()
        return None  # a socket left by a server that is gone
    if uid != os.geteuid():  # never our environment and terminal to another user's process
        conn.close()
        print(
            f"runner: the socket {path} is served by uid {uid}, not by you: not used "
            "(set RUNNER_SERVER to a socket of your own, or off)",
            file=sys.stderr,
        )
        return None
    umask = os.umask(0o077)  # read by setting it: this process runs no thread
    os.umask(umask)
    request = _request(argv, cwd, dict(os.environ), code_fingerprint(), umask)
    # Our stdin, stdout and stderr go with it (as socket.send_fds sends them: three C ints).
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
    terminal = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)
    try:
        conn.sendmsg([request], [terminal])
    except OSError:
        conn.close()
        return None

    def cancel(signum: int, frame: FrameType | None) -> None:
        try:  # noqa: SIM105 - contextlib.suppress would cost its import (about 2 ms)
            conn.sendall(b"cancel\n")
        except OSError:
            pass  # the server is gone: its silence says so below

    _signal.signal(_signal.SIGINT, cancel)
    _signal.signal(_signal.SIGTERM, cancel)
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
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    exit_code, stale = _answer(reply)
    if stale is not None:
        upgraded = (
            " (after an upgrade, restart `runner serve`; one that RUNNER_AUTOSERVE started "
            "stops by itself once its code changed or it is idle)"
            if "other code" in stale or "different checkout" in stale  # older servers' words
            else ""
        )
        print(
            f"runner: the runner server at {path} does not run this command: {stale}; "
            f"running it in this process{upgraded}",
            file=sys.stderr,
        )
        return None
    if exit_code is None:
        print(f"runner: the runner server at {path} stopped answering", file=sys.stderr)
        return 4
    return exit_code


def _request(argv: list[str], cwd: str, env: dict[str, str], code: str, umask: int) -> bytes:
    """The request line, as ``json.dumps`` of ``{"argv", "cwd", "env", "code", "umask"}``
    writes it
    (what the server reads with ``json.loads``), made with ``_json``'s own ASCII string
    encoder: every string escaped as ``json`` escapes it, a lone surrogate of a name that
    is not UTF-8 too, so that the server gets each string back as it was."""
    import _json

    text = _json.encode_basestring_ascii

    def strings(values: list[str]) -> str:
        return ", ".join(map(text, values))

    pairs = ", ".join(f"{text(k)}: {text(v)}" for k, v in env.items())
    body = (
        f'{{"argv": [{strings(argv)}], "cwd": {text(cwd)}, "env": {{{pairs}}}, '
        f'"code": {text(code)}, "umask": {int(umask)}}}\n'
    )
    return body.encode("ascii")


def _answer(reply: bytes) -> tuple[int | None, str | None]:
    """The server's answer, one of the two lines it writes with ``json.dumps``:
    ``{"exit": N}`` (the exit code) or ``{"stale": "why"}`` (it runs other code), read
    without ``json``; (None, None) for anything else (a server that stopped answering)."""
    import _json

    try:
        line = reply.decode("ascii")
        if line.startswith('{"exit": ') and line.endswith("}\n"):
            number = line[len('{"exit": ') : -2]
            digits = number.removeprefix("-")
            json_int = digits.isdigit() and (digits == "0" or digits[0] != "0")  # 007 is none
            if json_int and len(number) <= 3 and 0 <= int(number) <= 255:  # an exit status
                return int(number), None
        elif line.startswith('{"stale": "') and line.endswith('"}\n'):
            why, end = _json.scanstring(line, len('{"stale": "'), True)
            if end == len(line) - 2:
                return None, why
    except ValueError:  # not ASCII, or a string that is not JSON's
        pass
    return None, None


def autostart(path: str, idle: str) -> bool:
    """``RUNNER_AUTOSERVE``: no server answered at ``path``, so start ``runner serve
    --idle-exit <idle>`` there in the background, in a session of its own, unless one holds
    the socket's lock (it listens, or is starting); whether one was started. The command that
    found no server runs in its own process all the same: it does not wait for the server.

    The lock is taken here, before the server starts, and handed to it open, so that clients
    started at once start one server between them. The server imports the runner this client
    runs (its folder first on ``PYTHONPATH``; ``-P`` and ``/`` as its directory), and keeps
    only the variables :func:`server_environment` lets through. Never under Slurm
    (``SLURM_JOB_ID``): a server started inside one job's allocation would run the next job
    on the node there too, and die with the first. Its log (``<socket>.log``, yours alone)
    begins afresh past :data:`LOG_MAX_BYTES` when a server starts. A value that is not a
    duration of at most 7 days (:data:`runner.app.host.IDLE_EXIT_MAX_SECONDS`), something
    else than a socket at ``path``, or a lock or log file of another user, a link or a FIFO:
    said on stderr, no server, and the command runs on."""
    if idle.strip().lower() in AUTOSERVE_OFF or os.environ.get("SLURM_JOB_ID"):
        return False
    import stat
    import subprocess
    from pathlib import Path

    from runner.app.host import IDLE_EXIT_MAX_SECONDS, open_server_lock
    from runner.core import locks, units

    def refuse(why: object, fix: str = SHARED_FIX) -> bool:
        print(f"runner: RUNNER_AUTOSERVE: no server started: {why}\n  fix: {fix}", file=sys.stderr)
        return False

    try:
        seconds = units.parse_seconds(idle)
    except units.BadDuration as exc:
        return refuse(exc, DURATION_FIX)
    if not 0 < seconds <= IDLE_EXIT_MAX_SECONDS:
        return refuse(f"{idle!r} is not a duration above 0 and at most 7 days", DURATION_FIX)
    where = runner_folder()
    if where is not None and os.pathsep in where:  # PYTHONPATH could not name it
        return refuse(
            f"the runner's folder {where} has a {os.pathsep!r} in its name",
            "start `runner serve --idle-exit 10m` yourself, or move the runner",
        )
    socket_file = Path(os.path.abspath(path))
    if len(str(socket_file)) > 100:  # as `runner serve` refuses it (a Unix socket's limit)
        return refuse(f"{socket_file} is too long for a socket", "set RUNNER_SERVER shorter")
    try:
        there = os.lstat(socket_file)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return refuse(exc)
    else:
        if not stat.S_ISSOCK(there.st_mode):  # a server would fail on it, every time
            return refuse(
                f"{socket_file} is there and is not a socket",
                "remove it, or set RUNNER_SERVER to another path",
            )
    try:
        socket_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = open_server_lock(str(socket_file))
    except OSError as exc:
        return refuse(exc)
    try:
        if not locks.acquire(lock, wait=False):
            return False  # a server holds it: it listens, or is about to
        log = _open_log(socket_file.with_name(socket_file.name + ".log"))
        try:
            subprocess.Popen(
                # -P and cwd /: no runner/ of the working folder; this client's own runner
                # comes first on the server's PYTHONPATH (server_environment)
                [sys.executable, "-P", "-m", "runner", "serve", "--idle-exit", idle.strip(),
                 "--lock-fd", str(lock)],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(lock,),
                start_new_session=True,  # not in the client's process group: Ctrl-C is not its
                env=server_environment(str(socket_file), where),
            )  # fmt: skip
        finally:
            os.close(log)
    except OSError as exc:
        return refuse(exc)
    finally:
        os.close(lock)  # the server holds it now (the same open file), or no one
    return True


SERVER_VARIABLES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR",
                              "VIRTUAL_ENV"})  # fmt: skip
"""Besides the runner's own host variables (runner/core/envvars.py: the engine's, the config
folder's, ...), ``LC_*`` and Python's own ``PYTHON*`` (``PYTHONPATH`` made anew): all of a
client's environment a server it starts keeps. Each command still runs with its own client's
whole environment; the server's is what it starts with, and shows in ``/proc/<pid>/environ``
of it and of every process forked from it."""

DURATION_FIX = "set RUNNER_AUTOSERVE to a duration such as 10m (at most 7d), or to off"
SHARED_FIX = "keep RUNNER_SERVER in a folder of your own (the default <config dir>/server.sock)"
"""What a refusal of ``RUNNER_AUTOSERVE`` says to do (the command runs here meanwhile)."""


def server_environment(socket_file: str, where: str | None) -> dict[str, str]:
    """The environment of a server :func:`autostart` starts: :data:`SERVER_VARIABLES`, the
    runner's own host variables but Slurm's, ``LC_*``; ``RUNNER_SERVER`` the absolute socket;
    ``PYTHONPATH`` ``where`` (:func:`runner_folder`: this client's ``runner`` package's folder,
    None for an installed one), then the client's own entries made absolute (the server runs
    in ``/``)."""
    from runner.core.envvars import READ

    own = {v.name for v in READ if not v.name.startswith("SLURM")}
    env = {
        k: v
        for k, v in os.environ.items()
        if k in SERVER_VARIABLES or k in own or k.startswith(("LC_", "PYTHON"))
    }
    given = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    first = [] if where is None or where in given else [where]
    env["PYTHONPATH"] = os.pathsep.join([*first, *given])
    if not env["PYTHONPATH"]:
        del env["PYTHONPATH"]
    env["RUNNER_SERVER"] = socket_file
    return env


def runner_folder() -> str | None:
    """The folder this client's ``runner`` package is in, when a server started with ``-P``
    in ``/`` would not find it by itself (a checkout, an editable install, ``PYTHONPATH``);
    None when it is an installed package's (in the interpreter's own site-packages, which
    must not come before the standard library)."""
    import site

    where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # runner/ is in it
    installed = {os.path.abspath(p) for p in site.getsitepackages()}
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        installed.add(os.path.abspath(site.getusersitepackages()))
    return None if where in installed else where


def _open_log(path: Path) -> int:
    """``<socket>.log`` opened to append, this user's own and private; a link, a FIFO, a file
    of another user: OSError."""
    import stat

    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    log = os.open(str(path), flags | os.O_NONBLOCK, 0o600)  # a FIFO there: no wait
    try:
        st = os.fstat(log)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise OSError(f"{path} belongs to uid {st.st_uid}, not to this user")
        if st.st_mode & 0o077:
            os.fchmod(log, 0o600)
        os.set_blocking(log, True)
        if st.st_size > LOG_MAX_BYTES:
            os.ftruncate(log, 0)
    except BaseException:
        os.close(log)
        raise
    return log


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
    from runner.core import collector

    if argv is None:  # the runner program itself, not a caller that goes on after it
        collector.pause()  # until the command's imports are done (runner.core.collector)
    try:
        from runner.cli import dispatch

        sys.exit(dispatch(given))
    finally:  # a command that ended before it resumed it
        collector.resume()
