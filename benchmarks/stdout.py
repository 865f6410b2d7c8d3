"""Stdout capture: a job writing N bytes to stdout, through the runner and through
`docker run ... > file`."""

from __future__ import annotations

import shlex
import shutil
import statistics

from benchmarks._support import (
    GIB,
    MIB,
    Bench,
    Row,
    X,
    interleave,
    ratio_rows,
    size_text,
    summary,
)
from runner.state.jobdir import StateDir

LINE = "epoch 0003 step 0012345 loss=0.482913 lr=3.0e-04 grad_norm=1.2345 tput=812.4 samples/s"


def fig_stdout(b: Bench, reps: int, size: int) -> Row:
    command = [
        "/bin/sh",
        "-c",
        f"yes {shlex.quote(LINE)} | head -c {size} && echo '{{\"ok\": 1}}' > /job/output/done.json",
    ]
    contract = b.contract(
        b.s.tmp / "stdout",
        command=command,
        protocol={"stdoutPath": "logs/stdout.log", "stderrPath": "logs/stderr.log"},
        measurements=[
            {"measurementId": "toy-accuracy", "metric": "ok", "unit": "flag",
             "parser": {"id": "json.scalar", "version": "1", "evidencePath": "done.json",
                        "config": {"pointer": "/ok"}}}
        ],
    )  # fmt: skip
    rss: list[int] = []
    cli_rss: list[int] = []
    state = b.s.tmp / "stdout-state"

    def runner() -> float:
        seconds, _, peak, job_id = b.runner_job(contract, "stdout", state, True)
        job = StateDir(state).job(job_id)
        got = (job.output / "logs" / "stdout.log").stat().st_size
        shutil.rmtree(job.root)
        if got != size:
            raise RuntimeError(f"runner captured {got} bytes, not {size}")
        rss.append(peak)
        return seconds

    def baseline() -> float:
        d = b.s.tmp / "stdout-docker" / b.job_id("stdout-docker")
        out, ws = d / "output", d / "ws"
        b.writable(out, ws)
        target = d / "stdout.log"
        seconds, peak = b.docker_job(
            b.docker_argv(b.baseline_mounts(out, ws), command), target, True
        )
        got = target.stat().st_size
        shutil.rmtree(d)
        if got != size:
            raise RuntimeError(f"docker run > file captured {got} bytes, not {size}")
        cli_rss.append(peak)
        return seconds

    xs, ys = interleave(reps, runner, baseline)
    ratio = statistics.median(xs) / statistics.median(ys)
    peak_mb = max(rss) / MIB
    row = Row(
        f"stdout capture of a job writing {size_text(size)}",
        "stdout",
        "s",
        "the same job through `docker run --rm ... > file` (same caps)",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={
            "speedup": 1 / ratio,
            "runnerPeakRssBytes": max(rss),
            "runnerPeakRssSamples": rss,
            "dockerCliPeakRssBytes": max(cli_rss),
            "bytes": size,
            "runnerMBps": size / MIB / statistics.median(xs),
            "baselineMBps": size / MIB / statistics.median(ys),
        },
    )
    row.notes.append(
        f"speed-up {1 / ratio:.2f}{X}; runner peak RSS {peak_mb:.1f} MB (process tree, psutil "
        f"every 20 ms, and wait4 ru_maxrss); docker CLI peak {max(cli_rss) / MIB:.1f} MB; "
        "the baseline's bytes go through the attach stream to the docker CLI, and also through "
        "the json-file log driver (capped at 1 MiB, as the runner configures it)"
    )
    if size < GIB:
        row.notes.append(f"scaled down from 1 GiB to {size_text(size)} (`--stdout-gb`)")
    return row
