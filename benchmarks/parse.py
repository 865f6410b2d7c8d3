"""Parsing: `regex.scalar` on a large evidence log (the value last) against `grep -c`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._support import (
    INPROC,
    MIB,
    Bench,
    Row,
    X,
    interleave,
    ratio_rows,
    size_text,
    summary,
)

PATTERN = "final accuracy: ([0-9.]+)"


def make_log(path: Path, size: int) -> None:
    """``size`` bytes of chatty training log, then the one line with the value."""
    lines = []
    for i in range(12000):
        lines.append(
            f"epoch {i // 4000:04d} step {i:07d} loss={1 / (i + 2):.6f} lr=3.0e-04 "
            f"grad_norm={(i % 97) / 10:.4f} tput={800 + i % 50}.4 samples/s\n"
        )
    block = "".join(lines).encode()
    with path.open("wb") as f:
        written = 0
        while written + len(block) <= size:
            f.write(block)
            written += len(block)
        f.write(block[: size - written].rsplit(b"\n", 1)[0] + b"\n")
        f.write(b"final accuracy: 0.8190\n")


def fig_parse(b: Bench, reps: int, size: int) -> Row:
    log = b.s.tmp / "evidence.log"
    make_log(log, size)
    rss: list[int] = []
    before: list[int] = []

    def runner() -> float:
        out = subprocess.run(
            [sys.executable, str(INPROC), "parse", str(log), PATTERN],
            env=b.s.env,
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, Any] = json.loads(out.stdout)
        if result["value"] != 0.819:
            raise RuntimeError(f"regex.scalar read {result['value']!r}, not 0.819")
        rss.append(int(result["peakRssBytes"]))
        before.append(int(result["rssBeforeBytes"]))
        return float(result["seconds"])

    def baseline() -> float:
        t0 = time.perf_counter()
        out = subprocess.run(
            ["grep", "-cE", PATTERN, str(log)], capture_output=True, text=True, check=True
        )
        seconds = time.perf_counter() - t0
        if out.stdout.strip() != "1":
            raise RuntimeError(f"grep -c counted {out.stdout.strip()}")
        return seconds

    baseline()  # the file was just written, so it is in the page cache already
    xs, ys = interleave(reps, runner, baseline)
    log.unlink()
    ratio = statistics.median(xs) / statistics.median(ys)
    peak_mb = max(rss) / MIB
    row = Row(
        f"parsing a {size_text(size)} evidence log (`regex.scalar`, value last)",
        "parse",
        "s",
        f"`grep -cE '{PATTERN}'` on the same file",
        summary(ys),
        summary(xs),
        ratio,
        f"≤ 1.5{X}; RSS ≤ 100 MB",
        ratio <= 1.5 and peak_mb <= 100,
        ratio_rows(xs, ys),
        extra={
            "bytes": size,
            "runnerPeakRssBytes": max(rss),
            "rssBeforeParseBytes": max(before),
            "runnerMBps": size / MIB / statistics.median(xs),
            "grepMBps": size / MIB / statistics.median(ys),
        },
    )
    row.notes.append(
        f"runner: `registry.get('regex.scalar', '1').parse()` timed in-process; peak RSS of that "
        f"process {peak_mb:.1f} MB ({max(before) / MIB:.1f} MB before the call: interpreter and "
        "imports); the file is in the page cache for both"
    )
    return row
