"""Benchmark the runner against its floor (issue 8): each figure side by side with its baseline.

    .venv/bin/python scripts/benchmark.py --quick      # about 3-4 minutes on 2 cores
    .venv/bin/python scripts/benchmark.py              # the full sizes and more repeats
    .venv/bin/python scripts/benchmark.py --smoke      # tiny sizes, one repeat, writes nothing

(``python -m benchmarks`` from the checkout is the same.) One module of benchmarks/ per
figure, as ``--only`` names it; what they share is in benchmarks/_support.py.

Runner and baseline are measured interleaved (ABBA order) in the same run, so the ratios hold
on a noisy shared machine even when the absolute times do not. The report goes to
``benchmarks/results/latest.json`` and ``.md`` (``--out-dir``, ``--name``). Each figure is
judged against its target (benchmarks/targets.py) and compared with the previous report (the
one committed at HEAD, else the file there): a ratio more than 10% worse is a regression,
listed at the top of the report and on stderr.

Only the local engine is used. Every container started here carries the label
``bench=<run id>``; they, the child processes and the temporary folder are removed on exit,
Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._support import (
    GIB,
    MIB,
    ROOT,
    Bench,
    Row,
    Session,
    check_local_engine,
    machine_facts,
    on_signal,
    progress,
    runner_cli,
)
from benchmarks.agentimage import fig_agentimage
from benchmarks.concurrent_jobs import fig_concurrent
from benchmarks.egress import fig_egress
from benchmarks.fetch import fig_fetch
from benchmarks.parse import fig_parse
from benchmarks.profiles import (
    import_profile,
    run_profile,
)
from benchmarks.report import (
    markdown,
    row_json,
)
from benchmarks.stagecache import fig_stagecache
from benchmarks.staging import fig_staging
from benchmarks.startup import fig_startup
from benchmarks.stdout import fig_stdout
from benchmarks.targets import REGRESSION, compare, judge, read_previous, regression_lines
from benchmarks.toy import (
    box_check,
    fig_toy,
    fig_toy_autoserve,
    fig_toy_sampling,
    fig_toy_served,
    setup_toy,
)
from benchmarks.watch import fig_watch

MODES: dict[str, dict[str, Any]] = {
    # repeats per figure; sizes in bytes
    "smoke": {"toy": 1, "startup": 2, "stdout": 1, "staging": 1, "parse": 1, "concurrent": 1,
              "egress": 1, "stdoutBytes": 16 * MIB, "stageBytes": 16 * MIB, "logBytes": 16 * MIB,
              "jobs": 3, "downloadBytes": 16 * MIB, "fetch": 1, "fetchBytes": 16 * MIB,
              "stagecache": 1, "stagecacheBytes": 32 * MIB, "agentimage": 1, "sampling": 1,
              "watch": 1},
    "quick": {"toy": 5, "startup": 8, "stdout": 3, "staging": 3, "parse": 3, "concurrent": 2,
              "egress": 6, "stdoutBytes": GIB // 2, "stageBytes": GIB // 2, "logBytes": GIB,
              "jobs": 20, "downloadBytes": 100 * MIB, "fetch": 3, "fetchBytes": GIB // 4,
              "stagecache": 3, "stagecacheBytes": 2 * GIB, "agentimage": 4, "sampling": 10,
              "watch": 2},
    "full": {"toy": 15, "startup": 20, "stdout": 5, "staging": 5, "parse": 5, "concurrent": 3,
             "egress": 12, "stdoutBytes": GIB, "stageBytes": 2 * GIB, "logBytes": GIB,
             "jobs": 20, "downloadBytes": 100 * MIB, "fetch": 5, "fetchBytes": GIB,
             "stagecache": 5, "stagecacheBytes": 2 * GIB, "agentimage": 8, "sampling": 30,
             "watch": 4},
}  # fmt: skip


FIGURES = ("toy", "startup", "stdout", "staging", "parse", "concurrent", "egress", "fetch",
           "stagecache", "agentimage", "sampling", "watch")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="fewer repeats; 0.5 GiB stdout and staging"
    )
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, no report")
    p.add_argument("--repeats", type=int, help="repeats for every figure (overrides the mode)")
    p.add_argument("--only", help=f"comma-separated figures to run, of: {', '.join(FIGURES)}")
    p.add_argument("--jobs", type=int, help="concurrent jobs (default 20)")
    p.add_argument("--stage-gb", type=float, help="size of the staged input folder, GiB")
    p.add_argument("--stdout-gb", type=float, help="bytes the stdout job writes, GiB")
    p.add_argument("--log-gb", type=float, help="size of the parsed evidence log, GiB")
    p.add_argument("--fetch-gb", type=float, help="size of the fetched asset, GiB")
    p.add_argument(
        "--stagecache-gb", type=float, help="cached paper + asset of the stagecache figure, GiB"
    )
    p.add_argument("--workdir", type=Path, help="where the temporary folder goes (default $TMPDIR)")
    p.add_argument(
        "--out-dir", type=Path, help="report folder (default benchmarks/results/; none in smoke)"
    )
    p.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="run the CLI with the environment as given (no temporary PYTHONPYCACHEPREFIX)",
    )
    p.add_argument("--name", default="latest", help="report file name, without extension")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    cfg = dict(MODES[mode])
    if args.repeats:
        cfg.update({k: args.repeats for k in FIGURES})
    for flag, key in (("stage_gb", "stageBytes"), ("stdout_gb", "stdoutBytes"),
                      ("log_gb", "logBytes"), ("fetch_gb", "fetchBytes"),
                      ("stagecache_gb", "stagecacheBytes")):  # fmt: skip
        if getattr(args, flag):
            cfg[key] = int(getattr(args, flag) * GIB)
    if args.jobs:
        cfg["jobs"] = args.jobs
    only = set(args.only.split(",")) if args.only else set(FIGURES)
    if only - set(FIGURES):
        raise SystemExit(f"--only: unknown figure(s) {', '.join(sorted(only - set(FIGURES)))}")
    out_dir = args.out_dir or (None if args.smoke else ROOT / "benchmarks" / "results")
    # Read before anything is written: the committed report is what the run is compared with.
    previous, source = (
        read_previous(out_dir / f"{args.name}.json") if out_dir is not None else (None, "")
    )

    check_local_engine()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    session = Session(args.workdir, not args.no_bytecode_cache)
    b = Bench(session, args, runner_cli())
    rows: list[Row] = []
    errors: list[dict[str, str]] = []
    report: dict[str, Any] = {}
    interrupted = False
    try:
        report["machine"] = machine_facts()
        progress(f"run {session.id}: mode {mode}, temp {session.tmp}")
        progress("pinning the toy contract, warm-up run, reading the caps it applied")
        setup_toy(b)
        steps: list[tuple[str, Callable[[], list[Row]]]] = [
            (
                "toy",
                lambda: [
                    fig_toy(b, cfg["toy"]),
                    fig_toy_served(b, cfg["toy"]),
                    fig_toy_autoserve(b, cfg["toy"]),
                ],
            ),
            ("startup", lambda: fig_startup(b, cfg["startup"])),
            ("stdout", lambda: [fig_stdout(b, cfg["stdout"], cfg["stdoutBytes"])]),
            ("staging", lambda: [fig_staging(b, cfg["staging"], cfg["stageBytes"])]),
            ("parse", lambda: [fig_parse(b, cfg["parse"], cfg["logBytes"])]),
            ("concurrent", lambda: fig_concurrent(b, cfg["concurrent"], cfg["jobs"])),
            ("egress", lambda: fig_egress(b, cfg["egress"], cfg["downloadBytes"])),
            ("fetch", lambda: [fig_fetch(b, cfg["fetch"], cfg["fetchBytes"])]),
            ("stagecache", lambda: [fig_stagecache(b, cfg["stagecache"], cfg["stagecacheBytes"])]),
            ("agentimage", lambda: [fig_agentimage(b, cfg["agentimage"])]),
            ("sampling", lambda: [fig_toy_sampling(b, cfg["sampling"])]),
            ("watch", lambda: [fig_watch(b, cfg["watch"])]),
        ]
        if "toy" in only:
            progress("same box: docker inspect of a runner container and a baseline one")
            try:
                report["boxCheck"] = box_check(b)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                errors.append({"figure": "box check", "error": str(exc)})
        for name, step in steps:
            if name not in only:
                continue
            progress(f"figure {name} ({cfg[name]} repeats)")
            try:
                new = step()
            except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
                detail = getattr(exc, "stderr", None)
                errors.append({"figure": name, "error": f"{exc} {detail or ''}".strip()})
                progress(f"figure {name} FAILED: {exc}")
                continue
            for r in new:
                judge(r)
                progress(f"  {r.figure}: ratio {r.ratio:.2f}, {_said(r)}")
            rows.extend(new)
        try:  # a failed profile must not cost the figures already measured
            if "startup" in only:
                report["importProfile"] = import_profile(b)
            if "toy" in only:
                progress("profile of one toy run (pyinstrument, -X importtime)")
                report["runProfile"] = run_profile(b)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            detail = getattr(exc, "stderr", None)
            errors.append({"figure": "profiles", "error": f"{exc} {detail or ''}".strip()})
    except KeyboardInterrupt:
        interrupted = True
        progress("interrupted: stopping children, removing containers and temporary files")
    finally:
        session.close()
    if interrupted:
        return 130

    report.update(
        {
            "schemaVersion": "1.0",
            "command": shlex.join(["scripts/benchmark.py", *(argv or sys.argv[1:])]),
            "mode": mode,
            "config": cfg,
            "runId": session.id,
            "startedAt": started_at,
            "durationSeconds": time.monotonic() - started,
            "loadAverageAtEnd": os.getloadavg(),
            "figures": [row_json(r) for r in rows],
            "errors": errors,
            "allMet": bool(rows) and all(r.met for r in rows if r.target) and not errors,
        }
    )
    if previous is not None:
        report["previous"] = {
            "source": source,
            "runId": previous.get("runId"),
            "mode": previous.get("mode"),
            "startedAt": previous.get("startedAt"),
            "runnerCommit": previous.get("machine", {}).get("runnerCommit"),
        }
    report["regressions"] = compare(report["figures"], previous)
    md = markdown(report, rows)
    print(md)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out_dir / f"{args.name}.md").write_text(md)
        progress(f"wrote {out_dir / args.name}.json and .md")
    if previous is None and out_dir is not None:
        progress("no previous report to compare with")
    for line in regression_lines(report["figures"]):
        progress(f"REGRESSION (over {REGRESSION:.0%} worse than {source}): {line}")
    return 1 if errors else 0


def _said(row: Row) -> str:
    if not row.target:
        return "no target"
    return "met" if row.met else "NOT met"
