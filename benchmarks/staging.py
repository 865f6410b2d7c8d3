"""Staging: an input folder staged and hashed by the runner against `cp -r` and `sha256sum`."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from typing import Any

from benchmarks._support import (
    GIB,
    INPROC,
    Bench,
    Row,
    interleave,
    make_inputs,
    ratio_rows,
    size_text,
    summary,
    timed_command,
)
from runner.state.jobdir import StateDir


def fig_staging(b: Bench, reps: int, size: int) -> Row:
    base = b.s.tmp / "staging"
    files, nbytes = make_inputs(base / "data", size)
    contract = b.contract(base, repository="./data", with_toy_inputs=False)
    rss: list[int] = []

    def runner() -> float:
        job = StateDir(base).job(b.job_id("stage")).root
        out = subprocess.run(
            [sys.executable, str(INPROC), "stage", str(contract), str(job)],
            env=b.s.env,
            capture_output=True,
            text=True,
            check=True,
        )
        shutil.rmtree(job)
        result: dict[str, Any] = json.loads(out.stdout)
        rss.append(int(result["peakRssBytes"]))
        return float(result["seconds"])

    script = (
        'cp -r "$1" "$2/data" && cd "$2" && find data -type f -print0 | sort -z'
        " | xargs -0 sha256sum > manifest.txt"
    )

    def baseline() -> float:
        dest = base / "copies" / b.job_id("cp")
        dest.mkdir(parents=True)
        seconds = timed_command(b, ["/bin/sh", "-c", script, "sh", str(base / "data"), str(dest)])
        lines = (dest / "manifest.txt").read_text().count("\n")
        shutil.rmtree(dest)
        if lines != files:
            raise RuntimeError(f"sha256sum listed {lines} files, not {files}")
        return seconds

    runner()
    baseline()  # warm-up: both read the source from the page cache from here on
    xs, ys = interleave(reps, runner, baseline)
    ratio = statistics.median(xs) / statistics.median(ys)
    row = Row(
        f"staging and hashing a {size_text(nbytes)} input folder ({files} files)",
        "staging",
        "s",
        "`cp -r` then `sha256sum` of every copied file",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={"files": files, "bytes": nbytes, "runnerPeakRssBytes": max(rss)},
    )
    row.notes.append(
        "runner: `runner.staging.jobdir.stage_inputs` timed in-process (a fresh job folder "
        "each time); "
        "source in the page cache for both (after a warm-up of each)"
    )
    if size < 2 * GIB:
        row.notes.append(f"scaled down from 2 GiB to {size_text(size)} (`--stage-gb`)")
    return row
