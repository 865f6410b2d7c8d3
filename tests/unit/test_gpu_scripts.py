"""The GPU end-to-end scripts, as far as they go without a GPU machine: both parse as bash,
and the report says the result, the engine, the injection mode, the device and the figures
from the files the e2e script leaves (the full script is rehearsed with
`E2E_REHEARSAL=1 scripts/gpu_e2e.sh`, which starts an engine of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_the_scripts_parse() -> None:
    for name in ("gpu_e2e.sh", "gpu_bundle.sh"):
        done = subprocess.run(["bash", "-n", str(ROOT / "scripts" / name)], check=False)
        assert done.returncode == 0, name


def test_the_report_from_a_run(tmp_path: Path) -> None:
    (tmp_path / "status").write_text("passed\n")
    (tmp_path / "facts.json").write_text(json.dumps({"os": "Ubuntu 24.04.1 LTS", "cgroup": "v2"}))
    (tmp_path / "engine-version.json").write_text(json.dumps({"Version": "20.10.24+dfsg1"}))
    gpu = {"index": 0, "uuid": "GPU-1", "model": "NVIDIA H200", "driverVersion": "580.95.05",
           "injection": "cdi-applied", "cdiDevice": "nvidia.com/gpu=GPU-1"}  # fmt: skip
    measurements = [
        {"measurementId": "gpu-kernel-check", "value": True, "evidence": {"path": "x"}},
        {"measurementId": "gpu-h2d-bandwidth", "value": 25.3},
    ]
    envelope = {"status": "succeeded", "gpus": [gpu], "measurements": measurements}
    (tmp_path / "envelope.json").write_text(json.dumps(envelope))
    (tmp_path / "checks.tsv").write_text("kernel check\tPASS\tgpu-kernel-check = True\n")
    dest = tmp_path / "reports" / "latest.md"
    script = ROOT / "scripts" / "gpu_report.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(dest)], check=False)
    assert done.returncode == 0
    text = dest.read_text()
    assert "- result: **passed**" in text and "Docker 20.10.24+dfsg1" in text
    assert "injection: **cdi-applied** (nvidia.com/gpu=GPU-1)" in text and "NVIDIA H200" in text
    assert "| gpu-h2d-bandwidth | 25.3 |" in text and "| kernel check | PASS |" in text
    assert '"evidence"' not in text  # the excerpt leaves the evidence records out
