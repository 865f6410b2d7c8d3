#!/usr/bin/env python3
"""Check the runner's GPU detection and device locking against a real GPU host.

    python3 scripts/gpu_check.py            # prints a JSON report, exits 1 on a mismatch

The test suite runs on GPU-less machines, where detection can only be checked to answer
"none". This script is the other half, for a host that has NVIDIA GPUs (no container engine
needed): it asks NVML and ``nvidia-smi`` separately through ``runner.gpu.gpus.HostDetector``, checks
that both see the same devices (index, UUID, model, memory within 1 MiB, driver), that the
strings are text rather than ``b'...'`` reprs of bytes, and that the allocator hands every device
out once and refuses a second job while the first holds them.

Only the standard library and ``runner.gpu.gpus`` are imported (NVML through ``nvidia-ml-py`` when
it
is installed), so it runs from a checkout with no virtual environment. ``detect()`` is asked
as well as NVML and nvidia-smi on their own: the check is that it answers what they do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.core.errors import GpuUnavailable
from runner.gpu.gpus import Allocator, Gpu, HostDetector


def _problems_of(gpus: list[Gpu], source: str) -> list[str]:
    out = []
    for gpu in gpus:
        for field in ("uuid", "model", "driver_version"):
            value = getattr(gpu, field)
            if value.startswith(("b'", 'b"')) or not value:
                out.append(f"{source}: GPU {gpu.index} {field} is {value!r}")
        if not gpu.uuid.startswith(("GPU-", "MIG-")):
            out.append(f"{source}: GPU {gpu.index} uuid {gpu.uuid!r} is not a GPU-/MIG- id")
        if gpu.memory_bytes <= 0:
            out.append(f"{source}: GPU {gpu.index} memory {gpu.memory_bytes}")
    return out


def main() -> int:
    report: dict[str, object] = {}
    problems: list[str] = []
    nvml = HostDetector._nvml()
    smi = HostDetector._smi()
    found = HostDetector().detect()
    report["nvml"] = None if nvml is None else [asdict(g) for g in nvml]
    report["nvidiaSmi"] = None if smi is None else [asdict(g) for g in smi]
    report["detected"] = [asdict(g) for g in found]
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        report["nvidiaSmiL"] = listed.stdout.strip().splitlines()
        if len(found) != len(report["nvidiaSmiL"]):  # type: ignore[arg-type]
            problems.append(f"detected {len(found)} GPUs, nvidia-smi -L lists {listed.stdout!r}")
    if not found:
        problems.append("no GPU detected by NVML nor nvidia-smi")
    if nvml is None:
        problems.append(
            "NVML gave no answer (is its binding installed? pip install 'reproduction-runner[gpu]')"
        )
    if smi is None:
        problems.append("nvidia-smi gave no answer")
    problems += _problems_of(nvml or [], "nvml") + _problems_of(smi or [], "nvidia-smi")
    if nvml is not None and smi is not None:
        if len(nvml) != len(smi):
            problems.append(f"NVML sees {len(nvml)} GPUs, nvidia-smi {len(smi)}")
        for a, b in zip(nvml, smi, strict=False):
            same = (a.index, a.uuid, a.model, a.driver_version) == (
                b.index,
                b.uuid,
                b.model,
                b.driver_version,
            )
            if not same or abs(a.memory_bytes - b.memory_bytes) >= 1024**2:
                problems.append(f"NVML and nvidia-smi disagree: {a} vs {b}")

    with tempfile.TemporaryDirectory() as tmp:
        alive = {"/jobs/a"}
        allocator = Allocator(Path(tmp), lambda holder: holder.get("jobDir") in alive)
        if found:
            got = allocator.allocate("all", found, {"jobDir": "/jobs/a"})
            report["allocatedToA"] = [g.uuid for g in got]
            if [g.uuid for g in got] != [g.uuid for g in found]:
                problems.append("'all' did not hand out every device")
            locks = sorted(p.name for p in Path(tmp).glob("*.json"))
            report["lockFiles"] = locks
            try:
                allocator.allocate(1, found, {"jobDir": "/jobs/b"})
                problems.append("a second job got a device the first one holds")
            except GpuUnavailable as exc:
                report["secondJobRefused"] = str(exc)
            allocator.release("/jobs/a")
            again = allocator.allocate(1, found, {"jobDir": "/jobs/b"})
            report["afterReleaseB"] = [g.uuid for g in again]

    report["problems"] = problems
    print(json.dumps(report, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
