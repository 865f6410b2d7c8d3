"""``runner parsers``: the registered evidence parsers and their config."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from runner.cli._common import EXIT_SUCCEEDED

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    parsers = sub.add_parser(
        name,
        help=help,
        description="The parser catalog: every registered (id, version), what it reads and "
        "its config fields; --json prints the full config schemas (as "
        "/job/input/parser-catalog.json).",
    )
    parsers.add_argument("action", nargs="?", choices=["list"], default="list")
    parsers.add_argument("--json", action="store_true")
    parsers.set_defaults(func=cmd_parsers)


def cmd_parsers(args: argparse.Namespace) -> int:
    from runner.parsers import registry

    items = registry.catalog()
    for name, why in registry.broken().items():
        print(f"runner: parser plug-in {name} failed to load: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_SUCCEEDED
    for item in items:
        schema = item["configSchema"]
        required = set(schema.get("required", []))
        print(f"{item['id']}@{item['version']}  {item['description']}")
        for name in schema.get("properties", {}):
            print(f"    {name}{' (required)' if name in required else ''}")
    return EXIT_SUCCEEDED
