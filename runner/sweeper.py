"""``runner cleanup``: remove containers this runner left behind, never one a job still needs.

A container is removed when no runner holds its job's lock and the job's ledger says its
attempt has finished (or the job has). One whose ledger says it is still running is listed and
left alone: `runner run` on that job reattaches to it. The egress allowlist's slots (network,
proxy, namespace holder; see :mod:`runner.egress`) outlive attempts on purpose: each free one
(no runner holds its lock, no job container is in it) is removed, however recently used.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

from runner import egress, ledger
from runner.backends.base import Backend
from runner.errors import RunnerError
from runner.staging import JobDir


def runner_alive(job_root: Path) -> bool:
    """Whether a runner holds the job's lock right now."""
    lock = JobDir(job_root).lock
    if not lock.exists():
        return False
    with lock.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _verdict(labels: dict[str, str]) -> tuple[bool, str]:
    """(remove?, why) for a container or network carrying these labels."""
    job_dir = labels.get("org.runner.job-dir")
    if not job_dir or not Path(job_dir).is_dir():
        return False, f"its job folder {job_dir or '(unlabelled)'} is not here; remove it by hand"
    root = Path(job_dir)
    if runner_alive(root):
        return False, "a runner is watching it"
    path = JobDir(root).ledger
    if not path.exists():
        return False, "its job has no ledger; remove it by hand"
    state = ledger.read_state(path)
    attempt = int(labels.get("org.runner.attempt", "0") or 0)
    mine = next((a for a in state.attempts if a.number == attempt), None)
    if mine is None or mine.finished is not None or state.finished is not None:
        return True, "its attempt has finished and no runner watches it"
    return False, "its ledger says it still runs; `runner run` on the job reattaches to it"


def sweep(backend: Backend | None = None, *, dry_run: bool = False) -> dict[str, Any]:
    if backend is None:
        from runner import backends

        backend = backends.default()
    removed: list[dict[str, str]] = []
    kept: list[dict[str, str]] = []
    for c in backend.find({"org.runner.managed": "true"}):
        remove, why = _verdict(c.labels)
        item = {"id": c.id, "name": c.name, "status": c.status, "why": why}
        if remove:
            if not dry_run:
                backend.remove(c.id)
            removed.append(item)
        else:
            kept.append(item)
    for n in backend.find_networks({"org.runner.managed": "true"}):
        remove, why = _verdict(n.labels)
        item = {"id": n.id, "name": n.name, "status": "network", "why": why}
        if remove and not dry_run:
            try:
                backend.remove_network(n.name)
            except RunnerError as exc:  # a container not ours is still on it
                remove, item["why"] = False, f"it could not be removed: {exc.message}"
        (removed if remove else kept).append(item)
    for slot in egress.reap(backend, idle_seconds=0.0, dry_run=dry_run):
        why = "a free egress slot (its network, proxy and holder)"
        removed.append({"id": slot, "name": slot, "status": "egress slot", "why": why})
    return {"removed": removed, "kept": kept, "dryRun": dry_run}
