"""``runner replay JOB --times N``: a finished job's contract run again as N jobs of their own,
and how reproducible its result is (runner/app/replay.py runs them, runner/results/replay.py
compares)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runner.app import host
from runner.cli._common import (
    EXIT_CANCELLED,
    EXIT_JOB_FAILED,
    EXIT_SUCCEEDED,
    HOST_HELP,
    HumanProgress,
    NotesOnly,
    exit_code_of,
    host_options,
    host_run_options,
    labels,
    load_host,
    usage,
)
from runner.cli.job import _job_root
from runner.models.replay import REPORT_FILE
from runner.state.jobdir import JobDir

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.execution.container import Progress
    from runner.models.replay import ReplayReport, ReplayRun

__all__ = ["register"]

MAX_TIMES = 20
"""As :data:`runner.app.replay.MAX_TIMES` (not imported: ``--help`` stays light)."""

EXAMPLES = """\
examples:
  runner replay toy-eval --times 3             # 3 replays, progress on stderr, a table
  runner replay toy-eval --times 2 --json      # only the report (JSON) on stdout
  runner replay ~/.local/state/runner/jobs/toy-eval --times 5

Each replay is a job of its own (<job id>-replay-<n>: its own folder, ledger and budget; its
record/replay-of.json names the original). The report is written to the original's
record/replays.json (an earlier one is kept as record/replays-<time>.json).

exit codes:
  0    every replay ran and reproduced the original exactly (every value, every evidence file)
  1    a replay failed, or a value or an evidence file differs (the report names the first)
  2    the command line was wrong (--times outside 1..20)
  3    refused: the job has no result, its contract does not verify, or the host policy does
       not allow replays (a signed contract needs allowJobIdOverride); also when the host
       refused every replay before it ran (the contract expired since, say)
  4    infrastructure (the engine, the host's policy or keys), before any replay ran
  5    no such job
  130  interrupted; the report keeps the replays that ran (complete: false)
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    cmd = sub.add_parser(
        name,
        help=help,
        description=(
            "Run a finished job's contract again, --times N times, each as a job of its own\n"
            "in a fresh folder (its own ledger and budget), one after another, then compare\n"
            "each replay with the original: per measurement the values, their spread and\n"
            "whether they are identical; per evidence file whether its bytes are identical\n"
            "(sha256); and what differed first, in the contract's order.\n\n"
            "The contract is the one the job ran, read from its folder (input/task.dsse.json)\n"
            "and verified again against this host's trusted issuers and policy, as `runner\n"
            "run` does; its inputs are staged from the job's input/ under the digests it\n"
            "binds. The replays run under the original's --limit overrides."
        ),
        epilog=EXAMPLES + "\n" + HOST_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
    cmd.add_argument(
        "--times",
        type=int,
        required=True,
        metavar="N",
        help=f"how many replays to run, 1 to {MAX_TIMES}",
    )
    cmd.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where job folders live; the replays' too (default: the job folder's state "
        "folder when JOB is a folder, else $RUNNER_STATE_DIR, else the user's)",
    )
    cmd.add_argument(
        "--json",
        action="store_true",
        help="print only the reproducibility report (JSON) on stdout; progress stays on stderr",
    )
    cmd.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label on each replay's container (repeatable)",
    )
    cmd.add_argument(
        "--heartbeat",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="as `runner run --heartbeat` (default 5)",
    )
    cmd.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="as `runner run --stop-grace` (default 5)",
    )
    host_options(cmd)
    cmd.set_defaults(func=cmd_replay)


def _state_dir(args: argparse.Namespace, root: Path) -> str:
    """--state-dir, else the state folder a job folder given as JOB lies in, else the host's;
    absolute (the engine mounts the replays' folders from it)."""
    given_folder = not args.state_dir and JobDir(Path(args.job)).record.is_dir()
    if given_folder and root.resolve().parent.name == "jobs":
        return str(root.resolve().parent.parent)
    return str(host.state_dir(args.state_dir).absolute())


