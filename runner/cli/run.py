"""``runner run``: one contract in this process, or several as a batch (runner/app/batch.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import (
    EXIT_CODES_HELP,
    HEARTBEAT_SECONDS,
    HOST_HELP,
    HumanProgress,
    NotesOnly,
    batch_exit,
    checked_lease,
    envelope_exit,
    host_options,
    host_run_options,
    labels,
    load_host,
    summary,
    usage,
)
from runner.core import collector
from runner.core.errors import RunnerError

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.contract import Trust
    from runner.execution import orchestrator
    from runner.planning.policy import LoadedPolicy

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    run = sub.add_parser(
        name,
        help=help,
        description=(
            "Verify the contract (signature, digest, schema) and the host policy, stage its "
            "inputs into <state>/jobs/<job id>/, run the pinned image with no network and hard "
            "caps, then read every measurement through its parser. The envelope is written to "
            "<state>/jobs/<job id>/result.json."
        ),
        epilog=EXIT_CODES_HELP + "\n" + HOST_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "contract",
        metavar="CONTRACT",
        nargs="+",
        help="task.json, or a signed .dsse.json; several run as a batch (see --parallel)",
    )
    run.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="with several CONTRACTs: how many run at once (default: the number of CPUs). "
        "Each job runs in its own process forked from this one, so the runner's start-up is "
        "paid once for the whole batch",
    )
    run.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where job folders live (default: $RUNNER_STATE_DIR, else the user's state dir, "
        "e.g. ~/.local/state/runner)",
    )
    run.add_argument(
        "--job-id",
        metavar="ID",
        help="job id (default: the contract's jobId, else <name>-<digest prefix>)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print only the result envelope (JSON) on stdout; no progress",
    )
    run.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label on the job's container (repeatable)",
    )
    run.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tighten one of the contract's limits (cpus, memoryGb, shmGb, pidsLimit, "
        "timeoutMinutes, tmpfsMb); never loosens it (repeatable)",
    )
    run.add_argument(
        "--rerun",
        action="store_true",
        help="run a job id that already ran to an end again, as a new attempt under the same "
        "budget",
    )
    run.add_argument(
        "--bundle",
        metavar="BUNDLE.tar",
        help="a `docker save` tarball to load the pinned image from when it is not here "
        "(checked to hold the pinned image id before it is loaded)",
    )
    run.add_argument(
        "--heartbeat",
        type=float,
        default=HEARTBEAT_SECONDS,
        metavar="SECONDS",
        help="how often the budget ledger and runtime-budget.json are updated (default 5)",
    )
    run.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when stopping the job (default 5)",
    )
    run.add_argument(
        "--lease",
        type=float,
        metavar="SECONDS",
        help="how long this runner may go without writing a heartbeat before it removes its "
        "own container, and, after two of them, another host may take the job over (default "
        "three heartbeats and at least 120; at least three heartbeats and 10 s): shorter "
        "takes a lost host's job over sooner, and takes a slow moment for a lost host sooner",
    )
    run.add_argument(
        "--no-resource-sampling",
        dest="resource_sampling",
        action="store_false",
        help="do not follow the engine's stats of the job's container (CPU, memory, I/O, "
        "pids, and their time series in record/attempts/<n>/resources.json): no stats stream "
        "is opened, and the envelope's resource figures are null",
    )
    host_options(run)
    run.set_defaults(func=cmd_run)


def _overrides(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        key, sep, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            usage(f"--limit wants KEY=NUMBER, got {item!r}")
        if not sep:
            usage(f"--limit wants KEY=NUMBER, got {item!r}")
    return out


def _run_options(
    args: argparse.Namespace, loaded: LoadedPolicy, trust: Trust
) -> orchestrator.RunOptions:
    return host_run_options(
        loaded,
        trust,
        state_dir=args.state_dir,
        stop_grace=args.stop_grace,
        heartbeat=args.heartbeat,
        job_id=args.job_id,
        labels=labels(args.label),
        overrides=_overrides(args.limit),
        rerun=args.rerun,
        bundle=Path(args.bundle) if args.bundle else None,
        resource_sampling=args.resource_sampling,
        lease=checked_lease(args.lease, args.heartbeat),
    )


def _run_batch(args: argparse.Namespace, options: orchestrator.RunOptions) -> int:
    from runner.app import batch
    from runner.app.warmup import warm_up

    paths = [Path(c) for c in args.contract]
    parallel = args.parallel or os.cpu_count() or 1
    if parallel < 1:
        usage(f"--parallel wants a number of jobs of at least 1, got {parallel}")
    finished = 0
    if not args.json:
        print(f"==> batch     {len(paths)} contracts, {parallel} at a time", file=sys.stderr)

    def done(index: int, path: Path, data: dict[str, Any]) -> None:
        nonlocal finished
        finished += 1
        if args.json:
            return
        values = ", ".join(
            f"{m['measurementId']} = {m['value']}" for m in data.get("measurements") or []
        )
        failure = data.get("failure") or {}
        outcome = data["status"]
        if failure:
            reason = str(failure.get("reason") or "").splitlines()[0][:120]
            outcome += f" ({failure['category']}: {reason})"
        print(
            f"[{finished}/{len(paths)}] {path}: {outcome}{': ' + values if values else ''}"
            f"  job {data.get('jobId')}",
            flush=True,
        )

    results = batch.run_many(paths, options, parallel=parallel, on_done=done, warm_up=warm_up)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        tally = ", ".join(
            f"{sum(1 for d in results if d['status'] == status)} {status}"
            for status in sorted({d["status"] for d in results})
        )
        print(f"{len(results)} jobs: {tally}")
    return batch_exit(results)


def cmd_run(args: argparse.Namespace) -> int:
    from runner.execution import orchestrator

    if len(args.contract) > 1 and args.job_id:
        usage("--job-id names one job: give it with a single CONTRACT")
    try:
        loaded, trust = load_host(args)
    except RunnerError as exc:
        # Even a host misconfiguration ends in an envelope under --json.
        envelope = orchestrator.refused(exc, stage="policy")
        if args.json:
            data = orchestrator.as_json(envelope)
            batch = [data] * len(args.contract)
            print(json.dumps(data if len(args.contract) == 1 else batch, indent=2))
        print(f"runner: {exc.category}: {exc}", file=sys.stderr)
        return envelope_exit(envelope)
    options = _run_options(args, loaded, trust)
    if len(args.contract) > 1:
        return _run_batch(args, options)  # its warm-up resumes the collector, then forks
    collector.resume()  # the imports are done; the job may run for hours
    progress = NotesOnly() if args.json else HumanProgress()
    host.install_signal_handlers()
    envelope = orchestrator.run(Path(args.contract[0]), options, progress=progress)
    if isinstance(progress, HumanProgress):
        progress.done()
    data = orchestrator.as_json(envelope)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        where = Path(envelope.jobDir) / "result.json" if envelope.jobDir else None
        print(summary(data, where if where and where.exists() else None))
    return envelope_exit(envelope)
