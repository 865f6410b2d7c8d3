"""A running job's cost: the CPU that `runner run` and the engine spend each second while a
job runs, for a job that sleeps, against `docker run --rm` of the same.

A job's start and end cost what the toy figures say; this one is about the seconds between,
which a long job has many of. The runner watches a job every 0.2 s (its deadline, its disk
and log quotas, its heartbeat) and follows the engine's stats stream: that must cost next to
nothing, the engine's side included (until 2026-12-06 each look was a wait request of its
own; the request is now kept open). The CPU is read while the job sleeps, from
:data:`FROM_SECONDS` to :data:`FROM_SECONDS` + :data:`WINDOW_SECONDS` after the run began, so
that the start's and end's CPU, which vary more than the watch costs, stay out of it."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks._support import Bench, Row, interleave, ratio_rows, summary
from benchmarks.cpu import CpuMeter, CpuUse

SLEEP_SECONDS = 10
FROM_SECONDS = 3.0
"""When the window opens: the job's container runs by then, even on a loaded machine."""
WINDOW_SECONDS = 5.0
"""The window, which ends 2 s before the job's sleep does."""


def _sleeping(seconds: int) -> list[str]:
    """The toy's command, after ``seconds`` of sleep (its fragments still whole argv)."""
    return ["sh", "-c", f'sleep {seconds}; exec python3 "$@"', "sh",
            "/job/input/repository/evaluate.py", "--checkpoint",
            "/job/input/repository/checkpoint.json"]  # fmt: skip


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the threads of ``pids`` have run so far, from the scheduler's nanosecond
    counters (``/proc/PID/task/TID/schedstat``): the clock-tick counters psutil reads step by
    10 ms, too coarse for a few milliseconds a second over a few seconds."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def _steady(b: Bench, argv: list[str], out: Path, uses: list[CpuUse]) -> tuple[float, float]:
    """Run ``argv`` (a whole run of the sleeping job), its whole run's CPU appended to
    ``uses``; the milliseconds of CPU a second that its own process and the engine's daemons
    spent within the window."""
    meter = CpuMeter()
    with out.open("wb") as sink, meter.window(uses):
        t0 = time.monotonic()
        proc = b.s.spawn(argv, stdout=sink, stderr=subprocess.DEVNULL)
        engine = meter.engine_pids()
        time.sleep(max(t0 + FROM_SECONDS - time.monotonic(), 0))
        own0, engine0 = _cpu_seconds([proc.pid]), _cpu_seconds(engine)
        time.sleep(max(t0 + FROM_SECONDS + WINDOW_SECONDS - time.monotonic(), 0))
        own1, engine1 = _cpu_seconds([proc.pid]), _cpu_seconds(engine)
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} ended within the window: {proc.returncode}")
        code, _ = b.s.reap(proc)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} of the sleeping job exited {code}")
    return 1000 * (own1 - own0) / WINDOW_SECONDS, 1000 * (engine1 - engine0) / WINDOW_SECONDS


def fig_watch(b: Bench, reps: int) -> Row:
    """CPU seconds of a whole run of a job that sleeps :data:`SLEEP_SECONDS`, the run's own
    processes and the engine's daemons, `runner run`'s against `docker run`'s; and, read while
    the job sleeps, what each second of its run costs each side."""
    contract = b.contract(b.s.tmp / "watch", command=_sleeping(SLEEP_SECONDS))
    parts: dict[str, list[tuple[float, float]]] = {"runner": [], "docker": []}
    cpu: dict[str, list[CpuUse]] = {"runner": [], "docker": []}

    def runner() -> float:
        job_id = b.job_id("watch")
        out = b.s.tmp / f"{job_id}.json"
        parts["runner"].append(_steady(b, b.run_argv(contract, job_id), out, cpu["runner"]))
        return cpu["runner"][-1].own + cpu["runner"][-1].engine

    def baseline() -> float:
        i = b.job_id("watch-docker")
        out, ws = b.s.tmp / "watch-docker" / i / "output", b.s.tmp / "watch-docker" / i / "ws"
        b.writable(out / "logs", ws)
        argv = b.docker_argv(b.baseline_mounts(out, ws), _sleeping(SLEEP_SECONDS))
        log = out / "logs" / "evaluation.log"
        parts["docker"].append(_steady(b, argv, log, cpu["docker"]))
        return cpu["docker"][-1].own + cpu["docker"][-1].engine

    xs, ys = interleave(reps, runner, baseline)
    ratio = statistics.median(xs) / statistics.median(ys)

    def med(side: str, i: int) -> float:
        return statistics.median(p[i] for p in parts[side])

    return Row(
        f"a job sleeping {SLEEP_SECONDS} s: CPU of `runner run` and the engine, whole run",
        "watch",
        "s",
        "`docker run --rm` of the same: the `docker` CLI and the engine",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={
            "sleepSeconds": SLEEP_SECONDS,
            "windowSeconds": WINDOW_SECONDS,
            "msPerRunningSecond": {
                "runner": {"own": med("runner", 0), "engine": med("runner", 1)},
                "baseline": {"own": med("docker", 0), "engine": med("docker", 1)},
            },
        },
        notes=[
            f"each second of running, read from {FROM_SECONDS:g} s to "
            f"{FROM_SECONDS + WINDOW_SECONDS:g} s after each run began (the job asleep; "
            f"medians): `runner run` {med('runner', 0):.1f} ms of CPU and the engine "
            f"{med('runner', 1):.1f} ms, against the `docker` CLI's {med('docker', 0):.1f} ms "
            f"and the engine's {med('docker', 1):.1f} ms. The engine's share includes whatever "
            "else it did meanwhile (other users' containers on a shared engine); the runner's "
            "includes resource sampling's stats stream. The whole run's CPU (the row) is mostly "
            "its start and end, which the toy figures measure"
        ],
    )
