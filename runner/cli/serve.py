"""``runner serve``: the warm runner (runner/app/server.py) that ``runner run`` and ``runner
verify`` hand their work to."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runner.app import host
from runner.cli._common import EXIT_USAGE, usage
from runner.core import units

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    serve = sub.add_parser(
        name,
        help=help,
        description="Import everything once and listen on a Unix socket "
        "($RUNNER_SERVER, else <config dir>/server.sock; yours alone). While it runs, "
        "`runner run` and `runner verify contract` on this host hand their command line, working "
        "directory, environment and terminal to it and each runs in a process forked from "
        "it: the same output and exit codes, without the start-up (about 0.3 s a run). "
        "It runs no other command a client sends (a usage error, exit 2). "
        "Ctrl-C on a client stops its job; a server running older code is not used. "
        "RUNNER_SERVER=off keeps commands in their own process; RUNNER_AUTOSERVE=<duration> "
        "has a command that finds no server start one in the background "
        "(`runner serve --idle-exit <duration>`). One server a socket: a second is refused "
        "(exit 2).",
    )
    serve.add_argument(
        "--idle-exit",
        metavar="DURATION",
        type=_idle,
        help="stop by itself once DURATION has passed with no command running or received, "
        "or as soon as the runner's code on disk changes (its clients would not use it); "
        f"{units.DURATION_FORMS}. Without it, it runs until SIGINT or SIGTERM",
    )
    # The lock of the socket (runner.app.host.server_lock), taken by the client that started
    # this server (RUNNER_AUTOSERVE, runner.client) and handed down open.
    serve.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)


def _idle(text: str) -> float:
    try:
        seconds = units.parse_seconds(text)
    except units.BadDuration as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < seconds <= host.IDLE_EXIT_MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"the idle time must be more than 0 and at most 7d, not {text!r}"
        )
    return seconds


def cmd_serve(args: argparse.Namespace) -> int:
    from runner.app import server
    from runner.cli import dispatch, load_all, warm_served_parsers

    where = host.socket_path()
    if where is None:
        usage("RUNNER_SERVER=off: serving is switched off in this environment")
    path = Path(where)
    if len(str(path)) > 100:
        usage(f"the socket path {path} is too long for a Unix socket; set RUNNER_SERVER")

    import logging

    from runner.core import log

    def announce(line: str) -> None:
        # The server's own events: in the log when it is on (--log-level, --log-format),
        # else on stderr as before.
        if log.LOGGER.isEnabledFor(logging.INFO):
            log.event(logging.INFO, line, stage="serve")
        else:
            print(f"runner serve: {line}", file=sys.stderr, flush=True)

    load_all()  # every command's module, as the server's warm-up does the rest of the runner
    warm_served_parsers()
    return server.serve(
        path, served_only(dispatch), announce, idle_exit=args.idle_exit, lock_fd=args.lock_fd
    )


def served_only(dispatch: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """``dispatch`` for the server's clients: only ``runner run`` and ``runner verify
    contract`` (:func:`runner.app.host.served`, what a client hands over) are run; any other
    command line a client sends is refused with a usage error (exit 2), never run."""

    def run_served(argv: list[str]) -> int:
        if not host.served(argv):
            print(
                "runner serve: a client may hand over only `runner run` and `runner verify "
                f"contract`; refused: runner {' '.join(argv)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return dispatch(argv)

    return run_served
