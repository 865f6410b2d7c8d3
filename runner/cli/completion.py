"""``runner completion SHELL``: a completion script for bash, zsh or tcsh, generated from the
command line's own parser by shtab (so it never falls behind a new command or option)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from runner.cli._common import EXIT_SUCCEEDED

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]

SHELLS = ("bash", "zsh", "tcsh")


def register(sub: Subparsers, name: str, help: str) -> None:
    cmd = sub.add_parser(
        name,
        help=help,
        description="Print a shell completion script for every command and option.",
        epilog="examples:\n"
        "  runner completion bash > ~/.local/share/bash-completion/completions/runner\n"
        "  runner completion zsh > ~/.zfunc/_runner   # with fpath+=(~/.zfunc) in ~/.zshrc",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("shell", choices=SHELLS)
    cmd.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    from runner.cli import build_parser

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_SUCCEEDED
