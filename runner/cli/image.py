"""``runner image load``: an offline image bundle, checked before it is loaded."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from runner.cli._common import EXIT_SUCCEEDED

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    image = sub.add_parser(name, help=help)
    image_sub = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    load = image_sub.add_parser(
        "load",
        help="load a `docker save` bundle, checking the image ids it holds",
        description="Read the bundle's manifest, check each config's SHA-256 (the image id), "
        "refuse it when --expect names an id it lacks, then load it. `docker load` drops repo "
        "digests, so for bundles the image id is the pin.",
    )
    load.add_argument("bundle", metavar="BUNDLE.tar")
    load.add_argument("--expect", metavar="sha256:ID", help="refuse unless it holds this id")
    load.add_argument("--json", action="store_true")
    load.set_defaults(func=cmd_image_load)


def cmd_image_load(args: argparse.Namespace) -> int:
    from runner import backends
    from runner.images import pins as images

    bundle = Path(args.bundle)
    ids = images.bundle_image_ids(bundle)
    images.load_bundle(backends.default(), bundle, args.expect)
    if args.json:
        print(json.dumps({"bundle": str(bundle), "imageIds": ids}, indent=2))
    else:
        print(f"loaded {bundle}")
        for image_id in ids:
            print(f"  image {image_id}")
    return EXIT_SUCCEEDED
