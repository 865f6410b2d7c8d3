"""``runner job export`` (a job's run as one archive anyone can verify) and ``runner verify
bundle`` (check such an archive anywhere, offline, with no engine)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import (
    EXIT_SUCCEEDED,
    exit_code_of,
    named_result_keys,
    result_key_options,
    usage,
)

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.results.bundle.verify import Keys
    from runner.trust.signing import TrustedKey

__all__ = ["_keys", "register"]

MiB = 1024 * 1024

EXPORT_EPILOG = """\
what goes in: the envelope (result.json) and its signed statement, the contract as it ran
(task.json, task.dsse.json), the parser catalog, execution/ (input manifest, budget file),
every file of record/ but its lock (ledger, attempts, earlier envelopes), and every file of
output/ the envelope hashed (evidence, stdout and stderr, the job's result.json and the files
it lists). Links and other non-files are never followed: they are left out and listed, with
the reason, in the bundle's runner-bundle.json. The format is BagIt (RFC 8493), sealed with
this host's runner key.
"""

VERIFY_EPILOG = """\
keys: --key trusts a runner public key (the bundle's seal and the result statement),
--result-keys DIR a folder of them; --issuer-key trusts an issuer's (the signed contract),
--trusted-keys DIR a folder of them (as on run); --key and --issuer-key may be repeated.
Without --key or --result-keys, this host's own runner key and <config>/trusted-runner-keys
are trusted; without --issuer-key or --trusted-keys, this host's trusted issuer keys. A
signature that no trusted key verifies, and an unsigned contract, are reported UNVERIFIED
and fail the check unless --allow-untrusted.

exit codes:
  0    the bundle verifies: every file, signature, the ledger and every value
  2    the command line was wrong
  3    it does not (bundle_invalid, or signature_invalid for a signature): the first
       problem names its file
  4    the runner failed
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "export":
        exp = sub.add_parser(
            name,
            help=help,
            description="Write one archive of a job's run (BagIt bag in a tar file), sealed "
            "with this host's runner key, that `runner verify bundle` checks anywhere.",
            epilog=EXPORT_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        exp.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        exp.add_argument("--state-dir", metavar="DIR")
        exp.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="the archive: .tar.gz (default: <job id>.bag.tar.gz here), .tgz or .tar",
        )
        exp.add_argument(
            "--inline-max-mb",
            type=float,
            default=64.0,
            metavar="MB",
            help="a file larger than this is stored beside the archive, as "
            "FILE.blobs/sha256/<digest> (default 64)",
        )
        exp.add_argument(
            "--max-total-mb",
            type=float,
            default=65536.0,
            metavar="MB",
            help="refuse to bundle more than this, beside the archive included (default 65536)",
        )
        exp.add_argument(
            "--with-inputs",
            action="store_true",
            help="bundle the staged inputs too (paper, repository); by default their manifest",
        )
        exp.add_argument("--force", action="store_true", help="replace FILE if it exists")
        exp.add_argument("--policy", metavar="FILE", help="host policy (its resultSigningKey)")
        exp.add_argument(
            "--trusted-keys",
            metavar="DIR",
            help="trusted issuer keys; those that signed the contract are carried in the "
            "bundle for information (default: the host's)",
        )
        exp.add_argument("--json", action="store_true")
        exp.set_defaults(func=cmd_export)
    elif name == "bundle":
        ver = sub.add_parser(
            name,
            help=help,
            description="Check a bundle from `runner job export` offline, with no container "
            "engine: the seal and every sha256 (naming the first bad file), files stored "
            "beside it, the ledger's hash chain, the contract's and the result's signatures, "
            "and that every value re-parses from the bundled evidence.",
            epilog=VERIFY_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        ver.add_argument("archive", metavar="ARCHIVE", help="the .tar.gz, .tgz or .tar file")
        ver.add_argument(
            "--blobs", metavar="DIR", help="files stored beside it (default ARCHIVE.blobs)"
        )
        result_key_options(ver)
        ver.add_argument(
            "--issuer-key",
            action="append",
            default=[],
            metavar="PUB",
            help="trust this issuer key for the contract (repeatable)",
        )
        ver.add_argument(
            "--trusted-keys",
            metavar="DIR",
            help="trust the issuer keys in DIR for the contract, as on run (default: the "
            "host's trusted issuer keys)",
        )
        ver.add_argument(
            "--allow-untrusted",
            action="store_true",
            help="report, not fail, signatures no trusted key verifies and an unsigned contract",
        )
        ver.add_argument(
            "--max-total-mb",
            type=float,
            default=65536.0,
            metavar="MB",
            help="refuse an archive that unpacks to more than this (default 65536)",
        )
        ver.add_argument("--json", action="store_true")
        ver.set_defaults(func=cmd_verify_bundle)


def _runner_key_path(policy_file: str | None) -> Path:
    from runner.planning import policy

    loaded = policy.load(host.policy_path(policy_file))
    return host.result_key_path(loaded.policy.resultSigningKey)


def cmd_export(args: argparse.Namespace) -> int:
    from runner.cli.job import _job_root
    from runner.results.bundle import blobs_dir, is_archive_name
    from runner.results.bundle.export import export
    from runner.trust import signing

    root = _job_root(args)
    archive = Path(args.output) if args.output else Path(f"{root.name}.bag.tar.gz")
    if not is_archive_name(archive):
        usage(f"{archive}: the archive's name must end in .tar.gz, .tgz or .tar")
    if archive.exists() and not args.force:
        usage(f"{archive} exists; remove it, pass --force, or choose another -o")
    if args.inline_max_mb < 0 or args.max_total_mb <= 0:
        usage("--inline-max-mb must be 0 or more, --max-total-mb more than 0")
    key = _runner_key_path(args.policy)
    done = export(
        root,
        archive.absolute(),
        runner_key=key,
        issuer_keys=signing.load_trusted_keys(host.trusted_keys_dir(args.trusted_keys)),
        inline_max=int(args.inline_max_mb * MiB),
        max_total=int(args.max_total_mb * MiB),
        with_inputs=args.with_inputs,
    )
    info: dict[str, Any] = {
        "archive": str(archive),
        "blobs": str(blobs_dir(archive)) if done.blobs else None,
        "files": done.files,
        "insideBytes": done.inside_bytes,
        "beside": [
            {"path": f"data/{b.path}", "sha256": b.sha256, "size": b.size} for b in done.beside
        ],
        "skipped": [{"path": s.path, "why": s.why} for s in done.skipped],
        "sealedBy": done.seal_keyid,
        "runnerKey": str(key.with_suffix(".pub")),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    print(
        f"ok: wrote {archive} ({done.files} files, {done.inside_bytes:,} bytes inside; "
        f"sealed by {done.seal_keyid})"
    )
    for b in done.beside:
        print(f"  beside   data/{b.path} ({b.size:,} bytes): {info['blobs']}/sha256/{b.sha256}")
    for s in done.skipped:
        print(f"  skipped  {s.path}: {s.why}")
    print(f"check it anywhere: runner verify bundle {archive} --key {info['runnerKey']}")
    return EXIT_SUCCEEDED


def _labelled(keys: list[TrustedKey], label: str) -> list[TrustedKey]:
    from dataclasses import replace

    return [replace(k, source=f"{label} {k.source}") for k in keys]


def _keys(args: argparse.Namespace) -> Keys:
    """The keys the auditor trusts: those named, else this host's."""
    from runner.results.bundle.verify import Keys
    from runner.trust import signing

    runner, _ = named_result_keys(args)
    issuer = [signing.load_public_key(Path(p)) for p in args.issuer_key]
    if args.trusted_keys:
        issuer += _labelled(
            signing.load_trusted_keys(host.trusted_keys_dir(args.trusted_keys)),
            "trusted issuer key",
        )
    elif not issuer:
        issuer = _labelled(
            signing.load_trusted_keys(host.trusted_keys_dir()), "this host's trusted issuer key"
        )
    return Keys(runner=runner, issuer=issuer)


def cmd_verify_bundle(args: argparse.Namespace) -> int:
    from runner.results.bundle.verify import verify

    if args.max_total_mb <= 0:
        usage("--max-total-mb must be more than 0")
    archive = Path(args.archive)
    report = verify(
        archive,
        keys=_keys(args),
        blobs=Path(args.blobs) if args.blobs else None,
        allow_untrusted=args.allow_untrusted,
        max_total=int(args.max_total_mb * MiB),
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        if report.valid:
            print(f"ok: {archive} verifies: job {report.job_id}, {report.status}")
        else:
            print(f"FAILED: {archive} does not verify: {report.problems[0]}")
        width = max(len(c.name) for c in report.checks)
        for c in report.checks:
            print(
                f"  {c.name:<{width}}  {c.status.upper() if c.status != 'ok' else 'ok'}  {c.detail}"
            )
        for s in report.skipped:
            print(f"  left out at export: {s['path']}: {s['why']}")
        if len(report.problems) > 1:
            print(f"{len(report.problems)} problems:")
            for p in report.problems:
                print(f"  {p}")
    return EXIT_SUCCEEDED if report.valid else exit_code_of(report.category)
