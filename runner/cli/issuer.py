"""The key and contract commands: ``runner key new``, ``runner contract pin`` and ``runner
contract sign`` (the issuer's side, runner/app/issuer.py) and ``runner key trust`` (the
host's side)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import EXIT_SUCCEEDED, HOST_HELP, usage

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "pin":
        pin = sub.add_parser(
            name,
            help=help,
            description=(
                "Write the digest of each input the contract names into paper.digest, "
                "repository.digest and agent.promptDigest (their listings into "
                "<stem>.inputs.json beside the output); with --image, look up a local image "
                "and write its manifest digest (when it has one) or image id into "
                "environment.image and its id into environment.imageId; then recompute "
                "contractDigest."
            ),
        )
        pin.add_argument("contract", metavar="CONTRACT")
        pin.add_argument(
            "--image",
            metavar="REF",
            help="a local image: name:tag, name@sha256:… or sha256:<id> (default: the image "
            "pin is left as it is)",
        )
        pin.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="write the pinned contract here (default: overwrite CONTRACT)",
        )
        pin.add_argument("--json", action="store_true")
        pin.set_defaults(func=cmd_pin)
    elif name == "new":
        keygen = sub.add_parser(
            name,
            help=help,
            description="Write PREFIX.key (private, mode 0600) and PREFIX.pub (public). The key id "
            "is sha256 of the raw public key; hosts compute it themselves from PREFIX.pub.",
        )
        keygen.add_argument("--out", required=True, metavar="PREFIX", help="e.g. ~/keys/issuer")
        keygen.add_argument("--json", action="store_true")
        keygen.set_defaults(func=cmd_keygen)
    elif name == "trust":
        trust = sub.add_parser(
            name,
            help=help,
            description="Copy a .pub key into the trusted issuer keys folder (or, with "
            "--result-keys, the trusted runner keys folder), named by its key id.",
            epilog=HOST_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        trust.add_argument("public_key", metavar="KEY.pub")
        where = trust.add_mutually_exclusive_group()
        where.add_argument(
            "--trusted-keys",
            metavar="DIR",
            help="the folder of trusted issuer keys (default: the host's, <config>/trusted-keys)",
        )
        where.add_argument(
            "--result-keys",
            metavar="DIR",
            nargs="?",
            const="",
            help="trust it to sign results instead (a runner key): into DIR, else "
            "<config>/trusted-runner-keys",
        )
        trust.add_argument("--json", action="store_true")
        trust.set_defaults(func=cmd_trust)
    elif name == "sign":
        sign = sub.add_parser(
            name,
            help=help,
            description="Stamp issuedAt (now) and expiresAt (now + --expires-in), optionally "
            "audience and jobId, bind the inputs (paper.digest, repository.digest, "
            "agent.promptDigest filled in, or checked when present; their listings into "
            "<stem>.inputs.json beside the envelope), recompute contractDigest, and sign the "
            "exact contract bytes with Ed25519 into a DSSE envelope (payloadType "
            "application/vnd.citeark.execution-contract+json).",
        )
        sign.add_argument("contract", metavar="CONTRACT")
        sign.add_argument("--key", required=True, metavar="KEY", help="private key from keygen")
        sign.add_argument(
            "-o", "--output", metavar="FILE", help="default: CONTRACT with .dsse.json suffix"
        )
        sign.add_argument(
            "--expires-in",
            default="24h",
            metavar="DURATION",
            help="lifetime from now: 90s, 30m, 24h, 7d (default 24h)",
        )
        sign.add_argument(
            "--keep-times",
            action="store_true",
            help="keep the contract's own issuedAt/expiresAt instead of stamping new ones",
        )
        sign.add_argument(
            "--audience",
            action="append",
            default=[],
            metavar="NAME",
            help="a host audience the contract is for (repeatable)",
        )
        sign.add_argument("--job-id", metavar="ID", help="stamp this job id into the contract")
        sign.add_argument(
            "--repin-inputs",
            action="store_true",
            help="recompute input digests already in the contract instead of refusing inputs "
            "that no longer match them",
        )
        sign.add_argument("--json", action="store_true")
        sign.set_defaults(func=cmd_sign)


def cmd_keygen(args: argparse.Namespace) -> int:
    from runner.app import issuer

    pair = issuer.keygen(Path(args.out))
    keyid, private, public = pair.key_id, pair.private_key, pair.public_key
    result = {"keyId": keyid, "privateKey": str(private), "publicKey": str(public)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"key id      {keyid}")
        print(f"private key {private} (mode 0600: keep it secret)")
        print(f"public key  {public} (give it to hosts: `runner key trust {public}`)")
    return EXIT_SUCCEEDED


def cmd_trust(args: argparse.Namespace) -> int:
    from runner.trust import signing

    key = signing.load_public_key(Path(args.public_key))
    if args.result_keys is not None:
        folder = host.trusted_runner_keys_dir(args.result_keys or None)
    else:
        folder = host.trusted_keys_dir(args.trusted_keys)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{key.keyid.removeprefix('sha256:')[:32]}.pub"
    data = Path(args.public_key).read_bytes()
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)
    if args.json:
        print(json.dumps({"keyId": key.keyid, "trustedAs": str(target)}, indent=2))
    else:
        print(f"trusted {key.keyid}\n  as {target}")
    return EXIT_SUCCEEDED


def cmd_sign(args: argparse.Namespace) -> int:
    from runner.app import issuer

    path = Path(args.contract)
    try:
        signed = issuer.sign(
            path,
            Path(args.key),
            expires_in=None if args.keep_times else args.expires_in,
            audience=args.audience,
            job_id=args.job_id,
            output=Path(args.output) if args.output else None,
            repin_inputs=args.repin_inputs,
        )
    except issuer.BadDuration as exc:
        usage(str(exc))
    result: dict[str, Any] = {
        "envelope": str(signed.envelope),
        "keyId": signed.key_id,
        "contractDigest": signed.contract_digest,
        "issuedAt": signed.issued_at,
        "expiresAt": signed.expires_at,
        "audience": signed.audience,
        "jobId": signed.job_id,
        "inputs": signed.inputs,
        "listings": str(signed.listings) if signed.listings else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"signed {path} -> {signed.envelope}")
        for key in ("keyId", "contractDigest", "issuedAt", "expiresAt", "audience", "jobId"):
            if result[key] is not None:
                print(f"  {key:<15} {result[key]}")
        _print_inputs(signed.inputs, signed.listings)
    return EXIT_SUCCEEDED


def _print_inputs(digests: dict[str, str], listings: Path | None) -> None:
    for field, digest in digests.items():
        print(f"  {field.removeprefix('$.'):<18} {digest}")
    if listings is not None:
        print(f"  listings           {listings}")


def cmd_pin(args: argparse.Namespace) -> int:
    from runner.app import issuer

    pinned = issuer.pin(
        Path(args.contract),
        args.image,
        output=Path(args.output) if args.output else None,
        note=lambda line: print(f"note: {line}", file=sys.stderr),
    )
    result = {
        "contract": str(pinned.contract),
        "image": pinned.image,
        "imageId": pinned.image_id,
        "contractDigest": pinned.contract_digest,
        "inputs": pinned.inputs,
        "listings": str(pinned.listings) if pinned.listings else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if args.image:
            print(f"pinned {args.image} as {pinned.image}")
        print(f"  contractDigest {pinned.contract_digest}")
        print(f"  written to     {pinned.contract}")
        _print_inputs(pinned.inputs, pinned.listings)
    return EXIT_SUCCEEDED
