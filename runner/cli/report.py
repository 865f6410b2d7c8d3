"""``runner report JOB|BUNDLE``: one self-contained HTML page of a run (runner/results/report/
does the work)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli._common import EXIT_SUCCEEDED, named_result_keys, result_key_options, usage
from runner.core.redaction import NONE, Redactor

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]

MiB = 1024 * 1024

EPILOG = """\
what the page shows: the verdict and failure category; each measurement with its value, its
parser (id@version), its evidence file and a few lines of that file around the value; the
attempts against the job's budget; the agent's turns and cost against its limits (an agent
run); the egress summary (a job with egress); the inputs, images and materials by digest; and
whether the signatures verify, by the check `runner verify result` (a job folder) or `runner
verify bundle` (a bundle) runs, with the same keys and options. The page is one file: inline
CSS and SVG, no script, nothing fetched (its Content-Security-Policy forbids every fetch), so
it opens offline and can be mailed or archived as it is. No engine is needed.

The run's files are read as hostile: the evidence under a cap, never through a link, only
regular files; every string shown is cut to a cap and escaped. An agent's run: no excerpt of a
file it withheld from export (it held a secret); every other excerpt redacted of the secrets
its attempts were given (from --policy, checked against the ledger), or none shown where they
cannot be had.

keys: as on `runner verify result` (--key, --result-keys) and, for a bundle, `runner verify
bundle` (--issuer-key, --trusted-keys); by default this host's own. A signature that does not
verify is shown as such on the page; it does not stop the page from being written.

exit codes:
  0    the page was written (whether or not the run succeeded or its signatures verify)
  2    the command line was wrong, or FILE exists (pass --force)
  3    refused: the job has no result envelope, or the bundle holds none that can be shown
       (bundle_invalid)
  4    the runner failed
  5    no such job: the job id or folder given is not here
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    rep = sub.add_parser(
        name,
        help=help,
        description="Write one self-contained HTML page of a finished run, from its job "
        "folder (or job id) or from a bundle of `runner job export`.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument(
        "job",
        metavar="JOB",
        help="job id (under --state-dir), job folder, or a bundle (.tar.gz, .tgz, .tar)",
    )
    rep.add_argument("--state-dir", metavar="DIR")
    rep.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the page (default: <job id>.report.html here)",
    )
    rep.add_argument("--force", action="store_true", help="replace FILE if it exists")
    result_key_options(rep)
    rep.add_argument(
        "--issuer-key",
        action="append",
        default=[],
        metavar="PUB",
        help="(a bundle) trust this issuer key for the contract (repeatable)",
    )
    rep.add_argument(
        "--trusted-keys",
        metavar="DIR",
        help="(a bundle) trust the issuer keys in DIR for the contract (default: the host's)",
    )
    rep.add_argument(
        "--blobs", metavar="DIR", help="(a bundle) files stored beside it (default BUNDLE.blobs)"
    )
    rep.add_argument(
        "--allow-untrusted",
        action="store_true",
        help="(a bundle) count signatures no trusted key verifies, and an unsigned contract, "
        "as unverified, not as failures (as on `runner verify bundle`)",
    )
    rep.add_argument(
        "--max-total-mb",
        type=float,
        default=65536.0,
        metavar="MB",
        help="(a bundle) refuse one that unpacks to more than this (default 65536)",
    )
    rep.add_argument(
        "--policy",
        metavar="FILE",
        help="(a job) the host policy whose agent secrets the evidence excerpts are redacted "
        "of (default: this host's); read only for a job whose attempts were given secrets",
    )
    rep.add_argument("--json", action="store_true", help='print {"report": FILE, ...} as JSON')
    rep.set_defaults(func=cmd_report)


def _safe_name(envelope: dict[str, Any]) -> str:
    """The job id for the default file name when it is one a job id can be (a bundle's
    envelope is anyone's: never a path); else ``result``."""
    import re

    from runner.contract.models import JOB_ID_PATTERN

    job_id = envelope.get("jobId")
    return job_id if isinstance(job_id, str) and re.fullmatch(JOB_ID_PATTERN, job_id) else "result"


def _redaction(args: argparse.Namespace, root: Path, runtime: str | None) -> Redactor:
    """The job's redaction step for its excerpts: none where its ledger records no attempt
    given an agent's secrets; else the host policy's secrets for ``runtime``, checked against
    what its attempts were given; blind (no excerpt shown) where they cannot be had."""
    from runner.app import host
    from runner.app.regrade import redaction
    from runner.core.errors import RunnerError
    from runner.planning import policy
    from runner.state.jobdir import JobDir

    job = JobDir(root)
    try:
        if not redaction(job, runtime, {}):  # no attempt was given a secret
            return NONE
        adapters = policy.load(host.policy_path(args.policy)).policy.agents
        return redaction(job, runtime, adapters)
    except RunnerError as exc:  # a policy or a secret that cannot be read
        return NONE.blinded(f"{exc.message} (--policy names the host policy the job ran under)")


def cmd_report(args: argparse.Namespace) -> int:
    from runner.results import report
    from runner.results.bundle import is_archive_name

    if args.max_total_mb <= 0:
        usage("--max-total-mb must be more than 0")
    given = Path(args.job)
    if is_archive_name(given) and not given.is_dir():
        from runner.cli.bundle import _keys

        if args.policy:
            usage("--policy is for a job; a bundle holds no file its export found a secret in")
        data = report.from_bundle(
            given,
            _keys(args),
            blobs=Path(args.blobs) if args.blobs else None,
            max_total=int(args.max_total_mb * MiB),
            allow_untrusted=args.allow_untrusted,
        )
    else:
        from runner.cli.job import _job_root

        if args.blobs or args.issuer_key or args.allow_untrusted:
            usage("--blobs, --issuer-key and --allow-untrusted are for a bundle; JOB names a job")
        root = _job_root(args)
        keys, _ = named_result_keys(args)
        data = report.from_job(
            root, keys, redaction=lambda runtime: _redaction(args, root, runtime)
        )
    out = Path(args.output) if args.output else Path(f"{_safe_name(data.envelope)}.report.html")
    if out.exists() and not args.force:
        usage(f"{out} exists; remove it, pass --force, or choose another -o")
    report.write(data, out)
    info: dict[str, Any] = {
        "report": str(out),
        "job": data.envelope.get("jobId"),
        "status": data.envelope.get("status"),
        "from": data.kind,
        "verified": data.verification.valid,
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        mark = "verifies" if data.verification.valid else "DOES NOT VERIFY"
        print(f"ok: wrote {out} (job {info['job']}, {info['status']}; signatures: {mark})")
    return EXIT_SUCCEEDED
