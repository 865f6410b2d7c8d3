"""Concurrent jobs: N toy jobs at once as N `runner run` processes, as one batch, and with
`runner serve` running, against N `docker run --rm` (throughput)."""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks._support import (
    Bench,
    Row,
    interleave,
    ratio_rows,
    served,
    summary,
)
from benchmarks.cpu import CpuMeter, CpuUse, per_job
from benchmarks.cpu import note as cpu_note


def fig_concurrent(b: Bench, reps: int, jobs: int) -> list[Row]:
    command = json.loads(b.toy.read_text())["protocol"]["command"]
    cpu: dict[str, list[CpuUse]] = {k: [] for k in ("separate", "batch", "served", "docker")}
    meter = CpuMeter()

    def runner(
        env: dict[str, str] | None = None, uses: str = "separate", on: CpuMeter = meter
    ) -> float:
        state = b.s.tmp / "many" / b.job_id("state")
        ids = [b.job_id("many") for _ in range(jobs)]
        outs = [b.s.tmp / "many" / f"{i}.json" for i in ids]
        state.mkdir(parents=True)
        with contextlib.ExitStack() as files:
            sinks = [files.enter_context(o.open("wb")) for o in outs]
            with on.window(cpu[uses]):
                t0 = time.perf_counter()
                procs = [
                    b.s.spawn(
                        b.run_argv(b.toy, i, state),
                        stdout=f,
                        stderr=subprocess.DEVNULL,
                        env=env or b.s.env,
                    )
                    for i, f in zip(ids, sinks, strict=True)
                ]
                codes = [b.s.reap(p)[0] for p in procs]
                seconds = time.perf_counter() - t0
        bad = [c for c in codes if c != 0]
        ok = sum(json.loads(o.read_text()).get("status") == "succeeded" for o in outs)
        shutil.rmtree(state)
        if bad or ok != jobs:
            raise RuntimeError(f"{len(bad)} of {jobs} concurrent runner runs failed: {bad}")
        return jobs / seconds

    def baseline() -> float:
        d = b.s.tmp / "many-docker" / b.job_id("docker")
        dirs = [(d / f"{i}" / "output", d / f"{i}" / "ws") for i in range(jobs)]
        for out, ws in dirs:
            b.writable(out / "logs", ws)
        argvs = [b.docker_argv(b.baseline_mounts(out, ws), command) for out, ws in dirs]
        with contextlib.ExitStack() as files:
            sinks = [
                files.enter_context((o / "logs" / "evaluation.log").open("wb")) for o, _ in dirs
            ]
            with meter.window(cpu["docker"]):
                t0 = time.perf_counter()
                procs = [
                    b.s.spawn(a, stdout=f, stderr=subprocess.DEVNULL)
                    for a, f in zip(argvs, sinks, strict=True)
                ]
                codes = [b.s.reap(p)[0] for p in procs]
                seconds = time.perf_counter() - t0
        shutil.rmtree(d)
        bad = [c for c in codes if c != 0]
        if bad:
            raise RuntimeError(f"{len(bad)} of {jobs} concurrent docker runs failed: {bad}")
        return jobs / seconds

    contracts = batch_contracts(b, jobs)

    def batch() -> float:
        state = b.s.tmp / "many" / b.job_id("batch")
        out = b.s.tmp / "many" / f"{state.name}.json"
        state.mkdir(parents=True)
        argv = [*b.runner, "run", *map(str, contracts), "--parallel", str(jobs),
                "--allow-unsigned", "--json", "--state-dir", str(state),
                "--label", f"bench={b.s.id}", "--label", "bench.role=runner"]  # fmt: skip
        with out.open("wb") as sink, meter.window(cpu["batch"]):
            t0 = time.perf_counter()
            code, _ = b.s.reap(b.s.spawn(argv, stdout=sink, stderr=subprocess.DEVNULL))
            seconds = time.perf_counter() - t0
        ok = sum(e.get("status") == "succeeded" for e in json.loads(out.read_text()))
        shutil.rmtree(state)
        if code != 0 or ok != jobs:
            raise RuntimeError(f"the batch of {jobs} exited {code}; {ok} succeeded")
        return jobs / seconds

    xs, ys = interleave(reps, runner, baseline)
    bx, by = interleave(reps, batch, baseline)
    with served(b, "many-server") as (env, count, server):
        on_server = CpuMeter(server)
        sx, sy = interleave(reps, lambda: runner(env, "served", on_server), baseline)
        if count() < jobs * reps:
            raise RuntimeError(f"only {count()} of {jobs * reps} runs went to the server")
    docker = per_job(cpu["docker"], jobs)
    separate = _throughput_row(
        f"{jobs} toy jobs at once, {jobs} separate `runner run` processes (throughput)",
        "concurrent", jobs, xs, ys, "",
        (per_job(cpu["separate"], jobs), docker, "the runner's processes"),
    )  # fmt: skip
    batched = _throughput_row(
        f"{jobs} toy jobs at once, one `runner run` of {jobs} contracts (`--parallel {jobs}`)",
        "concurrentBatch", jobs, bx, by,
        "; each job is a process forked from the warm batch process (imports paid once)",
        (per_job(cpu["batch"], jobs), docker, "the batch and its forks"),
    )  # fmt: skip
    with_server = _throughput_row(
        f"{jobs} toy jobs at once, {jobs} `runner run` processes with `runner serve` running",
        "concurrentServed", jobs, sx, sy,
        "; each `runner run` hands its job to a fork of the server",
        (per_job(cpu["served"], jobs), docker, "the clients, the server and its forks"),
    )  # fmt: skip
    return [separate, batched, with_server]


def _throughput_row(
    figure: str,
    key: str,
    jobs: int,
    xs: list[float],
    ys: list[float],
    note: str,
    cpu: tuple[dict[str, float], dict[str, float], str],
) -> Row:
    """A row for ``jobs`` toy jobs at once: runner throughputs ``xs`` against ``ys``, and
    ``cpu``: the per-job CPU shares of the runner's runs and the baseline's (benchmarks.cpu),
    with what the runner's own share is."""
    ratio = statistics.median(xs) / statistics.median(ys)
    runner_cpu, docker_cpu, own_name = cpu
    return Row(
        figure,
        key,
        "jobs/s",
        f"{jobs} concurrent `docker run --rm` of the same",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={"jobs": jobs,
               "runnerWallSeconds": jobs / statistics.median(xs),
               "baselineWallSeconds": jobs / statistics.median(ys),
               "cpuSecondsPerJob": {"runner": runner_cpu, "baseline": docker_cpu}},
        notes=[f"wall for all {jobs}: runner {jobs / statistics.median(xs):.1f} s, "
               f"docker run {jobs / statistics.median(ys):.1f} s{note}",
               cpu_note(runner_cpu, docker_cpu, own_name)],
    )  # fmt: skip


def batch_contracts(b: Bench, jobs: int) -> list[Path]:
    """``jobs`` copies of the pinned toy contract, each under its own name (so its own job),
    beside it (its inputs resolve from the same folder)."""
    from runner.contract import with_digest

    data = json.loads(b.toy.read_text())
    out = []
    for i in range(jobs):
        copy = {**data, "name": f"{data['name']}-batch-{i:02d}"}
        copy.pop("jobId", None)
        path = b.toy.with_name(f"batch-{i:02d}.json")
        path.write_text(json.dumps(with_digest(copy)))
        out.append(path)
    return out
