"""``runner schema [NAME]``: the JSON Schemas of the runner's documents, from the installed
models (the same bytes as ``contracts/`` in a source checkout)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from runner.cli._common import EXIT_SUCCEEDED, EXIT_USAGE

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    cmd = sub.add_parser(
        name,
        help=help,
        description="Print the JSON Schema of one of the runner's documents: the execution "
        "contract, the host policy, the result envelope, a ledger event, or the job's own "
        "result.json. Without NAME, list them. Generated from this installed runner's models, "
        "so they are exactly what it checks.",
        epilog="examples:\n  runner schema\n"
        "  runner schema execution-contract > contract.schema.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("name", nargs="?", metavar="NAME", help="e.g. execution-contract")
    cmd.set_defaults(func=cmd_schema)


def cmd_schema(args: argparse.Namespace) -> int:
    from runner.app.schemas import render, schemas

    every = {k.removesuffix(".schema.json"): v for k, v in schemas().items()}
    if args.name is None:
        for name, schema in every.items():
            print(f"{name:20}  {schema.get('title', '')}")
        return EXIT_SUCCEEDED
    wanted = args.name.removesuffix(".json").removesuffix(".schema")
    if wanted not in every:
        print(f"runner: no schema {args.name!r}; there are: {', '.join(every)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(render(every[wanted]))
    return EXIT_SUCCEEDED
