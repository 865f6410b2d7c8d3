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

__all__ = ["main", "served"]


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
    from runner.cli import dispatch

    sys.exit(dispatch(given))
