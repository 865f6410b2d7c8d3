#!/usr/bin/env python3
"""Benchmark `runner submit --to slurm` against plain ``sbatch --wrap "docker run …"``.

    .venv/bin/python scripts/bench_slurm.py               # 100 toy jobs each way (default)
    .venv/bin/python scripts/bench_slurm.py --jobs 20     # fewer, for a quick look

Each side runs the toy job N times through the single-node Slurm with the same caps: the
runner's side submits N contracts (distinct job ids) in one `runner submit` and waits with
`runner wait`; the baseline submits N ``sbatch --wrap`` jobs with the same ``--cpus-per-task``
and ``--mem``, each a ``docker run --rm`` with the runner's container caps (CPU, memory = swap,
pids, no network, read-only root, the inputs read-only), and polls ``squeue`` until they are
gone. Throughput is jobs per second from the first submission to the last job's end. The sides
run in ABBA order (N/2 jobs per round) in one run, so the ratio holds on a noisy machine.

The report goes to ``benchmarks/results/slurm.md`` (``--out``). Every container started here carries
the label ``bench-slurm=<run id>`` and is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.targets import TARGETS
from runner.testing import IMAGE, image_id_of, write_contract

ROOT = Path(__file__).resolve().parent.parent

RUN_ID = uuid.uuid4().hex[:12]
LABEL = f"bench-slurm={RUN_ID}"
RUNNER = [sys.executable, "-m", "runner"]


def sh(*argv: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def _with_job_id(job: str) -> Callable[[dict[str, Any]], None]:
    """A contract change that sets its jobId to ``job``."""

    def change(data: dict[str, Any]) -> None:
        data["jobId"] = job

    return change


def runner_round(tmp: Path, n: int, tag: str, env: dict[str, str]) -> tuple[float, int]:
    """N toy contracts through `runner submit` + `runner wait`: (seconds, succeeded)."""
    image = image_id_of(IMAGE)
    contracts = []
    for i in range(n):
        folder = tmp / tag / f"c{i}"
        folder.mkdir(parents=True)
        job = f"bench-{RUN_ID}-{tag}-{i}"
        contracts.append(write_contract(folder, image, change=_with_job_id(job)))
    state = tmp / "state"
    start = time.monotonic()
    sub = subprocess.run(
        [*RUNNER, "submit", *map(str, contracts), "--to", "slurm", "--state-dir", str(state),
         "--json", "--allow-unsigned", "--label", LABEL],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if sub.returncode != 0:
        raise SystemExit(f"runner submit failed: {sub.stderr}")
    ids = [q["jobId"] for q in json.loads(sub.stdout)]
    done = subprocess.run(
        [*RUNNER, "wait", *ids, "--state-dir", str(state), "--json", "--poll", "0.5"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - start
    ends = json.loads(done.stdout or "[]")
    ok = sum(
        1
        for e in ends
        if e["status"] == "succeeded" and e["envelope"]["measurements"][0]["value"] == 0.819
    )
    return seconds, ok


def baseline_round(tmp: Path, n: int, tag: str, limits: dict[str, Any]) -> tuple[float, int]:
    """N ``sbatch --wrap "docker run …"`` toy jobs with the same caps: (seconds, succeeded)."""
    repo = ROOT / "examples" / "toy-evaluation" / "repository"
    outs = []
    start = time.monotonic()
    for i in range(n):
        out = tmp / f"base-{tag}-{i}"
        out.mkdir(parents=True)
        os.chmod(out, 0o777)  # noqa: S103 - the job user (10001) writes its result here
        outs.append(out)
        docker = (
            f"docker run --rm --label {LABEL} --network none --read-only --cap-drop ALL "
            "--security-opt no-new-privileges --init "
            f"--cpus {limits['cpus']} --memory {limits['memoryBytes']} "
            f"--memory-swap {limits['memoryBytes']} --pids-limit {limits['pidsLimit'] or 512} "
            f"--tmpfs /tmp --user 10001:10001 -v {repo}:/job/input/repository:ro "
            f"-v {out}:/job/output {IMAGE} python3 /job/input/repository/evaluate.py "
            "--checkpoint /job/input/repository/checkpoint.json"
        )
        sh(
            "sbatch", "--parsable", f"--job-name=bench-{RUN_ID}", "--cpus-per-task=1",
            "--mem=1024M", "--time=5", f"--output={out}/slurm.out",
            "--wrap", f"{docker} > {out}/evaluation.log",
        )  # fmt: skip
    while sh("squeue", "-h", "-n", f"bench-{RUN_ID}", "-o", "%i").split():
        time.sleep(0.5)
    seconds = time.monotonic() - start
    ok = 0
    for out in outs:
        with contextlib.suppress(OSError, ValueError, KeyError):
            ok += json.loads((out / "evaluation.log").read_text())["accuracy"] == 0.819
    return seconds, ok


@contextlib.contextmanager
def served(tmp: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A `runner serve` on the node (this machine) for the duration: the environment whose
    `runner run` (the batch script's, as sbatch exports the environment) is handed to it."""
    env = {**env, "RUNNER_SERVER": str(tmp / "serve.sock")}
    log = tmp / "serve.log"
    with log.open("wb") as sink:
        server = subprocess.Popen([*RUNNER, "serve"], stdout=sink, stderr=sink, env=env)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"runner serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield env
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def caps(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """The caps `runner run` applies to the toy job (one local run's envelope)."""
    folder = tmp / "caps"
    folder.mkdir()
    contract = write_contract(folder, image_id_of(IMAGE))
    done = subprocess.run(
        [*RUNNER, "run", str(contract), "--state-dir", str(tmp / "caps-state"), "--json",
         "--allow-unsigned", "--label", LABEL],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    envelope = json.loads(done.stdout)
    if envelope["status"] != "succeeded":
        raise SystemExit(f"the toy job does not run here: {envelope.get('failure')}")
    limits: dict[str, Any] = envelope["limits"]
    return limits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100, help="jobs each way (default 100)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "slurm.md"))
    args = ap.parse_args()
    if args.jobs < 2:
        ap.error("--jobs wants at least 2")
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    env = {**os.environ, "RUNNER_CONFIG_DIR": str(tmp / "config")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # Bytecode cached as an installed runner's is (sbatch passes the environment on, and some
    # machines set PYTHONDONTWRITEBYTECODE, which would compile every module in every job):
    # under this run's temporary folder, as the main benchmark does.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    rounds: dict[str, list[tuple[float, int, int]]] = {"runner": [], "served": [], "baseline": []}
    try:
        limits = caps(tmp, env)
        half = [args.jobs // 2, args.jobs - args.jobs // 2]
        order = [("baseline", half[0]), ("runner", half[0]), ("served", half[0]),
                 ("served", half[1]), ("runner", half[1]), ("baseline", half[1])]  # fmt: skip
        for k, (side, n) in enumerate(order):
            print(f"==> round {k + 1}: {side}, {n} jobs", file=sys.stderr, flush=True)
            if side == "runner":
                seconds, ok = runner_round(tmp, n, f"r{k}", env)
            elif side == "served":
                with served(tmp, env) as warm:
                    seconds, ok = runner_round(tmp, n, f"s{k}", warm)
            else:
                seconds, ok = baseline_round(tmp, n, f"b{k}", limits)
            rounds[side].append((seconds, n, ok))
            print(f"    {seconds:.1f} s, {ok}/{n} succeeded", file=sys.stderr, flush=True)
    finally:
        left = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}").split()
        if left:
            sh("docker", "rm", "-f", *left)
        shutil.rmtree(tmp, ignore_errors=True)
    report = render(rounds, limits, args.jobs)
    Path(args.out).write_text(report)
    print(report)
    return 0


def render(rounds: dict[str, list[tuple[float, int, int]]], limits: dict[str, Any], n: int) -> str:
    def side(name: str) -> tuple[float, int, int, float]:
        seconds = sum(r[0] for r in rounds[name])
        jobs = sum(r[1] for r in rounds[name])
        ok = sum(r[2] for r in rounds[name])
        return seconds, jobs, ok, jobs / seconds

    target = TARGETS["slurm"]
    rs, rj, rok, rt = side("runner")
    ss, sj, sok, st = side("served")
    bs, bj, bok, bt = side("baseline")
    cpus = os.cpu_count()
    lines = [
        '# Slurm: `runner submit` against `sbatch --wrap "docker run …"`',
        "",
        f"Measured {datetime.now(UTC).isoformat(timespec='minutes')} by `scripts/bench_slurm.py "
        f"--jobs {n}` on the single-node Slurm of scripts/setup_slurm.sh ({cpus} CPUs; each job "
        "asks 1 CPU and 1024 MiB, so at most "
        f"{cpus} run at once). Rounds in the order baseline, runner, served, served, runner, "
        f"baseline; {n // 2} + {n - n // 2} jobs a side.",
        "",
        "| side | jobs | succeeded | seconds | jobs/s |",
        "|---|---|---|---|---|",
        f"| runner submit + runner wait | {rj} | {rok} | {rs:.1f} | {rt:.3f} |",
        f"| the same, `runner serve` on the node | {sj} | {sok} | {ss:.1f} | {st:.3f} |",
        f"| sbatch --wrap docker run + squeue | {bj} | {bok} | {bs:.1f} | {bt:.3f} |",
        "",
        f"**Throughput ratio (runner / baseline): {rt / bt:.2f}x**; with `runner serve` on the "
        f"node: {st / bt:.2f}x (target, figure id `slurm` of benchmarks/targets.py: "
        f"{target.text()}; {'met' if target.met(rt / bt, {}) else 'not met'} by the fresh "
        "process per job).",
        "",
        "Per round (seconds, jobs, succeeded): "
        + "; ".join(f"{k}: {v}" for k, v in rounds.items()),
        "",
        f"Caps on both sides: {limits['cpus']} CPU, memory = swap = {limits['memoryBytes']} "
        f"bytes, pids {limits['pidsLimit']}, no network, read-only root. The runner's side also "
        "verifies each contract, stages and hashes its inputs, keeps the ledger, parses the "
        "evidence and writes the envelope on the node; the baseline only runs the container.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
