"""The toy evaluation: its contract pinned and run once (the warm-up that reads the caps the
runner applied), the same-box check, and `runner run` against `docker run --rm` of the same
job, in-process and with `runner serve` running."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from typing import Any

from benchmarks._support import (
    Bench,
    Row,
    interleave,
    ratio_rows,
    served,
    sh,
    summary,
)
from benchmarks.cpu import CpuMeter, CpuUse, per_job
from benchmarks.cpu import note as cpu_note
from runner.state.jobdir import StateDir
from runner.testing import IMAGE, TOY


def setup_toy(b: Bench) -> None:
    """Pin the toy contract, run it once through the runner (warm-up), read the caps it
    applied from the envelope, and keep its staged job folder for the baseline's mounts."""
    folder = b.s.tmp / "toy"
    folder.mkdir()
    shutil.copytree(TOY / "repository", folder / "repository")
    shutil.copy(TOY / "paper.md", folder / "paper.md")
    b.toy = folder / "task.json"
    subprocess.run(
        [*b.runner, "pin", str(TOY / "task.json"), "--image", IMAGE, "-o", str(b.toy)],
        env=b.s.env,
        capture_output=True,
        check=True,
    )
    b.state = b.s.tmp / "state"
    _, envelope, _, job_id = b.runner_job(b.toy, "warm")
    b.limits = envelope["limits"]
    b.image_id = envelope["image"]["id"]
    b.toy_job = StateDir(b.state).job(job_id).root


BOX_KEYS = (
    "Memory",
    "MemorySwap",
    "NanoCpus",
    "ShmSize",
    "PidsLimit",
    "Tmpfs",
    "CapDrop",
    "CapAdd",
    "SecurityOpt",
    "Init",
    "ReadonlyRootfs",
    "NetworkMode",
    "LogConfig",
    "Privileged",
)


def _box(inspect: dict[str, Any]) -> dict[str, Any]:
    hc = inspect["HostConfig"]
    box = {k: hc.get(k) for k in BOX_KEYS}
    box["User"] = inspect["Config"]["User"]
    box["WorkingDir"] = inspect["Config"]["WorkingDir"]
    box["Image"] = inspect["Image"]
    box["Mounts"] = sorted((m["Destination"], m["RW"], m["Type"]) for m in inspect["Mounts"])
    return box


