"""Where `runner submit` records the jobs it sent to a cluster, for `runner wait`, `runner
cancel` and `runner status` to find them again: ``<state>/<cluster>/<job id>/submissions.jsonl``
(``cluster``: ``slurm`` or ``kubernetes``), one JSON object a line, appended once per
submission; the last line is the job's latest submission.

What a line holds is each cluster's (a Slurm job id and the sbatch request; a Kubernetes
namespace, context and names); this module owns the folder, the file, appending a line and
reading the last one back. Lines are ``json.dumps(entry, sort_keys=True)``; any JSON object a
line is read, so records written before (Kubernetes' were compact, in insertion order) are
read as they are.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from runner.contract.models import JOB_ID_PATTERN
from runner.core import jsondepth, safefs
from runner.core.errors import InfrastructureError

__all__ = ["FILE", "append", "folder", "latest"]

Cluster = Literal["slurm", "kubernetes"]
FILE = "submissions.jsonl"

MAX_LINE = 1 << 20
"""The most bytes read from the end of the file for its last line (a line is a few hundred
bytes); a file of many submissions is never read whole."""


def folder(state: Path, cluster: Cluster, job_id: str) -> Path:
    """``<state>/<cluster>/<job id>``: the job's submissions (and, for Slurm, its batch
    scripts, logs and envelopes)."""
    return state / cluster / job_id


def append(state: Path, cluster: Cluster, job_id: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Append ``entry`` as one line to the job's ``submissions.jsonl`` (its folder made when
    missing); ``entry``."""
    where = folder(state, cluster, job_id)
    where.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(where / FILE, flags, 0o666)  # never appended through a link
    except OSError as exc:
        raise InfrastructureError(f"{where / FILE}: cannot record the submission ({exc})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return entry


def latest(state: Path, cluster: Cluster, job_id: str) -> dict[str, Any] | None:
    """The job's latest submission to ``cluster``: None when it was never submitted there (no
    file, or one without a line; or ``job_id`` is no job id, a path say); a last line that is
    not a JSON object is an infrastructure error naming the file."""
    if not re.fullmatch(JOB_ID_PATTERN, job_id):
        return None
    path = folder(state, cluster, job_id) / FILE
    if not os.path.lexists(path):
        return None
    try:
        with safefs.open_regular(path) as f:  # not through a link, no FIFO or device
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - MAX_LINE))
            tail = f.read(MAX_LINE)
    except safefs.UnsafePath as exc:
        raise InfrastructureError(f"{path}: {exc.problem}; the runner writes a file") from None
    except OSError as exc:
        raise InfrastructureError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    lines = [line for line in tail.splitlines() if line.strip()]
    if size > MAX_LINE and lines:
        lines = lines[1:]  # the first may be a line's end only
    if not lines:
        if size > MAX_LINE:
            raise InfrastructureError(f"{path}: its last line is over {MAX_LINE:,} bytes")
        return None
    try:
        data = jsondepth.loads(lines[-1].decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deep
        raise InfrastructureError(f"{path}: its last line is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InfrastructureError(f"{path}: its last line is not a JSON object")
    return data
