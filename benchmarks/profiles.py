"""Where the time goes: `-X importtime` of the CLI and pyinstrument of one toy run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks._support import Bench


def import_profile(b: Bench, args: Sequence[str] = ("--help",), top: int = 15) -> dict[str, Any]:
    """``python -X importtime -m runner ARGS``: the heaviest imports, cumulative and self."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "runner", *args],
        capture_output=True,
        text=True,
        env=b.s.env,
        check=False,
    )
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), (len(m[3]) - 1) // 2, m[4]))
    total = sum(r[0] for r in rows)
    packages: dict[str, int] = {}
    for r in rows:
        packages[r[3].split(".")[0]] = packages.get(r[3].split(".")[0], 0) + r[0]
    # what the runner's own modules import directly: depth 1 below a runner.* module
    direct: list[tuple[int, str]] = []
    parent_is_runner: list[bool] = []
    for _self_us, cum_us, depth, name in reversed(rows):  # importtime lists children first
        del parent_is_runner[depth:]
        if depth > 0 and parent_is_runner[depth - 1] and not name.startswith("runner"):
            direct.append((cum_us, name))
        parent_is_runner.append(name.startswith("runner"))
    return {
        "totalImportSeconds": total / 1e6,
        "modules": len(rows),
        "byPackage": [{"package": k, "selfSeconds": v / 1e6}
                      for k, v in sorted(packages.items(), key=lambda kv: -kv[1])[:top]],
        "importedByRunner": [{"module": n, "cumulativeSeconds": c / 1e6}
                             for c, n in sorted(direct, reverse=True)[:top]],
        "bySelf": [{"module": r[3], "selfSeconds": r[0] / 1e6}
                   for r in sorted(rows, key=lambda r: -r[0])[:top]],
    }  # fmt: skip


def run_profile(b: Bench) -> dict[str, Any]:
    """Where one toy ``runner run`` spends its time: pyinstrument's call tree (wall clock,
    library frames folded) and ``-X importtime`` of the same command."""
    argv = b.run_argv(b.toy, b.job_id("profile"))[len(b.runner) :]
    out = b.s.tmp / "profile.txt"
    subprocess.run(
        [sys.executable, "-m", "pyinstrument", "-r", "text", "--no-color", "--unicode",
         "-i", "0.001", "-o", str(out), "-m", "runner", *argv],
        env=b.s.env, capture_output=True, check=True,
    )  # fmt: skip
    tree = [line.rstrip() for line in out.read_text().splitlines() if line.strip()]
    return {
        "command": shlex.join(["runner", *argv]),
        "pyinstrument": tree[:70],
        "imports": import_profile(b, b.run_argv(b.toy, b.job_id("imports"))[len(b.runner) :]),
    }
