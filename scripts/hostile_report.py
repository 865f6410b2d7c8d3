#!/usr/bin/env python3
"""Run the hostile suite (every tests/*/test_hostile*.py, in tests/unit and tests/integration:
tests/integration/test_hostile.py, hostile jobs under runc and runsc;
tests/integration/test_hostile_review.py and the later rounds' files, the holes each
security review found, as a hostile contract author, job, agent or local user) and publish what
held: reports/hostile/latest.json and reports/hostile/latest.md.

    .venv/bin/python scripts/hostile_report.py [pytest args]

Each case records its outcome category, the caps in force and host-side measurements (free
disk before and after, the runner's peak memory, files written, ...).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "hostile"

MIB = 1024 * 1024
SUITE = tuple(sorted((ROOT / "tests").glob("*/test_hostile*.py")))


def _engine() -> dict[str, Any]:
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .}}"], capture_output=True, text=True, check=False
    )
    data = json.loads(info.stdout) if info.returncode == 0 else {}
    return {
        "serverVersion": data.get("ServerVersion"),
        "storageDriver": data.get("Driver"),
        "cgroupVersion": data.get("CgroupVersion"),
        "runtimes": sorted((data.get("Runtimes") or {}).keys()),
        "kernel": data.get("KernelVersion"),
    }


def _detail(rec: dict[str, Any]) -> str:
    parts = []
    for key, label, scale in (
        ("runnerPeakRss", "runner peak RSS", MIB),
        ("freeDiskBefore", "free disk before", MIB * 1024),
        ("freeDiskAfter", "after", MIB * 1024),
        ("floodBytes", "flooded", MIB),
        ("keptBytes", "kept", MIB),
        ("processesMade", "processes made", 1),
        ("files", "files", 1),
        ("quotaMeasurements", "quota walks", 1),
        ("wallSeconds", "wall s", 1),
    ):
        value = rec.get(key)
        if value is None:
            continue
        unit = " MiB" if scale == MIB else (" GiB" if scale == MIB * 1024 else "")
        shown = f"{value / scale:,.1f}" if scale > 1 else f"{value:,}"
        parts.append(f"{label} {shown}{unit}")
    disk = rec.get("disk") or {}
    if disk.get("peakBytes") and rec["case"] == "disk filler":
        parts.append(
            f"peak written {disk['peakBytes'] / MIB:,.0f} MiB of {disk['quotaBytes'] / MIB:,.0f}"
        )
    return "; ".join(parts)


def render(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Hostile suite",
        "",
        f"Run {meta['at']} on {meta['host']['cpus']} CPUs, {meta['host']['memoryGiB']} GiB, "
        f"Docker {meta['engine']['serverVersion']} ({meta['engine']['storageDriver']}, "
        f"cgroup v{meta['engine']['cgroupVersion']}), kernel {meta['engine']['kernel']}. "
        f"pytest exit code {meta['pytestExit']}.",
        "",
        "| case | runtime | outcome | held | measurements |",
        "|---|---|---|---|---|",
    ]
    for rec in records:
        outcome = rec.get("category") or rec.get("status")
        held = "yes" if rec.get("held") else "NO"
        lines.append(f"| {rec['case']} | {rec['runtime']} | {outcome} | {held} | {_detail(rec)} |")
    caps = next((r.get("limits") for r in records if r.get("limits")), None)
    if caps:
        lines += [
            "",
            "Caps in force (typical case):",
            "",
            "```json",
            json.dumps(caps, indent=2),
            "```",
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as handle:
        report = Path(handle.name)
    try:
        env = {**os.environ, "HOSTILE_REPORT_FILE": str(report)}
        code = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", *map(str, SUITE), *argv],
            cwd=ROOT,
            env=env,
            check=False,
        ).returncode
        records = [json.loads(line) for line in report.read_text().splitlines() if line]
    finally:
        report.unlink(missing_ok=True)

    meta = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "memoryGiB": round(psutil.virtual_memory().total / 1024**3, 1),
            "python": platform.python_version(),
        },
        "engine": _engine(),
        "pytestExit": code,
    }
    (OUT / "latest.json").write_text(json.dumps({"meta": meta, "cases": records}, indent=2) + "\n")
    (OUT / "latest.md").write_text(render(records, meta))
    held = bool(records) and all(r.get("held") for r in records) and code == 0
    print(f"{len(records)} cases recorded; all held: {held}; report: {OUT / 'latest.md'}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
