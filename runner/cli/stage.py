"""``runner cluster stage CONTRACT``: lay out a job's folder as `runner run` would, and run nothing
(runner/execution/stageonly.py does the work)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runner.app import host
from runner.cli._common import EXIT_SUCCEEDED, HOST_HELP, host_options, load_host

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]

EPILOG = (
    """\
what is laid out under <state>/jobs/<job id>/, exactly as `runner run` lays it out before it
creates a container:
  input/                the contract's inputs, copied and checked against the digests (and
                        the commit) the contract binds; task.json, parser-catalog.json,
                        result.schema.json, compute-decision.json
  workspace/repository  the job's writable copy of the repository
  output/, workspace/, runtime-cache/, runtime-venv/
                        given to the job's user (uid 10001 when staged as root, else yours)
  execution/            input-manifest.json, runtime-budget.json
  record/ledger.jsonl   the job accepted (once); no attempt is started or recorded

No image is looked at and no engine or cluster is contacted. Run it on a host that mounts the
cluster's claim (--state-dir at the claim's root), as root so that the pod's user (10001) owns
the writable folders, then apply the manifests of `runner cluster render --to kubernetes`:

  runner cluster stage task.dsse.json --state-dir /mnt/runner-jobs
  runner cluster render task.dsse.json --to kubernetes --state-dir /mnt/runner-jobs \\
    | kubectl apply -f -

`runner run` on the same contract and --state-dir later runs the staged job (it stages again,
with the same checks).

exit codes:
  0    staged
  1    the job has no budget left (resource_exhausted)
  3    refused: the same refusals as `runner run` (contract, signature, policy, an input that
       is not the one the contract binds, a hostile input), a finished job, a job id of
       another contract
  4    infrastructure: the policy or keys are broken, the ledger is corrupt, another runner
       holds the job, or an attempt is in flight

"""
    + HOST_HELP
)


def register(sub: Subparsers, name: str, help: str) -> None:
    stage = sub.add_parser(
        name,
        help=help,
        description="Verify the contract and this host's policy as `runner run` does, then lay "
        "out the job's folder (inputs staged and verified, budget, compute decision, writable "
        "folders) without running anything.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    stage.add_argument("contract", metavar="CONTRACT", help="task.json, or a signed .dsse.json")
    stage.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where job folders live, as `runner run --state-dir` (for a cluster: the claim's "
        "root as this host mounts it)",
    )
    stage.add_argument("--job-id", metavar="ID", help="as `runner run --job-id`")
    stage.add_argument(
        "--json", action="store_true", help="print {jobId, jobDir, files, bytes, ...} as JSON"
    )
    host_options(stage)
    stage.set_defaults(func=cmd_stage)


def cmd_stage(args: argparse.Namespace) -> int:
    from runner.execution import stageonly
    from runner.execution.options import RunOptions

    loaded, trust = load_host(args)
    options = RunOptions(
        state_dir=host.state_dir(args.state_dir),
        job_id=args.job_id,
        policy=loaded,
        trust=trust,
        result_key=host.result_key_path(loaded.policy.resultSigningKey),
        protected=(Path(host.config_dir()),),
    )
    staged = stageonly.stage(
        Path(args.contract), options, host_uid=os.getuid(), host_gid=os.getgid()
    )
    info = {
        "staged": True,
        "jobId": staged.job_id,
        "jobDir": str(staged.job_dir),
        "files": staged.files,
        "bytes": staged.bytes,
        "attempt": staged.attempt,
        "user": staged.user,
        "acceptedNow": staged.accepted_now,
        "signed": staged.signed,
        "budget": staged.budget.as_json(),
    }
    if not staged.signed:
        print("runner: WARNING: unsigned contract accepted (local development)", file=sys.stderr)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(
            f"ok: staged job {staged.job_id} for attempt {staged.attempt}: {staged.files} input "
            f"files ({staged.bytes:,} bytes) in {staged.job_dir}"
        )
        print(
            f"  writable folders owned by {staged.user}; "
            f"{staged.budget.remaining:g} s of budget left; nothing was run"
        )
    return EXIT_SUCCEEDED
