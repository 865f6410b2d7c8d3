"""The docker CLI, as the test helpers call it: one command, its output captured, never
raising on a non-zero exit (the caller reads ``returncode``)."""

from __future__ import annotations

import subprocess

__all__ = ["docker", "image_id_of"]


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    """``docker ARGS``, its stdout and stderr captured as text."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False)


def image_id_of(tag: str) -> str:
    """The local image id of ``tag`` (the engine's answer); RuntimeError when it is missing."""
    out = docker("image", "inspect", "--format", "{{.Id}}", tag)
    if out.returncode != 0:
        raise RuntimeError(f"{tag} is missing: run scripts/setup.sh ({out.stderr.strip()})")
    return out.stdout.strip()