class _Progress:
    """Each replay's run, on stderr, its lines prefixed with which replay it is."""

    def __init__(self, n: int, times: int, quiet: bool) -> None:
        self.inner: Progress = NotesOnly() if quiet else HumanProgress()
        self.prefix = f"[{n}/{times}] "
        self.quiet = quiet

    def stage(self, name: str, detail: str) -> None:
        self.inner.stage(name, detail if self.quiet else self.prefix + detail)

    def running(self, elapsed: float, budget: float) -> None:
        self.inner.running(elapsed, budget)

    def transfer(self, label: str, done: int, total: int) -> None:
        self.inner.transfer(label, done, total)


def cmd_replay(args: argparse.Namespace) -> int:
    from runner.app import replay

    if not 1 <= args.times <= MAX_TIMES:
        usage(
            f"--times wants a number of replays from 1 to {MAX_TIMES}, got {args.times}; "
            f"run more in several `runner replay` calls of at most {MAX_TIMES}"
        )
    root = _job_root(args).absolute()
    loaded, trust = load_host(args)
    options = host_run_options(
        loaded,
        trust,
        state_dir=_state_dir(args, root),
        stop_grace=args.stop_grace,
        heartbeat=args.heartbeat,
        labels=labels(args.label),
    )
    orig = replay.original(root, options)
    times = args.times
    print(
        f"==> replay    {orig.envelope.jobId}: {times} replay{'s' if times != 1 else ''} of "
        f"{orig.contract.model.name} ({orig.contract.digest[:19]}…)",
        file=sys.stderr,
    )
    current: list[_Progress] = []

    def started(n: int, job_id: str) -> Progress:
        print(f"==> replay    [{n}/{times}] job {job_id}", file=sys.stderr, flush=True)
        current[:] = [_Progress(n, times, args.json)]
        return current[0]

    def done(run: ReplayRun) -> None:
        if current and isinstance(current[0].inner, HumanProgress):
            current[0].inner.done()
        outcome: str = run.status or "no envelope"
        if run.failure is not None:
            outcome += f" ({run.failure.category} at {run.failure.stage})"
        if run.problem:
            outcome += f": {run.problem}"
        print(f"==> replay    [{run.run}/{times}] {outcome}", file=sys.stderr, flush=True)

    host.install_signal_handlers()
    report = replay.replay(orig, options, times, on_start=started, on_done=done)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(_table(report))
        print(f"\nreport    {orig.job.record / REPORT_FILE}")
    return _exit(report)


def _exit(report: ReplayReport) -> int:
    """130 when a replay was interrupted; a refusal's code (3) or an infrastructure failure's
    (4) when this host ran none of the replays (each was stopped before it became a job: a
    contract expired since, a policy that no longer admits it); else 0 when identical, 1."""
    replays = report.runs[1:]
    if any(r.failure is not None and r.failure.category == "cancelled" for r in replays):
        return EXIT_CANCELLED
    never = [r.failure.category for r in replays if r.jobDir is None and r.failure is not None]
    if replays and len(never) == len(replays):
        return exit_code_of(never[0])
    return EXIT_SUCCEEDED if report.identical else EXIT_JOB_FAILED


def _table(report: ReplayReport) -> str:
    """The report for people: each measurement's values and spread, each evidence file (what
    a job wrote shown as ASCII JSON, cut short)."""
    from runner.results.replay import shown as show

    lines = [report.summary, ""]
    rows: list[tuple[str, ...]] = [("run", "job", "status")]
    for r in report.runs:
        status: str = r.status or "no envelope"
        if r.failure is not None:
            status += f" ({r.failure.category})"
        rows.append((str(r.run) if r.run else "original", str(r.jobId), status))
    lines += _columns(rows)
    lines.append("")
    rows = [("measurement", "identical", "values", "range", "relative")]  # fmt: skip
    for m in report.measurements:
        values = ", ".join(show(v.value, 24) if v.missing is None else "-" for v in m.values)
        rows.append(
            (
                show(m.measurementId, 40).strip('"'),
                "yes" if m.identical else "NO",
                values[:80],
                "" if m.range is None else show(m.range, 24),
                "" if m.relativeSpread is None else f"{m.relativeSpread:.3g}",
            )
        )
    lines += _columns(rows)
    lines.append("")
    rows = [("evidence file", "identical", "differs first in run")]  # fmt: skip
    for e in report.evidence:
        first = "" if e.firstDifferentRun is None else str(e.firstDifferentRun)
        rows.append((show(e.path, 60).strip('"'), "yes" if e.identical else "NO", first))
    lines += _columns(rows)
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
