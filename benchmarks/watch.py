"""A running job's cost: the CPU that `runner run` and the engine spend while a job runs, for
a job that sleeps, against `docker run --rm` of the same.

A job's start and end cost what the toy figures say; this one is about the seconds between,
which a long job has many of. The runner watches a job every 0.2 s (its deadline, its disk
and log quotas, its heartbeat): that watch must cost next to nothing, the engine's side
included (until 2026-12 each look was a wait request of its own, about 10 ms of CPU a second
of every running job; the request is now kept open for the job's whole run)."""

from __future__ import annotations

import statistics

from benchmarks._support import Bench, Row, interleave, ratio_rows, summary
from benchmarks.cpu import CpuMeter, CpuUse
from benchmarks.toy import toy_baseline

SLEEP_SECONDS = 10


def _sleeping(seconds: int) -> list[str]:
    """The toy's command, after ``seconds`` of sleep (its fragments still whole argv)."""
    return ["sh", "-c", f'sleep {seconds}; exec python3 "$@"', "sh",
            "/job/input/repository/evaluate.py", "--checkpoint",
            "/job/input/repository/checkpoint.json"]  # fmt: skip


def fig_watch(b: Bench, reps: int) -> Row:
    """CPU seconds (the run's own processes and the engine's daemons) of a whole run of a
    job that sleeps :data:`SLEEP_SECONDS`, the runner's against `docker run`'s; and, from
    the same runs of a job that does not sleep, what each second of running costs."""
    meter = CpuMeter()
    cpu: dict[tuple[str, int], list[CpuUse]] = {}
    contracts = {
        s: b.contract(b.s.tmp / f"watch-{s}", command=_sleeping(s)) for s in (0, SLEEP_SECONDS)
    }

    def runner(sleep: int) -> float:
        with meter.window(cpu.setdefault(("runner", sleep), [])):
            b.runner_job(contracts[sleep], f"watch-{sleep}")
        use = cpu[("runner", sleep)][-1]
        return use.own + use.engine

    def baseline(sleep: int) -> float:
        with meter.window(cpu.setdefault(("docker", sleep), [])):
            toy_baseline(b, _sleeping(sleep))
        use = cpu[("docker", sleep)][-1]
        return use.own + use.engine

    runner(0), baseline(0)  # warm-up of both sides
    cpu.clear()
    xs, ys = interleave(reps, lambda: runner(SLEEP_SECONDS), lambda: baseline(SLEEP_SECONDS))
    x0, y0 = interleave(reps, lambda: runner(0), lambda: baseline(0))

    def per_second(slept: list[float], still: list[float]) -> float:
        """Milliseconds of CPU a second of running, from the medians."""
        return 1000 * (statistics.median(slept) - statistics.median(still)) / SLEEP_SECONDS

    def share(side: str, part: str) -> float:
        slept = [getattr(u, part) for u in cpu[(side, SLEEP_SECONDS)]]
        still = [getattr(u, part) for u in cpu[(side, 0)]]
        return per_second(slept, still)

    ratio = statistics.median(xs) / statistics.median(ys)
    runner_ms, docker_ms = per_second(xs, x0), per_second(ys, y0)
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
            "cpuMillisecondsPerRunningSecond": {"runner": runner_ms, "baseline": docker_ms},
        },
        notes=[
            f"each second of running (the {SLEEP_SECONDS} s job less the same job without "
            f"its sleep, medians): the runner's side {runner_ms:.1f} ms of CPU (its own "
            f"{share('runner', 'own'):.1f} ms, the engine {share('runner', 'engine'):.1f} ms), "
            f"`docker run`'s {docker_ms:.1f} ms (the CLI {share('docker', 'own'):.1f} ms, "
            f"the engine {share('docker', 'engine'):.1f} ms); the whole run's CPU is mostly "
            "its start and end, which the toy figures measure"
        ],
    )
