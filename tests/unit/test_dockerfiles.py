"""The job images' Dockerfiles: linted (the GPU one cannot be built without a registry) and
kept to the same non-root /job layout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    ROOT / "images" / "cpu" / "Dockerfile",
    ROOT / "images" / "gpu" / "Dockerfile",
    ROOT / "images" / "proxy" / "Dockerfile",
    ROOT / "images" / "agent-scripted" / "Dockerfile",
    ROOT / "images" / "agent-claude" / "Dockerfile",
    ROOT / "images" / "gpu-smoke" / "Dockerfile",
    ROOT / "images" / "slurm-node" / "Dockerfile",
]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint is missing: scripts/setup.sh installs it with the dev extras")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_hadolint(), str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gpu_base_is_pinned_by_digest() -> None:
    text = DOCKERFILES[1].read_text()
    match = re.search(r"^ARG BASE=(\S+)$", text, re.MULTILINE)
    assert match and re.search(r"@sha256:[0-9a-f]{64}$", match.group(1)), "pin the CUDA base"


def test_gpu_image_has_the_cpu_images_layout() -> None:
    """Same user, uid, folders and permissions as the CPU image."""

    def layout(path: Path) -> list[str]:
        lines = path.read_text().splitlines()
        keep = (
            "RUN groupadd",
            " && useradd",
            "--home-dir",
            " && mkdir",
            " && chown",
            " && chmod",
            "USER ",
            "WORKDIR ",
        )
        return [line.strip().rstrip(" \\") for line in lines if line.startswith(keep)]

    assert layout(DOCKERFILES[1]) == layout(DOCKERFILES[0])
