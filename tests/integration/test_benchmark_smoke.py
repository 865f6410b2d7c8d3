"""The benchmark script keeps working: its smoke mode (tiny sizes, one repeat) runs end to
end against the real engine, prints every figure and writes no report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_smoke_runs(image_id: str, tmp_path: Path) -> None:
    """`scripts/benchmark.py --smoke` measures every figure and exits 0."""
    results = ROOT / "benchmarks" / "results"
    before = sorted(results.glob("*"))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "benchmark.py"),
            "--smoke",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for figure in (
        "toy evaluation",
        "start-up",
        "stdout capture",
        "staging",
        "regex.scalar",
        "toy jobs at once",
        "egress allowlist",
        "asset from a loopback server",
        "staging a second job whose",
        "agent in the contract's image",
        "same box",
        "## Where `runner --help` spends its start-up",
        "## Where one toy `runner run` spends its time",
    ):
        assert figure in proc.stdout + proc.stderr, figure
    assert sorted(results.glob("*")) == before


@pytest.mark.slow
def test_startup_benchmark_compares_with_an_earlier_commit(tmp_path: Path) -> None:
    """`python -m benchmarks.startup --against HEAD` measures both trees and both baselines
    and writes its report where it is told (here HEAD against itself: the same modules)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", "--repeats", "1", "--against", "HEAD",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    report = json.loads((tmp_path / "startup.json").read_text())
    rows = {(f["tree"], f["command"]) for f in report["figures"]}
    assert {("base", "pass"), ("base", "json"), ("now", "verify"), ("before", "verify")} <= rows
    for name in ("version", "help", "verify"):
        now, before = report["imports"][f"now:{name}"], report["imports"][f"before:{name}"]
        assert now["modules"] == before["modules"] > 0
    assert "| `runner verify contract TOY --allow-unsigned` | before |" in proc.stdout
    assert (tmp_path / "startup.md").read_text() == proc.stdout.removesuffix("\n")
