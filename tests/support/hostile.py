"""Helpers for the hostile suite: a measured `runner run` (the runner's peak memory sampled
while it runs), a job written as a Python snippet, and the per-case record that
scripts/hostile_report.py publishes (with HOSTILE_REPORT_FILE set)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.jobs import start_job

RUNTIMES = ["runc", "runsc"]


def record(case: str, runtime: str, env: dict[str, Any], **measured: Any) -> None:
    target = os.environ.get("HOSTILE_REPORT_FILE")
    if not target:
        return
    failure = env.get("failure") or {}
    line = {
        "case": case,
        "runtime": runtime,
        "status": env.get("status"),
        "category": failure.get("category"),
        "exitCode": env.get("exitCode"),
        "limits": env.get("limits"),
        "disk": env.get("disk"),
        **measured,
    }
    with open(target, "a") as f:
        f.write(json.dumps(line) + "\n")


def measured_run(
    contract: Path, state: Path, runtime: str, *extra: str, policy: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any], str, int]:
    """`runner run --json` under ``runtime``; also the runner process's peak RSS (bytes)."""
    policy_file = state.parent / f"policy-{runtime}.json"
    policy_file.write_text(json.dumps({"isolation": runtime, **(policy or {})}))
    proc = start_job(contract, state, "--policy", str(policy_file), *extra)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        watched = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak = max(peak, watched.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
    sampler.join(timeout=5)
    try:
        envelope = json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(f"no envelope on stdout:\n{out}\n{err}")
    return proc.returncode, envelope, err, peak


def py(code: str) -> list[str]:
    return ["python3", "-c", code]


def probe_measurement(mid: str = "probe") -> list[dict[str, Any]]:
    return [
        {
            "measurementId": mid,
            "metric": mid,
            "unit": "count",
            "parser": {
                "id": "json.scalar",
                "version": "1",
                "evidencePath": "probe.json",
                "config": {"pointer": "/ok"},
            },
        }
    ]