def _inspect_role(b: Bench, role: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = sh("docker", "ps", "-q", "--filter", f"label=bench={b.s.id}", "--filter",
                 f"label=bench.role={role}").split()  # fmt: skip
        if ids:
            data: list[dict[str, Any]] = json.loads(sh("docker", "inspect", ids[0]))
            return data[0]
        time.sleep(0.1)
    raise RuntimeError(f"no running {role} container appeared within {timeout:.0f} s")


def box_check(b: Bench) -> dict[str, Any]:
    """``docker inspect`` a runner-started container and a baseline one, both running
    ``sleep``: the caps must be the same box."""
    contract = b.contract(b.s.tmp / "boxcheck", command=["sleep", "4"], measurements=[
        {"measurementId": "toy-accuracy", "metric": "accuracy", "unit": "fraction",
         "parser": {"id": "json.scalar", "version": "1", "evidencePath": "done.json",
                    "config": {"pointer": "/ok"}}}
    ])  # fmt: skip
    job_id = b.job_id("box")
    argv = b.run_argv(contract, job_id)
    argv[argv.index("bench.role=runner")] = "bench.role=box-runner"
    proc = b.s.spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runner_box = _box(_inspect_role(b, "box-runner"))
    finally:
        b.s.reap(proc)
    out, ws = b.s.tmp / "box-out", b.s.tmp / "box-ws"
    b.writable(out, ws)
    cid = sh(*b.docker_argv(b.baseline_mounts(out, ws), ["sleep", "4"], "box-baseline", True))
    base_box = _box(json.loads(sh("docker", "inspect", cid))[0])
    subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    diffs = {
        k: {"runner": runner_box[k], "baseline": base_box.get(k)}
        for k in runner_box
        if runner_box[k] != base_box.get(k)
    }
    return {"same": not diffs, "differences": diffs, "runner": runner_box}


def fig_toy(b: Bench, reps: int) -> Row:
    command = json.loads(b.toy.read_text())["protocol"]["command"]
    evidence: list[str] = []

    parts: dict[str, list[float]] = {}
    meter = CpuMeter()
    cpu: dict[str, list[CpuUse]] = {"runner": [], "docker": []}

    def runner() -> float:
        with meter.window(cpu["runner"]):
            seconds, envelope, _, job_id = b.runner_job(b.toy, "toy")
        log = StateDir(b.state).job(job_id).output / "logs" / "evaluation.log"
        evidence.append(log.read_text())
        t = envelope["timings"]
        split = {
            "beforeRunnerClock": seconds - t["totalSeconds"],
            "stage": t["stageSeconds"],
            "image": t["imageSeconds"],
            "container": t["runSeconds"],
            "otherInRunner": t["totalSeconds"] - t["stageSeconds"] - t["imageSeconds"]
            - t["runSeconds"],
        }  # fmt: skip
        for k, v in split.items():
            parts.setdefault(k, []).append(v)
        return seconds

    def baseline() -> float:
        with meter.window(cpu["docker"]):
            return toy_baseline(b, command, evidence)

    baseline()  # warm-up (the runner's was setup_toy)
    cpu["docker"].clear()
    xs, ys = interleave(reps, runner, baseline)
    notes = []
    if len(set(evidence)) != 1:
        notes.append("WARNING: runner and baseline evidence differ")
    med = {k: statistics.median(v) for k, v in parts.items()}
    notes.append(
        "where the runner's wall time goes (medians, from the envelope's `timings`): "
        f"{med['beforeRunnerClock']:.3f} s before the runner's clock starts (interpreter, "
        f"imports, CLI), staging {med['stage']:.3f} s, image check {med['image']:.3f} s, "
        f"container {med['container']:.3f} s, the rest inside the runner "
        f"{med['otherInRunner']:.3f} s (engine calls, ledger fsyncs, parse, envelope)"
    )
    row = toy_row("toy evaluation, whole `runner run` wall time", "toy", xs, ys, notes)
    row.extra["runnerBreakdownMedianSeconds"] = med
    _cpu_of(row, cpu, "`runner run`")
    return row


def _cpu_of(row: Row, cpu: dict[str, list[CpuUse]], own_name: str) -> None:
    """Add a run's CPU shares (benchmarks.cpu), the runner's against the baseline's."""
    runner, docker = per_job(cpu["runner"], 1), per_job(cpu["docker"], 1)
    row.extra["cpuSecondsPerJob"] = {"runner": runner, "baseline": docker}
    row.notes.append(cpu_note(runner, docker, own_name))


def toy_baseline(b: Bench, command: list[str], evidence: list[str] | None = None) -> float:
    """One `docker run --rm` of the toy job with the runner's caps; its wall seconds."""
    i = b.job_id("toy-docker")
    out, ws = b.s.tmp / "toy-docker" / i / "output", b.s.tmp / "toy-docker" / i / "ws"
    b.writable(out / "logs", ws)
    log = out / "logs" / "evaluation.log"
    seconds, _ = b.docker_job(b.docker_argv(b.baseline_mounts(out, ws), command), log)
    if evidence is not None:
        evidence.append(log.read_text())
    return seconds


def toy_row(figure: str, key: str, xs: list[float], ys: list[float], notes: list[str]) -> Row:
    ratio = statistics.median(xs) / statistics.median(ys)
    return Row(
        figure,
        key,
        "s",
        "`docker run --rm`, same image id, command, mounts and caps, stdout `> file`",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        notes=notes,
    )


def fig_toy_sampling(b: Bench, reps: int) -> Row:
    """The toy run with resource sampling (the default: the engine's stats stream followed in
    a thread) against the same run with ``--no-resource-sampling`` (no stream opened)."""
    samples: list[int] = []

    def sampled() -> float:
        seconds, envelope, _, _ = b.runner_job(b.toy, "toy-sampled")
        figures = envelope["attempts"][-1].get("resources") or {}
        samples.append(int(figures.get("samples") or 0))
        return seconds

    def unsampled() -> float:
        return b.runner_job(b.toy, "toy-unsampled", extra=["--no-resource-sampling"])[0]

    unsampled()  # warm-up of the path without a stream
    xs, ys = interleave(reps, sampled, unsampled)
    ratio = statistics.median(xs) / statistics.median(ys)
    return Row(
        "toy evaluation, `runner run` wall time with resource sampling",
        "toySampling",
        "s",
        "the same `runner run --no-resource-sampling` (no stats stream opened)",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={"samplesMedian": statistics.median(samples) if samples else 0},
        notes=[
            f"ratio {ratio:.4f}: sampling costs {100 * (ratio - 1):+.2f}% of the toy's wall "
            f"time (median of {len(xs)} interleaved pairs); the engine answered a median of "
            f"{statistics.median(samples) if samples else 0:g} stats samples per run"
        ],
    )


def fig_toy_served(b: Bench, reps: int) -> Row:
    """The toy run again, with a `runner serve` running that `runner run` hands it to."""
    command = json.loads(b.toy.read_text())["protocol"]["command"]
    cpu: dict[str, list[CpuUse]] = {"runner": [], "docker": []}
    with served(b, "toy-server") as (env, count, server):
        on_server, meter = CpuMeter(server), CpuMeter()

        def runner() -> float:
            with on_server.window(cpu["runner"]):
                return b.runner_job(b.toy, "toy-served", env=env)[0]

        def baseline() -> float:
            with meter.window(cpu["docker"]):
                return toy_baseline(b, command)

        runner()  # warm-up: the server's first fork
        cpu["runner"].clear()
        xs, ys = interleave(reps, runner, baseline)
        handed = count()
    if handed < len(xs) + 1:
        raise RuntimeError(f"only {handed} of {len(xs) + 1} runs went through the server")
    row = toy_row(
        "toy evaluation, whole `runner run` wall time, with `runner serve` running",
        "toyServed",
        xs,
        ys,
        [f"{handed} runs went through the server (its log counts them); the client is "
         "`runner run` itself, which hands its command line, directory, environment and "
         "terminal to a fork of the server"],
    )  # fmt: skip
    _cpu_of(row, cpu, "the client, the server and its fork")
    return row


def fig_toy_autoserve(b: Bench, reps: int) -> Row:
    """The toy run as fresh `runner run` processes with ``RUNNER_AUTOSERVE`` set and no server
    running: the first starts one in the background (its time is a note), the rest use it."""
    import os
    import re
    import signal

    command = json.loads(b.toy.read_text())["protocol"]["command"]
    sock = b.s.sockets / "auto.sock"
    log = sock.with_name(sock.name + ".log")
    env = {**b.s.env, "RUNNER_SERVER": str(sock), "RUNNER_AUTOSERVE": "5m"}
    first = b.runner_job(b.toy, "toy-auto", env=env)[0]
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RUNNER_AUTOSERVE started no server: {log}")
            time.sleep(0.05)
        xs, ys = interleave(
            reps,
            lambda: b.runner_job(b.toy, "toy-auto", env=env)[0],
            lambda: toy_baseline(b, command),
        )
        handed = log.read_text().count(": runner run")
    finally:
        found = re.search(r"\(pid (\d+)\)", log.read_text()) if log.exists() else None
        if found:
            os.kill(int(found.group(1)), signal.SIGTERM)
    if handed < len(xs):
        raise RuntimeError(f"only {handed} of {len(xs)} runs went through the started server")
    return toy_row(
        "toy evaluation, whole `runner run` wall time, fresh processes with `RUNNER_AUTOSERVE`",
        "toyAutoserve",
        xs,
        ys,
        [f"no server at first: the first run took {first:.3f} s (it ran in its own process "
         "and started `runner serve --idle-exit 5m` in the background); the "
         f"{handed} runs after it went through that server (its log counts them). Opt-in: "
         "the default `runner run` (the first row) starts no server"],
    )  # fmt: skip
